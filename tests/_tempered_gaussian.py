"""The tempered 2-d Gaussian of the subsampled steps' tests (theory §5), built once per session."""

from __future__ import annotations

from functools import cache

import numpy as np

from pymc_dp import RowLikelihood
from pymc_dp.testing import Banana

SPEC = Banana(d=2, a=0.0)
N, N0 = 100_000, 1000
T = N0 / N


@cache
def tempered_setup():
    """Oracle over n = 100 000 rows, and the mean and sd of the posterior tempered to n0 = 1000."""
    data = SPEC.simulate(N, np.random.default_rng(1))
    oracle = RowLikelihood(SPEC.model(data))
    mean, var = SPEC.posterior_params(data, temperature=T)
    return oracle, mean, np.sqrt(var)


@cache
def small_model():
    """A 2000-row model and its data, for step plumbing."""
    data = SPEC.simulate(2000, np.random.default_rng(3))
    return SPEC.model(data), data


def batch_means_se(x: np.ndarray, batches: int = 40) -> float:
    """Monte Carlo standard error of a chain's mean by batch means."""
    means = x[: len(x) // batches * batches].reshape(batches, -1).mean(1)
    return float(means.std(ddof=1) / np.sqrt(batches))
