"""Time to build a DP step next to PyMC's own compilation of the same model's logp and dlogp.

For each model (the validation zoo's and this folder's benchmark models, ``n`` rows), prints

* ``pymc s``: ``model.logp_dlogp_function()`` — PyMC's graph construction and compilation of
  the joint log-density and gradient, what ``pm.sample`` builds before NUTS runs;
* ``step s``: ``pymc_dp.DPPenalty(budget=...)`` (the oracle's checks, validation against PyMC
  and compilation) plus the compilation of the per-row gradient function that its private
  initialisation uses on first call, i.e. everything compiled before the first release;
* ``ratio = step s / pymc s`` (target ≤ 2).

Each build is done once untimed, to fill PyTensor's on-disk cache of compiled C code (which a
user pays once per machine, not per model), then ``--repeats`` times (default 3); each side's
fastest is reported, since a shared machine only ever adds time. A trivial function is compiled
before anything is timed, so neither side pays for loading that cache.

The last line is ``build ratio <r> (target 2)``: the worst ratio. Run: ``python
benchmarks/build.py`` (``--models logistic ordinal_no_p`` for some).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt

import pymc_dp
from pymc_dp.experiments.zoo import ZOO

warnings.filterwarnings("ignore")

TARGET = 2.0
ZOO_MODELS = [
    "linear",
    "robust",
    "logistic",
    "poisson",
    "negbin",
    "hierarchical",
    "hierarchical_centred",
    "ordinal_no_p",
    "mixture",
]


def _bench_models() -> dict:
    from oracle import MODELS  # benchmarks/oracle.py's models

    return {f"bench: {name}": build for name, (build, _) in MODELS.items()}


def pymc_seconds(model: pm.Model) -> float:
    start = time.perf_counter()
    fn = model.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    return time.perf_counter() - start


def step_seconds(model: pm.Model) -> float:
    start = time.perf_counter()
    with model:
        step = pymc_dp.DPPenalty(budget=pymc_dp.PrivacyBudget(epsilon=1.0, delta=1e-6))
    step._channel._oracle._grad_rows_fn()  # compiled on first use by the initialisation
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="rows (default 20 000)")
    parser.add_argument("--models", nargs="*", default=None, help="zoo or bench model names")
    parser.add_argument("--repeats", type=int, default=3, help="timed builds (default 3)")
    args = parser.parse_args()
    pytensor.function([], pt.constant(1.0))()  # load the compiled-code cache once
    models = {name: (lambda n, z=ZOO[name]: z.model(n, seed=0)[1]) for name in ZOO_MODELS}
    for name, build in _bench_models().items():
        models[name] = lambda n, b=build: b(n, np.random.default_rng(0))
    if args.models:
        models = {k: v for k, v in models.items() if any(m in k for m in args.models)}
    print(f"n = {args.n}, pytensor {pytensor.__version__}, pymc {pm.__version__}")
    print(f"{'model':36s} {'pymc s':>7s} {'step s':>7s} {'ratio':>6s}")
    worst = 0.0
    for name, make in models.items():
        times = []
        for _ in range(1 + args.repeats):  # the first fills the on-disk cache of C code
            model = make(args.n)
            times.append((pymc_seconds(model), step_seconds(model)))
        t_pymc = min(t for t, _ in times[1:])
        t_step = min(t for _, t in times[1:])
        ratio = t_step / t_pymc
        worst = max(worst, ratio)
        print(f"{name:36s} {t_pymc:7.2f} {t_step:7.2f} {ratio:6.2f}", flush=True)
    print(f"build ratio {worst:.2f} (target {TARGET:g})")


if __name__ == "__main__":
    main()
