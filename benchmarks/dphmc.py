"""Wall time per iteration of DPHMC next to PyMC's own (non-DP) HamiltonianMC.

Both run on the seeds' flat 2-d banana (theory §5, n = 100 000 rows) with the same number of
leapfrog steps ``L`` and the same fixed step size (no adaptation, no jitter), one chain, calling
``step.step(point)`` directly so that only the iterations are timed. Per iteration DPHMC reads
the data ``L + 1`` times for clipped per-row gradient sums and once for the per-row
log-likelihood at the proposal; HamiltonianMC evaluates PyMC's summed log-density and gradient
``L`` times (it keeps the gradient of the current state).

The last line is ``ratio <r>``: DPHMC seconds per iteration / HamiltonianMC seconds per
iteration (target: ``r ≤ 1.5``). Run: ``python benchmarks/dphmc.py`` (``--n 20000`` for a quick
look).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pymc as pm

import pymc_dp
from pymc_dp.testing import Banana

warnings.filterwarnings("ignore")


def seconds_per_iteration(step, point: dict, iterations: int, repeats: int) -> float:
    """Best-of-``repeats`` mean wall time of ``iterations`` calls of ``step.step``."""
    for _ in range(3):  # warm up (first calls, caches)
        point, _ = step.step(point)
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            point, _ = step.step(point)
        best = min(best, (time.perf_counter() - start) / iterations)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="rows (default 100 000)")
    parser.add_argument("--steps", type=int, default=25, help="leapfrog steps L (default 25)")
    parser.add_argument("--iterations", type=int, default=20, help="iterations per repeat")
    parser.add_argument("--repeats", type=int, default=5, help="repeats (best is kept)")
    args = parser.parse_args()

    spec = Banana(d=2, a=20.0)
    data = spec.simulate(args.n, np.random.default_rng(0))
    mean, var = spec.posterior_params(data)
    model = spec.model(data)
    start = {"theta": spec.g(mean)}
    step_size = 0.5 * float(np.sqrt(var.min()))  # a usable step on this posterior
    L = args.steps

    with model:
        dp = pymc_dp.DPHMC(
            budget=pymc_dp.PrivacyBudget(epsilon=1e6, delta=1e-6),
            step_size=step_size,
            n_steps=L,
            grad_clip=5.0,
            llr_clip=2.0,
            grad_noise_multiplier=10.0,
            llr_noise_multiplier=10.0,
            step_jitter=False,
        )
        dp.tune = False  # fixed step size, as HamiltonianMC below
        hmc = pm.HamiltonianMC(
            step_scale=step_size * 2**0.25,  # PyMC's step size is step_scale / d^(1/4)
            path_length=(L + 0.5) * step_size,  # int(path_length / step_size) = L
            adapt_step_size=False,
            step_rand=lambda size, rng=None: size,  # no jitter
            scaling=np.ones(2),
        )
        hmc.tune = False
    point = {**model.initial_point(), **start}
    assert hmc.step(point)[1][0]["n_steps"] == L

    t_dp = seconds_per_iteration(dp, point, args.iterations, args.repeats)
    t_hmc = seconds_per_iteration(hmc, point, args.iterations, args.repeats)
    print(f"2-d banana, n = {args.n}, L = {L}, step size {step_size:.3g}")
    print(f"{'sampler':<28}{'ms / iteration':>16}{'data reads / iteration':>26}")
    print(f"{'pm.HamiltonianMC (non-DP)':<28}{1e3 * t_hmc:>16.1f}{L:>26}")
    print(f"{'pymc_dp.DPHMC':<28}{1e3 * t_dp:>16.1f}{L + 2:>26}")
    print(f"ratio {t_dp / t_hmc:.2f}")


if __name__ == "__main__":
    main()
