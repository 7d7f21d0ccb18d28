"""Tight (ε, δ) accounting for adaptive compositions of Gaussian mechanisms (theory §3).

Any adaptive composition of Gaussian mechanisms with PLD parameters ``μ_j`` has privacy loss
distribution ``N(M, 2M)`` with ``M = Σ_j μ_j`` (Sommer, Meiser, Mohammadi 2019; thesis
``004`` Thm 2.11 (3), Thm 3.2, Thm 4.3; DP-HMC paper ``003`` Thm 2.4, Thm 3.5) and is
(ε, δ(ε))-DP with the *tight*

.. math::

    δ(ε; M) = Φ(-ε/s + s/2) - e^{ε} Φ(-ε/s - s/2),\\qquad s = \\sqrt{2M},

which equals ``½ [erfc((ε - M)/(2√M)) - e^ε erfc((ε + M)/(2√M))]`` (theory §3) and is the
(ε, δ) curve of ``s``-Gaussian differential privacy.

Numerics
--------
Writing ``x = -a/√2`` and ``y = -b/√2`` for ``a = -ε/s + s/2`` and ``b = a - s`` one has
``y² - x² = ε`` exactly, so with the scaled complementary error function
``erfcx(t) = exp(t²) erfc(t)``

.. math::

    δ = Φ(a) \\left(1 - \\frac{\\operatorname{erfcx}(y)}{\\operatorname{erfcx}(x)}\\right).

The factor ``e^ε`` cancels analytically, so nothing overflows for large ε, ``Φ(a)`` is
taken in log space (:func:`scipy.special.log_ndtr`), and the ratio is in ``(0, 1)`` so the
subtraction loses no more than the relative gap between the two terms. For very large
``a`` (``Φ(a) = 1`` in double precision) the direct form ``1 - e^{ε + log Φ(b)}`` is used.
All functions work on NumPy arrays (broadcasting) as well as on scalars.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import optimize, special

from pymc_dp.accounting._checks import (
    as_float_array,
    check_delta,
    check_epsilon,
    check_positive,
)
from pymc_dp.accounting._search import MAX_ITERATIONS, largest_fitting
from pymc_dp.errors import InvalidParameterError

__all__ = [
    "gaussian_capacity",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_epsilon_curve",
    "gaussian_iterations",
    "gaussian_log_delta",
]

_SQRT2 = math.sqrt(2.0)
# Above this value of ``a`` erfcx(-a/√2) would overflow; Φ(a) == 1 there anyway.
_A_SWITCH = 30.0


def _check_eps_mu(epsilon: object, mu: object) -> tuple[np.ndarray, np.ndarray]:
    eps = as_float_array(epsilon, "epsilon")
    m = as_float_array(mu, "mu")
    if np.any(~np.isfinite(eps)) or np.any(eps < 0):
        raise InvalidParameterError(
            f"epsilon must be finite and >= 0 for the Gaussian (ε, δ) curve; got {epsilon!r}."
        )
    if np.any(~np.isfinite(m)) or np.any(m < 0):
        raise InvalidParameterError(
            "mu (the total PLD parameter, a sum of per-release mu = 1/(2 z^2)) must be finite "
            f"and >= 0; got {mu!r}."
        )
    return eps, m


def _log_delta_array(eps: np.ndarray, m: np.ndarray) -> np.ndarray:
    """log δ(ε; M) for validated, broadcast-compatible arrays (no argument checks)."""
    eps, m = np.broadcast_arrays(eps, m)
    out = np.full(eps.shape, -np.inf)
    pos = m > 0
    if not np.any(pos):
        return out
    e = eps[pos]
    s = np.sqrt(2.0 * m[pos])
    a = -e / s + s / 2.0
    b = a - s
    res = np.empty_like(e)
    small = a <= _A_SWITCH
    if np.any(small):
        x = -a[small] / _SQRT2
        h = s[small] / _SQRT2  # y - x
        y = x + h
        ex = special.erfcx(x)
        one_minus_ratio = 1.0 - special.erfcx(y) / ex
        # When y - x is tiny the ratio is within a few ulps of 1: use the Taylor series
        # 1 - erfcx(x+h)/erfcx(x) = -h c1 - h² c2/2 - h³ c3/6 + O(h⁴), with
        # c_n = erfcx^(n)(x) / erfcx(x) from erfcx' = 2x erfcx - 2/√π.
        tiny = h * (1.0 + np.abs(x)) < 1e-4
        if np.any(tiny):
            xt, ht = x[tiny], h[tiny]
            inv = 2.0 / (math.sqrt(math.pi) * ex[tiny])
            c1 = 2.0 * xt - inv
            c2 = 2.0 + 4.0 * xt * xt - 2.0 * xt * inv
            c3 = 8.0 * xt + (2.0 + 4.0 * xt * xt) * c1 - 2.0 * inv
            one_minus_ratio[tiny] = -ht * (c1 + ht * (c2 / 2.0 + ht * c3 / 6.0))
        with np.errstate(divide="ignore"):
            res[small] = special.log_ndtr(a[small]) + np.log(np.clip(one_minus_ratio, 0.0, 1.0))
    big = ~small
    if np.any(big):
        log_second = np.minimum(e[big] + special.log_ndtr(b[big]), 0.0)
        with np.errstate(divide="ignore"):
            res[big] = special.log_ndtr(a[big]) + np.log1p(-np.exp(log_second))
    out[pos] = res
    return out


def gaussian_log_delta(epsilon: float | np.ndarray, mu: float | np.ndarray) -> float | np.ndarray:
    """Natural logarithm of the tight δ(ε) of a Gaussian PLD ``N(mu, 2 mu)`` (theory §3).

    Parameters
    ----------
    epsilon : float or array_like
        ε ≥ 0 (finite).
    mu : float or array_like
        Total PLD parameter ``M = Σ_j μ_j ≥ 0`` of the composition (``M = 0`` gives
        ``log δ = -inf``).

    Returns
    -------
    float or numpy.ndarray
        ``log δ(ε; M)``; a float when both inputs are scalars.

    Notes
    -----
    Stays accurate where δ itself underflows (e.g. ``log δ ≈ -800``); see the module notes for
    the cancellation-free form used.
    """
    eps, m = _check_eps_mu(epsilon, mu)
    out = _log_delta_array(eps, m)
    return float(out) if out.ndim == 0 else out


def gaussian_delta(epsilon: float | np.ndarray, mu: float | np.ndarray) -> float | np.ndarray:
    """Tight δ(ε) of an adaptive composition of Gaussian mechanisms (theory §3).

    Implements ``δ(ε) = Φ(-ε/s + s/2) - e^ε Φ(-ε/s - s/2)``, ``s = √(2 mu)`` (thesis Thm 2.11
    (3); paper Thm 2.4) without overflow for large ε and without catastrophic cancellation.

    Parameters
    ----------
    epsilon : float or array_like
        ε ≥ 0 (finite).
    mu : float or array_like
        Total PLD parameter ``M = Σ_j μ_j ≥ 0``; one Gaussian release with noise multiplier
        ``z = σ/Δ`` contributes ``μ = 1/(2 z²)``.

    Returns
    -------
    float or numpy.ndarray
        δ(ε; mu) in ``[0, 1)``; a float when both inputs are scalars.

    Examples
    --------
    >>> round(gaussian_delta(1.0, 0.5), 6)
    0.126937
    """
    out = np.exp(gaussian_log_delta(epsilon, mu))
    return float(out) if np.ndim(out) == 0 else out


# Relative safety margin on δ. In double precision the stable formula can underestimate δ by up to
# ~5e-11 relative (cancellation in 1 − erfcx(y)/erfcx(x) when √M·(1 + |x|) is near 1e-4; found by
# an independent 80-digit mpmath review), so "fits" demands δ ≤ target · (1 − 1e-9).
_DELTA_MARGIN = 1e-9


def _fits(eps: float, m: float, delta: float) -> bool:
    """``δ(eps; m) ≤ delta · (1 − 1e-9)``, so float error in δ can never overshoot the target."""
    log_d = float(_log_delta_array(np.asarray(eps), np.asarray(m)))
    target = delta * (1.0 - _DELTA_MARGIN)
    return log_d <= math.log(target) and math.exp(log_d) <= target


@functools.lru_cache(maxsize=4096)  # pure; a chain asks for the same M again and again
def _epsilon_scalar(delta: float, m: float) -> float:
    if m == 0.0:
        return 0.0
    log_target = math.log(delta * (1.0 - _DELTA_MARGIN))  # the target _fits checks

    def f(e: float) -> float:
        return float(_log_delta_array(np.asarray(e), np.asarray(m))) - log_target

    if f(0.0) <= 0.0:
        return 0.0
    # zCDP conversion (thesis Thm 2.5) is a valid, looser bound: δ(ε_hi) ≤ δ.
    hi = m + 2.0 * math.sqrt(m * -log_target)
    while f(hi) > 0.0:  # only if rounding bites; keep the bracket valid
        hi = 2.0 * hi + 1.0
    root = optimize.brentq(f, 0.0, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
    # Never report an ε whose δ exceeds the target: brentq may stop short of the root (by its
    # absolute xtol, 10⁷ ulps of a root near 5·10⁻⁸): gallop up to an ε that fits, then bisect
    # back to the first float that does (one float at a time took minutes there).
    if not _fits(root, m, delta):
        failing, step = root, math.ulp(root)
        while not _fits(root + step, m, delta):
            failing, step = root + step, 2.0 * step
        fitting = root + step
        while failing < (mid := 0.5 * (failing + fitting)) < fitting:
            if _fits(mid, m, delta):
                fitting = mid
            else:
                failing = mid
        root = fitting
    return root


def gaussian_epsilon(delta: float | np.ndarray, mu: float | np.ndarray) -> float | np.ndarray:
    """Smallest ε with ``δ(ε; mu) ≤ delta`` for a Gaussian PLD ``N(mu, 2 mu)`` (theory §3).

    Parameters
    ----------
    delta : float or array_like
        Target δ in ``(0, 1)``.
    mu : float or array_like
        Total PLD parameter ``M ≥ 0``.

    Returns
    -------
    float or numpy.ndarray
        ε ≥ 0 (``0`` when already ``δ(0; mu) ≤ delta``); the returned ε satisfies
        ``gaussian_delta(ε, mu) <= delta`` in floating point.

    Notes
    -----
    One bracketed root-find (Brent) on ``log δ(ε)``, which decreases in ε; the zCDP bound
    ``mu + 2√(mu ln(1/δ))`` (thesis Thm 2.5) brackets the root from above.
    """
    d = as_float_array(delta, "delta")
    if np.any(~((d > 0) & (d < 1))):
        raise InvalidParameterError(f"delta must lie strictly between 0 and 1; got {delta!r}.")
    m = as_float_array(mu, "mu")
    if np.any(~np.isfinite(m)) or np.any(m < 0):
        raise InvalidParameterError(f"mu must be finite and >= 0; got {mu!r}.")
    d_b, m_b = np.broadcast_arrays(d, m)
    out = np.array(
        [
            _epsilon_scalar(float(dd), float(mm))
            for dd, mm in zip(d_b.ravel(), m_b.ravel(), strict=True)
        ]
    )
    out = out.reshape(d_b.shape)
    return float(out) if out.ndim == 0 else out


def gaussian_epsilon_curve(delta: float, mus: np.ndarray) -> np.ndarray:
    """:func:`gaussian_epsilon` at many ``M`` at once (a chain's spend, iteration by iteration).

    The same smallest ε with ``δ(ε; M) ≤ delta`` as :func:`gaussian_epsilon` (within about
    10⁻¹⁰ relative: where M is tiny the computed δ is noisy and the check flips back and forth
    over a few hundred ulps, so the crossing found depends on the bracket; each returned ε
    passes the check), found for all values together instead of one Brent root-find per value:
    from the
    same zCDP bracket, safeguarded Newton steps on ``log δ`` (:func:`_newton_bracket`) and then
    a bisection that ends at adjacent floats. A block of 512 iterations costs about 1.4 ms
    (2.9 ms with the bisection alone), the per-iteration ``epsilon_spent`` stat of every chain.
    Each returned ε passes the same ``δ ≤ delta · (1 − 1e-9)`` check.

    Parameters
    ----------
    delta : float
        Target δ in ``(0, 1)``.
    mus : array_like
        Total PLD parameters ``M ≥ 0`` (finite).

    Returns
    -------
    numpy.ndarray
        ε ≥ 0 per ``M``, of the shape of ``mus``.
    """
    check_delta(delta)
    m = np.atleast_1d(as_float_array(mus, "mus")).astype(float)
    if np.any(~np.isfinite(m)) or np.any(m < 0):
        raise InvalidParameterError(f"mus must be finite and >= 0; got {mus!r}.")
    log_target = math.log(delta * (1.0 - _DELTA_MARGIN))
    target = delta * (1.0 - _DELTA_MARGIN)

    def excess(eps: np.ndarray, mm: np.ndarray) -> np.ndarray:
        return _log_delta_array(eps, mm) - log_target

    out = np.zeros_like(m)
    todo = (m > 0) & (excess(np.zeros_like(m), m) > 0.0)
    mm = m[todo]
    lo = np.zeros_like(mm)
    hi = mm + 2.0 * np.sqrt(mm * -log_target)
    high = excess(hi, mm) > 0.0
    while np.any(high):  # only if rounding bites; keep the bracket valid
        hi = np.where(high, 2.0 * hi + 1.0, hi)
        high = excess(hi, mm) > 0.0
    # invariant: excess(lo) > 0 ≥ excess(hi). First a safeguarded Newton iteration on log δ
    # (its slope is −e^ε Φ(b)/δ: ∂δ/∂ε = −e^ε Φ(b), as φ(a) = e^ε φ(b)), a bisection step
    # wherever Newton's point leaves the bracket; then the bracket is closed around its root
    # to a relative 10⁻¹³ and the bisection below ends it at adjacent floats, as before: the
    # same ε in about a third of the evaluations (the per-iteration stat of every chain).
    lo, hi = _newton_bracket(lo, hi, mm, log_target)
    # stop when no float lies strictly between lo and hi
    for _ in range(1100):
        mid = 0.5 * (lo + hi)
        open_ = (mid > lo) & (mid < hi)
        if not np.any(open_):
            break
        above = excess(mid, mm) > 0.0
        lo = np.where(open_ & above, mid, lo)
        hi = np.where(open_ & ~above, mid, hi)
    # the δ check of _fits on each value, stepping up where the exp form disagrees
    while True:
        log_d = _log_delta_array(hi, mm)
        bad = ~((log_d <= log_target) & (np.exp(log_d) <= target))
        if not np.any(bad):
            break
        hi = np.where(bad, np.nextafter(hi, np.inf), hi)
    out[todo] = hi
    return out.reshape(np.shape(mus)) if np.ndim(mus) else out


#: Safeguarded Newton steps before the bisection of :func:`gaussian_epsilon_curve` (from the
#: zCDP bracket's top it is within 10⁻¹⁴ after five on the chains measured).
_NEWTON_STEPS = 7


def _newton_bracket(
    lo: np.ndarray, hi: np.ndarray, m: np.ndarray, log_target: float
) -> tuple[np.ndarray, np.ndarray]:
    """A tighter bracket ``lo < ε* ≤ hi`` of ``log δ(ε; m) = log_target`` (same invariant).

    Safeguarded Newton (a bisection step where Newton's point is not in ``(lo, hi]``), then
    points ``x (1 ± 10⁻¹³)`` around the last iterate: each evaluation only
    moves an end of the bracket to a point whose side it checked, so the bracket stays valid
    whatever the iteration does.
    """
    x = hi.copy()
    s = np.sqrt(2.0 * m)
    for _ in range(_NEWTON_STEPS):
        log_d = _log_delta_array(x, m)
        above = log_d > log_target
        lo = np.where(above, np.maximum(lo, x), lo)
        hi = np.where(above, hi, np.minimum(hi, x))
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            slope = -np.exp(x + special.log_ndtr(-x / s - s / 2.0) - log_d)  # d log δ / dε
            newton = x - (log_d - log_target) / slope
        inside = np.isfinite(newton) & (newton > lo) & (newton <= hi)
        x = np.where(inside, newton, 0.5 * (lo + hi))
    for side in (1.0 - 1e-13, 1.0 + 1e-13):
        probe = x * side
        valid = (probe > lo) & (probe < hi)
        above = _log_delta_array(probe, m) > log_target
        lo = np.where(valid & above, probe, lo)
        hi = np.where(valid & ~above, probe, hi)
    return lo, hi


def _capacity_scalar(epsilon: float, delta: float) -> float:
    log_target = math.log(delta * (1.0 - _DELTA_MARGIN))  # the target _fits checks

    def g(u: float) -> float:  # increasing in u = log M
        return float(_log_delta_array(np.asarray(epsilon), np.asarray(math.exp(u)))) - log_target

    # The zCDP capacity is a valid lower bound on the tight capacity (thesis Thm 2.5).
    log_inv = -math.log(delta)  # log of _zcdp_rho, without underflow for a tiny epsilon
    lo = 2.0 * (math.log(epsilon) - math.log(math.sqrt(epsilon + log_inv) + math.sqrt(log_inv)))
    while g(lo) > 0.0:
        lo -= 1.0
    hi = lo + 1.0
    while g(hi) <= 0.0:
        lo, hi = hi, hi + 1.0
    u = optimize.brentq(g, lo, hi, xtol=1e-16, rtol=4 * np.finfo(float).eps, maxiter=500)
    m = math.exp(u)
    # Step down (a few ulps at most) until the capacity really satisfies the budget, then up
    # while the next float still does, so that the result is the largest such double.
    while not _fits(epsilon, m, delta):
        m = math.nextafter(m, 0.0)
    for _ in range(64):
        up = math.nextafter(m, math.inf)
        if not _fits(epsilon, up, delta):
            break
        m = up
    return m


def gaussian_capacity(epsilon: float | np.ndarray, delta: float | np.ndarray) -> float | np.ndarray:
    """Largest total PLD parameter ``M*`` with ``δ(epsilon; M*) ≤ delta`` (theory §3).

    A sampler whose iterations each cost ``μ`` may run ``⌊M*/μ⌋`` iterations in total over all
    chains (thesis Algorithm 2 gives the same count by bisection).

    Parameters
    ----------
    epsilon : float or array_like
        ε > 0 (finite).
    delta : float or array_like
        δ in ``(0, 1)``.

    Returns
    -------
    float or numpy.ndarray
        ``M*``; ``gaussian_delta(epsilon, M*) <= delta`` holds in floating point.

    Notes
    -----
    Root-find on ``log δ`` in ``log M``, bracketed below by the zCDP capacity
    ``ρ* = (√(ε + ln 1/δ) - √(ln 1/δ))²`` (thesis Thm 3.1), which is always feasible.
    """
    e = as_float_array(epsilon, "epsilon")
    d = as_float_array(delta, "delta")
    if np.any(~np.isfinite(e)) or np.any(e <= 0):
        raise InvalidParameterError(f"epsilon must be finite and > 0; got {epsilon!r}.")
    if np.any(~((d > 0) & (d < 1))):
        raise InvalidParameterError(f"delta must lie strictly between 0 and 1; got {delta!r}.")
    e_b, d_b = np.broadcast_arrays(e, d)
    out = np.array(
        [
            _capacity_scalar(float(ee), float(dd))
            for ee, dd in zip(e_b.ravel(), d_b.ravel(), strict=True)
        ]
    ).reshape(e_b.shape)
    return float(out) if out.ndim == 0 else out


def gaussian_iterations(epsilon: float, delta: float, mu: float, *, spent_mu: float = 0.0) -> int:
    """Number of iterations of per-iteration cost ``mu`` that fit in an (ε, δ) budget.

    Returns the largest integer ``k ≥ 0`` with ``δ(ε; spent_mu + k·mu) ≤ δ`` (theory §3,
    ``k = ⌊(M* - spent)/μ⌋``), checked against the δ formula so that float rounding in
    ``M*/μ`` can never make the count overshoot.

    Parameters
    ----------
    epsilon, delta : float
        The budget.
    mu : float
        PLD parameter of one iteration (> 0).
    spent_mu : float, optional
        Total PLD parameter already spent on the same data.

    Returns
    -------
    int
        Iterations that still fit (``0`` if none).
    """
    eps = check_epsilon(epsilon)
    dlt = check_delta(delta)
    mu = check_positive(mu, "mu")
    if not (math.isfinite(spent_mu) and spent_mu >= 0):
        raise InvalidParameterError(f"spent_mu must be finite and >= 0; got {spent_mu!r}.")

    def fits(k: int) -> bool:
        return _fits(eps, spent_mu + k * mu, dlt)

    cap = _capacity_scalar(eps, dlt)
    guess = 0 if cap <= spent_mu else min(math.floor((cap - spent_mu) / mu), MAX_ITERATIONS)
    return largest_fitting(fits, guess)
