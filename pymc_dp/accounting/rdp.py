"""Rényi-DP accounting: RDP → (ε, δ), subsampling amplification and DP Barker (theory §3, §4.4).

Three pieces, each a formula from the literature:

* :func:`rdp_to_epsilon` — RDP → (ε, δ) with the improved conversion of Canonne, Kamath &
  Steinke (2020, Prop. 12) / Asoodeh et al. (2020) / Balle et al. (2020):
  ``ε = ε_RDP(α) + ln((α-1)/α) - (ln δ + ln α)/(α - 1)``. It is never larger than the classic
  ``ε_RDP(α) + ln(1/δ)/(α - 1)`` (thesis Thm 2.5; theory §3), because
  ``ln((α-1)/α) < 0`` and ``ln α/(α-1) > 0`` for every ``α > 1``. Both are minimised over the
  supplied orders.
* :func:`wbk_subsampled_rdp` — amplification by subsampling *without replacement* under the
  substitute relation, Wang, Balle & Kasiviswanathan (2019), Thm 9, in the form the thesis
  ``004`` states it in Thm 3.3 (no bound on ``ε(∞)``, so ``min{2, (e^{ε(∞)} - 1)^j} = 2``)::

      ε(α) = 1/(α-1) ln(1 + q² C(α,2) min{4(e^{ε'(2)} - 1), 2e^{ε'(2)}}
                          + 2 Σ_{j=3}^{α} q^j C(α,j) e^{(j-1) ε'(j)})

  evaluated in log space (the terms overflow doubles for large ``α``). We also take the minimum
  with the unamplified ``ε'(α)``, which is valid by joint convexity of ``e^{(α-1) D_α}``.
* :func:`barker_base_rdp` / :func:`barker_rdp` — DP Barker (Heikkilä et al. 2019; thesis Thm 3.3,
  theory §4.4). One iteration on a batch of ``b`` rows, with the log-likelihood-ratio clip of
  theory §4.4 and total normal variance ``C = 2``, is ``(α, ε'(α))``-RDP for integers
  ``2 < α < b/5`` with ``ε'(α) = 5/(2b) + ln(2b/(b - 5α))/(2(α - 1)) + 2α/(b - 5α)``.

Monotone envelope (a deliberate, sound deviation)
-------------------------------------------------
The amplification formula needs ``ε'(j)`` for ``j = 2, ..., α``, but the thesis states the base
bound only for ``2 < α`` (its Thm 3.3 nevertheless plugs in ``ε'(2)``; the earlier draft ``001``
states ``α < b/5`` without the lower limit). Rényi divergence is non-decreasing in the order,
so an ``(α', ε)``-RDP guarantee is also an ``(α, ε)``-RDP guarantee for every ``α ≤ α'``.
:func:`barker_rdp` therefore uses the envelope

.. math::

    \\tilde ε'(j) = \\min_{\\max(j, 3) \\le α' < b/5} ε'(α'),

which only ever uses the base bound where the thesis proves it. ``ε'`` first *decreases* in α
(its ``ln 2/(2(α-1))`` term), so for usual batch sizes the envelope is much smaller than the thesis'
literal ``ε'(2)`` and the resulting counts are several times the thesis' (b = 1000,
n = 100 000: 5336 instead of 972 iterations at ε = 2, δ = 1e-6) — see docs/accounting.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import special

from pymc_dp.accounting._checks import check_delta, check_int, check_positive
from pymc_dp.errors import InvalidParameterError

__all__ = [
    "BARKER_MAX_ORDER",
    "barker_base_rdp",
    "barker_epsilon",
    "barker_orders",
    "barker_rdp",
    "rdp_to_epsilon",
    "wbk_subsampled_rdp",
]

#: Largest RDP order used for DP Barker (orders above this never help at practical δ).
BARKER_MAX_ORDER = 1024


def _check_orders(orders: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(orders, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidParameterError("orders must be a non-empty 1-d sequence of RDP orders > 1.")
    if np.any(~np.isfinite(arr)) or np.any(arr <= 1.0):
        raise InvalidParameterError(f"orders must be finite and > 1; got {orders!r}.")
    return arr


def rdp_to_epsilon(
    orders: Sequence[float] | np.ndarray,
    rdp: Sequence[float] | np.ndarray,
    delta: float,
    *,
    method: str = "improved",
) -> tuple[float, float]:
    """Convert an RDP curve to (ε, δ)-DP, minimising over the orders (theory §3).

    Parameters
    ----------
    orders : sequence of float
        RDP orders ``α > 1``.
    rdp : sequence of float
        ``ε_RDP(α)`` at those orders (``inf`` allowed: that order is then unusable).
    delta : float
        Target δ in ``(0, 1)``.
    method : {"improved", "classic"}
        ``"improved"``: ``ε_RDP(α) + ln((α-1)/α) - (ln δ + ln α)/(α - 1)`` (Canonne, Kamath &
        Steinke 2020, Prop. 12), and ε = 0 where ``δ² ≥ 1 − e^{−ε_RDP(α)}`` (the KL/total
        variation bound). ``"classic"``: ``ε_RDP(α) + ln(1/δ)/(α - 1)`` (Mironov 2017;
        thesis Thm 2.5).

    Returns
    -------
    (float, float)
        ``(ε, α*)``: the smallest ε (clipped at 0) and the order that attains it; ``(inf, nan)``
        if every order has infinite RDP.
    """
    a = _check_orders(orders)
    r = np.asarray(rdp, dtype=float)
    if r.shape != a.shape:
        raise InvalidParameterError("orders and rdp must have the same length.")
    if np.any(np.isnan(r)) or np.any(r < 0):
        raise InvalidParameterError("rdp values must be >= 0 (inf allowed), not NaN or negative.")
    d = check_delta(delta)
    log_d = math.log(d)
    with np.errstate(invalid="ignore"):
        if method == "improved":
            eps = r + np.log1p(-1.0 / a) - (log_d + np.log(a)) / (a - 1.0)
        elif method == "classic":
            eps = r - log_d / (a - 1.0)
        else:
            raise InvalidParameterError(f"method must be 'improved' or 'classic'; got {method!r}.")
    eps = np.where(np.isfinite(r), eps, np.inf)
    if method == "improved":
        # Rényi divergences grow with the order, so each ε_RDP(α) bounds the KL divergence and
        # the Bretagnolle–Huber bound TV ≤ √(1 − e^{−KL}) gives (0, δ)-DP when δ² ≥ 1 − e^{−r}
        # (as dp_accounting's compute_epsilon).
        eps = np.where(d * d + np.expm1(-r) > 0, 0.0, eps)
    i = int(np.argmin(eps))
    if not np.isfinite(eps[i]):
        return math.inf, math.nan
    return max(0.0, float(eps[i])), float(a[i])


def _log_binom(n: np.ndarray, k: np.ndarray) -> np.ndarray:
    return special.gammaln(n + 1.0) - special.gammaln(k + 1.0) - special.gammaln(n - k + 1.0)


def wbk_subsampled_rdp(
    orders: Sequence[int] | np.ndarray,
    base_rdp: Callable[[np.ndarray], np.ndarray],
    sampling_ratio: float,
) -> np.ndarray:
    """RDP of a mechanism run on a batch drawn without replacement (WBK 2019, Thm 9).

    Substitute relation, batch of ``b = q n`` rows drawn uniformly without replacement; formula
    as in thesis Thm 3.3 (see module docstring), evaluated with ``logsumexp``.

    Parameters
    ----------
    orders : sequence of int
        Integer orders ``α ≥ 2``.
    base_rdp : callable
        ``base_rdp(j)`` → RDP ``ε'(j)`` of the mechanism on a fixed batch (substitute relation)
        for an integer array ``j`` (values ``2 ... max(orders)``); may return ``inf``.
    sampling_ratio : float
        ``q = b/n`` in ``(0, 1]``.

    Returns
    -------
    numpy.ndarray
        Amplified RDP at each order (``min`` with the unamplified ``ε'(α)``).
    """
    a = np.asarray(orders)
    if a.ndim != 1 or a.size == 0 or np.any(a != np.round(a)) or np.any(a < 2):
        raise InvalidParameterError(f"orders must be integers >= 2; got {orders!r}.")
    q = check_positive(sampling_ratio, "sampling_ratio")
    if q > 1.0:
        raise InvalidParameterError(f"sampling_ratio must be in (0, 1]; got {q}.")
    a = a.astype(np.int64)
    a_max = int(a.max())
    j = np.arange(2, a_max + 1, dtype=np.int64)
    base = np.asarray(base_rdp(j), dtype=float)
    if base.shape != j.shape or np.any(np.isnan(base)) or np.any(base < 0):
        raise InvalidParameterError("base_rdp must return one non-negative value per order.")
    log_q = math.log(q)
    e2 = base[0]
    # log of min{4(e^{ε'(2)} - 1), 2 e^{ε'(2)}}
    if np.isfinite(e2):
        log_m2 = min(
            math.log(4.0) + (math.log(math.expm1(e2)) if e2 > 0 else -math.inf), math.log(2.0) + e2
        )
    else:
        log_m2 = math.inf
    out = np.empty(a.shape, dtype=float)
    jj = j[1:].astype(float)  # j = 3 ... a_max
    log_terms_j = math.log(2.0) + jj * log_q + (jj - 1.0) * base[1:]
    for idx, alpha in enumerate(a):
        af = float(alpha)
        t2 = 2.0 * log_q + float(_log_binom(np.array(af), np.array(2.0))) + log_m2
        if alpha >= 3:
            k = jj[: alpha - 2]
            tj = log_terms_j[: alpha - 2] + _log_binom(np.full_like(k, af), k)
            log_a = special.logsumexp(np.concatenate(([0.0, t2], tj)))
        else:
            log_a = np.logaddexp(0.0, t2)
        amplified = log_a / (af - 1.0)
        out[idx] = min(amplified, float(base[alpha - 2]))
    return out


def _check_barker(batch_size: object, n: object) -> tuple[int, int]:
    b = check_int(
        batch_size,
        "batch_size",
        minimum=16,
        hint=" DP Barker's RDP bound (thesis Thm 3.3) needs an integer order 2 < α < b/5, "
        "so the batch must hold at least 16 rows.",
    )
    n_rows = check_int(n, "n", minimum=1)
    if b > n_rows:
        raise InvalidParameterError(
            f"batch_size ({b}) cannot exceed the number of rows n ({n_rows})."
        )
    return b, n_rows


def barker_orders(batch_size: int, max_order: int = BARKER_MAX_ORDER) -> np.ndarray:
    """Integer orders at which the DP Barker bound holds: ``3 ≤ α < b/5`` (capped).

    Parameters
    ----------
    batch_size : int
        Batch size ``b ≥ 16``.
    max_order : int
        Cap on the largest order returned.
    """
    b = check_int(batch_size, "batch_size", minimum=16)
    top = min(math.ceil(b / 5) - 1, int(max_order))
    return np.arange(3, top + 1, dtype=np.int64)


def barker_base_rdp(alpha: float | np.ndarray, batch_size: int) -> float | np.ndarray:
    """Per-iteration RDP of DP Barker before subsampling (thesis Thm 3.3; theory §4.4).

    ``ε'(α) = 5/(2b) + ln(2b/(b - 5α))/(2(α - 1)) + 2α/(b - 5α)`` for ``1 < α < b/5``
    (proved for integers ``2 < α < b/5``; ``inf`` where ``5α ≥ b``).

    Parameters
    ----------
    alpha : float or array_like
        Orders.
    batch_size : int
        Batch size ``b``.
    """
    b = float(check_int(batch_size, "batch_size", minimum=1))
    a = np.asarray(alpha, dtype=float)
    if np.any(a <= 1):
        raise InvalidParameterError("alpha must be > 1.")
    gap = b - 5.0 * a
    with np.errstate(divide="ignore", invalid="ignore"):
        val = 5.0 / (2.0 * b) + np.log(2.0 * b / gap) / (2.0 * (a - 1.0)) + 2.0 * a / gap
    val = np.where(gap > 0, val, np.inf)
    return float(val) if val.ndim == 0 else val


@functools.lru_cache(maxsize=64)
def _barker_curve(
    batch_size: int, n: int, max_order: int, envelope: bool
) -> tuple[np.ndarray, np.ndarray]:
    orders = barker_orders(batch_size, max_order)
    if envelope:
        top = math.ceil(batch_size / 5) - 1  # all proven orders, even above max_order
        proven = np.arange(3, top + 1)
        base = barker_base_rdp(proven.astype(float), batch_size)
        # suffix minimum: envelope(α) = min_{α ≤ α' ≤ top} ε'(α'), for α ≥ 3
        suffix_min = np.minimum.accumulate(base[::-1])[::-1]

        def base_fn(j: np.ndarray) -> np.ndarray:
            return suffix_min[np.maximum(j, 3) - 3]

    else:

        def base_fn(j: np.ndarray) -> np.ndarray:
            return np.asarray(barker_base_rdp(j.astype(float), batch_size))

    rdp = wbk_subsampled_rdp(orders, base_fn, batch_size / n)
    rdp.setflags(write=False)
    orders.setflags(write=False)
    return orders, rdp


def barker_rdp(
    batch_size: int, n: int, *, max_order: int = BARKER_MAX_ORDER, envelope: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """RDP curve of one DP Barker iteration, subsampling included (thesis Thm 3.3; theory §4.4).

    Parameters
    ----------
    batch_size : int
        Batch size ``b`` (≥ 16).
    n : int
        Number of rows; sampling ratio ``q = b/n``.
    max_order : int
        Largest order considered.
    envelope : bool
        ``True`` (default): WBK Thm 9 applied to the monotone envelope of ``ε'`` (module
        docstring). ``False``: the thesis' Thm 3.3 literally, with ``ε'(2)`` from the base
        formula — only for reproducing the thesis' numbers.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        Integer orders ``3 ≤ α < b/5`` and the per-iteration RDP at those orders. ``k``
        iterations compose to ``k`` times this curve.
    """
    b, n_rows = _check_barker(batch_size, n)
    return _barker_curve(b, n_rows, int(max_order), bool(envelope))


def barker_epsilon(
    iterations: int, batch_size: int, n: int, delta: float, *, envelope: bool = True
) -> float:
    """ε at ``delta`` of ``iterations`` DP Barker iterations (theory §4.4; improved conversion).

    Parameters
    ----------
    iterations : int
        Number of iterations ``k ≥ 0`` (over all chains).
    batch_size, n : int
        Batch size and number of rows.
    delta : float
        Target δ.
    envelope : bool
        See :func:`barker_rdp`.

    Returns
    -------
    float
        ``min_α [k ε(α) + ln((α-1)/α) - (ln δ + ln α)/(α - 1)]`` over integer ``3 ≤ α < b/5``.
    """
    k = check_int(iterations, "iterations", minimum=0)
    if k == 0:
        return 0.0
    orders, rdp = barker_rdp(batch_size, n, envelope=envelope)
    return rdp_to_epsilon(orders, k * rdp, delta)[0]
