"""How close the private initialisation gets to the posterior, on the validation zoo.

    python benchmarks/private_init_quality.py --n 100000 --epsilon 1 5 --models logistic linear \\
        --repeats 3

For each model × ε × repeat it builds ``DPPenalty(budget=PrivacyBudget(ε, 0.1/n))`` (default
settings), runs its private initialisation (``step.prepare``) and prints, against the Laplace
approximation of the same data (non-private, evaluation only; unconstrained space):

* ``err``: the largest ``|θ* − mode|`` over the coordinates, in posterior sd;
* ``ascent``: the same for the ascent's end ``θ_a`` (before the curvature);
* ``stated``: the range of the stated location sd ``√diag Cov θ*``, in posterior sd, and
  ``z``, the largest ``|θ* − mode| / stated`` (≈ 2–3 when the statement is honest);
* ``sd ratio``: the range of ``√diag Σ̂`` over the Laplace sd;
* the clips, the share of the capacity the initialisation spent, and its wall time.
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings

import numpy as np
from pymc.blocking import DictToArrayBijection

import pymc_dp
from pymc_dp.experiments.zoo import ZOO, _laplace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 5.0])
    parser.add_argument("--models", nargs="+", default=["logistic", "linear", "poisson"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for name in args.models:
        _, model = ZOO[name].model(args.n, seed=0)
        laplace = _laplace(model, 20, "fd")
        mode = laplace.mode.data
        sd = np.sqrt(np.diag(np.linalg.inv(laplace.precision)))
        layout = laplace.mode.point_map_info
        for epsilon in args.epsilon:
            for _ in range(args.repeats):
                started = time.perf_counter()
                with model:
                    budget = pymc_dp.PrivacyBudget(epsilon=epsilon, delta=0.1 / args.n)
                    step = pymc_dp.DPPenalty(budget=budget)
                try:
                    step.prepare(chains=4)
                except pymc_dp.PyMCDPError as error:
                    print(f"{name} ε={epsilon:g}: {type(error).__name__}: {error}")
                    continue
                start = step.private_start

                def flat(theta: np.ndarray, step=step, layout=layout) -> np.ndarray:
                    point = step.space.unravel(theta)
                    values = {key: np.asarray(point[key]) for key, *_ in layout}
                    return DictToArrayBijection.map(values).data

                theta = flat(start.theta)
                err = np.abs(theta - mode) / sd
                ascent = np.abs(flat(start.ascent_theta) - mode) / sd
                stated = (
                    np.abs(flat(start.theta + np.sqrt(np.diag(start.location_covariance))) - theta)
                    / sd
                )
                ratio = np.abs(flat(start.theta + start.scale) - theta) / sd
                # the centred ratio's clip (the centring's) where no plain ratio clip is chosen
                ratio_clip = (
                    f"ratio {start.llr_clip:.3g}"
                    if start.llr_clip is not None
                    else f"remainder {step.privacy_metadata()['dp_remainder_clip']:.3g}"
                )
                print(
                    f"{name:9s} ε={epsilon:<4g} err {err.max():6.2f}  ascent {ascent.max():7.2f}"
                    f"  stated {stated.min():.2f}–{stated.max():.2f} z {np.max(err / stated):5.1f}"
                    f"  sd ratio {ratio.min():.2f}–{ratio.max():.2f}  clips grad "
                    f"{start.grad_clip:.3g} {ratio_clip}  share "
                    f"{start.mu / budget.capacity_mu:.2f}  {time.perf_counter() - started:.0f} s",
                    flush=True,
                )


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    logging.getLogger("pymc").setLevel(logging.CRITICAL)
    np.seterr(all="ignore")
    main()
