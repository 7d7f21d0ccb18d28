"""Independent high-precision reference formulas for the accounting tests (mpmath).

Nothing here imports pymc_dp: these are the plain textbook formulas of theory §3 / §4.4
evaluated with 60 significant digits, so that tests compare the package against an
independent implementation.
"""

from __future__ import annotations

import math

import mpmath as mp

mp.mp.dps = 60


def delta(eps: float, M: float) -> mp.mpf:
    """δ(ε) = ½[erfc((ε - M)/(2√M)) - e^ε erfc((ε + M)/(2√M))] (theory §3, erfc form)."""
    eps, M = mp.mpf(eps), mp.mpf(M)
    r = mp.sqrt(M)
    return (mp.erfc((eps - M) / (2 * r)) - mp.e**eps * mp.erfc((eps + M) / (2 * r))) / 2


def capacity(eps: float, dlt: float) -> mp.mpf:
    """Largest M with δ(ε; M) ≤ δ, by bisection in log M (monotone increasing)."""
    target = mp.log(mp.mpf(dlt))
    lo, hi = mp.mpf(-60), mp.mpf(10)
    while mp.log(delta(eps, mp.e**hi)) < target:
        hi += 5
    for _ in range(250):
        mid = (lo + hi) / 2
        if mp.log(delta(eps, mp.e**mid)) <= target:
            lo = mid
        else:
            hi = mid
    return mp.e**lo


def epsilon(dlt: float, M: float) -> mp.mpf:
    """Smallest ε ≥ 0 with δ(ε; M) ≤ δ, by bisection (δ decreases in ε)."""
    target = mp.mpf(dlt)
    if delta(0, M) <= target:
        return mp.mpf(0)
    lo, hi = mp.mpf(0), mp.mpf(1)
    while delta(hi, M) > target:
        hi *= 2
    for _ in range(250):
        mid = (lo + hi) / 2
        if delta(mid, M) > target:
            lo = mid
        else:
            hi = mid
    return hi


def zcdp_rho(eps: float, dlt: float) -> mp.mpf:
    """ρ* = (√(ε + ln 1/δ) - √(ln 1/δ))² (thesis Thm 3.1)."""
    L = -mp.log(mp.mpf(dlt))
    return (mp.sqrt(mp.mpf(eps) + L) - mp.sqrt(L)) ** 2


def tight_iterations(eps: float, dlt: float, mu: mp.mpf) -> int:
    """max k with δ(ε; k μ) ≤ δ, from the high-precision capacity (with neighbour check)."""
    k = int(mp.floor(capacity(eps, dlt) / mu))
    while delta(eps, (k + 1) * mu) <= dlt:
        k += 1
    while k > 0 and delta(eps, k * mu) > dlt:
        k -= 1
    return k


def zcdp_iterations(eps: float, dlt: float, mu: mp.mpf) -> int:
    """⌊ρ*/μ⌋ (thesis Thm 3.1 / 4.2)."""
    return int(mp.floor(zcdp_rho(eps, dlt) / mu))


def barker_base(alpha: int, b: int) -> mp.mpf:
    """Thesis Thm 3.3: ε'(α) = 5/(2b) + ln(2b/(b - 5α))/(2(α-1)) + 2α/(b - 5α)."""
    a, b = mp.mpf(alpha), mp.mpf(b)
    return 5 / (2 * b) + mp.log(2 * b / (b - 5 * a)) / (2 * (a - 1)) + 2 * a / (b - 5 * a)


def wbk_thm9(alpha: int, q: float, base) -> mp.mpf:
    """Thesis Thm 3.3 / WBK19 Thm 9 written out term by term in high precision."""
    q = mp.mpf(q)
    e2 = base(2)
    total = 1 + q**2 * mp.binomial(alpha, 2) * min(4 * (mp.e**e2 - 1), 2 * mp.e**e2)
    for j in range(3, alpha + 1):
        total += 2 * q**j * mp.binomial(alpha, j) * mp.e ** ((j - 1) * base(j))
    return mp.log(total) / (alpha - 1)


def improved_conversion(rdp: float, alpha: float, dlt: float) -> float:
    """Canonne–Kamath–Steinke 2020 Prop. 12 conversion at one order (0 under the KL bound)."""
    if dlt**2 > -math.expm1(-rdp):  # TV ≤ √(1 − e^{−KL}) ≤ δ: (0, δ)-DP
        return 0.0
    return rdp + math.log1p(-1 / alpha) - (math.log(dlt) + math.log(alpha)) / (alpha - 1)


def classic_conversion(rdp: float, alpha: float, dlt: float) -> float:
    """Mironov 2017 / thesis Thm 2.5 conversion at one order."""
    return rdp + math.log(1 / dlt) / (alpha - 1)
