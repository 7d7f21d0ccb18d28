"""Minibatch DP penalty on the seeds' tempered 2-d banana (SPEC §4.2, §5), scored by MMD.

The seeds' regime: n = 100 000 rows tempered to n0 = 1000 (T = 0.01), one chain spending the
whole (ε, δ = 0.1/n) budget, started at an exact posterior draw (standing in for a cheap private
point estimate), a fixed random-walk scale, the first half discarded. Prints the iterations the
subsampled-Gaussian PLD accountant allows, the acceptance rate, the share of clipped batch ratios
(non-private diagnostics, for this report only), the MMD to an exact tempered-posterior sample
and the floor (MMD between two exact samples of the same size).

Run: ``python examples/minibatch_penalty_banana.py --epsilon 1`` (and ``4``).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import pymc_dp
from pymc_dp.metrics import mmd
from pymc_dp.testing import Banana

warnings.filterwarnings("ignore")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--n0", type=float, default=1000.0, help="tempered size T·n")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--scale", type=float, default=0.3, help="proposal, in posterior sds")
    parser.add_argument("--llr-clip", type=float, default=3.0)
    parser.add_argument("--noise-multiplier", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start_time = time.perf_counter()

    banana = Banana(d=2, a=20.0)
    temperature = args.n0 / args.n
    rng = np.random.default_rng(args.seed)
    data = banana.simulate(args.n, rng)
    exact = banana.posterior_sample(data, 6000, rng, temperature=temperature)
    model = banana.model(data)
    with model:
        step = pymc_dp.DPPenalty(
            budget=pymc_dp.PrivacyBudget(epsilon=args.epsilon, delta=0.1 / args.n),
            batch_size=args.batch,
            llr_clip=args.llr_clip,
            noise_multiplier=args.noise_multiplier,
            proposal_scale=args.scale * exact.std(0),
            temperature=temperature,
            nonprivate_diagnostics=True,  # clip shares for this report: NOT a DP release
        )
    idata = pymc_dp.sample(
        step,
        chains=1,
        tune=0,
        cores=1,
        progressbar=False,
        compute_convergence_checks=False,
        initvals={"theta": exact[0]},
    )
    draws = idata.posterior.theta.values[0]
    kept = draws[len(draws) // 2 :]
    size = min(len(kept), 2000)
    chain_sample = kept[np.linspace(0, len(kept) - 1, size).astype(int)]
    stats = idata.sample_stats
    print(f"epsilon = {args.epsilon:g}, delta = {0.1 / args.n:g}, n = {args.n}, n0 = {args.n0:g}")
    print(
        f"batch {args.batch}, llr_clip {args.llr_clip:g}, noise multiplier "
        f"{args.noise_multiplier:g}, proposal {args.scale:g} posterior sds"
    )
    print(f"iterations: {len(draws)}")
    print(f"acceptance rate: {float(stats.accepted.mean()):.2f}")
    print(f"batch ratios clipped (not private): {float(stats.llr_clipped_fraction.mean()):.1%}")
    print(f"MMD to exact: {mmd(chain_sample, exact[:size]):.4f}")
    print(f"floor (two exact samples of {size}): {mmd(exact[:size], exact[size : 2 * size]):.4f}")
    print(f"wall time: {time.perf_counter() - start_time:.1f} s")


if __name__ == "__main__":
    main()
