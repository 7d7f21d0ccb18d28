"""What secure noise costs: per-iteration time with ``secure_noise=True`` against the fast mode.

For each benchmark model of ``benchmarks/oracle.py`` (n rows, default 100 000) and each of
DPPenalty, DPHMC (3 leapfrog steps) and DPSGLD (batches of 500 rows), builds the step twice —
secure (the default: OS CSPRNG, inverse-CDF Gaussians, snapped releases, rejection-sampled
batches) and ``secure_noise=False`` (NumPy's PCG64, no snapping) — and times the iterations of
one chain run through the step's own loop (no PyMC sampler around it), interleaving the two
so that machine noise hits both alike. Prints milliseconds per iteration and the ratio
secure/fast; the last line is the worst ratio, against the target ≤ 2.

Run: ``python benchmarks/secure_noise.py`` (``--n 20000`` for a quick look).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from oracle import MODELS

import pymc_dp

warnings.filterwarnings("ignore")


def steps(secure: bool) -> dict:
    budget = pymc_dp.PrivacyBudget(epsilon=1e6, delta=1e-6)
    common = {"budget": budget, "secure_noise": secure}
    return {
        "DPPenalty": lambda: pymc_dp.DPPenalty(
            llr_clip=5.0, noise_multiplier=2.0, proposal_scale=0.01, **common
        ),
        "DPHMC": lambda: pymc_dp.DPHMC(
            step_size=0.001,
            n_steps=3,
            grad_clip=5.0,
            llr_clip=5.0,
            grad_noise_multiplier=2.0,
            llr_noise_multiplier=2.0,
            adapt_step_size=False,
            adapt_mass=False,
            **common,
        ),
        "DPSGLD": lambda: pymc_dp.DPSGLD(step_size=1e-4, grad_clip=5.0, batch_size=500, **common),
    }


def ms_per_iteration(step, model, iterations: int) -> float:
    point = model.initial_point()
    step._start_chain(np.random.default_rng(0), iterations, 0, False, None)
    begin = time.perf_counter()
    for _ in range(iterations):
        point, _ = step.step(point)
    return 1e3 * (time.perf_counter() - begin) / iterations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    worst = 0.0
    print(f"{'model':30s} {'step':10s} {'fast ms':>8s} {'secure ms':>9s} {'ratio':>6s}")
    for name, (build, _) in MODELS.items():
        model = build(args.n, np.random.default_rng(0))
        with model:
            built = {secure: {k: f() for k, f in steps(secure).items()} for secure in (False, True)}
        for step_name in built[True]:
            times = {False: [], True: []}
            for _ in range(args.rounds):
                for secure in (False, True):
                    times[secure].append(
                        ms_per_iteration(built[secure][step_name], model, args.iterations)
                    )
            fast, secure = min(times[False]), min(times[True])
            ratio = secure / fast
            worst = max(worst, ratio)
            print(f"{name:30s} {step_name:10s} {fast:8.3f} {secure:9.3f} {ratio:6.2f}")
    print(f"worst ratio {worst:.2f} (target <= 2)")


if __name__ == "__main__":
    main()
