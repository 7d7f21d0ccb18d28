"""Per-iteration overhead of the DP steps: wall time per iteration over the time of its data passes.

A DP iteration should cost the passes over the data that it makes (the oracle's compiled
per-row functions) plus a small constant. This script runs each step as a user does
(``pymc_dp.sample(step, chains=1)``, automatic settings, a budget only), and during the
sampling loop measures

* ``iter ms``: wall time per iteration, from the first call of ``step.step`` to the return of
  the last one, so PyMC's plumbing between calls (point dicts, trace, stats) is included;
* ``passes ms``: time per iteration spent inside the oracle's compiled per-row functions (the
  data passes themselves; for the centred gradient sum, also its per-row product with the
  metric where that runs in NumPy), and ``passes``: how many full passes over the rows an
  iteration makes;
* ``ratio = iter ms / passes ms`` (target ≤ 1.3: a DP iteration costs its data passes plus a
  small constant).

The last line is ``overhead ratio <r> (target 1.3)``: the worst ratio over the models with a
target. Run: ``python benchmarks/iteration.py`` (``--n 20000`` for a quick look, ``--steps
DPPenalty`` for one step).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from oracle import MODELS as ORACLE_MODELS  # benchmarks/oracle.py

import pymc_dp
from pymc_dp.oracle import RowLikelihood

warnings.filterwarnings("ignore")

TARGET = 1.3


# the first three of benchmarks/oracle.py's models (those with a per-pass target)
MODELS = {name: build for name, (build, _) in list(ORACLE_MODELS.items())[:3]}
STEPS = {
    "DPPenalty": lambda budget: pymc_dp.DPPenalty(budget=budget),
    "DPHMC": lambda budget: pymc_dp.DPHMC(budget=budget),
}


class _Timer:
    """Wall time of the data passes while ``active``: inside the oracle's compiled functions,
    and the whole centred gradient sum, whose per-row product with the metric runs in NumPy
    after the compiled pass where that is faster (PyTensor's C backend, gathered variables)."""

    def __init__(self) -> None:
        self.active = False
        self.inside = False
        self.seconds = 0.0
        self.original = RowLikelihood._private_call
        self.original_centred = RowLikelihood.clipped_centred_grad_sum

    def _timed(self, fn, *args, **kwargs):
        if not self.active or self.inside:
            return fn(*args, **kwargs)
        start = time.perf_counter()
        self.inside = True
        try:
            return fn(*args, **kwargs)
        finally:
            self.inside = False
            self.seconds += time.perf_counter() - start

    def install(self) -> None:
        timer = self
        RowLikelihood._private_call = lambda oracle, fn, *args: timer._timed(
            timer.original, oracle, fn, *args
        )
        RowLikelihood.clipped_centred_grad_sum = lambda oracle, *args, **kwargs: timer._timed(
            timer.original_centred, oracle, *args, **kwargs
        )


def run(build, step_name: str, n: int, epsilon: float, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    model = build(n, rng)
    timer = _Timer()
    timer.install()
    with model:
        step = STEPS[step_name](pymc_dp.PrivacyBudget(epsilon=epsilon, delta=1e-6))
    step.prepare(chains=1)
    oracle = step._channel._oracle  # its pass counters (public instrumentation)
    marks: list[float] = []
    original_step = step.step

    def step_and_mark(point):
        if not marks:
            marks.append(time.perf_counter())
            rows0, calls0 = oracle.rows_read, oracle.calls
            marks.extend([rows0, calls0])
            timer.active = True
        result = original_step(point)
        marks[3:] = [time.perf_counter()]
        return result

    step.step = step_and_mark
    pymc_dp.sample(
        step, chains=1, random_seed=seed, progressbar=False, compute_convergence_checks=False
    )
    timer.active = False
    iterations = step._iteration
    wall = marks[3] - marks[0]
    passes = (oracle.rows_read - marks[1]) / oracle.n_rows / iterations
    return {
        "iterations": iterations,
        "iter_ms": 1e3 * wall / iterations,
        "passes_ms": 1e3 * timer.seconds / iterations,
        "passes": passes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="rows (default 100 000)")
    parser.add_argument("--epsilon", type=float, default=2.0, help="budget ε (default 2)")
    parser.add_argument("--steps", nargs="*", default=list(STEPS), choices=list(STEPS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"n = {args.n}, ε = {args.epsilon}, δ = 1e-6, one chain, automatic settings")
    print(
        f"{'step':10s} {'model':28s} {'iters':>6s} {'iter ms':>8s} {'passes ms':>10s} "
        f"{'passes':>7s} {'ratio':>6s}"
    )
    worst = 0.0
    for step_name in args.steps:
        for name, build in MODELS.items():
            r = run(build, step_name, args.n, args.epsilon, args.seed)
            ratio = r["iter_ms"] / r["passes_ms"]
            worst = max(worst, ratio)
            print(
                f"{step_name:10s} {name:28s} {r['iterations']:6d} {r['iter_ms']:8.3f} "
                f"{r['passes_ms']:10.3f} {r['passes']:7.2f} {ratio:6.2f}",
                flush=True,
            )
    print(f"overhead ratio {worst:.2f} (target {TARGET})")


if __name__ == "__main__":
    main()
