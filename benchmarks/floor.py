"""How close the oracle's clipped gradient sum is to a hand-written kernel of the same arithmetic.

``benchmarks/oracle.py`` compares the clipped per-row gradient sum with PyMC's own log-density
and gradient. On two of its models that ratio stays above its target on PyTensor 3 (Numba),
and this script shows why: for each it times, at ``n`` rows (milliseconds per call, the best
of interleaved rounds, as ``oracle.py``),

* ``pymc``: PyMC's compiled ``logp`` + ``dlogp`` (``model.logp_dlogp_function``);
* ``pymc-like``: a hand-written Numba loop (``fastmath``) computing the same sums as PyMC's
  function, one pass over the rows: PyMC's function is at this floor, so PyTensor fuses it
  fully;
* ``clipped floor``: a hand-written Numba loop (``fastmath``) computing the clipped sum
  ``Σ_i g_i · min(1, b / ‖D g_i‖)`` of the same model as the oracle does (each entry bounded
  as :func:`pymc_dp.oracle.bounded_entries` bounds it, the preconditioner's weights ``D``
  read per row), one pass, nothing else: about the least the package's clipped sum can cost
  on this machine (a square root and a division per row, which a sum of squares does not
  need);
* ``oracle``: the package's clipped gradient sum (``RowLikelihood.clipped_grad_sum``);

and the ratios ``floor / pymc`` (the least ``oracle.py``'s ratio can be) and ``oracle /
floor`` (what is left to gain). Before timing, each hand-written clipped sum is checked
against the oracle's value (relative 1e-9), so both compute the same thing.

Needs Numba (installed with PyTensor 3). Run: ``python benchmarks/floor.py`` (``--n 100000``).
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import pymc as pm
import pytensor
from oracle import ms_per_call, normal_halfnormal, varying_slopes  # benchmarks/oracle.py

from pymc_dp import RowLikelihood

warnings.filterwarnings("ignore")

try:
    import numba
except ImportError:  # PyTensor 2's stack does not install it
    numba = None


def _kernels() -> dict:
    jit = numba.njit(fastmath=True, cache=False)
    LIMIT = np.sqrt(np.finfo(np.float64).max) * 1e-4  # the oracle's bound L

    @jit
    def normal_pymc(y, mu, log_sigma):
        s = np.exp(-2.0 * log_sigma)
        total = 0.0
        squares = 0.0
        for i in range(y.size):
            r = y[i] - mu
            total += r
            squares += r * r
        return total * s, squares * s - y.size

    @jit
    def bounded(g):  # the oracle's bounded_entries: NaN -> 0, beyond ±L -> ±L
        return 0.0 if np.isnan(g) else min(max(g, -LIMIT), LIMIT)

    @jit
    def normal_clipped(y, mu, log_sigma, bound, weights):
        s = np.exp(-2.0 * log_sigma)
        inverse_square = 1.0 / (bound * bound)
        w_mu, w_sigma = weights[0] ** 2, weights[1] ** 2
        g_mu = 0.0
        g_sigma = 0.0
        for i in range(y.size):
            r = y[i] - mu
            a = bounded(r * s)
            b = bounded(r * r * s - 1.0)
            scale = 1.0 / np.sqrt(max(1.0, (a * a * w_mu + b * b * w_sigma) * inverse_square))
            g_mu += scale * a
            g_sigma += scale * b
        return g_mu, g_sigma

    @jit
    def slopes_pymc(y, x, group, a, b, log_sigma):
        s = np.exp(-2.0 * log_sigma)
        g_a = np.zeros(a.size)
        g_b = np.zeros(b.size)
        squares = 0.0
        for i in range(y.size):
            k = group[i]
            r = y[i] - a[k] - b[k] * x[i]
            squares += r * r
            g_a[k] += r * s
            g_b[k] += r * x[i] * s
        return g_a, g_b, squares * s - y.size

    @jit
    def slopes_clipped(y, x, group, a, b, log_sigma, bound, w_a, w_b, w_sigma):
        s = np.exp(-2.0 * log_sigma)
        inverse_square = 1.0 / (bound * bound)
        w_sigma = w_sigma * w_sigma
        g_a = np.zeros(a.size)
        g_b = np.zeros(b.size)
        g_sigma = 0.0
        for i in range(y.size):
            k = group[i]
            r = y[i] - a[k] - b[k] * x[i]
            u = bounded(r * s)
            v = bounded(r * x[i] * s)
            w = bounded(r * r * s - 1.0)
            q = u * u * w_a[k] ** 2 + v * v * w_b[k] ** 2 + w * w * w_sigma
            scale = 1.0 / np.sqrt(max(1.0, q * inverse_square))
            g_a[k] += scale * u
            g_b[k] += scale * v
            g_sigma += scale * w
        return g_a, g_b, g_sigma

    return {
        "normal": (normal_pymc, normal_clipped),
        "slopes": (slopes_pymc, slopes_clipped),
    }


def _observed(model: pm.Model, name: str = "y") -> np.ndarray:
    """The observed values of ``name`` as a NumPy array (the benchmark's own simulated data)."""
    return np.asarray(model.rvs_to_values[model[name]].data, dtype=float)


def _data(model: pm.Model, name: str) -> np.ndarray:
    return np.asarray(model[name].get_value(borrow=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="rows (default 10⁶)")
    args = parser.parse_args()
    if numba is None:
        print("floor: Numba is not installed (PyTensor 3's stack installs it); nothing to time")
        return
    kernels = _kernels()
    rng = np.random.default_rng(0)
    print(f"n = {args.n}, pytensor {pytensor.__version__}, pymc {pm.__version__}")
    print(
        f"{'model':28s} {'pymc':>7s} {'pymc-like':>10s} {'clipped floor':>14s} {'oracle':>7s} "
        f"{'floor/pymc':>11s} {'oracle/floor':>13s}"
    )
    cases = []

    ones = np.ones(2)  # the preconditioner's weights: the plain clip's
    normal = normal_halfnormal(args.n, rng)
    y = _observed(normal)
    pymc_like, clipped = kernels["normal"]
    cases.append(
        (
            "normal, halfnormal scale",
            normal,
            lambda p: pymc_like(y, p["mu"], p["sigma_log__"]),
            lambda p, b: dict(
                zip(
                    ("mu", "sigma_log__"),
                    clipped(y, p["mu"], p["sigma_log__"], b, ones),
                    strict=True,
                )
            ),
        )
    )

    slopes = varying_slopes(args.n, rng)
    ys, x, group = _observed(slopes), _data(slopes, "floor"), _data(slopes, "county_idx")
    group = group.astype(np.int64)
    groups = len(slopes.initial_point()["a"])
    unit_weights = (np.ones(groups), np.ones(groups))  # the plain clip's weights
    slopes_pymc, slopes_clipped = kernels["slopes"]
    cases.append(
        (
            "varying slopes, 175 params",
            slopes,
            lambda p: slopes_pymc(ys, x, group, p["a"], p["b"], p["sigma_log__"]),
            lambda p, b: dict(
                zip(
                    ("a", "b", "sigma_log__"),
                    slopes_clipped(
                        ys, x, group, p["a"], p["b"], p["sigma_log__"], b, *unit_weights, 1.0
                    ),
                    strict=True,
                )
            ),
        )
    )

    worst = 0.0
    for name, model, pymc_like_call, clipped_call in cases:
        oracle = RowLikelihood(model)
        theta = oracle.space.ravel(model.initial_point()) + rng.normal(0, 0.1, oracle.ndim)
        point = {k: np.asarray(v, dtype=float) for k, v in oracle.space.unravel(theta).items()}
        scalar = {k: (float(v) if v.ndim == 0 else v) for k, v in point.items()}
        bound = float(np.median(np.linalg.norm(oracle.grad_rows(theta, slice(0, 1000)), axis=1)))
        # the same quantity: the hand-written sum against the oracle's, likelihood coordinates
        ours = oracle.clipped_grad_sum(theta, bound).value
        theirs = clipped_call(scalar, bound)
        for var, sl, _ in oracle.space.slices:  # value variables: sigma_log__, ...
            if var.name in theirs:
                np.testing.assert_allclose(
                    ours[sl], np.ravel(theirs[var.name]), rtol=1e-9, atol=1e-9 * abs(ours).max()
                )
        joint = model.logp_dlogp_function(ravel_inputs=True)
        joint.set_extra_values({})
        t_pymc, t_like, t_floor, t_oracle = ms_per_call(
            [
                lambda: joint(theta),  # noqa: B023
                lambda: pymc_like_call(scalar),  # noqa: B023
                lambda: clipped_call(scalar, bound),  # noqa: B023
                lambda: oracle.clipped_grad_sum(theta, bound),  # noqa: B023
            ]
        )
        print(
            f"{name:28s} {t_pymc:7.2f} {t_like:10.2f} {t_floor:14.2f} {t_oracle:7.2f} "
            f"{t_floor / t_pymc:11.2f} {t_oracle / t_floor:13.2f}",
            flush=True,
        )
        worst = max(worst, t_oracle / t_floor)
    print(f"oracle / hand-written floor, worst {worst:.2f}")


if __name__ == "__main__":
    main()
