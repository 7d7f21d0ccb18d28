"""Gallery: Bayesian logistic regression (the SGHMC thesis' model) with every full-data DP step.

Three standard-normal covariates in a ``pm.Data`` container aligned with the rows, an intercept,
θ ~ N(0, 25 I), y_i ~ Bernoulli(logit⁻¹(θ0 + x_i·θ1:)), n = 100 000, true θ = (−0.3, 1, −0.5, 0.8).
No closed form: the figure compares with a (non-private) NUTS reference.

Run: ``python examples/gallery/logistic_regression.py`` (``--quick`` for a fast check).
"""

import numpy as np
import pymc as pm

from pymc_dp.experiments import gallery


def build_model(data: np.ndarray) -> pm.Model:
    x, y = data[:, :-1], data[:, -1].astype("int64")
    with pm.Model() as model:
        covariates = pm.Data("covariates", x)
        theta = pm.Normal("theta", 0.0, 5.0, shape=x.shape[1] + 1)
        pm.Bernoulli("y", logit_p=theta[0] + pm.math.dot(covariates, theta[1:]), observed=y)
    return model


if __name__ == "__main__":
    gallery.main({"default": ("logistic_regression", {})}, build_model, __doc__)
