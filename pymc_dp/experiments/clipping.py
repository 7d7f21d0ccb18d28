"""The clipping experiment of the seeds (thesis §6.2): MMD vs the share of clipped ratios, non-DP.

Random-walk Metropolis and HMC on the 2-d flat banana with the log-likelihood ratio clipped at
``b_l ‖θ' − θ‖`` for a range of ``b_l`` and **no noise** (so that only clipping moves the
posterior): the kernels of :mod:`pymc_dp.kernels` with a noise-free release. This is an
evaluation of the clipping bias, not a private computation; nothing here is released.
As the seeds: 3000 random-walk and 500 HMC iterations, the first half discarded, MMD against an
exact posterior sample.
"""

from __future__ import annotations

import numpy as np

from pymc_dp.experiments.run import prepare
from pymc_dp.kernels.hmc import HMCMechanisms, HMCParams, HMCState, hmc_kernel
from pymc_dp.kernels.penalty import PenaltyMechanisms, PenaltyParams, PenaltyState, penalty_kernel
from pymc_dp.metrics import mmd
from pymc_dp.oracle import RowLikelihood
from pymc_dp.releases import Release

__all__ = ["CLIP_FACTORS", "clipping_run"]

#: Clip bounds as multiples of the 80th-percentile rule of :mod:`.recipes`.
CLIP_FACTORS = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 2.0, 5.0)
_UNCLIPPED_GRADIENT = 1e12


def clipping_run(
    sampler: str,
    factor: float,
    seed: int,
    *,
    problem: str = "flat_banana_2d",
    n: int | None = None,
    iterations: int | None = None,
) -> dict[str, float | str | int]:
    """One noise-free chain with the ratio clipped at ``factor`` times the rule's bound."""
    prep = prepare(problem, n)
    oracle = RowLikelihood(prep.problem.model(prep.data))
    space = oracle.space
    sd = prep.tuning.sd
    rng = np.random.default_rng(seed)
    theta = prep.reference[rng.integers(len(prep.reference))].copy()
    clipped, releases = 0, 0

    def release(a: np.ndarray, b: np.ndarray, llr_clip: float) -> Release:
        nonlocal clipped, releases
        total = oracle.clipped_llr_sum(a, b, llr_clip * np.linalg.norm(b - a), count_clipped=True)
        clipped += total.n_clipped
        releases += 1
        return Release(total.value, 0.0, total.n_clipped)

    draws = []
    if sampler == "random walk":
        llr_clip = factor * prep.tuning.llr_clip_walk
        state = PenaltyState(theta, space.logprior(theta), np.ones(sd.size))
        params = PenaltyParams(sd * 2.38 / np.sqrt(sd.size))
        mechanisms = PenaltyMechanisms(space.logprior, lambda a, b: release(a, b, llr_clip))
        for _ in range(iterations or 3000):
            state, _info = penalty_kernel(state, params, rng, mechanisms)
            draws.append(state.theta)
    elif sampler == "HMC":
        llr_clip = factor * prep.tuning.llr_clip_hmc
        state = HMCState(theta, space.logprior(theta))

        def grad(x: np.ndarray) -> Release:  # exact: no clipping, no noise
            return Release(oracle.clipped_grad_sum(x, _UNCLIPPED_GRADIENT).value, 0.0, None)

        mechanisms = HMCMechanisms(
            space.logprior, space.logprior_grad, grad, lambda a, b: release(a, b, llr_clip)
        )
        for _ in range(iterations or 500):
            params = HMCParams(rng.uniform(0.85, 1.15) * 1.5 / 20, 20, sd**2)
            state, _info = hmc_kernel(state, params, rng, mechanisms)
            draws.append(state.theta)
    else:
        raise ValueError(f"sampler must be 'random walk' or 'HMC', got {sampler!r}.")
    kept = np.asarray(draws)[len(draws) // 2 :]
    size = min(len(kept), len(prep.reference) // 2)
    ref = prep.reference
    return {
        "problem": problem,
        "sampler": sampler,
        "clip_factor": float(factor),
        "llr_clip": float(llr_clip),
        "seed": int(seed),
        "clipped_fraction": clipped / max(releases * oracle.n_rows, 1),
        "mmd": mmd(kept[:size], ref[:size]),
        "floor": mmd(ref[:size], ref[size : 2 * size]),
    }
