"""Honest warnings for free: is the released posterior usable? (issue 17)

R̂, the bulk effective sample size, the acceptance rate and the share of diverging iterations
computed from the *released* draws and their private statistics are post-processing of a
differentially private release, so checking them costs no privacy. :func:`check_convergence`
computes them; :func:`pymc_dp.sample` warns (:class:`~pymc_dp.errors.ConvergenceWarning`) and
:func:`pymc_dp.privacy_report` prints the verdict, so that a run whose chains never mixed, or
whose draws all diverged, never comes back looking clean.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from pymc_dp._compat import group_dataset

__all__ = ["ConvergenceCheck", "check_convergence"]

#: thresholds: R̂ above, bulk ESS below, acceptance below, divergences above → not converged
RHAT_MAX = 1.05
ESS_MIN = 100.0
ACCEPTANCE_MIN = 0.02
DIVERGING_MAX = 0.5

_ADVICE = (
    "The draws are not a usable posterior. What helps: a larger epsilon, more rows, or fewer "
    "parameters. At a fixed budget, sampling longer does not help: every iteration then gets "
    "more noise."
)
# the stochastic-gradient samplers: the step size, not the plan, sets each release's noise
_ADVICE_NO_ACCEPT_REJECT = (
    "The draws are not a usable posterior. What helps: a larger epsilon, more rows, or fewer "
    "parameters. This sampler has no accept/reject step and its step_size sets the noise of "
    "every gradient release: at a fixed budget a smaller step_size buys about proportionally "
    "more iterations (the same simulated time, less discretisation bias, more computation); "
    "a longer run at the same step_size costs proportionally more epsilon."
)


@dataclasses.dataclass(frozen=True)
class ConvergenceCheck:
    """Convergence diagnostics of a release (all computed from released values)."""

    chains: int
    draws: int
    rhat_max: float  # NaN for one chain, or without draws
    ess_bulk_min: float
    acceptance: float  # NaN when the step records no acceptance
    diverging: float  # share of diverging iterations (0 when the step has none)
    problems: tuple[str, ...]
    accept_reject: bool = True  # False: a stochastic-gradient sampler (no ``accepted`` stat)

    @property
    def converged(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """One line for reports."""
        acceptance = (
            f"acceptance {self.acceptance:.2f}" if self.accept_reject else "no accept/reject"
        )
        numbers = (
            f"R̂ max {self.rhat_max:.3g}, bulk ESS min {self.ess_bulk_min:.3g}, "
            f"{acceptance}, diverging {self.diverging:.0%}"
        )
        if self.converged:
            return f"convergence: no problem found ({numbers})"
        advice = _ADVICE if self.accept_reject else _ADVICE_NO_ACCEPT_REJECT
        return f"NOT CONVERGED: {'; '.join(self.problems)} ({numbers}). {advice}"


def _components(dataset: Any) -> list[tuple[str, np.ndarray]]:
    """Every variable's scalar components as ``(name, (chains, draws, k))``."""
    parts = []
    for name in dataset.data_vars:
        values = np.asarray(dataset[name].values, dtype=float)
        parts.append((str(name), values.reshape(values.shape[0], values.shape[1], -1)))
    return parts


def _diagnostics(variables: list[tuple[str, np.ndarray]]) -> tuple[float, float]:
    """Largest R̂ and smallest bulk ESS over the components of ``(chains, draws, k)`` arrays.

    A component that is the same in every draw of every chain is a constant of the model (the
    unit diagonal of a correlation matrix, a fixed entry of a deterministic or of an
    ``LKJCorr`` value), not a stuck chain, when other chains started elsewhere could not
    have agreed on it by chance: with several chains and some other component that moved, or
    with another component of its own variable that moved. It is left out. Any other component
    that never moved counts as R̂ = ∞ (several chains) and one effective draw. ``(nan, nan)``
    when there is no component at all.
    """
    import arviz as az

    still = {}
    for name, draws in variables:
        if not np.all(np.isfinite(draws)):
            return math.inf, 0.0
        flat = draws.reshape(-1, draws.shape[2])
        still[name] = (
            np.ptp(flat, axis=0) == 0.0 if flat.size else np.zeros(draws.shape[2], dtype=bool)
        )
    several_chains = bool(variables) and variables[0][1].shape[0] > 1
    anything_moved = any(not np.all(flags) for flags in still.values())
    rhat, ess = [], []
    for name, draws in variables:
        constant_of_model = (several_chains and anything_moved) or not np.all(still[name])
        for j in range(draws.shape[2]):
            x = draws[:, :, j]
            if still[name][j]:  # a stuck chain counts, a constant of the model does not
                if not constant_of_model:
                    rhat.append(math.inf if x.shape[0] > 1 else math.nan)
                    ess.append(1.0)
                continue
            if x.shape[0] > 1:
                value = float(az.rhat(x))  # a NaN would make max() depend on the order
                rhat.append(math.inf if math.isnan(value) else value)
            value = float(az.ess(x, method="bulk"))
            ess.append(1.0 if math.isnan(value) else value)
    return (max(rhat) if rhat else math.nan), (min(ess) if ess else math.nan)


def check_convergence(
    idata: Any,
    *,
    rhat_max: float = RHAT_MAX,
    ess_min: float = ESS_MIN,
    acceptance_min: float = ACCEPTANCE_MIN,
    diverging_max: float = DIVERGING_MAX,
) -> ConvergenceCheck:
    """Diagnose the released draws of ``idata`` (InferenceData or DataTree).

    Post-processing of the release: no privacy cost.

    Parameters
    ----------
    idata : arviz.InferenceData or DataTree or mapping
        A release with a ``posterior`` group (and ``sample_stats``, when the step records
        ``accepted`` or ``diverging``).
    rhat_max, ess_min, acceptance_min, diverging_max : float
        A problem is reported when R̂ (rank-normalised split R̂, several chains only) exceeds
        ``rhat_max``, the bulk ESS of some component is below ``ess_min``, the acceptance rate
        after tuning is below ``acceptance_min``, or more than ``diverging_max`` of the
        iterations diverged.

    Returns
    -------
    ConvergenceCheck
        The numbers and the problems found (none: ``converged``). A component that is the
        same in every draw of every chain while others move (the unit diagonal of a
        correlation matrix from ``pm.LKJCholeskyCov``) is a constant of the model and is left
        out; chains that started apart cannot agree on a value they never left. A release with
        no component at all is a problem.
    """
    posterior = group_dataset(idata, "posterior")
    stats = group_dataset(idata, "sample_stats")
    variables = _components(posterior)
    chains, n_draws = variables[0][1].shape[:2] if variables else (0, 0)
    rhat, ess = _diagnostics(variables)
    acceptance = math.nan
    diverging = 0.0
    accept_reject = stats is None or "accepted" in stats.data_vars
    if stats is not None and "accepted" in stats.data_vars:
        acceptance = float(np.mean(stats["accepted"].values))
    if stats is not None and "diverging" in stats.data_vars:
        diverging = float(np.mean(stats["diverging"].values))
    problems = []
    if math.isnan(ess):
        problems.append("the posterior has no draws to diagnose")
    if diverging > diverging_max:
        problems.append(f"{diverging:.0%} of the iterations diverged")
    if acceptance < acceptance_min:
        problems.append(f"acceptance rate {acceptance:.3f} (the chains hardly move)")
    if rhat > rhat_max:
        problems.append(f"R̂ up to {rhat:.3g} (the chains disagree)")
    if ess < ess_min:
        problems.append(f"bulk effective sample size down to {ess:.3g}")
    return ConvergenceCheck(
        chains, n_draws, rhat, ess, acceptance, diverging, tuple(problems), accept_reject
    )
