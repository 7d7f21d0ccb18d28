"""Gallery: Gaussian with known covariance (theory §5), 2-d and 30-d, with every full-data DP step.

θ ~ N(0, 1000 I), x_i ~ N(θ, diag(20, 2.5, 1, …, 1)): the posterior is Gaussian in closed form.
Variants: 2-d (n = 100 000) and the seeds' high-dimensional 30-d Gaussian (n = 200 000), where
the seeds found the penalty method with guided one-component updates best.

Run: ``python examples/gallery/gaussian.py --variant 30d`` (``--quick`` for a fast check).
"""

import numpy as np
import pymc as pm
import pytensor.tensor as pt

from pymc_dp.experiments import gallery


def build_model(data: np.ndarray, prior_var: float = 1000.0) -> pm.Model:
    d = data.shape[1]
    lik_sd = np.sqrt(np.r_[20.0, 2.5, np.ones(d - 2)])
    with pm.Model() as model:
        # the prior as a potential on a flat parameter, as the banana family it belongs to
        theta = pm.Flat("theta", shape=d)
        pm.Potential("prior", -0.5 * pt.sum(theta**2) / prior_var)
        pm.Normal("x", mu=theta, sigma=lik_sd, observed=data)
    return model


VARIANTS = {"2d": ("gaussian", {}), "30d": ("gaussian_30d", {})}

if __name__ == "__main__":
    gallery.main(VARIANTS, build_model, __doc__)
