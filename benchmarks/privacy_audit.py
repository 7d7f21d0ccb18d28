"""The privacy audit of every step, and of four deliberately broken variants of each.

For each built-in scenario of :mod:`pymc_dp.audit` (a Normal mean, n = 100 rows, neighbouring
datasets with row 0 at −30 and +30, one fixed public seed), runs the step ``--runs`` times on
each dataset and prints the claimed ε of one run next to the audit's lower bound (95 %
confidence), for the step as built and with every mechanism broken (no noise, a tenth of the
noise, uniform noise of the same variance, no clipping). A correct step must stay at or below
its claim; a broken one is flagged when its bound exceeds the claim. The last line counts both.

The one-bit steps (the DP penalty, DP Barker) are audited from a grid of starts, chosen on pilot
runs. Two DP Barker cells cannot be flagged at this size: the last lines give, from the exact
accept probabilities, each variant's true ε and the largest bound an audit could show with 10³,
10⁵ and 10⁶ runs per dataset.

Run: ``python benchmarks/privacy_audit.py`` (``--runs 2000`` by default, about 5 minutes).
"""

from __future__ import annotations

import argparse
import time
import warnings

from pymc_dp.audit import SCENARIOS, audit_scenario
from pymc_dp.experiments.broken import BROKEN_VARIANTS, broken

warnings.filterwarnings("ignore")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--steps", nargs="*", default=list(SCENARIOS))
    args = parser.parse_args()
    variants = ("as built", *BROKEN_VARIANTS)
    print("| step | claimed ε | " + " | ".join(variants) + " |")
    print("|---" * (2 + len(variants)) + "|")
    passed = flagged = broken_total = 0
    begin = time.perf_counter()
    for name in args.steps:
        cells = []
        claimed = None
        for variant in variants:
            if variant == "as built":
                result = audit_scenario(name, runs=args.runs)
                passed += not result.violated
            else:
                with broken(variant):
                    result = audit_scenario(name, runs=args.runs)
                broken_total += 1
                flagged += result.violated
            claimed = result.claimed_epsilon
            mark = " **flagged**" if result.violated else ""
            cells.append(f"{result.epsilon_lower_bound:.2f}{mark}")
        print(f"| {name} | {claimed:.2f} | " + " | ".join(cells) + " |", flush=True)
    minutes = (time.perf_counter() - begin) / 60
    print(
        f"steps passing {passed}/{len(args.steps)}; broken variants flagged "
        f"{flagged}/{broken_total}; {args.runs} runs per dataset, {minutes:.1f} min"
    )


def barker_limits() -> None:
    """DP Barker's scenario (n = b = 100, one iteration): what an audit of the bit could show."""
    import numpy as np

    from pymc_dp.accounting.costs import BarkerCost
    from pymc_dp.experiments.broken import barker_accept_probability, one_bit_audit_limit

    claim = BarkerCost(100, 100).epsilon(1e-5, 1)
    lam = np.linspace(-15, 15, 30001)  # λ at every start an auditor could choose
    print(f"\nDP Barker's accept bit, claimed ε {claim:.2f}, a neighbour moving λ by 2/√b = 0.2:")
    print("| variant | true ε | best bound, 10³ runs | 10⁵ runs | 10⁶ runs |")
    print("|---|---|---|---|---|")
    for kind in ("as built", "noise / 10", "uniform noise"):
        p = barker_accept_probability(kind, lam, batch_variance=0.01)
        q = barker_accept_probability(kind, lam + 0.2, batch_variance=0.01)
        cells = [one_bit_audit_limit(p, q, runs=r, delta=1e-5) for r in (10**3, 10**5, 10**6)]
        print(f"| {kind} | {cells[0][0]:.2f} | " + " | ".join(f"{c[1]:.2f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
    barker_limits()
