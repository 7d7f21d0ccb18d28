"""An empirical privacy audit: a statistical lower bound on a step's ε from its output.

The accounting proves an upper bound on ε from the mechanisms' sensitivities and noise; the
audit checks the implementation end to end from the other side. It runs the same step many
times on two neighbouring datasets ``D`` and ``D'`` (one row replaced, ideally by a row at the
clip bound), reduces each run's draws to one number (the *statistic*), and bounds ε from below:
for any set ``S`` of outputs, (ε, δ)-DP requires ``P_D(S) ≤ e^ε P_D'(S) + δ``, so

    ε ≥ log((P_D(S) − δ) / P_D'(S)).

The probabilities are estimated from the runs with one-sided Clopper–Pearson bounds (lower on
the numerator, upper on the denominator, each at ``(1 + confidence)/2``, so the bound holds with
probability ``confidence``). ``S`` is chosen on one half of the runs (thresholds on the
statistic and likelihood-ratio sets of its histogram, in both directions) and the bound is
computed on the other half, so choosing ``S`` does not bias it.

A correct step gives a lower bound below its claimed ε (with probability ``confidence``); a
bound above the claim is a proof, at that confidence, that the implementation leaks more than
it accounts for. A bound below the claim proves nothing about tightness: the largest bound
``runs`` can show is about ``log(runs / 7)``, so audit at a claimed ε of a few.

Each run is one chain of ``iterations`` iterations from the same ``start`` with the same public
randomness (PyMC's ``random_seed`` for proposals and momenta): DP must hold for every value of
the public randomness, and fixing it removes variation that is not the DP noise. The DP noise
is fresh (secret) in every run. All runs of one dataset are one reservation on a budget that
only the audit uses. docs: security.md, "Auditing a step".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import stats

from pymc_dp.accounting import PrivacyBudget
from pymc_dp.accounting.costs import compose_epsilon
from pymc_dp.errors import InvalidParameterError

__all__ = [
    "AuditResult",
    "audit_step",
    "epsilon_lower_bound",
    "replace_row",
]


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """The outcome of :func:`audit_step`.

    Attributes
    ----------
    step : str
        The audited step's class.
    claimed_epsilon : float
        ε of one run (``iterations`` iterations) by the step's own accounting, at ``delta``.
    epsilon_lower_bound : float
        The audit's lower bound on the true ε, holding with probability ``confidence``.
    delta, confidence : float
    runs, iterations : int
        Runs per dataset, iterations per run.
    """

    step: str
    claimed_epsilon: float
    epsilon_lower_bound: float
    delta: float
    confidence: float
    runs: int
    iterations: int

    @property
    def violated(self) -> bool:
        """True when the audit proves (at ``confidence``) that ε exceeds the claim."""
        return self.epsilon_lower_bound > self.claimed_epsilon

    def __str__(self) -> str:
        verdict = "VIOLATION" if self.violated else "ok"
        return (
            f"{self.step}: claimed ε = {self.claimed_epsilon:.3g}, audited lower bound "
            f"{self.epsilon_lower_bound:.3g} ({self.confidence:.0%} confidence, {self.runs} runs "
            f"× {self.iterations} iterations per dataset): {verdict}"
        )


def replace_row(data: np.ndarray, index: int, row: Any) -> np.ndarray:
    """A neighbouring dataset: ``data`` with row ``index`` replaced by ``row`` (a copy)."""
    out = np.array(data, copy=True)
    out[index] = row
    return out


def _clopper_pearson(k: int, n: int, level: float) -> tuple[float, float]:
    """One-sided Clopper–Pearson bounds (lower, upper) for ``k`` of ``n``, each at ``level``."""
    lower = 0.0 if k == 0 else float(stats.beta.ppf(1 - level, k, n - k + 1))
    upper = 1.0 if k == n else float(stats.beta.ppf(level, k + 1, n - k))
    return lower, upper


def _candidate_sets(x: np.ndarray, y: np.ndarray) -> list[Callable[[np.ndarray], np.ndarray]]:
    """Sets of outputs (as membership tests) that may separate ``x`` from ``y``."""
    pooled = np.concatenate([x, y])
    values = np.unique(pooled)
    cuts = values if values.size <= 200 else np.quantile(pooled, np.linspace(0.005, 0.995, 199))
    sets: list[Callable[[np.ndarray], np.ndarray]] = []
    for tau in np.unique(cuts):
        sets.append(lambda s, tau=tau: s > tau)
        sets.append(lambda s, tau=tau: s <= tau)
    # likelihood-ratio sets of the histogram: outputs where one side is much more frequent
    if values.size <= 200:
        edges = np.concatenate([values, [np.inf]])
    else:
        edges = np.unique(np.quantile(pooled, np.linspace(0, 1, 41)))
        edges[-1] = np.inf
    hx = np.histogram(x, edges)[0] + 0.5
    hy = np.histogram(y, edges)[0] + 0.5
    ratio = np.log(hx / hy)
    for r in np.unique(np.abs(ratio)):
        for chosen in (ratio >= r, -ratio >= r):
            bins = np.flatnonzero(chosen)
            if bins.size:
                sets.append(
                    lambda s, bins=bins: np.isin(np.searchsorted(edges, s, side="right") - 1, bins)
                )
    return sets


def _bound(x: np.ndarray, y: np.ndarray, member: Callable, delta: float, level: float) -> float:
    kx, ky = int(np.sum(member(x))), int(np.sum(member(y)))
    lower, _ = _clopper_pearson(kx, x.size, level)
    _, upper = _clopper_pearson(ky, y.size, level)
    if lower - delta <= 0 or upper <= 0:
        return 0.0
    return max(0.0, math.log((lower - delta) / upper))


def epsilon_lower_bound(
    x: np.ndarray, y: np.ndarray, *, delta: float, confidence: float = 0.95
) -> float:
    """A lower bound on ε from one-dimensional outputs ``x`` (on ``D``) and ``y`` (on ``D'``).

    ``S`` is chosen on the first half of each sample and the bound
    ``log((P_lo(S) − δ) / P_hi(S))`` computed on the second half, in both directions (the
    roles of ``D`` and ``D'`` swapped). Holds with probability ``confidence``.
    """
    x, y = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if x.size < 20 or y.size < 20:
        raise InvalidParameterError("an audit needs at least 20 runs per dataset.")
    if not 0 < confidence < 1:
        raise InvalidParameterError(f"confidence must be in (0, 1), got {confidence!r}.")
    level = (1 + confidence) / 2
    hx, hy = x.size // 2, y.size // 2
    best = None
    for first, second in ((x, y), (y, x)):
        a, b = (first[: first.size // 2], second[: second.size // 2])
        for member in _candidate_sets(a, b):
            score = _bound(a, b, member, delta, level)
            if best is None or score > best[0]:
                best = (score, member, first is x)
    _, member, x_first = best
    xe, ye = x[hx:], y[hy:]
    return _bound(xe, ye, member, delta, level) if x_first else _bound(ye, xe, member, delta, level)


def _runs(
    build_model: Callable[[Any], Any],
    data: Any,
    make_step: Callable[[PrivacyBudget], Any],
    *,
    runs: int,
    iterations: int,
    start: dict[str, Any] | None,
    statistic: Callable[[np.ndarray], float],
    public_seed: int,
    budget_epsilon: float,
    delta: float,
) -> tuple[np.ndarray, float, str]:
    model = build_model(data)
    with model:
        step = make_step(PrivacyBudget(epsilon=budget_epsilon, delta=delta))
        point = dict(model.initial_point() if start is None else start)
        if step.noise_reproducible:
            raise InvalidParameterError(
                "the audit needs fresh secret noise in every run: build the step without "
                "noise_rng (seeded noise would replay the same noise on both datasets)."
            )
        if not step.prepared:
            raise InvalidParameterError(
                "the audit runs steps with explicit settings (no automatic clip, noise or "
                "initialisation): give make_step's step its noise and clip, and init_share=0."
            )
        claimed = compose_epsilon(step.chain_spending(0, iterations), delta)[0]
        step._start_chain(np.random.default_rng(public_seed), runs * iterations, 0, False, None)
        state = step.sampling_state  # the public state every run starts from
        out = np.empty(runs)
        for r in range(runs):
            step.sampling_state = state
            step._iteration = 0  # each run is a chain of its own; the reservation covers all
            current = dict(point)
            draws = []
            for _ in range(iterations):
                current, _stats = step.step(current)
                draws.append(step.space.ravel(current))
            out[r] = float(statistic(np.asarray(draws)))
    return out, float(claimed), type(step).__name__


def audit_step(
    build_model: Callable[[Any], Any],
    data: Any,
    neighbour: Any,
    make_step: Callable[[PrivacyBudget], Any],
    *,
    runs: int = 1000,
    iterations: int = 1,
    delta: float = 1e-5,
    start: dict[str, Any] | None = None,
    statistic: Callable[[np.ndarray], float] | None = None,
    confidence: float = 0.95,
    public_seed: int = 0,
    budget_epsilon: float = 1e4,
) -> AuditResult:
    """Audit a DP step: a lower bound on its ε from ``runs`` chains on ``data`` and ``neighbour``.

    Parameters
    ----------
    build_model : callable
        ``build_model(dataset) -> pm.Model``, the model as the user writes it.
    data, neighbour : array-like
        Neighbouring datasets (e.g. ``replace_row(data, 0, worst_row)``).
    make_step : callable
        ``make_step(budget) -> DPStep``, called inside the model's context; explicit settings
        (noise, clip, ``init_share=0``), as the audit measures one chain of fixed length.
    runs : int
        Chains per dataset (the largest bound that can be shown is about ``log(runs / 7)``).
    iterations : int
        Iterations per chain; the claim is the step's ε for this many.
    delta : float
        The δ at which ε is claimed and bounded.
    start : dict, optional
        The chains' start (default: the model's initial point).
    statistic : callable, optional
        ``statistic(draws) -> float`` of a chain's draws (``iterations × d``). Default: the
        first coordinate of the last draw.
    confidence : float
        Probability with which the lower bound holds.
    public_seed : int
        The public randomness every run shares.
    budget_epsilon : float
        ε of the audit's own budget, which must hold ``runs × iterations`` iterations.

    Returns
    -------
    AuditResult
    """
    if statistic is None:

        def statistic(draws: np.ndarray) -> float:
            return float(draws[-1, 0])

    kwargs = {
        "runs": int(runs),
        "iterations": int(iterations),
        "start": start,
        "statistic": statistic,
        "public_seed": public_seed,
        "budget_epsilon": budget_epsilon,
        "delta": delta,
    }
    x, claimed, name = _runs(build_model, data, make_step, **kwargs)
    y, claimed_y, _ = _runs(build_model, neighbour, make_step, **kwargs)
    if not math.isclose(claimed, claimed_y, rel_tol=1e-9):
        raise InvalidParameterError(
            f"the step claims ε = {claimed:.4g} on data and {claimed_y:.4g} on neighbour: "
            "neighbouring datasets must have the same number of rows."
        )
    bound = epsilon_lower_bound(x, y, delta=delta, confidence=confidence)
    return AuditResult(name, claimed, bound, delta, confidence, int(runs), int(iterations))


# -- the built-in audit of every step ---------------------------------------------------------
#: rows of the audit model. Every row is 0 except row 0, at −30 in one dataset and +30 in the
#: other: far beyond every clip, so the replaced row moves each clipped sum by the whole
#: sensitivity 2C, and identical other rows leave a minibatch nothing to hide it behind (the
#: worst case for the subsampled steps, as in audits with a canary)
AUDIT_ROWS = 100


def _audit_data() -> tuple[np.ndarray, np.ndarray]:
    rows = np.zeros(AUDIT_ROWS)
    return replace_row(rows, 0, -30.0), replace_row(rows, 0, 30.0)


def _audit_model(data: np.ndarray) -> Any:
    import pymc as pm

    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=data)
    return model


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One step's audit: how to build it, how long a run is (claimed ε of a few), and where
    the chains start (the auditor's choice: where one row can tip the step's decisions)."""

    make_step: Callable[[PrivacyBudget], Any]
    iterations: int
    start: float = 0.0


def _scenarios() -> dict[str, Scenario]:
    import pymc_dp

    n = AUDIT_ROWS
    return {
        "DPPenalty": Scenario(
            lambda b: pymc_dp.DPPenalty(
                budget=b, llr_clip=2.0, noise_multiplier=4.0, proposal_scale=0.1
            ),
            5,
            -0.3,
        ),
        "DPPenalty (minibatch)": Scenario(
            lambda b: pymc_dp.DPPenalty(
                budget=b, llr_clip=2.0, noise_multiplier=2.0, batch_size=20, proposal_scale=0.1
            ),
            5,
            -1.0,
        ),
        "DPHMC": Scenario(
            lambda b: pymc_dp.DPHMC(
                budget=b,
                step_size=0.1,
                n_steps=1,
                grad_clip=2.0,
                llr_clip=2.0,
                grad_noise_multiplier=3.0,
                llr_noise_multiplier=16.0,
                mass_diag=[100.0],
                adapt_step_size=False,
                adapt_mass=False,
            ),
            1,
            -0.3,
        ),
        "DPBarker": Scenario(
            lambda b: pymc_dp.DPBarker(budget=b, batch_size=50, proposal_scale=0.1), 1
        ),
        "DPSGLD": Scenario(
            lambda b: pymc_dp.DPSGLD(budget=b, step_size=1.0, grad_clip=2.0, batch_size=n), 1
        ),
        "DPSGNHT": Scenario(
            lambda b: pymc_dp.DPSGNHT(
                budget=b, step_size=1.0, diffusion=1.0, grad_clip=2.0, batch_size=n
            ),
            1,
        ),
        "DPSGHMC": Scenario(
            lambda b: pymc_dp.DPSGHMC(
                budget=b, step_size=1.0, friction=1.0, n_steps=1, grad_clip=2.0, batch_size=n
            ),
            1,
        ),
    }


#: The built-in audit scenarios, one per step (a Normal mean, n = 100, a row at ±30).
SCENARIOS = (
    "DPPenalty",
    "DPPenalty (minibatch)",
    "DPHMC",
    "DPBarker",
    "DPSGLD",
    "DPSGNHT",
    "DPSGHMC",
)


def audit_scenario(name: str, *, runs: int = 1000, confidence: float = 0.95) -> AuditResult:
    """Run the built-in audit of one step (:data:`SCENARIOS`): the Normal-mean model with
    ``n = 100`` rows, all 0 but row 0, which is −30 in one dataset and +30 in the other; chains
    started at the scenario's point with one fixed public seed, δ = 10⁻⁵."""
    scenarios = _scenarios()
    if name not in scenarios:
        raise InvalidParameterError(f"name must be one of {SCENARIOS}, got {name!r}.")
    data, neighbour = _audit_data()
    scenario = scenarios[name]
    start = {"mu": np.array(scenario.start)}
    return audit_step(
        _audit_model,
        data,
        neighbour,
        scenario.make_step,
        runs=runs,
        iterations=scenario.iterations,
        start=start,
        confidence=confidence,
    )
