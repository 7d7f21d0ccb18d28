"""Gallery: the seeds' banana posteriors (theory §5, thesis Table 5.1) with every DP step.

θ ~ Ban(0, σ0² I, a) with σ0² = 1000 (a flat parameter plus the banana prior as a data-free
potential), x_i1 ~ N(θ1, 20), x_i2 ~ N(θ2 + a θ1², 2.5), x_ij ~ N(θj, 1) for j > 2. Variants:
flat 2-d (n = 100 000, a = 20), flat 10-d (n = 200 000), tempered 2-d and 10-d (n0 = 1000,
where DP Barker and the minibatch penalty join), the narrow banana (a = 350, n = 150 000), and
the DP-HMC paper's wider banana (σ1² = 2000, σ2² = 2500, n = 100 000; variant ``paper``), where
DP-SGLD and DP-SGNHT join DP HMC and the DP penalty with the paper's settings.
The tempered posterior is a banana in closed form (thesis Thm 5.2), drawn exactly for the
figures.

Run: ``python examples/gallery/banana.py --variant tempered-2d`` (``--quick`` for a fast check).
"""

import numpy as np
import pymc as pm
import pytensor.tensor as pt

from pymc_dp.experiments import gallery


def build_model(
    data: np.ndarray,
    a: float = 20.0,
    prior_var: float = 1000.0,
    lik_var: tuple[float, float] = (20.0, 2.5),
) -> pm.Model:
    d = data.shape[1]
    lik_sd = np.sqrt(np.r_[lik_var, np.ones(d - 2)])
    with pm.Model() as model:
        theta = pm.Flat("theta", shape=d)
        bent = pt.concatenate([theta[:1], (theta[1] + a * theta[0] ** 2)[None], theta[2:]])
        pm.Potential("banana_prior", -0.5 * pt.sum(bent**2) / prior_var)
        pm.Normal("x", mu=bent, sigma=lik_sd, observed=data)
    return model


VARIANTS = {
    "flat-2d": ("flat_banana_2d", {}),
    "flat-10d": ("flat_banana_10d", {}),
    "tempered-2d": ("tempered_banana_2d", {}),
    "tempered-10d": ("tempered_banana_10d", {}),
    "narrow": ("narrow_banana", {"a": 350.0}),
    "paper": ("paper_banana", {"lik_var": (2000.0, 2500.0)}),
}

if __name__ == "__main__":
    gallery.main(VARIANTS, build_model, __doc__)
