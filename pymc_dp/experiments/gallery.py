"""What every gallery script does (``examples/gallery/*.py``): sample one model with every DP step.

A gallery script defines an ordinary PyMC model and calls :func:`main` with it. :func:`main`
simulates the seeds' data set for that model (theory §5), checks the script's model against the
registry's (same log-density), and then, for every applicable DP step (settings from
:mod:`pymc_dp.experiments.recipes`), runs :func:`pymc_dp.sample` with two chains started at
reference posterior draws, prints ``az.summary`` and :func:`pymc_dp.privacy_report`, and saves
a trace plot per step and one figure of all steps' draws against the exact posterior.
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["main"]

_QUICK_N = 10_000
_QUICK_DRAWS = 120
# The stochastic-gradient samplers' budgets buy millions of cheap iterations at ε = 4; a gallery
# run stops at this many per chain (20 % tuning) and so spends less than its ε.
_MAX_ITERATIONS = 100_000
_DEFAULT_OUT = Path("docs") / "gallery"


def _check_same_model(script_model: Any, registry_model: Any, point: np.ndarray) -> None:
    """The script's model must be the registry's (whose data and exact posterior we use)."""
    from pymc_dp.oracle import RowLikelihood

    mine, theirs = RowLikelihood(script_model), RowLikelihood(registry_model)
    a = mine.loglik_rows(point).sum() + mine.space.logprior(point)
    b = theirs.loglik_rows(point).sum() + theirs.space.logprior(point)
    if not np.isclose(a, b, rtol=1e-9, atol=1e-6):
        raise RuntimeError(f"the script's model differs from the registry's: logp {a} vs {b}.")


def main(
    variants: dict[str, tuple[str, dict[str, Any]]],
    build_model: Callable[..., Any],
    description: str,
) -> None:
    """Command line of a gallery script: ``--variant``, ``--quick``, ``--epsilon``, ``--out``.

    ``variants`` maps a variant name (the first is the default) to the registry problem and the
    keyword arguments of ``build_model(data, **kwargs)`` for it.
    """
    import arviz as az

    from pymc_dp.experiments import pyplot

    plt = pyplot()

    import pymc_dp
    from pymc_dp._compat import trace_figure
    from pymc_dp.experiments.recipes import applicable_steps, build_step
    from pymc_dp.experiments.run import prepare

    parser = argparse.ArgumentParser(description=description.strip().splitlines()[0])
    parser.add_argument("--variant", choices=list(variants), default=next(iter(variants)))
    parser.add_argument("--epsilon", type=float, default=4.0)
    parser.add_argument("--quick", action="store_true", help=f"n = {_QUICK_N}, few draws")
    parser.add_argument("--out", type=Path, default=_DEFAULT_OUT, help="figure folder")
    parser.add_argument("--steps", nargs="+", help="only these steps")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("pymc").setLevel(logging.ERROR)
    start_time = time.perf_counter()

    problem_name, model_kwargs = variants[args.variant]
    prep = prepare(problem_name, _QUICK_N if args.quick else None)
    problem, data, reference = prep.problem, prep.data, prep.reference
    model = build_model(data, **model_kwargs)
    _check_same_model(model, problem.model(data), reference.mean(0))
    print(f"# {problem.title}: n = {problem.n}, T = {problem.temperature:g}, d = {problem.d}")
    print(f"ε = {args.epsilon:g}, δ = 0.1/n = {0.1 / problem.n:g}, 2 chains share the budget\n")
    args.out.mkdir(parents=True, exist_ok=True)
    steps = args.steps or applicable_steps(problem)
    rng = np.random.default_rng(0)
    results = {}
    for name in steps:
        budget = pymc_dp.PrivacyBudget(epsilon=args.epsilon, delta=0.1 / problem.n)
        step = build_step(
            name, problem, model, prep.tuning, budget, adapt=True, nonprivate_diagnostics=False
        )
        starts = reference[rng.choice(len(reference), size=2, replace=False)]
        per_chain = budget.iterations_per_chain(step.cost, 2)
        if args.quick:
            tune, draws = 0, min(_QUICK_DRAWS, per_chain)
        elif per_chain > _MAX_ITERATIONS:
            tune, draws = _MAX_ITERATIONS // 5, _MAX_ITERATIONS - _MAX_ITERATIONS // 5
            print(
                f"({name}: the budget allows {per_chain} iterations per chain; this run stops "
                f"at {_MAX_ITERATIONS} and spends less than ε = {args.epsilon:g})"
            )
        else:
            tune, draws = 0.2, None  # the budget's share: 20 % tuning, the rest kept
        idata = pymc_dp.sample(
            step,
            chains=2,
            tune=tune,
            draws=draws,
            cores=1,
            random_seed=1,
            progressbar=False,
            initvals=[{"theta": s} for s in starts],
            model=model,
        )
        print(f"## {name}")
        print(az.summary(idata, var_names=["theta"], kind="stats").round(4).to_string())
        pymc_dp.privacy_report(idata)
        print()
        fig = trace_figure(idata, var_names=["theta"])
        fig.suptitle(f"{problem.title}: {name} (ε = {args.epsilon:g})")
        fig.savefig(args.out / f"{problem_name}_{name}_trace.png", dpi=90)
        plt.close(fig)
        results[name] = idata.posterior["theta"].values.reshape(-1, problem.d)

    fig, axes = plt.subplots(
        1, len(results), figsize=(3.6 * len(results), 3.6), squeeze=False, constrained_layout=True
    )
    for ax, (name, draws) in zip(axes[0], results.items(), strict=True):
        label = "exact" if problem.has_exact_sample else "reference (NUTS)"
        ax.plot(*reference[:, :2].T, ".", color="0.75", ms=2, label=label)
        ax.plot(*draws[:, :2].T, ".", color="C3", ms=3, alpha=0.6, label=name)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("θ₁")
        ax.legend(fontsize=7, loc="upper right")
    axes[0][0].set_ylabel("θ₂")
    fig.suptitle(f"{problem.title}, ε = {args.epsilon:g}: DP draws vs the posterior")
    path = args.out / f"{problem_name}_posterior.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    print(f"figures in {args.out}; wall time {time.perf_counter() - start_time:.0f} s")
