"""zCDP accounting: the looser comparator of theory §3 (thesis Thm 2.5, 3.1, 4.2).

A Gaussian mechanism with PLD parameter ``μ = Δ²/(2σ²)`` is ``μ``-zCDP (Bun & Steinke 2016;
thesis Thm 2.11 (2)), zCDP composes additively, and ``ρ``-zCDP implies
``(ρ + 2√(ρ ln(1/δ)), δ)``-DP (thesis Thm 2.5). Hence the zCDP capacity of an (ε, δ) budget is

.. math::

    ρ^* = \\left(\\sqrt{ε + \\ln(1/δ)} - \\sqrt{\\ln(1/δ)}\\right)^2,

and a sampler with per-iteration cost ``μ`` may run ``⌊ρ*/μ⌋`` iterations under this
accounting (thesis Thm 3.1 with ``μ = 1/(2τ²n^{2α})``; Thm 4.2 for DP HMC). These functions
exist for the comparison of thesis §6.1 (the tight bound of :mod:`.gaussian` always allows at
least as many iterations).
"""

from __future__ import annotations

import math

import numpy as np

from pymc_dp.accounting._checks import as_float_array, check_delta, check_epsilon, check_positive
from pymc_dp.accounting._search import MAX_ITERATIONS, largest_fitting
from pymc_dp.errors import InvalidParameterError

__all__ = ["zcdp_capacity", "zcdp_epsilon", "zcdp_iterations"]


def _delta_array(delta: object) -> np.ndarray:
    d = as_float_array(delta, "delta")
    if np.any(~((d > 0) & (d < 1))):
        raise InvalidParameterError(f"delta must lie strictly between 0 and 1; got {delta!r}.")
    return d


def zcdp_epsilon(rho: float | np.ndarray, delta: float | np.ndarray) -> float | np.ndarray:
    """ε of the (ε, δ)-DP guarantee implied by ``rho``-zCDP: ``ρ + 2√(ρ ln(1/δ))``.

    Parameters
    ----------
    rho : float or array_like
        zCDP parameter ``ρ ≥ 0`` (for Gaussian mechanisms, the total PLD parameter ``M``).
    delta : float or array_like
        δ in ``(0, 1)``.

    Returns
    -------
    float or numpy.ndarray
        ε (thesis Thm 2.5, second statement).
    """
    r = as_float_array(rho, "rho")
    if np.any(~np.isfinite(r)) or np.any(r < 0):
        raise InvalidParameterError(f"rho must be finite and >= 0; got {rho!r}.")
    d = _delta_array(delta)
    out = r + 2.0 * np.sqrt(r * -np.log(d))
    return float(out) if np.ndim(out) == 0 else out


def zcdp_capacity(epsilon: float | np.ndarray, delta: float | np.ndarray) -> float | np.ndarray:
    """zCDP capacity ``ρ* = (√(ε + ln 1/δ) - √(ln 1/δ))²`` of an (ε, δ) budget (theory §3).

    Evaluated as ``(ε / (√(ε + L) + √L))²`` with ``L = ln(1/δ)``, which avoids the cancellation
    of the textbook form for small ε.

    Parameters
    ----------
    epsilon : float or array_like
        ε > 0.
    delta : float or array_like
        δ in ``(0, 1)``.

    Returns
    -------
    float or numpy.ndarray
        ``ρ*``; ``zcdp_epsilon(ρ*, δ) = ε`` up to rounding.
    """
    e = as_float_array(epsilon, "epsilon")
    if np.any(~np.isfinite(e)) or np.any(e <= 0):
        raise InvalidParameterError(f"epsilon must be finite and > 0; got {epsilon!r}.")
    log_inv = -np.log(_delta_array(delta))
    out = (e / (np.sqrt(e + log_inv) + np.sqrt(log_inv))) ** 2
    return float(out) if np.ndim(out) == 0 else out


def zcdp_iterations(epsilon: float, delta: float, mu: float) -> int:
    """Iterations allowed by zCDP accounting: largest ``k`` with ``zcdp_epsilon(k μ, δ) ≤ ε``.

    This is ``⌊ρ*/μ⌋`` (thesis Thm 3.1: ``k = ⌊2τ²n^{2α}ρ⌋``; Thm 4.2 for DP HMC), checked so
    that rounding never lets it overshoot.

    Parameters
    ----------
    epsilon, delta : float
        The budget.
    mu : float
        zCDP cost (= PLD parameter) of one iteration.

    Returns
    -------
    int
        Iterations (``0`` if none fits).
    """
    eps = check_epsilon(epsilon)
    dlt = check_delta(delta)
    mu = check_positive(mu, "mu")
    log_inv = -math.log(dlt)

    def fits(k: int) -> bool:
        rho = k * mu
        return rho + 2.0 * math.sqrt(rho * log_inv) <= eps

    rho_star = (eps / (math.sqrt(eps + log_inv) + math.sqrt(log_inv))) ** 2
    return largest_fitting(fits, min(math.floor(rho_star / mu), MAX_ITERATIONS))
