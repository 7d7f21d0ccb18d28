"""One evaluation run: a model, a DP step, an ε, a seed → MMD to the exact posterior (theory §5).

δ = 0.1/n and one chain that spends the whole budget, as the seeds. Two recipes
(:mod:`.recipes`):

* ``"private"``: the step on its automatic settings, started at PyMC's initial point; the
  private initialisation and the tuning are counted in the budget, and every released draw
  after tuning is compared (the tuning is the burn-in);
* ``"seeds"``: the chain starts at a draw of the reference posterior (standing in for a cheap
  private point estimate), with the seeds' non-private settings, spends the whole budget without
  tuning, and the first half is discarded.

The draws are compared by MMD (median heuristic) with a reference sample; the floor is the MMD
between two reference samples of the same size. For the circle the score is the distance of the
sample mean from the true posterior mean, the origin.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pymc as pm

import pymc_dp
from pymc_dp.experiments.problems import Problem, get_problem
from pymc_dp.experiments.recipes import Tuning, build_step, private_step, tune_from_reference
from pymc_dp.metrics import mmd

__all__ = ["RunResult", "prepare", "run"]

_REFERENCE_SIZE = 4000
_MAX_COMPARED = 2000
_DATA_SEED = 20260101  # one data set per model, as the seeds; runs vary the start and noise


@dataclass(frozen=True)
class Prepared:
    problem: Problem
    data: np.ndarray
    reference: np.ndarray  # exact posterior draws (NUTS for logistic regression)
    tuning: Tuning


@dataclass(frozen=True)
class RunResult:
    problem: str
    step: str
    recipe: str
    epsilon: float
    seed: int
    n: int
    iterations: int
    acceptance: float
    clipped_fraction: float  # NOT private: evaluation only (ratios; gradients for SG samplers)
    score: float  # MMD to the reference, or ‖mean‖ for the circle
    floor: float  # MMD between two reference samples (0 for the circle)
    metric: str
    seconds: float

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


@functools.lru_cache(maxsize=4)
def prepare(name: str, n: int | None = None) -> Prepared:
    """Data, reference sample and tuning for problem ``name`` (optionally resized to ``n`` rows)."""
    problem = get_problem(name)
    if n is not None and n != problem.n:
        problem = problem.resized(n)
    rng = np.random.default_rng(_DATA_SEED)
    data = problem.simulate(rng)
    model = problem.model(data)
    if problem.has_exact_sample:
        reference = problem.exact_sample(data, _REFERENCE_SIZE, rng)
    else:  # circle, logistic regression: non-private NUTS draws (fewer for resized, quick runs)
        resized = n is not None and n != get_problem(name).n
        reference = _nuts_reference(model, draws=250 if resized else _REFERENCE_SIZE // 2)
    tuning = tune_from_reference(problem, model, reference)
    return Prepared(problem, data, reference, tuning)


def _nuts_reference(model: pm.Model, draws: int) -> np.ndarray:
    """Non-private reference draws from PyMC's NUTS (evaluation only, never released)."""
    with model:
        idata = pm.sample(
            draws=draws,
            tune=min(500, 2 * draws),
            chains=2,
            cores=1,
            random_seed=1,
            progressbar=False,
            compute_convergence_checks=False,
        )
    theta = idata.posterior["theta"].values
    return theta.reshape(-1, theta.shape[-1])


def run(
    problem: str,
    step: str,
    epsilon: float,
    seed: int,
    *,
    n: int | None = None,
    chains: int = 1,
    max_iterations: int | None = None,
    recipe: str = "private",
) -> tuple[RunResult, Any]:
    """Run ``step`` on ``problem`` at ``epsilon``; returns the scores and the InferenceData.

    ``max_iterations`` (quick runs, the seeds' recipe) caps the iterations per chain below what
    the budget allows; the private recipe runs the step's own plan.
    """
    start_time = time.perf_counter()
    prep = prepare(problem, n)
    prob = prep.problem
    model = prob.model(prep.data)
    budget = pymc_dp.PrivacyBudget(epsilon=epsilon, delta=0.1 / prob.n)
    options: dict[str, Any] = {
        "chains": chains,
        "cores": 1,
        "random_seed": seed,
        "progressbar": False,
        "compute_convergence_checks": False,
        "model": model,
    }
    if recipe == "private":
        idata = pymc_dp.sample(private_step(step, model, budget), **options)
        theta = idata.posterior["theta"].values
        kept = theta.reshape(-1, theta.shape[-1])
    elif recipe == "seeds":
        dp_step = build_step(step, prob, model, prep.tuning, budget)
        rng = np.random.default_rng(seed)
        starts = prep.reference[rng.choice(len(prep.reference), size=chains, replace=False)]
        per_chain = budget.iterations_per_chain(dp_step.cost, chains)
        draws = per_chain if max_iterations is None else min(per_chain, max_iterations)
        idata = pymc_dp.sample(
            dp_step, tune=0, draws=draws, initvals=[{"theta": s} for s in starts], **options
        )
        theta = idata.posterior["theta"].values
        kept = theta[:, theta.shape[1] // 2 :].reshape(-1, theta.shape[-1])
    else:
        raise ValueError(f"recipe must be 'private' or 'seeds', not {recipe!r}")
    stats = idata.sample_stats
    # not measured (NaN): the private recipe releases no clip counts; the SG samplers clip
    # gradients (no ratios) and have no accept/reject step
    clip_stat = next(
        (k for k in ("llr_clipped_fraction", "grad_clipped_fraction") if k in stats), None
    )
    clipped = float(stats[clip_stat].mean()) if clip_stat else float("nan")
    acceptance = float(stats["accepted"].mean()) if "accepted" in stats else float("nan")
    if prob.has_exact_sample or prob.exact_mean is None:
        size = min(len(kept), _MAX_COMPARED, len(prep.reference) // 2)
        sample = kept[np.linspace(0, len(kept) - 1, size).astype(int)]
        ref = prep.reference
        score = mmd(sample, ref[:size])
        floor = mmd(ref[:size], ref[size : 2 * size])
        metric = "mmd"
    else:
        score, floor, metric = float(np.linalg.norm(kept.mean(0) - prob.exact_mean)), 0.0, "mean"
    result = RunResult(
        problem=problem,
        step=step,
        recipe=recipe,
        epsilon=float(epsilon),
        seed=int(seed),
        n=prob.n,
        iterations=int(theta.shape[1]),
        acceptance=acceptance,
        clipped_fraction=clipped,
        score=float(score),
        floor=float(floor),
        metric=metric,
        seconds=time.perf_counter() - start_time,
    )
    return result, idata
