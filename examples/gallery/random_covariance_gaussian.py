"""Gallery: the DP-HMC paper's 10-d Gaussian with a random covariance, and the samplers it compared.

θ ~ N(0, 100² I), x_i ~ N(θ, Σ) with n = 100 000 and Σ = Q diag(λ) Qᵀ, λ_j ~ Gamma(1/2, 1) and Q
orthonormalised from a matrix of U(0, 1) draws (the paper's §4; our draw of Σ has condition
number 576). The posterior is Gaussian in closed form. DP HMC, the DP penalty, DP-SGLD and
DP-SGNHT run with the paper's settings; the paper found DP-SGLD best on this model.

Run: ``python examples/gallery/random_covariance_gaussian.py`` (``--quick`` for a fast check).
"""

import numpy as np
import pymc as pm

from pymc_dp.experiments import gallery
from pymc_dp.experiments.problems import paper_gaussian_covariance


def build_model(data: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, 100.0, shape=data.shape[1])
        pm.MvNormal("x", mu=theta, cov=paper_gaussian_covariance(), observed=data)
    return model


VARIANTS = {"10d": ("gaussian_10d", {})}

if __name__ == "__main__":
    gallery.main(VARIANTS, build_model, __doc__)
