"""Deliberately broken mechanisms: the negative controls of the privacy audit (research only).

:func:`broken` patches every mechanism for the length of a ``with`` block, so that
:mod:`pymc_dp.audit` can show it detects a leak (``benchmarks/privacy_audit.py``,
``tests/test_audit.py``). It lives in the research harness because it reaches into the oracle
(its clipping), which nothing but the mechanisms may touch in a real release.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from pymc_dp.errors import InvalidParameterError

__all__ = ["BROKEN_VARIANTS", "broken"]

#: Deliberately broken mechanisms an audit must catch (:func:`broken`).
BROKEN_VARIANTS = ("no noise", "noise / 10", "uniform noise", "no clipping")


@contextlib.contextmanager
def broken(kind: str) -> Iterator[None]:
    """Break every mechanism the way ``kind`` says, inside the ``with`` block (negative controls).

    ``"no noise"``: releases without noise; ``"noise / 10"``: a tenth of the noise;
    ``"uniform noise"``: uniform noise of the same variance (bounded, so not DP at any ε);
    ``"no clipping"``: per-row gradients and ratios unclipped, the noise unchanged. For checking
    that an audit detects a leak; never for a real release.
    """
    from pymc_dp import noise, oracle, releases

    if kind not in BROKEN_VARIANTS:
        raise InvalidParameterError(f"kind must be one of {BROKEN_VARIANTS}, got {kind!r}.")
    saved = []

    def patch(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    if kind == "no clipping":
        grad, llr = oracle.RowLikelihood.clipped_grad_sum, oracle.RowLikelihood.clipped_llr_sum
        patch(
            oracle.RowLikelihood,
            "clipped_grad_sum",
            lambda self, theta, _clip, *a, **k: grad(self, theta, np.inf, *a, **k),
        )
        patch(
            oracle.RowLikelihood,
            "clipped_llr_sum",
            lambda self, theta, new, _clip, *a, **k: llr(self, theta, new, np.inf, *a, **k),
        )
        patch(releases, "clip_ratio", lambda ratio, bound: np.asarray(ratio, dtype=float))
    else:
        factor = {"no noise": 0.0, "noise / 10": 0.1, "uniform noise": 1.0}[kind]
        standard = noise.NoiseSource.standard_normal

        def weakened(self: Any, size: Any = None) -> Any:
            z = standard(self, size)
            if kind == "uniform noise":  # same variance, bounded support
                u = self.random(None if size is None else int(np.prod(size)))
                z = math.sqrt(3.0) * (2 * np.asarray(u) - 1)
                z = float(z) if size is None else z.reshape(size)
            return factor * z

        patch(noise.NoiseSource, "standard_normal", weakened)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
