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

__all__ = ["BROKEN_VARIANTS", "barker_accept_probability", "broken", "one_bit_audit_limit"]

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


def barker_accept_probability(
    kind: str, lam: np.ndarray, *, batch_variance: float = 0.0
) -> np.ndarray:
    """``P(accept | λ)`` of DP Barker's test as built (``kind="as built"``) or broken by
    ``"noise / 10"`` or ``"uniform noise"`` (exactly, from the shipped correction's mixture).

    The test accepts iff ``λ + σ_s Z + m_J + s_J Z' > 0`` with ``σ_s² = C − σ_b²`` and ``V_corr``
    the mixture ``Σ w_j N(m_j, s_j²)`` (theory §4.4); :func:`broken` scales every standard
    normal draw (both ``Z`` and ``Z'``) by 1/10, or replaces it with a uniform of the same
    variance. Used to show which broken Barker variants any audit of the accept bit could
    catch (:func:`one_bit_audit_limit`).
    """
    from scipy import special

    from pymc_dp.barker_correction import BarkerCorrection

    correction = BarkerCorrection.load(2.0)
    sigma = math.sqrt(correction.normal_variance - batch_variance)
    lam = np.asarray(lam, dtype=float)[..., None]
    means, sds, weights = correction.means, correction.sds, correction.weights
    if kind in ("as built", "noise / 10"):
        factor = 1.0 if kind == "as built" else 0.1
        scale = factor * np.sqrt(sigma**2 + sds**2)
        return special.ndtr((lam + means) / scale) @ weights
    if kind != "uniform noise":
        raise InvalidParameterError(
            f"kind must be 'as built', 'noise / 10' or 'uniform noise', got {kind!r}."
        )
    # σ U + s_j U' > −(λ + m_j), U and U' uniform on [−√3, √3]: average over U' (midpoints)
    half = math.sqrt(3.0)
    u2 = (np.arange(400) + 0.5) / 400 * 2 * half - half
    x = -(lam + means)[..., None] - sds[:, None] * u2  # (…, components, grid)
    inside = np.clip((half - x / sigma) / (2 * half), 0.0, 1.0)
    return inside.mean(axis=-1) @ weights


def one_bit_audit_limit(
    p: np.ndarray,
    p_neighbour: np.ndarray,
    *,
    runs: int,
    delta: float,
    confidence: float = 0.95,
    sets: int = 3,
) -> tuple[float, float]:
    """For a one-bit output with ``P(1) = p`` on ``D`` and ``p_neighbour`` on ``D'`` (arrays over
    the auditor's designs): (the true ε at ``delta``, sup over designs; the largest lower bound an
    audit with ``runs`` runs per dataset shows when it sees the expected counts).

    The true ε of a Bernoulli pair is the smallest ε with ``max(0, P'(o) − e^ε P(o)) ≤ δ`` for
    both outcomes ``o`` and both directions; the audit's bound is
    ``log((P_lo(o) − δ) / P_hi(o))`` with one-sided Clopper–Pearson bounds at
    ``1 − (1 − c)/(2·sets)``, as :func:`pymc_dp.audit.audit_step` evaluates its ``sets`` best
    sets (``sets=1``: one set, each bound at ``(1 + c)/2``).
    """
    from scipy import stats

    level = 1 - (1 - confidence) / (2 * sets)
    true, shown = 0.0, 0.0
    for a, b in ((p, p_neighbour), (p_neighbour, p)):
        for high, low in ((a, b), (1 - a, 1 - b)):
            high, low = np.asarray(high, dtype=float), np.asarray(low, dtype=float)
            leaks = high > delta  # the outcome's δ-excess needs e^ε low ≥ high − δ
            if np.any(leaks & (low <= 0)):
                true = math.inf
            elif np.any(leaks):
                true = max(true, float(np.max(np.log((high[leaks] - delta) / low[leaks]))))
            k_high, k_low = np.round(high * runs), np.round(low * runs)
            lower = np.where(k_high > 0, stats.beta.ppf(1 - level, k_high, runs - k_high + 1), 0.0)
            upper = np.where(k_low < runs, stats.beta.ppf(level, k_low + 1, runs - k_low), 1.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                bound = np.log(np.maximum(lower - delta, 1e-300) / upper)
            shown = max(shown, float(np.max(np.where(lower > delta, bound, 0.0))))
    return true, shown
