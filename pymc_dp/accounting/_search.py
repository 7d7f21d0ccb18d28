"""Integer search for the largest iteration count that fits a budget (thesis Algorithm 2)."""

from __future__ import annotations

from collections.abc import Callable

__all__: list[str] = []

#: No budget allows more iterations than this; the search stops here.
MAX_ITERATIONS = 2**62


def largest_fitting(fits: Callable[[int], bool], guess: int = 1, step: int = 1) -> int:
    """Largest ``k >= 0`` with ``fits(k)``, for a predicate that is true then false in ``k``.

    Galloping search from ``guess`` (doubling the step until the predicate changes) followed by
    bisection, as in the thesis' Algorithm 2 but on integers only. Returns ``0`` when
    ``fits(0)`` is false as well (nothing fits) and :data:`MAX_ITERATIONS` if everything fits.

    Parameters
    ----------
    fits : callable
        Monotone predicate: ``fits(k)`` implies ``fits(j)`` for every ``j < k``.
    guess : int
        A starting point close to the answer (e.g. from a closed form or a looser bound).
    step : int
        First galloping step (doubled until the predicate changes).
    """
    guess = min(max(int(guess), 0), MAX_ITERATIONS)
    first_step = max(int(step), 1)
    if fits(guess):
        lo, step = guess, first_step
        while True:
            hi = min(lo + step, MAX_ITERATIONS)
            if hi == lo:
                return lo
            if not fits(hi):
                break
            lo, step = hi, 2 * step
    else:
        hi, step = guess, first_step
        while True:
            lo = max(hi - step, 0)
            if fits(lo):
                break
            if lo == 0:
                return 0
            hi, step = lo, 2 * step
    # Invariant: fits(lo) and not fits(hi).
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo
