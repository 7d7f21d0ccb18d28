"""Shared test models with closed-form posteriors: a Gaussian oracle and a Normal model."""

from __future__ import annotations

from functools import cache

import numpy as np
import pymc as pm

from pymc_dp import RowLikelihood
from pymc_dp.testing import Banana

GAUSSIAN = Banana(d=2, a=0.0)  # Gaussian model with known covariance (T§5.1)


@cache
def gaussian_setup(n: int = 1000):
    """The oracle of ``n`` rows of ``GAUSSIAN``, its posterior mean and sd."""
    data = GAUSSIAN.simulate(n, np.random.default_rng(1))
    oracle = RowLikelihood(GAUSSIAN.model(data))
    mean, var = GAUSSIAN.posterior_params(data)
    return oracle, mean, np.sqrt(var)


def normal_model(n: int, seed: int = 0):
    """``y ~ N(μ, σ)`` with PyMC-docs priors; the Laplace posterior is closed-form at this n.

    Returns the model and the posterior of ``(μ, log σ)``: means ≈ ``(ȳ, log s)``, sds ≈
    ``(s/√n, 1/√(2n))``.
    """
    y = np.random.default_rng(seed).normal(1.5, 2.0, n)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        sigma = pm.HalfNormal("sigma", 5.0)
        pm.Normal("y", mu, sigma, observed=y)
    s = y.std()
    return model, np.array([y.mean(), np.log(s)]), np.array([s / np.sqrt(n), 1 / np.sqrt(2 * n)])


@cache
def neighbouring_oracles(seed: int, rows: int = 60) -> tuple[RowLikelihood, list[RowLikelihood]]:
    """``rows`` rows of ``GAUSSIAN`` and four neighbours, each with one row replaced by an
    extreme one (scales 5 to 5·10⁴): for sensitivity property tests."""
    data = GAUSSIAN.simulate(rows, np.random.default_rng(seed))
    rng = np.random.default_rng(seed + 1)
    neighbours = []
    for scale in (5.0, 50.0, 500.0, 5e4):
        other = data.copy()
        other[rng.integers(rows)] = rng.normal(0.0, scale, GAUSSIAN.d)
        neighbours.append(RowLikelihood(GAUSSIAN.model(other)))
    return RowLikelihood(GAUSSIAN.model(data)), neighbours
