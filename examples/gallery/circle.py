"""Gallery: the circle (theory §5) with every full-data DP step.

A flat prior on (x, y) and ``log p(r_i | x, y) = −a (x² + y² − r_i²)²`` with a = 1e-5 and
r_i ~ N(3, 1), n = 100 000: the posterior is a ring, its mean the origin. There is no
closed-form sample; the figure compares with a (non-private) NUTS reference.

Run: ``python examples/gallery/circle.py`` (``--quick`` for a fast check).
"""

import numpy as np
import pymc as pm
import pytensor.tensor as pt

from pymc_dp.experiments import gallery

A = 1e-5


def circle_logp(value, theta):
    return -A * (pt.sum(theta**2) - value**2) ** 2


def build_model(data: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        theta = pm.Flat("theta", shape=2)
        pm.CustomDist("r", theta, logp=circle_logp, observed=data)
    return model


if __name__ == "__main__":
    gallery.main({"default": ("circle", {})}, build_model, __doc__)
