"""The validation zoo: a default-settings DP step on every zoo model, next to a reference.

For each model × n × ε it simulates the data (fixed seed), builds the model as PyMC's docs write
it (:mod:`pymc_dp.experiments.zoo`), computes the non-private reference posterior on the same
data (Laplace, importance-corrected; ``--reference nuts`` for small n), builds the DP step with
**default settings only**::

    pymc_dp.DPPenalty(budget=pymc_dp.PrivacyBudget(epsilon=eps, delta=0.1 / n))   # --step penalty
    pymc_dp.DPHMC(budget=...)                                                      # --step hmc

and runs ``pymc_dp.sample(step, chains=chains, progressbar=False)`` from PyMC's default initial
point. One row per run: the model, n, d (unconstrained parameters), ε, the step's predicted ESS
(``step.predicted_ess()`` where the step has it, NaN otherwise), max R̂, min and median bulk
ESS, the smallest bulk ESS an ideal chain with the predicted ESS would show over as many
components (:func:`ideal_min_ess`: the yardstick for the minimum), the
largest ``|mean − reference mean|`` in reference sds and in the run's own sds (how honest its
intervals are about its error), the range of sd ratios (DP / reference),
the ε spent, the stated tilt of the target by the centre's noise (in posterior sd) and the
directions the Fisher release left unresolved (from the release's privacy metadata,
:func:`pymc_dp.privacy_report`), the first words of each warning pymc_dp issued, and the wall
time of building the step and sampling. A run that raises is recorded with the error's class
and the table goes on. The rows go to ``--out`` (CSV) as they finish; a Markdown table is
printed at the end.

Run: ``python benchmarks/zoo.py --n 100000 --epsilon 1 5 10 --models all --step penalty
--chains 4 --out zoo.csv``.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import sys
import time
import warnings
from typing import Any

import numpy as np

import pymc_dp
from pymc_dp._compat import group_dataset
from pymc_dp.accounting import GaussianCost, compose
from pymc_dp.experiments.zoo import ZOO, Reference, summarize, unconstrained_dim

COLUMNS = (
    "model",
    "n",
    "d",
    "epsilon",
    "step",
    "predicted_ess",
    "rhat_max",
    "ess_bulk_min",
    "ess_bulk_median",
    "ideal_min_ess",
    "max_abs_mean_diff_sd",
    "max_abs_mean_diff_own_sd",
    "sd_ratio_min",
    "sd_ratio_max",
    "acceptance",
    "epsilon_spent",
    "centre_shift_sd",
    "unresolved",
    "warnings",
    "seconds",
    "reference",
    "error",
)
DATA_SEED = 0

# --explicit (hidden; for smoke tests until the default-settings constructors exist): explicit
# step settings, none of them read from the data. The noise is calibrated so that the budget
# buys --explicit-iterations iterations per chain.
EXPLICIT_LLR_CLIP = 2.0
EXPLICIT_GRAD_CLIP = 5.0
EXPLICIT_LEAPFROG = 10


def default_step(kind: str, epsilon: float, n: int) -> Any:
    """The DP step with default settings only (inside the model's context)."""
    budget = pymc_dp.PrivacyBudget(epsilon=epsilon, delta=0.1 / n)
    if kind == "penalty":
        return pymc_dp.DPPenalty(budget=budget)
    return pymc_dp.DPHMC(budget=budget)


def explicit_step(kind: str, epsilon: float, n: int, d: int, chains: int, per_chain: int) -> Any:
    """Explicit, data-independent settings (hidden ``--explicit``), inside the model's context.

    Random-walk and leapfrog scales ``∝ 1/√n`` (a data-informed posterior's width); noise
    multipliers calibrated to ``per_chain`` iterations per chain.
    """
    budget = pymc_dp.PrivacyBudget(epsilon=epsilon, delta=0.1 / n)
    iterations = chains * per_chain
    scale = 1.0 / math.sqrt(n)
    if kind == "penalty":
        z = budget.calibrate_noise(GaussianCost.from_noise_multiplier, iterations)
        return pymc_dp.DPPenalty(
            budget=budget,
            llr_clip=EXPLICIT_LLR_CLIP,
            noise_multiplier=z,
            proposal_scale=2.38 / math.sqrt(d) * scale,
        )
    leapfrog = EXPLICIT_LEAPFROG
    ratio = math.sqrt(leapfrog + 1)  # equal shares of μ for the ratio and the gradients

    def cost(z: float) -> Any:
        return compose(
            GaussianCost.from_noise_multiplier(z),
            (GaussianCost.from_noise_multiplier(z * ratio), leapfrog + 1),
        )

    z = budget.calibrate_noise(cost, iterations)
    return pymc_dp.DPHMC(
        budget=budget,
        step_size=scale / leapfrog,
        n_steps=leapfrog,
        grad_clip=EXPLICIT_GRAD_CLIP,
        llr_clip=EXPLICIT_LLR_CLIP,
        llr_noise_multiplier=z,
        grad_noise_multiplier=z * ratio,
    )


def predicted_ess(step: Any) -> float:
    """``step.predicted_ess()`` where the step has it, NaN otherwise."""
    method = getattr(step, "predicted_ess", None)
    if method is None:
        return math.nan
    try:
        return float(method())
    except Exception as error:  # a bound that cannot be computed is not a failed run
        print(f"  predicted_ess: {type(error).__name__}: {error}", file=sys.stderr)
        return math.nan


def ideal_min_ess(
    predicted: float, chains: int, draws: int, components: int, *, reps: int = 5, seed: int = 0
) -> float:
    """The smallest bulk ESS over ``components`` coordinates of an ideal chain, median of
    ``reps`` simulations (public: no data).

    The ideal chain is what :mod:`pymc_dp.prediction` assumes: each iteration it jumps, with
    the probability ``m`` that gives ``predicted = chains · draws · m / (2 − m)``, to a fresh
    independent draw of every coordinate, and stays put otherwise. Its expected ESS per
    coordinate is the prediction; the smallest of many coordinates' *estimates* is lower
    (every coordinate shares the chain's jumps, and each estimate is noisy), so a run's
    minimum is read against this, not against the prediction itself.
    """
    if not (math.isfinite(predicted) and predicted > 0 and chains > 0 and draws > 1):
        return math.nan
    import arviz as az

    rate = predicted / (chains * draws)
    moving = min(2.0 * rate / (1.0 + rate), 1.0)  # solves rate = m / (2 − m)
    rng = np.random.default_rng(seed)
    minima = []
    for _ in range(reps):
        jumps = rng.uniform(size=(chains, draws)) < moving
        jumps[:, 0] = True
        index = np.maximum.accumulate(np.where(jumps, np.arange(draws), 0), axis=1)
        fresh = rng.standard_normal((chains, draws, components))
        held = np.take_along_axis(fresh, index[:, :, None], axis=1)
        minima.append(min(float(az.ess(held[:, :, j], method="bulk")) for j in range(components)))
    return float(np.median(minima))


def run_one(
    name: str,
    model: Any,
    ref: Reference,
    *,
    n: int,
    d: int,
    epsilon: float,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One DP run; the row (``error`` names the exception's class if it raised)."""
    row: dict[str, Any] = {
        "model": name,
        "n": n,
        "d": d,
        "epsilon": epsilon,
        "step": args.step,
        "reference": f"{ref.method} (ESS {ref.ess:.0f})",
        "error": "",
    }
    start = time.perf_counter()
    try:
        with model:
            if args.explicit:
                step = explicit_step(
                    args.step, epsilon, n, d, args.chains, args.explicit_iterations
                )
            else:
                step = default_step(args.step, epsilon, n)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            idata = pymc_dp.sample(
                step,
                chains=args.chains,
                progressbar=False,
                cores=args.cores,
                random_seed=args.seed,
            )
        row["warnings"] = _pymc_dp_warnings(caught)
        row["predicted_ess"] = predicted_ess(step)  # public: from the prepared plan
        row["seconds"] = time.perf_counter() - start
        row.update(summarize(idata, ref))
        posterior = group_dataset(idata, "posterior")
        chains, draws = posterior.sizes["chain"], posterior.sizes["draw"]
        components = sum(int(np.prod(v.shape[2:])) for v in posterior.data_vars.values())
        row["ideal_min_ess"] = ideal_min_ess(row["predicted_ess"], chains, draws, components)
        report = pymc_dp.privacy_report(idata, show=False)
        row["epsilon_spent"] = report["dp_epsilon_spent"]
        row["centre_shift_sd"] = report.get("dp_centre_shift_sd", "")
        row["unresolved"] = report.get("dp_unresolved_directions", "")
    except Exception as error:
        row["seconds"] = time.perf_counter() - start
        row["error"] = type(error).__name__
        print(f"  {name} n={n} ε={epsilon:g}: {type(error).__name__}: {error}", file=sys.stderr)
    return row


def _pymc_dp_warnings(caught: list[warnings.WarningMessage]) -> str:
    """The first words of each distinct warning that pymc_dp issued during a run."""
    seen: list[str] = []
    for item in caught:
        if not item.category.__module__.startswith("pymc_dp"):
            continue
        words = item.category.__name__ + ": " + " ".join(str(item.message).split()[:8])
        if words not in seen:
            seen.append(words)
    return " / ".join(seen)


def _cell(value: Any) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.3e}"
    return str(value)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in COLUMNS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100_000], help="rows (several ok)")
    parser.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 5.0, 10.0])
    parser.add_argument(
        "--models", nargs="+", default=["all"], help=f"'all' or some of {', '.join(ZOO)}"
    )
    parser.add_argument("--step", choices=("penalty", "hmc"), default="penalty")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--cores", type=int, default=None, help="passed to pm.sample")
    parser.add_argument("--seed", type=int, default=0, help="public randomness of the runs")
    parser.add_argument(
        "--reference",
        choices=("laplace", "nuts"),
        default="laplace",
        help="laplace (importance-corrected, for n ≥ 1e5) or nuts (short, for small n)",
    )
    parser.add_argument("--out", default="zoo.csv", help="CSV file (written as rows finish)")
    parser.add_argument("--explicit", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--explicit-iterations", type=int, default=1000, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = list(ZOO) if args.models == ["all"] else args.models
    unknown = sorted(set(names) - set(ZOO))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {list(ZOO)}")

    rows: list[dict[str, Any]] = []
    with open(args.out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for name in names:
            zoo_model = ZOO[name]
            for n in args.n:
                data, model = zoo_model.model(n, seed=DATA_SEED)
                d = unconstrained_dim(model)
                try:
                    ref = zoo_model.reference(data, method=args.reference)
                except Exception as error:
                    print(f"  {name} n={n} reference: {type(error).__name__}: {error}")
                    ref = None
                for epsilon in args.epsilon:
                    if ref is None:
                        row = {"model": name, "n": n, "d": d, "epsilon": epsilon}
                        row.update(step=args.step, error="reference failed")
                    else:
                        row = run_one(name, model, ref, n=n, d=d, epsilon=epsilon, args=args)
                    rows.append(row)
                    writer.writerow({c: row.get(c, "") for c in COLUMNS})
                    handle.flush()
                    print(
                        f"{name} n={n} ε={epsilon:g}: done in {row['seconds']:.1f} s"
                        if "seconds" in row
                        else f"{name} n={n} ε={epsilon:g}: skipped",
                        flush=True,
                    )
    if args.explicit:
        print("\n(--explicit: explicit step settings, not the defaults)")
    print()
    print(markdown(rows))
    return rows


if __name__ == "__main__":
    warnings.filterwarnings("ignore")  # convergence, privacy (δ) and PyMC warnings: see rows
    logging.getLogger("pymc").setLevel(logging.CRITICAL)  # its ESS note is an ERROR
    np.seterr(all="ignore")
    main()
