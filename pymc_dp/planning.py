"""The one planner: how many tuning and kept iterations per chain a step's budget buys.

Every chain reads the same data, so chains compose; tuning iterations count like any other
(theory §3). :func:`plan_iterations` is used by :func:`pymc_dp.sample` and by
``DPStep.sampling_kwargs`` alike. It reads only the step's budget and per-iteration cost, so it
works for any step (duck-typed: ``step.budget``, ``step.cost``).
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

from pymc_dp.errors import BudgetExceededError, InvalidParameterError

__all__ = ["plan_iterations"]


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
            if budget.fits(step.cost, int(chains) * (n_tune + int(draws))):
                return n_tune, int(draws)
        per_chain = budget.iterations_per_chain(step.cost, int(chains))
    elif 0 <= tune < 1:
        per_chain = budget.iterations_per_chain(step.cost, int(chains))
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
