"""Sample-quality metrics used by the seeds' evaluation (theory §5)."""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import cdist, pdist

from pymc_dp.errors import InvalidParameterError

__all__ = ["median_heuristic", "mmd"]


def median_heuristic(
    x: np.ndarray, y: np.ndarray, *, subsample: int = 1000, rng: np.random.Generator | None = None
) -> float:
    """Median pairwise Euclidean distance of the pooled samples (on at most ``subsample`` rows)."""
    pooled = np.concatenate([_as_2d(x, "x"), _as_2d(y, "y")])
    if pooled.shape[0] > subsample:
        rng = np.random.default_rng(0) if rng is None else rng
        pooled = pooled[rng.choice(pooled.shape[0], subsample, replace=False)]
    width = float(np.median(pdist(pooled)))
    if not width > 0:
        raise InvalidParameterError("The samples have zero median distance; MMD is undefined.")
    return width


def mmd(x: np.ndarray, y: np.ndarray, *, bandwidth: float | None = None) -> float:
    """Maximum mean discrepancy with a Gaussian kernel (the seeds' metric, theory §5).

    ``MMD²(x, y) = mean k(x, x') + mean k(y, y') − 2 mean k(x, y)`` (the biased V-statistic,
    never negative) with ``k(u, v) = exp(−‖u − v‖² / (2 h²))`` and ``h`` the median pairwise
    distance of the pooled samples unless ``bandwidth`` is given. Returns ``MMD`` (the root).

    Parameters
    ----------
    x, y : array, shape (n, d) or (n,)
        The two samples (rows are draws).
    bandwidth : float, optional
        Kernel width ``h``; default: the median heuristic.
    """
    x, y = _as_2d(x, "x"), _as_2d(y, "y")
    if x.shape[1] != y.shape[1]:
        raise InvalidParameterError(f"x has {x.shape[1]} columns and y {y.shape[1]}.")
    h = median_heuristic(x, y) if bandwidth is None else float(bandwidth)
    scale = -0.5 / h**2

    def mean_kernel(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.exp(scale * cdist(a, b, "sqeuclidean")).mean())

    value = mean_kernel(x, x) + mean_kernel(y, y) - 2.0 * mean_kernel(x, y)
    return float(np.sqrt(max(value, 0.0)))


def _as_2d(sample: np.ndarray, name: str) -> np.ndarray:
    sample = np.asarray(sample, dtype=float)
    if sample.ndim == 1:
        sample = sample[:, None]
    if sample.ndim != 2 or sample.shape[0] < 2:
        raise InvalidParameterError(f"{name} must be an (n, d) array of at least 2 draws.")
    return sample
