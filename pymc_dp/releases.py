"""What a mechanism hands back to a kernel, and the clipping rule for ratios (NumPy only).

Kernels (``pymc_dp.kernels``) import this module and nothing that imports PyMC: a kernel sees
released numbers, never the data or the oracle.

* :class:`Release` — a noisy release and the standard deviation of its noise.
* :class:`BarkerDecision` — the outcome of a DP Barker test (only ``accepted`` is released).
* :func:`clip_ratio` — the rule for a per-row log-likelihood ratio (theory §2): an undefined
  ratio (both terms infinite: NaN) counts as ``−B``, bounded and against the move, and every
  ratio is clipped to ``[−B, B]``. The oracle applies the same rule inside its compiled
  functions (``pymc_dp.oracle.clip_ratio_graph``); a test checks that the two agree.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["BarkerDecision", "Release", "clip_ratio", "count_clipped", "quantile_from_counts"]


class Release(NamedTuple):
    """A noisy release and the standard deviation of the noise that was added.

    ``n_clipped`` is NOT private (computed from the data without noise); a mechanism counts it
    only for a step's opt-in, non-private diagnostics, and it is ``None`` otherwise.
    """

    value: float | np.ndarray
    noise_std: float
    n_clipped: int | None


class BarkerDecision(NamedTuple):
    """Outcome of one DP Barker test: only ``accepted`` is released.

    ``batch_variance`` (``σ_b²``) and ``n_clipped`` are computed from the batch without noise:
    NOT private, kept only in the opt-in diagnostics.
    """

    accepted: bool
    batch_variance: float
    n_clipped: int


def clip_ratio(ratio: np.ndarray, bound: float) -> np.ndarray:
    """``clip(r, −B, B)`` with an undefined ratio (NaN) counted as ``−B`` (theory §2)."""
    ratio = np.asarray(ratio, dtype=float)
    return np.clip(np.where(np.isnan(ratio), -bound, ratio), -bound, bound)


def count_clipped(ratio: np.ndarray, bound: float) -> int:
    """Rows whose ratio :func:`clip_ratio` changes: ``|r| > B``, and NaN. NOT private."""
    return int(np.sum(~(np.abs(np.asarray(ratio, dtype=float)) <= bound)))


def quantile_from_counts(counts: np.ndarray, edges: np.ndarray, quantile: float) -> float:
    """The smallest edge below which a share ``quantile`` of the (noisy) counts lies.

    ``counts`` has one more entry than ``edges`` (bin ``k`` is ``(edges[k-1], edges[k]]``, the
    last is above every edge), as released by a noisy histogram; post-processing only. Negative
    noisy counts are kept (dropping them would bias the sum); the total is that of the noisy
    counts. Returns ``edges[-1]`` when no edge reaches the quantile.
    """
    counts = np.asarray(counts, dtype=float)
    edges = np.asarray(edges, dtype=float)
    cumulative = np.cumsum(counts[:-1])
    total = float(counts.sum())
    reached = np.nonzero(cumulative >= quantile * total)[0]
    return float(edges[reached[0]]) if reached.size else float(edges[-1])
