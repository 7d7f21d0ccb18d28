"""The one planner: how many tuning and kept iterations per chain a step's budget buys.

Every chain reads the same data, so chains compose; tuning iterations count like any other
(theory §3). :func:`plan_iterations` is used by :func:`pymc_dp.sample` and by
``DPStep.sampling_kwargs`` alike. It reads only the step's budget and per-iteration cost, so it
works for any step (duck-typed: ``step.budget``, ``step.cost``; a step whose iterations do not
all cost the same, e.g. under a decreasing step-size schedule, also has ``uniform_cost = False``
and ``chain_spending(first, last)``).
"""

from __future__ import annotations

import math
import warnings
from numbers import Integral, Real
from typing import Any

from pymc_dp.accounting._search import largest_fitting
from pymc_dp.errors import BudgetExceededError, InvalidParameterError

__all__ = ["MAX_SCHEDULED_CHAIN_LENGTH", "plan_iterations"]

#: Longest chain the default plan gives a step under a decreasing step-size schedule.
MAX_SCHEDULED_CHAIN_LENGTH = 100_000


def plan_iterations(
    step: Any, *, chains: int = 4, tune: float | int = 0.5, draws: int | None = None
) -> tuple[int, int]:
    """``(tune, draws)`` per chain that fit the step's budget for ``chains`` chains.

    ``tune`` is a count (int) or a fraction in ``[0, 1)`` of each chain's share of the budget;
    ``draws=None`` takes the rest of the share. Raises :class:`BudgetExceededError` (before any
    data is read) when the request does not fit, saying what does.
    """
    if isinstance(chains, bool) or not isinstance(chains, Integral) or chains < 1:
        raise InvalidParameterError(f"chains must be a positive integer, got {chains!r}.")
    budget = step.budget
    if isinstance(tune, bool) or not isinstance(tune, Real):
        raise InvalidParameterError(f"tune must be an int or a fraction in [0, 1), got {tune!r}.")
    if isinstance(tune, Integral):
        if tune < 0:
            raise InvalidParameterError(f"tune must not be negative, got {tune}.")
        n_tune = int(tune)
        if isinstance(draws, Integral) and not isinstance(draws, bool) and draws >= 1:
            # both counts given: one composition check, no search for the largest count
            if _chains_fit(step, int(chains), n_tune + int(draws)):
                return n_tune, int(draws)
        per_chain = _iterations_per_chain(step, int(chains))
    elif 0 <= tune < 1:
        per_chain = _iterations_per_chain(step, int(chains))
        n_tune = math.floor(float(tune) * per_chain)
    else:
        raise InvalidParameterError(
            f"tune={tune!r}: give a fraction in [0, 1) of each chain's iterations, or an int count."
        )
    if draws is None:
        n_draws = per_chain - n_tune
    elif isinstance(draws, bool) or not isinstance(draws, Integral) or draws < 1:
        raise InvalidParameterError(f"draws must be a positive integer, got {draws!r}.")
    else:
        n_draws = int(draws)
    if n_draws < 1 or n_tune + n_draws > per_chain:
        state = budget.spent_summary()
        if per_chain == 0:
            raise BudgetExceededError(
                f"{state}; nothing more fits: not one more iteration of {type(step).__name__} in "
                f"each of {chains} chains. Use fewer chains, larger noise multipliers, or a new "
                "budget for new data. No data was read."
            )
        asked = f"{n_tune} tune + {n_draws} draws" if n_draws >= 1 else f"{n_tune} tune"
        hint = "use fewer iterations or chains, larger noise multipliers, or a larger budget"
        if per_chain >= 2:
            hint = f"e.g. tune={per_chain // 2}, draws={per_chain - per_chain // 2}; or {hint}"
        raise BudgetExceededError(
            f"{chains} chains of {asked} do not fit. {state}, and what is left allows "
            f"{per_chain} iterations per chain for {chains} chains, tuning included: {hint}. "
            "No data was read."
        )
    return n_tune, n_draws


def _chains_fit(step: Any, chains: int, iterations: int) -> bool:
    """Whether ``chains`` chains of ``iterations`` iterations each fit the step's budget."""
    if getattr(step, "uniform_cost", True):
        return step.budget.fits(step.cost, chains * iterations)
    spending = step.chain_spending(0, iterations)
    return step.budget.fits_spending([(cost, chains * k) for cost, k in spending])


def _iterations_per_chain(step: Any, chains: int) -> int:
    """Longest chain length such that ``chains`` chains fit (every chain starts at stage 0).

    Under a step-size schedule later iterations cost less than the first, and the count can
    grow without practical bound (with ``γ = 1`` a budget that buys 10⁴ constant-step
    iterations buys 10⁸): the search stops at :data:`MAX_SCHEDULED_CHAIN_LENGTH`, with a
    warning, leaving the rest of the budget unspent.
    """
    budget = step.budget
    at_first_cost = budget.iterations_per_chain(step.cost, chains)  # refuses a tiny budget
    if getattr(step, "uniform_cost", True) or at_first_cost == 0:
        return at_first_cost
    cap = max(MAX_SCHEDULED_CHAIN_LENGTH, at_first_cost)

    def fits(k: int) -> bool:
        return k <= cap and _chains_fit(step, chains, k)

    guess = min(_central_limit_guess(step, chains, at_first_cost), cap)
    # searched in units of about 1/1000 of the guess: each check composes every stage's PLD,
    # and a plan at most 0.1 % short of the longest is as good
    unit = max(1, guess // 1000)
    length = unit * largest_fitting(lambda m: fits(m * unit), guess // unit, step=16)
    length = max(length, at_first_cost)
    if length == cap and _chains_fit(step, chains, cap + 1):
        warnings.warn(
            f"Under its step-size schedule this budget allows more than {cap} iterations per "
            f"chain for {chains} chains; the plan stops at {cap} and leaves the rest of the "
            "budget unspent. Give draws= (and tune=) to choose the length.",
            UserWarning,
            stacklevel=3,
        )
    return length


def _central_limit_guess(step: Any, chains: int, at_first_cost: int) -> int:
    """A start for the search: the length whose privacy loss has the mean of ``at_first_cost``
    first-stage iterations (each cost's mean loss is ``∝ 1 / cost.iterations_guess``)."""
    eps, delta = step.budget.epsilon, step.budget.delta

    guesses: dict = {}  # one per stage's cost (each may build a PLD)

    def load(length: int) -> float:
        total = 0.0
        for cost, k in step.chain_spending(0, length):
            if cost not in guesses:
                guesses[cost] = cost.iterations_guess(eps, delta)
            total += chains * k / guesses[cost]
        return total

    target = chains * at_first_cost / step.cost.iterations_guess(eps, delta)
    return largest_fitting(lambda k: load(k) <= target, at_first_cost, step=at_first_cost)
