"""The reproduction runner (theory §5): ``python -m pymc_dp.experiments``.

Four parts (``--part``, one or several; all by default), each writing CSV results and PNG
figures to ``--out``:

* ``comparison`` — MMD vs ε for every applicable step on the 2-d flat and tempered banana and
  the correlated Gaussian, several seeds each (``comparison_<recipe>.csv``,
  ``comparison_<recipe>.png``, ``comparison_<recipe>_table.md``). ``--recipe private`` (the
  default) runs the steps as a user would: automatic settings from PyMC's initial point,
  everything read from the data accounted; ``--recipe seeds`` the seeds' non-private settings
  and starts at exact posterior draws, kept only to compare (:mod:`.recipes`);
* ``paper`` — the DP-HMC paper's comparison (its §4): MMD vs ε for DP-SGLD and DP-SGNHT next to
  DP-HMC and the DP penalty on the paper's banana and 10-d Gaussian, with the paper's settings
  (``paper_comparison.csv``, ``.png``, ``_table.md``). The SG samplers' budgets allow millions
  of iterations at large ε; runs are capped at :data:`PAPER_MAX_ITERATIONS` (the table gives
  the iterations run, and a capped run spends less than its ε; ``--paper-max-iterations 0``
  lifts the cap);
* ``clipping`` — MMD vs the share of clipped ratios, non-DP (``clipping.csv``, ``clipping.png``);
* ``accounting`` — iterations allowed by tight PLD vs zCDP accounting
  (``accounting.csv``, ``accounting_iterations.png``).

Runs already in a CSV are skipped, so an interrupted run resumes where it stopped
(``--fresh`` starts over). ``--quick`` shrinks everything (fewer rows, capped iterations, one
seed) to check the pipeline in a few minutes; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

_DEFAULT_OUT = Path("docs") / "reproduction"
COMPARISON_PROBLEMS = ("flat_banana_2d", "tempered_banana_2d", "correlated_gaussian")
EPSILONS = (1.0, 2.0, 4.0, 6.0)
PAPER_PROBLEMS = ("paper_banana", "gaussian_10d")
PAPER_EPSILONS = (2.0, 6.0, 10.0, 15.0)  # from the paper's grid 2, 4, …, 15
PAPER_MAX_ITERATIONS = 200_000
_QUICK_N = 10_000
_QUICK_ITERATIONS = 200


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger("pymc").setLevel(logging.ERROR)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _comparison_task(task: dict[str, Any]) -> dict[str, Any]:
    _quiet()
    from pymc_dp import InsufficientDataError
    from pymc_dp.experiments.problems import get_problem
    from pymc_dp.experiments.run import RunResult, run

    try:
        result, _ = run(
            task["problem"],
            task["step"],
            task["epsilon"],
            task["seed"],
            n=task["n"],
            max_iterations=task["max_iterations"],
            recipe=task["recipe"],
        )
    except InsufficientDataError as error:
        if task["recipe"] != "private":
            raise
        # the private pipeline refuses before sampling when it cannot bound a clip: an outcome
        # a user would see, recorded (no draws, no score) rather than ending the table
        nan = float("nan")
        result = RunResult(
            problem=task["problem"],
            step=task["step"],
            recipe=task["recipe"],
            epsilon=float(task["epsilon"]),
            seed=int(task["seed"]),
            n=get_problem(task["problem"]).n if task["n"] is None else int(task["n"]),
            iterations=0,
            acceptance=nan,
            clipped_fraction=nan,
            score=nan,
            floor=nan,
            metric=f"refused: {type(error).__name__}",
            seconds=nan,
        )
    return result.as_row()


def _clipping_task(task: dict[str, Any]) -> dict[str, Any]:
    _quiet()
    from pymc_dp.experiments.clipping import clipping_run

    return clipping_run(
        task["sampler"],
        task["clip_factor"],
        task["seed"],
        n=task["n"],
        iterations=task["iterations"],
    )


def _read_done(path: Path, keys: tuple[str, ...]) -> set[tuple[str, ...]]:
    if not path.exists():
        return set()
    with open(path, newline="") as handle:
        return {tuple(str(row[k]) for k in keys) for row in csv.DictReader(handle)}


def _run_tasks(
    tasks: list[dict[str, Any]],
    worker: Callable[[dict[str, Any]], dict[str, Any]],
    path: Path,
    keys: tuple[str, ...],
    workers: int,
    label: str,
) -> None:
    """Run the tasks not yet in ``path``, appending each result as it arrives (resumable)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    done = _read_done(path, keys)
    todo = [t for t in tasks if tuple(str(t[k]) for k in keys) not in done]
    print(f"{label}: {len(tasks) - len(todo)} of {len(tasks)} runs already in {path}")
    if not todo:
        return
    columns = ["{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]

    def record(row: dict[str, Any]) -> None:
        new_file = not path.exists()
        with open(path, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(row))
            if new_file:
                writer.writeheader()
            writer.writerow(row)

    with Progress(*columns) as progress:
        bar = progress.add_task(label, total=len(todo))
        if workers <= 1:
            for task in todo:
                record(worker(task))
                progress.advance(bar)
            return
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            for future in as_completed([pool.submit(worker, t) for t in todo]):
                record(future.result())
                progress.advance(bar)


def _comparison(
    args: argparse.Namespace,
    *,
    stem: str,
    problems: Iterable[str],
    epsilons: Iterable[float],
    recipe: str,
    max_iterations: int | None = None,
) -> None:
    from pymc_dp.experiments.problems import get_problem
    from pymc_dp.experiments.recipes import applicable_steps

    cap = _QUICK_ITERATIONS if args.quick else max_iterations
    tasks = [
        {
            "problem": name,
            "step": step,
            "recipe": recipe,
            "epsilon": float(eps),
            "seed": seed,
            "n": _QUICK_N if args.quick else None,
            "max_iterations": cap,
        }
        for name in problems
        for step in applicable_steps(get_problem(name), recipe)
        if args.steps is None or step in args.steps
        for eps in epsilons
        for seed in range(args.seeds)
    ]
    path = args.out / f"{stem}.csv"
    _run_tasks(
        tasks,
        _comparison_task,
        path,
        ("problem", "step", "epsilon", "seed"),
        args.workers,
        f"{stem.replace('_', ' ')} ({recipe} recipe)",
    )
    if not path.exists():
        print(f"{stem}: no runs selected, nothing to plot")
        return
    plot_comparison(path, args.out / f"{stem}.png")
    write_comparison_table(path, args.out / f"{stem}_table.md")


def _clipping(args: argparse.Namespace) -> None:
    from pymc_dp.experiments.clipping import CLIP_FACTORS

    tasks = [
        {
            "sampler": sampler,
            "clip_factor": float(factor),
            "seed": seed,
            "n": _QUICK_N if args.quick else None,
            "iterations": (300 if sampler == "random walk" else 60) if args.quick else None,
        }
        for sampler in ("random walk", "HMC")
        for factor in ((CLIP_FACTORS[0], 1.0, CLIP_FACTORS[-1]) if args.quick else CLIP_FACTORS)
        for seed in range(args.seeds)
    ]
    path = args.out / "clipping.csv"
    _run_tasks(
        tasks, _clipping_task, path, ("sampler", "clip_factor", "seed"), args.workers, "clipping"
    )
    plot_clipping(path, args.out / "clipping.png")
    write_clipping_table(path, args.out / "clipping_table.md")


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def write_comparison_table(path: Path, out: Path) -> None:
    """Markdown table: median MMD (min–max over seeds) per model, step and ε; iterations.

    Each cell also gives the step's own floor (the MMD between two exact samples of the size its
    runs compared: few kept draws make a high floor); the last row per model is the median floor.
    """
    import numpy as np

    rows = _rows(path)
    eps_all = sorted({float(r["epsilon"]) for r in rows})
    head = "| model | step | " + " | ".join(f"ε = {e:g}" for e in eps_all) + " |"
    lines = [head, "|" + "---|" * (len(eps_all) + 2)]
    for problem in dict.fromkeys(r["problem"] for r in rows):
        mine = [r for r in rows if r["problem"] == problem]
        for step in [*dict.fromkeys(r["step"] for r in mine), "exact-sample floor"]:
            cells = []
            for e in eps_all:
                at = [r for r in mine if float(r["epsilon"]) == e]
                if step != "exact-sample floor":
                    at = [r for r in at if r["step"] == step]
                key = "floor" if step == "exact-sample floor" else "score"
                refused = sum(r["metric"].startswith("refused") for r in at)
                at = [r for r in at if not r["metric"].startswith("refused")]
                values = [float(r[key]) for r in at]
                if not values:
                    cells.append(f"{refused} refused" if refused and key == "score" else "")
                    continue
                its = int(np.median([int(r["iterations"]) for r in at]))
                cell = f"{np.median(values):.3f}"
                if len(values) > 1 and key == "score":
                    cell += f" ({min(values):.2f}–{max(values):.2f})"
                if key == "score":
                    # this step's own floor: it depends on how many draws its runs kept
                    own_floor = np.median([float(r["floor"]) for r in at])
                    cell += f"; {its} it; floor {own_floor:.2f}"
                    if refused:
                        cell += f"; {refused} refused before sampling"
                cells.append(cell)
            lines.append(f"| {problem.replace('_', ' ')} | {step} | " + " | ".join(cells) + " |")
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


def write_clipping_table(path: Path, out: Path) -> None:
    """Markdown table: clipped fraction and MMD (medians over seeds) per sampler and clip bound."""
    import numpy as np

    rows = _rows(path)
    lines = [
        "| sampler | clip bound (× rule) | ratios clipped | MMD | floor |",
        "|---|---|---|---|---|",
    ]
    for sampler in dict.fromkeys(r["sampler"] for r in rows):
        for factor in sorted({float(r["clip_factor"]) for r in rows if r["sampler"] == sampler}):
            at = [r for r in rows if r["sampler"] == sampler and float(r["clip_factor"]) == factor]
            clipped = np.median([float(r["clipped_fraction"]) for r in at])
            mmd = np.median([float(r["mmd"]) for r in at])
            floor = np.median([float(r["floor"]) for r in at])
            lines.append(f"| {sampler} | {factor:g} | {clipped:.1%} | {mmd:.3f} | {floor:.3f} |")
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


def plot_comparison(path: Path, out: Path) -> None:
    """One panel per model: median MMD over seeds vs ε per step (band: min–max), and the floor."""
    from pymc_dp.experiments import pyplot

    plt = pyplot()
    import numpy as np

    rows = [r for r in _rows(path) if not r["metric"].startswith("refused")]
    problems = list(dict.fromkeys(r["problem"] for r in rows))
    if not problems:  # every run refused: nothing to plot
        print(f"no sampled runs in {path}: {out} not written")
        return
    fig, axes = plt.subplots(
        1, len(problems), figsize=(4.6 * len(problems), 4.0), squeeze=False, constrained_layout=True
    )
    for ax, problem in zip(axes[0], problems, strict=True):
        mine = [r for r in rows if r["problem"] == problem]
        for i, step in enumerate(dict.fromkeys(r["step"] for r in mine)):
            eps = sorted({float(r["epsilon"]) for r in mine if r["step"] == step})
            scores = [
                [float(r["score"]) for r in mine if r["step"] == step and float(r["epsilon"]) == e]
                for e in eps
            ]
            med = [np.median(s) for s in scores]
            ax.plot(eps, med, "o-", color=f"C{i}", label=step)
            ax.fill_between(
                eps, [min(s) for s in scores], [max(s) for s in scores], color=f"C{i}", alpha=0.15
            )
        eps_all = sorted({float(r["epsilon"]) for r in mine})
        floor = [
            np.median([float(r["floor"]) for r in mine if float(r["epsilon"]) == e])
            for e in eps_all
        ]
        ax.plot(eps_all, floor, "k--", lw=1, label="exact-sample floor")
        ax.set_title(problem.replace("_", " "))
        ax.set_xlabel("ε  (δ = 0.1/n)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("MMD to the exact posterior (median over seeds)")
    for ax in axes[0]:
        ax.legend(fontsize=7)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    print(f"wrote {out}")


def plot_clipping(path: Path, out: Path) -> None:
    """MMD vs clip bound and vs the fraction of clipped ratios (thesis Figure 6.2, 2-d)."""
    from pymc_dp.experiments import pyplot

    plt = pyplot()

    rows = _rows(path)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.0), constrained_layout=True)
    for i, sampler in enumerate(dict.fromkeys(r["sampler"] for r in rows)):
        mine = [r for r in rows if r["sampler"] == sampler]
        axes[0].plot(
            [float(r["clip_factor"]) for r in mine],
            [float(r["mmd"]) for r in mine],
            "o",
            color=f"C{i}",
            label=sampler,
        )
        axes[1].plot(
            [float(r["clipped_fraction"]) for r in mine],
            [float(r["mmd"]) for r in mine],
            "o",
            color=f"C{i}",
            label=sampler,
        )
    floors = [float(r["floor"]) for r in rows]
    for ax in axes:
        ax.axhline(sum(floors) / len(floors), color="k", ls="--", lw=1, label="exact-sample floor")
        ax.set_ylabel("MMD to the exact posterior")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("clip bound (multiple of the 80th-percentile rule)")
    axes[1].set_xlabel("fraction of ratios clipped")
    axes[0].legend(fontsize=8)
    fig.suptitle("Flat 2-d banana, no DP noise: the bias of clipping alone")
    fig.savefig(out, dpi=120)
    plt.close(fig)
    print(f"wrote {out}")


def main(argv: Iterable[str] | None = None) -> None:
    # here: the module imports PyMC lazily
    from pymc_dp.experiments.recipes import RECIPES, STEPS

    parser = argparse.ArgumentParser(
        prog="python -m pymc_dp.experiments", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=_DEFAULT_OUT, help="results folder")
    parser.add_argument(
        "--part",
        nargs="+",
        choices=("comparison", "paper", "clipping", "accounting", "all"),
        default=["all"],
        help="the parts to run (default: all)",
    )
    parser.add_argument("--problems", nargs="+", default=list(COMPARISON_PROBLEMS))
    parser.add_argument("--epsilons", nargs="+", type=float, default=list(EPSILONS))
    parser.add_argument(
        "--paper-epsilons",
        nargs="+",
        type=float,
        default=list(PAPER_EPSILONS),
        help="ε grid of the paper part",
    )
    parser.add_argument(
        "--paper-max-iterations",
        type=int,
        default=PAPER_MAX_ITERATIONS,
        help="iteration cap of the paper part (0: none, every run spends its whole budget); "
        "runs already in --out are not rerun, so give a new --out for another cap",
    )
    parser.add_argument(
        "--steps", nargs="+", choices=STEPS, help="only these steps (default: all that apply)"
    )
    parser.add_argument("--seeds", type=int, default=3, help="runs per setting")
    parser.add_argument(
        "--recipe",
        choices=RECIPES,
        default="private",
        help="private: automatic settings from PyMC's initial point (what a user gets); "
        "seeds: the seeds' non-private settings, kept only to compare",
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--quick", action="store_true", help="a fast check of the pipeline")
    parser.add_argument("--fresh", action="store_true", help="ignore earlier results")
    args = parser.parse_args(None if argv is None else list(argv))
    if args.paper_max_iterations < 0:
        parser.error("--paper-max-iterations must be 0 (no cap) or positive")
    if args.quick:
        args.seeds = 1
    parts = set(args.part)
    if "all" in parts:
        parts = {"comparison", "paper", "clipping", "accounting"}
    args.out.mkdir(parents=True, exist_ok=True)
    if args.fresh:
        files = {
            "comparison": f"comparison_{args.recipe}.csv",
            "paper": "paper_comparison.csv",
            "clipping": "clipping.csv",
        }
        for part, name in files.items():
            if part in parts:
                (args.out / name).unlink(missing_ok=True)
    _quiet()
    if "accounting" in parts:
        from pymc_dp.experiments import accounting_comparison

        accounting_comparison.main(args.out)
    if "clipping" in parts:
        _clipping(args)
    if "comparison" in parts:
        _comparison(
            args,
            stem=f"comparison_{args.recipe}",
            problems=args.problems,
            epsilons=args.epsilons,
            recipe=args.recipe,
        )
    if "paper" in parts:
        # the paper's own settings: the seeds recipe, on its models and ε grid
        _comparison(
            args,
            stem="paper_comparison",
            problems=PAPER_PROBLEMS,
            epsilons=args.paper_epsilons,
            recipe="seeds",
            max_iterations=args.paper_max_iterations or None,
        )
