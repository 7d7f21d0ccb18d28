"""DPHMC on the seeds' flat 2-d banana (SPEC §5), scored by MMD against the exact posterior.

The seeds' regime: n = 100 000 rows, one chain spending the whole (ε, δ = 0.1/n) budget,
started near the posterior (standing in for a cheap private point estimate), a fixed step size,
the first half of the chain discarded. Prints the number of iterations the budget allows, the
acceptance rate, the share of clipped per-row quantities at the exact posterior mean (computed
here without noise, for the report only), the MMD (Gaussian kernel, median heuristic) of the
chain to an exact posterior sample, and the floor: the MMD between two exact samples of the
same size.

Run: ``python examples/dphmc_banana.py --epsilon 1`` (and ``4``; ``--chains 4 --epsilon 1e4``
for the low-noise check of the tests).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pymc as pm

import pymc_dp
from pymc_dp.metrics import mmd
from pymc_dp.testing import Banana

warnings.filterwarnings("ignore")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--chains", type=int, default=1)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--tau-g", type=float, default=0.55, help="z_g = tau_g sqrt(n)")
    parser.add_argument("--tau-l", type=float, default=0.1, help="z_l = tau_l sqrt(n)")
    parser.add_argument("--steps", type=int, default=25, help="leapfrog steps L")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start_time = time.perf_counter()

    banana = Banana(d=2, a=20.0)
    rng = np.random.default_rng(args.seed)
    data = banana.simulate(args.n, rng)
    exact = banana.posterior_sample(data, 6000, rng)
    model = banana.model(data)
    sd = exact.std(0)
    with model:
        step = pymc_dp.DPHMC(
            budget=pymc_dp.PrivacyBudget(epsilon=args.epsilon, delta=0.1 / args.n),
            step_size=2.0 / args.steps,  # in posterior-sd units (mass = 1/var): η L = 2
            n_steps=args.steps,
            grad_clip=2.0,
            llr_clip=0.3,
            tau_g=args.tau_g,
            tau_l=args.tau_l,
            mass_diag=1.0 / sd**2,
            adapt_step_size=False,
            adapt_mass=False,
        )
        plan = step.sampling_kwargs(chains=args.chains, tune_fraction=0.0)
        start = exact[0]  # one exact posterior draw: "near the posterior", as the seeds
        idata = pm.sample(
            step=step,
            **plan,
            cores=min(args.chains, 2),
            progressbar=False,
            compute_convergence_checks=False,
            initvals={"theta": start},
        )
    draws = idata.posterior.theta.values
    kept = draws[:, draws.shape[1] // 2 :].reshape(-1, 2)  # discard the first half (seeds)
    size = min(len(kept), 2000)
    chain_sample = kept[np.linspace(0, len(kept) - 1, size).astype(int)]
    mean = exact.mean(0)
    oracle = step.oracle
    grad_norms = np.linalg.norm(oracle.grad_rows(mean), axis=1)
    jump = exact[1] - exact[2]
    ratios = np.abs(oracle.loglik_rows(mean + jump) - oracle.loglik_rows(mean))
    print(f"epsilon = {args.epsilon:g}, delta = {0.1 / args.n:g}, n = {args.n}, L = {args.steps}")
    print(f"iterations per chain: {plan['draws']} ({args.chains} chain(s))")
    print(f"acceptance rate: {float(idata.sample_stats.accepted.mean()):.2f}")
    print(
        "clipped at the posterior mean (not private, report only): "
        f"gradients {np.mean(grad_norms > 2.0):.1%}, "
        f"ratios {np.mean(ratios > 0.3 * np.linalg.norm(jump)):.1%}"
    )
    print(f"MMD to exact: {mmd(chain_sample, exact[:size]):.4f}")
    print(f"floor (two exact samples of {size}): {mmd(exact[:size], exact[size : 2 * size]):.4f}")
    print(f"wall time: {time.perf_counter() - start_time:.1f} s")


if __name__ == "__main__":
    main()
