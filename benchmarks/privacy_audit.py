"""The privacy audit of every step, and of four deliberately broken variants of each.

For each built-in scenario of :mod:`pymc_dp.audit` (a Normal mean, n = 100 rows, neighbouring
datasets with row 0 at −30 and +30, one fixed public seed), runs the step ``--runs`` times on
each dataset and prints the claimed ε of one run next to the audit's lower bound (95 %
confidence), for the step as built and with every mechanism broken (no noise, a tenth of the
noise, uniform noise of the same variance, no clipping). A correct step must stay at or below
its claim; a broken one is flagged when its bound exceeds the claim. The last line counts both.

Run: ``python benchmarks/privacy_audit.py`` (``--runs 1000`` by default, about 4 minutes).
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
    parser.add_argument("--runs", type=int, default=1000)
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


if __name__ == "__main__":
    main()
