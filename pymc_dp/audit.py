"""An empirical privacy audit: a statistical lower bound on a step's ε from its output.

The accounting proves an upper bound on ε from the mechanisms' sensitivities and noise; the
audit checks the implementation end to end from the other side. It runs the same step many
times on two neighbouring datasets ``D`` and ``D'`` (one row replaced, ideally by a row at the
clip bound), reduces each run's draws to one number (the *statistic*), and bounds ε from below:
for any set ``S`` of outputs, (ε, δ)-DP requires ``P_D(S) ≤ e^ε P_D'(S) + δ``, so

    ε ≥ log((P_D(S) − δ) / P_D'(S)).

The probabilities are estimated from the runs with one-sided Clopper–Pearson bounds (lower on
the numerator, upper on the denominator). Candidate sets (thresholds on the statistic and
likelihood-ratio sets of its histogram, in both directions) are scored on one half of the runs,
and the ``sets`` best are evaluated on the other half, so choosing them does not bias the bound;
the largest of their bounds is reported, each computed at ``1 − (1 − confidence)/(2k)`` per
probability for the ``k ≤ sets`` sets evaluated, so that all of them hold together with
probability ``confidence`` (Bonferroni).
Evaluating a few sets rather than one keeps the audit from resting on a set that only just
excluded the other dataset's runs in the first half (a threshold at the edge of their sample),
which the second half's runs then enter.

A correct step gives a lower bound below its claimed ε (with probability ``confidence``); a
bound above the claim is a proof, at that confidence, that the implementation leaks more than
it accounts for. A bound below the claim proves nothing about tightness: the largest bound
``runs`` can show is about ``log(runs / 10)`` (three sets; ``log(runs / 5)`` from a grid of
starts), so audit at a claimed ε of a few.

Each run is one chain of ``iterations`` iterations from the same ``start`` with the same public
randomness (PyMC's ``random_seed`` for proposals and momenta): DP must hold for every value of
the public randomness, and fixing it removes variation that is not the DP noise. The DP noise
is fresh (secret) in every run. All runs of one dataset are one reservation on a budget that
only the audit uses. A run that stops with a data-dependent error is the output ``+inf``.

Steps that release one accept/reject bit per iteration leak, when broken, only where their
threshold sits in the tail of the noise, which the start decides: ``start`` may be a list of
candidates, and pilot runs choose the start and the ``sets`` sets before fresh runs give the
bound.
docs: security.md, "Auditing a step".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from pymc_dp.accounting import PrivacyBudget
from pymc_dp.accounting.costs import compose_epsilon
from pymc_dp.errors import (
    BarkerVarianceError,
    InsufficientDataError,
    InvalidParameterError,
    PrivateEvaluationError,
)
from pymc_dp.step_methods.options import check_positive_int

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
    start : dict or None
        The start the runs were made from (the chosen one, when candidates were given; None:
        the model's initial point).
    """

    step: str
    claimed_epsilon: float
    epsilon_lower_bound: float
    delta: float
    confidence: float
    runs: int
    iterations: int
    start: dict[str, Any] | None = None

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


#: Errors a run may stop with depending on the data (a step that refuses to go on); the audit
#: records such a run as the output :data:`_STOPPED`, since a user sees that it stopped.
_RUN_ERRORS = (BarkerVarianceError, InsufficientDataError, PrivateEvaluationError)
_STOPPED = np.inf


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
    """Sets of outputs (as membership tests) that may separate ``x`` from ``y``.

    A run that stopped with an error has the output ``+inf`` (:data:`_STOPPED`): above every
    threshold, and a bin of its own.
    """
    pooled = np.concatenate([x, y])
    finite = pooled[np.isfinite(pooled)]
    values = np.unique(finite)
    few = values.size <= 200
    cuts = values if few else np.quantile(finite, np.linspace(0.005, 0.995, 199))
    sets: list[Callable[[np.ndarray], np.ndarray]] = [np.isinf, lambda s: ~np.isinf(s)]
    for tau in np.unique(cuts):
        sets.append(lambda s, tau=tau: s > tau)
        sets.append(lambda s, tau=tau: s <= tau)
    # likelihood-ratio sets of the histogram: outputs where one side is much more frequent
    inner = values if few else np.unique(np.quantile(finite, np.linspace(0, 1, 41)))[:-1]
    edges = np.concatenate([inner, [np.finfo(float).max, np.inf]])
    last = edges.size - 2

    def bin_of(s: np.ndarray) -> np.ndarray:
        return np.minimum(np.searchsorted(edges, s, side="right") - 1, last)

    hx = np.bincount(bin_of(x)[bin_of(x) >= 0], minlength=last + 1) + 0.5
    hy = np.bincount(bin_of(y)[bin_of(y) >= 0], minlength=last + 1) + 0.5
    ratio = np.log(hx / hy)
    for r in np.unique(np.abs(ratio)):
        for chosen in (ratio >= r, -ratio >= r):
            bins = np.flatnonzero(chosen)
            if bins.size:
                sets.append(lambda s, bins=bins: np.isin(bin_of(s), bins))
    return sets


def _top_sets(
    x: np.ndarray, y: np.ndarray, delta: float, level: float, sets: int
) -> list[tuple[float, Callable[[np.ndarray], np.ndarray], bool]]:
    """The ``sets`` candidate sets that separate runs ``x``, ``y`` most, best first: (the bound
    on these same runs, the set, whether ``x`` is the numerator). Sets that hold the same runs
    count once, and after the first only sets with a positive bound count (one that shows
    nothing here would only spend confidence). A choice, never a reported bound."""
    scored = []
    for first, second, x_first in ((x, y, True), (y, x, False)):
        for member in _candidate_sets(first, second):
            scored.append((_bound(first, second, member, delta, level), member, x_first))
    scored.sort(key=lambda entry: -entry[0])  # stable: ties keep the candidates' order
    chosen: list[tuple[float, Callable[[np.ndarray], np.ndarray], bool]] = []
    seen: set[tuple[bool, bytes]] = set()
    for score, member, x_first in scored:
        if chosen and score <= 0:
            break  # sorted: every later set shows nothing either
        key = (x_first, np.packbits(np.concatenate([member(x), member(y)])).tobytes())
        if key not in seen:
            seen.add(key)
            chosen.append((score, member, x_first))
            if len(chosen) == sets:
                break
    return chosen


def _evaluate(
    x: np.ndarray,
    y: np.ndarray,
    chosen: Sequence[tuple[float, Callable[[np.ndarray], np.ndarray], bool]],
    delta: float,
    confidence: float,
) -> float:
    """The largest bound of the ``chosen`` sets on fresh runs ``x``, ``y``, all of them holding
    together with probability ``confidence`` (each probability at ``1 − (1 − confidence)/2k``)."""
    level = 1 - (1 - confidence) / (2 * len(chosen))
    return max(
        _bound(x, y, member, delta, level) if x_first else _bound(y, x, member, delta, level)
        for _, member, x_first in chosen
    )


def _bound(x: np.ndarray, y: np.ndarray, member: Callable, delta: float, level: float) -> float:
    kx, ky = int(np.sum(member(x))), int(np.sum(member(y)))
    lower, _ = _clopper_pearson(kx, x.size, level)
    _, upper = _clopper_pearson(ky, y.size, level)
    if lower - delta <= 0 or upper <= 0:
        return 0.0
    return max(0.0, math.log((lower - delta) / upper))


def epsilon_lower_bound(
    x: np.ndarray, y: np.ndarray, *, delta: float, confidence: float = 0.95, sets: int = 3
) -> float:
    """A lower bound on ε from one-dimensional outputs ``x`` (on ``D``) and ``y`` (on ``D'``).

    The ``sets`` sets ``S`` that separate the first halves most (in both directions: the roles
    of ``D`` and ``D'`` swapped) are chosen there, and the largest of their bounds
    ``log((P_lo(S) − δ) / P_hi(S))`` on the second halves is returned, each probability bounded
    with a one-sided Clopper–Pearson bound at ``1 − (1 − confidence)/(2k)`` for the ``k`` sets
    evaluated (Bonferroni: all of them hold together with probability ``confidence``).

    Parameters
    ----------
    x, y : array-like
        One number per run on ``D`` and on ``D'`` (at least 20 each; ``+inf`` for a run that
        stopped).
    delta : float
        The δ at which ε is bounded.
    confidence : float
        Probability with which the bound holds.
    sets : int
        How many of the first halves' best sets are evaluated on the second halves.

    Returns
    -------
    float
        The lower bound on ε (0 when no set shows anything).
    """
    x, y = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if x.size < 20 or y.size < 20:
        raise InvalidParameterError("an audit needs at least 20 runs per dataset.")
    if not 0 < confidence < 1:
        raise InvalidParameterError(f"confidence must be in (0, 1), got {confidence!r}.")
    sets = check_positive_int(sets, "sets")
    hx, hy = x.size // 2, y.size // 2
    chosen = _top_sets(x[:hx], y[:hy], delta, (1 + confidence) / 2, sets)
    return _evaluate(x[hx:], y[hy:], chosen, delta, confidence)


def _runs(
    build_model: Callable[[Any], Any],
    data: Any,
    make_step: Callable[[PrivacyBudget], Any],
    *,
    runs: int,
    iterations: int,
    starts: Sequence[dict[str, Any] | None],
    statistic: Callable[[np.ndarray], float],
    public_seed: int,
    budget_epsilon: float,
    delta: float,
) -> tuple[np.ndarray, float, str]:
    """``runs`` chains from each start on ``data``: the statistics, ``(len(starts), runs)``."""
    model = build_model(data)
    with model:
        step = make_step(PrivacyBudget(epsilon=budget_epsilon, delta=delta))
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
        total = len(starts) * runs * iterations
        step._start_chain(np.random.default_rng(public_seed), total, 0, False, None)
        state = step.sampling_state  # the public state every run starts from
        out = np.empty((len(starts), runs))
        for s, start in enumerate(starts):
            point = dict(model.initial_point() if start is None else start)
            for r in range(runs):
                step.sampling_state = state
                step._iteration = 0  # each run is a chain of its own; the reservation covers all
                current = dict(point)
                draws = []
                try:
                    for _ in range(iterations):
                        current, _stats = step.step(current)
                        draws.append(np.concatenate([np.ravel(current[v.name]) for v in step.vars]))
                except _RUN_ERRORS:  # a data-dependent stop is an output an adversary sees
                    out[s, r] = _STOPPED
                    continue
                out[s, r] = float(statistic(np.asarray(draws)))
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
    start: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
    pilot_runs: int = 200,
    statistic: Callable[[np.ndarray], float] | None = None,
    confidence: float = 0.95,
    public_seed: int = 0,
    budget_epsilon: float = 1e4,
    sets: int = 3,
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
        Chains per dataset (the largest bound that can be shown is about ``log(runs / 10)``
        with the default ``sets``, ``log(runs / 5)`` from a grid of starts).
    iterations : int
        Iterations per chain; the claim is the step's ε for this many.
    delta : float
        The δ at which ε is claimed and bounded.
    start : dict or sequence of dicts, optional
        The chains' start (default: the model's initial point). A sequence is a set of
        candidate starts: ``pilot_runs`` chains from each, on both datasets, choose the start
        and the ``sets`` sets that separate the datasets most there, and the bound is computed
        from ``runs`` fresh chains from that start (so the choice does not bias it). Steps that
        release one accept/reject bit per iteration leak where their decision threshold sits
        in the tail of the noise, which depends on the start: give a grid of starts for them.
    pilot_runs : int
        Chains per candidate start and dataset when ``start`` is a sequence.
    statistic : callable, optional
        ``statistic(draws) -> float`` of a chain's draws (``iterations × d``). Default: the
        first coordinate of the last draw.
    confidence : float
        Probability with which the lower bound holds.
    public_seed : int
        The public randomness every run shares.
    budget_epsilon : float
        ε of the audit's own budget, which must hold every run's iterations.
    sets : int
        How many of the best sets of the first half (or of the pilot runs) are evaluated on
        the rest; the bound is the largest of theirs, Bonferroni-corrected. A few (the
        default 3) make the bound steadier than one: on DP HMC with uniform noise in the
        built-in scenario (2000 runs, claim 1.88) one set gave bounds as low as 1.75 (about
        1 audit in 100), three gave 2.40–3.05 in 101 audits (docs: security.md).

    Returns
    -------
    AuditResult
    """
    if statistic is None:

        def statistic(draws: np.ndarray) -> float:
            return float(draws[-1, 0])

    if not 0 < confidence < 1:
        raise InvalidParameterError(f"confidence must be in (0, 1), got {confidence!r}.")
    sets = check_positive_int(sets, "sets")
    if start is None or isinstance(start, Mapping):
        candidates: list[dict[str, Any] | None] = [None if start is None else dict(start)]
    else:
        candidates = [dict(s) for s in start]
        if not candidates:
            raise InvalidParameterError("start must hold at least one candidate start.")
    kwargs = {
        "iterations": int(iterations),
        "statistic": statistic,
        "public_seed": public_seed,
        "budget_epsilon": budget_epsilon,
        "delta": delta,
    }

    def both(starts: list, count: int) -> tuple[np.ndarray, np.ndarray, float, str]:
        x, claimed, name = _runs(build_model, data, make_step, runs=count, starts=starts, **kwargs)
        y, claimed_y, _ = _runs(
            build_model, neighbour, make_step, runs=count, starts=starts, **kwargs
        )
        if not math.isclose(claimed, claimed_y, rel_tol=1e-9):
            raise InvalidParameterError(
                f"the step claims ε = {claimed:.4g} on data and {claimed_y:.4g} on neighbour: "
                "neighbouring datasets must have the same number of rows."
            )
        return x, y, claimed, name

    if len(candidates) == 1:
        x, y, claimed, name = both(candidates, int(runs))
        bound = epsilon_lower_bound(x[0], y[0], delta=delta, confidence=confidence, sets=sets)
        return AuditResult(
            name, claimed, bound, delta, confidence, int(runs), int(iterations), candidates[0]
        )
    # design: the start and the sets from pilot runs; the bound from fresh runs, all of them
    if int(pilot_runs) < 20:
        raise InvalidParameterError(f"pilot_runs must be at least 20, got {pilot_runs!r}.")
    px, py, _, _ = both(candidates, int(pilot_runs))
    level = (1 + confidence) / 2
    designs = [_top_sets(a, b, delta, level, sets) for a, b in zip(px, py, strict=True)]
    best = int(np.argmax([chosen[0][0] for chosen in designs]))
    x, y, claimed, name = both([candidates[best]], int(runs))
    bound = _evaluate(x[0], y[0], designs[best], delta, confidence)
    return AuditResult(
        name, claimed, bound, delta, confidence, int(runs), int(iterations), candidates[best]
    )


# -- the built-in audit of every step ---------------------------------------------------------
#: rows of the audit model. Every row is 0 except row 0, at −30 in one dataset and +30 in the
#: other (by default): far beyond every clip, so the replaced row moves each clipped sum by the
#: whole sensitivity 2C, and identical other rows leave a minibatch nothing to hide it behind
#: (the worst case for the subsampled steps, as in audits with a canary)
AUDIT_ROWS = 100


def _audit_data(rows: tuple[float, float] = (-30.0, 30.0)) -> tuple[np.ndarray, np.ndarray]:
    zeros = np.zeros(AUDIT_ROWS)
    return replace_row(zeros, 0, rows[0]), replace_row(zeros, 0, rows[1])


def _audit_model(data: np.ndarray) -> Any:
    import pymc as pm

    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=data)
    return model


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One step's audit: how to build it, how long a run is (claimed ε of a few), where the
    chains start (the auditor's choice: where one row can tip the step's decisions), and the
    value of row 0 in the two datasets."""

    make_step: Callable[[PrivacyBudget], Any]
    iterations: int
    start: float | tuple[float, ...] = 0.0  # a tuple: candidate starts (see audit_step)
    pilot_runs: int = 400
    rows: tuple[float, float] = (-30.0, 30.0)


def _grid(low: float, high: float, step: float) -> tuple[float, ...]:
    return tuple(np.round(np.arange(low, high + step / 2, step), 6).tolist())


def _scenarios() -> dict[str, Scenario]:
    import pymc_dp

    n = AUDIT_ROWS
    # The steps that release one accept/reject bit per iteration leak (if broken) where their
    # threshold log U + σ²/2 sits in the tail of the noise; with the public seed fixed, the start
    # moves the threshold, so these audits search a grid of starts (one iteration each). With
    # public seed 0 both penalty scenarios propose upwards, and their thresholds cross the noise
    # distribution's body and tails between starts 0.9 and 1.4.
    return {
        "DPPenalty": Scenario(
            lambda b: pymc_dp.DPPenalty(
                budget=b, llr_clip=2.0, noise_multiplier=2.0, proposal_scale=0.1
            ),
            1,
            _grid(0.9, 1.3, 0.02),
        ),
        "DPPenalty (minibatch)": Scenario(
            lambda b: pymc_dp.DPPenalty(
                budget=b, llr_clip=2.0, noise_multiplier=2.0, batch_size=50, proposal_scale=0.1
            ),
            1,
            _grid(0.96, 1.4, 0.02),
            # its uniform-noise leak sits at starts 1.30–1.32: with 400 pilot runs a neighbour
            # sometimes won the pilot (bound 0.72 against the claim 1.35 in one test run); with
            # 1000 the pilot chose 1.30–1.32 in 6 of 6 runs (bounds 2.35–2.90)
            pilot_runs=1000,
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
        # DP Barker accepts iff λ + s + V_corr > 0, with s ~ N(0, C − σ_b²) the DP noise and
        # V_corr close to discrete (atoms at 0, ±2.95, ±9.23). A full batch (no subsampling to
        # dilute the row) and starts that put λ within 0.1 of the central atom let the audit
        # see a decision the noise no longer hides. Row 0 is 30 against 0: without clipping
        # its ratio (30 × proposals of 0.063 from public seed 0) exceeds the batch-variance
        # check on one dataset only, and the run stops there.
        "DPBarker": Scenario(
            lambda b: pymc_dp.DPBarker(budget=b, batch_size=n, proposal_scale=0.5),
            1,
            _grid(-0.08, 0.04, 0.004),
            rows=(30.0, 0.0),
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
    ``n = 100`` rows, all 0 but row 0, which is −30 in one dataset and +30 in the other (30 and
    0 for DP Barker); chains started at the scenario's point, or at the best of its grid of
    starts (the one-bit steps), with one fixed public seed, δ = 10⁻⁵."""
    scenarios = _scenarios()
    if name not in scenarios:
        raise InvalidParameterError(f"name must be one of {SCENARIOS}, got {name!r}.")
    scenario = scenarios[name]
    data, neighbour = _audit_data(scenario.rows)
    if isinstance(scenario.start, tuple):
        start: Any = [{"mu": np.array(s)} for s in scenario.start]
    else:
        start = {"mu": np.array(scenario.start)}
    return audit_step(
        _audit_model,
        data,
        neighbour,
        scenario.make_step,
        runs=runs,
        iterations=scenario.iterations,
        start=start,
        pilot_runs=scenario.pilot_runs,
        confidence=confidence,
    )
