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

__all__ = ["BarkerDecision", "Release", "clip_ratio", "count_clipped"]


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
