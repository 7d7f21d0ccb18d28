"""Budget-first calibration: the noise that makes a planned run spend the budget exactly.

The budget usually answers "how many iterations does this noise buy?"
(:meth:`PrivacyBudget.iterations`). :func:`calibrate_noise` answers the other question: given
``(ε, δ)``, what is already spent, and a planned number of iterations, what is the smallest noise
scale ``s`` such that the plan is still ``(ε, δ)``-DP (theory §3)?

A step describes its per-iteration cost as a function ``s ↦ cost_of(s)`` of one noise scale
(e.g. DPHMC scales both noise multipliers together, ``z_l = s``, ``z_g = r·s``), with the cost
non-increasing in ``s``. The answer never overshoots: the returned scale always passes the same
:func:`~pymc_dp.accounting.composition_fits` check that :meth:`PrivacyBudget.reserve` enforces.

* **Gaussian costs** (``μ(s) = μ(1)/s²``, every part a Gaussian mechanism): closed form. The
  Gaussian capacity ``M*(ε, δ)`` is what the whole run may spend; with ``M_spent`` already
  reserved, ``s = √(k·μ(1) / (M* − M_spent))`` spends it exactly.
* **Other costs** (subsampled Gaussian, ...): bisection on ``log s`` between a scale that does
  not fit and one that does, to relative width ``rtol``; the fitting end is returned.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from pymc_dp.accounting import gaussian as _g
from pymc_dp.accounting._checks import check_delta, check_epsilon, check_int, check_positive
from pymc_dp.accounting.costs import (
    PrivacyCost,
    _flatten,
    _normalise,
    _total_mu,
    as_cost,
    composition_fits,
)
from pymc_dp.errors import BudgetExceededError, InvalidParameterError

__all__ = ["calibrate_noise"]

_MAX_DOUBLINGS = 200


def _cost(cost_of: Callable[[float], PrivacyCost | float], scale: float) -> PrivacyCost:
    try:
        return as_cost(cost_of(scale))
    except InvalidParameterError as exc:
        raise InvalidParameterError(
            f"cost_of({scale:g}) did not give a privacy cost: {exc}"
        ) from exc


def _gaussian_mu_at_one(cost_of: Callable[[float], PrivacyCost | float]) -> float | None:
    """``μ(1)`` when ``cost_of`` is Gaussian with ``μ(s) = μ(1)/s²``, else ``None``."""
    one, two = _cost(cost_of, 1.0), _cost(cost_of, 2.0)
    mu1, mu2 = one.gaussian_mu(), two.gaussian_mu()
    if mu1 is None or mu2 is None or not one.is_gaussian():
        return None
    return mu1 if math.isclose(4.0 * mu2, mu1, rel_tol=1e-9) else None


def calibrate_noise(
    cost_of: Callable[[float], PrivacyCost | float],
    epsilon: float,
    delta: float,
    iterations: int,
    *,
    spent: Iterable[tuple[PrivacyCost | float, int]] = (),
    rtol: float = 1e-4,
) -> float:
    """Smallest noise scale ``s`` such that ``spent + [(cost_of(s), iterations)]`` fits.

    Parameters
    ----------
    cost_of : callable
        ``s ↦`` per-iteration cost (a :class:`PrivacyCost` or a float ``μ``), non-increasing
        in ``s``: more noise never costs more.
    epsilon, delta : float
        The budget.
    iterations : int
        Planned iterations of the new cost, all chains and tuning included (≥ 1).
    spent : iterable of (cost, int)
        What is already reserved on the same data.
    rtol : float
        Relative precision of ``s`` for non-Gaussian costs (bisection on ``log s``).

    Returns
    -------
    float
        ``s`` with ``composition_fits(spent + [(cost_of(s), iterations)], ε, δ)`` true. For
        Gaussian costs the plan then spends ``(ε, δ)`` exactly (up to rounding); otherwise
        ``s / (1 + rtol)`` does not fit.

    Raises
    ------
    BudgetExceededError
        When ``spent`` alone already uses the whole budget, so no noise makes the plan fit.
    """
    eps = check_epsilon(epsilon)
    d = check_delta(delta)
    k = check_int(iterations, "iterations", minimum=1, hint=" Plan at least one iteration.")
    tol = check_positive(rtol, "rtol")
    before = _normalise(spent)
    if not composition_fits(before, eps, d):
        raise BudgetExceededError(
            f"what is already reserved exceeds the budget (epsilon={eps:g}, delta={d:g}); no "
            "noise makes a further run fit. Start from a new budget for new data."
        )

    def fits(scale: float) -> bool:
        return composition_fits([*before, (_cost(cost_of, scale), k)], eps, d)

    mu1 = _gaussian_mu_at_one(cost_of)
    if mu1 is not None and all(c.is_gaussian() for c, _ in before):
        capacity = float(_g.gaussian_capacity(eps, d))
        remaining = capacity - _total_mu(_flatten(before))
        if remaining <= 1e-9 * capacity:  # what is left would buy only noise-drowned releases
            raise BudgetExceededError(
                f"what is already reserved uses the whole budget (epsilon={eps:g}, "
                f"delta={d:g}); no noise makes a further run fit."
            )
        scale = math.sqrt(k * mu1 / remaining)
        for _ in range(64):  # the closed form sits on the boundary: step over rounding
            if fits(scale):
                return scale
            scale *= 1.0 + 1e-12
        raise RuntimeError(  # pragma: no cover - would mean capacity and fits disagree
            f"calibrate_noise: the Gaussian closed form s = {scale} does not fit."
        )

    lo = hi = 1.0
    if fits(hi):
        for _ in range(_MAX_DOUBLINGS):
            lo /= 2.0
            if not fits(lo):
                break
            hi = lo
        else:  # pragma: no cover - a cost that does not shrink with noise would end here
            return hi
    else:
        for _ in range(_MAX_DOUBLINGS):
            lo, hi = hi, hi * 2.0
            if fits(hi):
                break
        else:
            raise BudgetExceededError(
                f"no noise scale up to {hi:g} makes {k} iterations fit the budget "
                f"(epsilon={eps:g}, delta={d:g}): is cost_of decreasing in the noise scale?"
            )
    while hi / lo > 1.0 + tol:
        mid = math.sqrt(lo * hi)
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi
