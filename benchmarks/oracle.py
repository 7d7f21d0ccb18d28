"""Cost of the oracle's per-row quantities next to PyMC's own summed log-density and gradient.

Prints, per model (n = 100 000 rows), milliseconds per call of

* ``pymc logp+dlogp``: PyMC's compiled joint log-density and gradient, the function NUTS and
  HamiltonianMC call once per leapfrog step (``model.logp_dlogp_function``);
* ``pymc dlogp``: PyMC's gradient alone (for reference);
* ``loglik rows``: the oracle's per-row log-likelihood vector;
* ``clipped grad``: the oracle's clipped per-row gradient sum ``Σ_i clip_b(∇ℓ_i)``;

and ``ratio = clipped grad / pymc logp+dlogp``. The line ``ratio <r>`` is the worst ratio over
the first three models (logistic regression, 2-d banana, Normal with HalfNormal scale; target
1.5); the last line, ``ratio, added likelihoods <r>``, the worst over the likelihoods that were
once pathological (ordinal, mixture, censored, 175-parameter varying slopes; target 3); the
hierarchical model with 50 group intercepts is printed without a target.

Run: ``python benchmarks/oracle.py`` (add ``--n 20000`` for a quick look).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pymc as pm
import pytensor

from pymc_dp import RowLikelihood
from pymc_dp.errors import BackendNotSupportedError
from pymc_dp.experiments.zoo import ZOO
from pymc_dp.testing import Banana

warnings.filterwarnings("ignore")


def logistic(n: int, rng: np.random.Generator) -> pm.Model:
    d = 10
    X = rng.normal(size=(n, d))
    y = rng.binomial(1, 1 / (1 + np.exp(-X @ rng.normal(size=d) * 0.3)))
    with pm.Model() as model:
        Xd = pm.Data("X", X)
        beta = pm.Normal("beta", 0, 1, shape=d)
        pm.Bernoulli("y", logit_p=Xd @ beta, observed=y)
    return model


def banana(n: int, rng: np.random.Generator) -> pm.Model:
    spec = Banana(d=2, a=20.0)
    return spec.model(spec.simulate(n, rng))


def normal_halfnormal(n: int, rng: np.random.Generator) -> pm.Model:
    y = 1.0 + 2.0 * rng.normal(size=n)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 10)
        sigma = pm.HalfNormal("sigma", 5)
        pm.Normal("y", mu, sigma, observed=y)
    return model


def hierarchical(n: int, rng: np.random.Generator) -> pm.Model:
    groups = 50
    g = rng.integers(0, groups, n)
    y = rng.normal(size=groups)[g] + rng.normal(size=n)
    with pm.Model() as model:
        idx = pm.Data("group_idx", g)
        mu_a = pm.Normal("mu_a", 0, 1)
        sigma_a = pm.HalfNormal("sigma_a", 1)
        a = pm.Normal("a", mu_a, sigma_a, shape=groups)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", a[idx], sigma, observed=y)
    return model


def ordinal(n: int, rng: np.random.Generator) -> pm.Model:
    # the validation zoo's ordinal regression (OrderedLogistic, ordered cutpoints)
    return ZOO["ordinal_no_p"].model(n, seed=int(rng.integers(2**31)))[1]


def mixture(n: int, rng: np.random.Generator) -> pm.Model:
    # the validation zoo's two-component NormalMixture
    return ZOO["mixture"].model(n, seed=int(rng.integers(2**31)))[1]


def censored(n: int, rng: np.random.Generator) -> pm.Model:
    x = rng.normal(size=n)
    y = np.minimum(0.5 + 1.2 * x + rng.normal(size=n), 1.5)  # right-censored at 1.5
    with pm.Model() as model:
        xd = pm.Data("x", x)
        alpha = pm.Normal("alpha", 0, 5)
        beta = pm.Normal("beta", 0, 5)
        sigma = pm.HalfNormal("sigma", 2)
        pm.Censored(
            "y", pm.Normal.dist(alpha + beta * xd, sigma), lower=None, upper=1.5, observed=y
        )
    return model


def varying_slopes(n: int, rng: np.random.Generator) -> pm.Model:
    # radon-style varying intercepts and slopes: 85 groups, 175 parameters
    groups = 85
    g = rng.integers(0, groups, n)
    x = rng.binomial(1, 0.3, n).astype(float)
    y = rng.normal(1, 0.3, groups)[g] + rng.normal(-0.6, 0.2, groups)[g] * x + rng.normal(size=n)
    with pm.Model() as model:
        idx = pm.Data("county_idx", g)
        floor = pm.Data("floor", x)
        mu_a = pm.Normal("mu_a", 0, 10)
        sigma_a = pm.HalfNormal("sigma_a", 1)
        mu_b = pm.Normal("mu_b", 0, 10)
        sigma_b = pm.HalfNormal("sigma_b", 1)
        a = pm.Normal("a", mu_a, sigma_a, shape=groups)
        b = pm.Normal("b", mu_b, sigma_b, shape=groups)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", a[idx] + b[idx] * floor, sigma, observed=y)
    return model


# name: (builder, target ratio or None)
MODELS = {
    "logistic regression (d=10)": (logistic, 1.5),
    "banana (d=2)": (banana, 1.5),
    "normal, halfnormal scale": (normal_halfnormal, 1.5),
    "hierarchical, 50 groups": (hierarchical, None),
    "ordinal (OrderedLogistic)": (ordinal, 3.0),
    "mixture (NormalMixture)": (mixture, 3.0),
    "censored normal": (censored, 3.0),
    "varying slopes, 175 params": (varying_slopes, 3.0),
}


def ms_per_call(fns: list, rounds: int = 40, seconds_per_round: float = 0.01) -> list[float]:
    """Milliseconds per call of each function: the best over ``rounds`` interleaved rounds.

    Each round times a batch of calls of every function in turn, so that a slow spell of a
    shared machine hits all of them alike; the minimum over rounds estimates the undisturbed
    cost.
    """
    calls = []
    for fn in fns:
        fn()  # warm up (allocations, caches)
        start = time.perf_counter()
        fn()
        calls.append(max(1, int(seconds_per_round / (time.perf_counter() - start))))
    best = [np.inf] * len(fns)
    for _ in range(rounds):
        for k, fn in enumerate(fns):
            start = time.perf_counter()
            for _ in range(calls[k]):
                fn()
            best[k] = min(best[k], (time.perf_counter() - start) / calls[k])
    return [b * 1e3 for b in best]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="rows (default 100 000)")
    parser.add_argument(
        "--jax",
        action="store_true",
        help="also time the clipped gradient sum compiled with JAX (compile_kwargs={'mode': "
        "'JAX'}) and print its speed-up over the default backend",
    )
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(
        f"n = {args.n}, pytensor {pytensor.__version__}, pymc {pm.__version__}, "
        f"linker {pytensor.config.linker}, blas ldflags {pytensor.config.blas__ldflags!r}"
    )
    header = (
        f"{'model':30s} {'pymc logp+dlogp':>16s} {'pymc dlogp':>11s} "
        f"{'loglik rows':>12s} {'clipped grad':>13s} {'ratio':>6s}"
        + (f" {'jax clipped':>12s} {'jax speed-up':>13s}" if args.jax else "")
        + "  method"
    )
    speedups = {}
    print(header)
    worst = {}  # target → worst ratio among the models with that target
    for name, (build, target) in MODELS.items():
        model = build(args.n, rng)
        oracle = RowLikelihood(model)
        theta = oracle.space.ravel(model.initial_point()) + rng.normal(0, 0.1, oracle.ndim)
        point = {**model.initial_point(), **oracle.space.unravel(theta)}
        joint = model.logp_dlogp_function(ravel_inputs=True)
        joint.set_extra_values({})
        dlogp = model.compile_dlogp()
        bound = float(np.median(np.linalg.norm(oracle.grad_rows(theta, slice(0, 1000)), axis=1)))
        calls = [
            lambda: joint(theta),  # noqa: B023
            lambda: dlogp(point),  # noqa: B023
            lambda: oracle.loglik_rows(theta),  # noqa: B023
            lambda: oracle.clipped_grad_sum(theta, bound),  # noqa: B023
        ]
        jax_column = ""
        if args.jax:
            try:
                on_jax = RowLikelihood(model, backend="JAX")
            except BackendNotSupportedError as err:
                jax_column = f" {'-':>12s} {'-':>13s}"
                print(f"  ({name}: {err})")
            else:
                calls.append(lambda: on_jax.clipped_grad_sum(theta, bound))  # noqa: B023
        t_joint, t_dlogp, t_rows, t_clip, *t_jax = ms_per_call(calls)
        if t_jax:
            speedups[name] = t_clip / t_jax[0]
            jax_column = f" {t_jax[0]:12.2f} {speedups[name]:12.2f}x"
        ratio = t_clip / t_joint
        if target is not None:
            worst[target] = max(worst.get(target, 0.0), ratio)
        note = "  (no target)" if target is None else f"  (target {target:g})"
        print(
            f"{name:30s} {t_joint:16.2f} {t_dlogp:11.2f} {t_rows:12.2f} {t_clip:13.2f} "
            f"{ratio:6.2f}{jax_column}  {oracle.gradient_method}{note}",
            flush=True,
        )
    print(f"ratio {worst.get(1.5, 0.0):.2f} (target 1.5)")
    print(f"ratio, added likelihoods {worst.get(3.0, 0.0):.2f} (target 3)")
    if speedups:
        import jax

        print(
            f"JAX speed-up of the clipped gradient sum on {jax.devices()[0]}: "
            f"{min(speedups.values()):.2f}x to {max(speedups.values()):.2f}x"
        )


if __name__ == "__main__":
    main()
