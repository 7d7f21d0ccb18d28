"""Time to build a DP step next to PyMC's own compilation of the same model's logp and dlogp.

For each model (the validation zoo's and this folder's benchmark models, ``n`` rows), prints

* ``pymc s``: ``model.logp_dlogp_function()`` — PyMC's graph construction and compilation of
  the joint log-density and gradient, what ``pm.sample`` builds before NUTS runs — and its
  first evaluation, at the initial point (NUTS evaluates it before its first draw; on PyMC 6
  the Numba backend compiles, or loads from its cache, on that first call: 26–71 ms on the
  zoo's logistic, negative binomial and ordinal models here, 8–28 ms on PyMC 5);
* ``step s``: ``pymc_dp.DPPenalty(budget=...)`` (the oracle's checks, validation against PyMC
  and compilation) plus the two functions compiled on first use before the first draw: the
  per-row gradients (the private initialisation's clip selection and centring) and the
  centred-ratio pass (the chain's), i.e. everything compiled before sampling starts, each
  evaluated once, as PyMC's function is (the build's validation already evaluates the
  per-row log-likelihood and the clipped gradient sum);
* ``ratio = step s / pymc s`` (target ≤ 2);
* ``again s``: the same step built on a new model object with the same graph (a re-run cell,
  another budget), when the package's in-process cache of compiled functions
  (``pymc_dp._compile.cached_compile``) already holds its functions; ``step s`` is measured
  with that cache emptied first.

Each build is done once untimed, to fill PyTensor's on-disk cache of compiled C code (which a
user pays once per machine, not per model), then ``--repeats`` times (default 3); each side's
fastest is reported, since a shared machine only ever adds time. A trivial function is compiled
before anything is timed, so neither side pays for loading that cache, and Python's garbage is
collected (untimed) before each timed build, so neither pays for the other's garbage: a full
collection of this process's heap takes 0.2–0.5 s, as long as a build, and the step pauses the
collector while it builds (``pymc_dp._compile.gc_paused``), leaving its garbage to the next one.

The last lines are ``build ratio <r> (target 2)`` (the worst ratio) and the same for ``again
s``. Run: ``python
benchmarks/build.py`` (``--models logistic ordinal_no_p`` for some).
"""

from __future__ import annotations

import argparse
import gc
import time
import warnings

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pymc.blocking import DictToArrayBijection

import pymc_dp
from pymc_dp import _compile
from pymc_dp.experiments.zoo import ZOO
from pymc_dp.releases import Centre

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
    point = model.initial_point()  # not timed: PyMC's side is its logp + dlogp alone
    start_values = DictToArrayBijection.map({v.name: point[v.name] for v in model.value_vars})
    gc.collect()
    start = time.perf_counter()
    fn = model.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    fn(start_values)  # its first evaluation, as NUTS's before the first draw
    return time.perf_counter() - start


def step_seconds(model: pm.Model, *, cold: bool = True) -> float:
    if cold:
        _compile._cache.clear()  # nothing compiled for an earlier model is reused
    gc.collect()
    start = time.perf_counter()
    with model:
        step = pymc_dp.DPPenalty(budget=pymc_dp.PrivacyBudget(epsilon=1.0, delta=1e-6))
    oracle = step._channel._oracle
    oracle._compact_fn()  # compiled on first use by the initialisation
    oracle.compile_centred()  # compiled when the centring is released, before the chain
    # each evaluated once (the per-row gradients at a centre, the centred ratio's pass)
    theta = oracle.space.ravel(oracle._initial_point)  # the sampled coordinates
    centre = Centre(theta, 1.0, np.eye(theta.size))
    oracle.clipped_centred_llr_sum(theta, theta + 1e-3, centre, 1.0)
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
    print(
        f"{'model':36s} {'pymc s':>7s} {'step s':>7s} {'ratio':>6s} {'again s':>8s} {'ratio':>6s}"
    )
    worst = worst_again = 0.0
    for name, make in models.items():
        times = []
        for _ in range(1 + args.repeats):  # the first fills the on-disk cache of C code
            model, other = make(args.n), make(args.n)
            times.append(
                (pymc_seconds(model), step_seconds(model), step_seconds(other, cold=False))
            )
        t_pymc, t_step, t_again = (min(t[i] for t in times[1:]) for i in range(3))
        ratio, ratio_again = t_step / t_pymc, t_again / t_pymc
        worst, worst_again = max(worst, ratio), max(worst_again, ratio_again)
        print(
            f"{name:36s} {t_pymc:7.2f} {t_step:7.2f} {ratio:6.2f} {t_again:8.2f} "
            f"{ratio_again:6.2f}",
            flush=True,
        )
    print(f"build ratio {worst:.2f} (target {TARGET:g})")
    print(f"build ratio, same graph again {worst_again:.2f} (target {TARGET:g})")


if __name__ == "__main__":
    main()
