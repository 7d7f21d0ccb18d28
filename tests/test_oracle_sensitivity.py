"""Sensitivity of the clipped sums under substitution of one row (theory §1–§2).

For neighbouring data sets ``X ~ X'`` (one row substituted, extreme rows included), the clipped
gradient sum moves by at most ``2 b_g`` and the clipped log-likelihood-ratio sum by at most ``2B``.
Neighbours are built from one oracle by evaluating it on two row subsets that differ in one index.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pymc as pm
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymc_dp.errors import InvalidParameterError
from pymc_dp.oracle import RowLikelihood
from pymc_dp.releases import Centre

N_BASE = 200
EXTREME = [0.0, 1e3, -1e3, 1e6, -1e6, 1e-12]


@cache
def logistic_oracle() -> RowLikelihood:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(N_BASE, 3))
    y = rng.integers(0, 2, N_BASE)
    X_ext = np.array([[v, -v, v] for v in EXTREME] * 2)
    y_ext = np.array([0] * len(EXTREME) + [1] * len(EXTREME))
    with pm.Model() as model:
        Xd = pm.Data("X", np.vstack([X, X_ext]))
        beta = pm.Normal("beta", 0, 1, shape=3)
        pm.Bernoulli("y", logit_p=Xd @ beta, observed=np.concatenate([y, y_ext]))
    return RowLikelihood(model)


@cache
def linear_oracle() -> RowLikelihood:
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.normal(size=N_BASE), EXTREME, EXTREME])
    y = np.concatenate([rng.normal(size=N_BASE), EXTREME, -np.array(EXTREME)])
    with pm.Model() as model:
        xd = pm.Data("x", x)
        b = pm.Normal("b")
        sigma = pm.HalfNormal("sigma")
        pm.Normal("y", b * xd, sigma, observed=y)
    return RowLikelihood(model)


@cache
def hierarchical_oracle() -> RowLikelihood:
    """Group intercepts read as ``a[g_i]``: per-row gradients on the sparse (gathered) path."""
    rng = np.random.default_rng(5)
    groups = 4
    extreme = np.concatenate([EXTREME, -np.array(EXTREME)])
    g = np.concatenate([rng.integers(0, groups, N_BASE), np.arange(extreme.size) % groups])
    y = np.concatenate([rng.normal(size=N_BASE), extreme])
    with pm.Model() as model:
        idx = pm.Data("group_idx", g)
        a = pm.Normal("a", 0, 1, shape=groups)
        sigma = pm.HalfNormal("sigma")
        pm.Normal("y", a[idx], sigma, observed=y)
    oracle = RowLikelihood(model)
    assert oracle.gathered_vars == ["a"]
    return oracle


ORACLES = {
    "logistic": logistic_oracle,
    "linear": linear_oracle,
    "hierarchical": hierarchical_oracle,
}


@st.composite
def neighbours(draw):
    oracle = ORACLES[draw(st.sampled_from(sorted(ORACLES)))]()
    coords = st.floats(-3, 3, allow_nan=False)
    theta = np.array(draw(st.lists(coords, min_size=oracle.ndim, max_size=oracle.ndim)))
    step = np.array(
        draw(st.lists(st.floats(-0.5, 0.5), min_size=oracle.ndim, max_size=oracle.ndim))
    )
    rows = np.arange(N_BASE)
    other = rows.copy()
    other[draw(st.integers(0, N_BASE - 1))] = draw(st.integers(0, oracle.n_rows - 1))
    bound = draw(st.floats(1e-3, 1e3))
    return oracle, theta, theta + step, rows, other, bound


@settings(max_examples=60, deadline=None)
@given(neighbours())
def test_clipped_gradient_sum_moves_at_most_2b(case):
    oracle, theta, _, rows, other, bound = case
    a = oracle.clipped_grad_sum(theta, bound, rows=rows).value
    b = oracle.clipped_grad_sum(theta, bound, rows=other).value
    assert np.linalg.norm(a - b) <= 2 * bound * (1 + 1e-9) + 1e-12 * N_BASE * bound


@settings(max_examples=60, deadline=None)
@given(neighbours())
def test_clipped_ratio_sum_moves_at_most_2B(case):
    oracle, theta, theta_new, rows, other, bound = case
    a = oracle.clipped_llr_sum(theta, theta_new, bound, rows=rows).value
    b = oracle.clipped_llr_sum(theta, theta_new, bound, rows=other).value
    assert np.isfinite(a) and np.isfinite(b)
    assert abs(a - b) <= 2 * bound * (1 + 1e-9) + 1e-12 * N_BASE * bound


def test_every_row_is_clipped_to_the_bound():
    # the per-row contributions themselves respect the bound, extreme rows included
    oracle = logistic_oracle()
    theta = np.array([0.5, -1.0, 2.0])
    bound = 0.7
    for i in range(oracle.n_rows):
        g = oracle.clipped_grad_sum(theta, bound, rows=np.array([i])).value
        assert np.linalg.norm(g) <= bound * (1 + 1e-12)
    r = [oracle.clipped_llr_sum(theta, -theta, bound, rows=np.array([i])).value for i in range(5)]
    assert np.all(np.abs(r) <= bound)
    # and on the sparse path, where a row's gradient is one group's entry and sigma's
    oracle = hierarchical_oracle()
    theta = np.array([0.3, -0.2, 1.0, 0.0, -1.5])
    bound = 5.0  # unclipped row norms run from 1 to 2e13
    norms = []
    for i in range(oracle.n_rows):
        g = oracle.clipped_grad_sum(theta, bound, rows=np.array([i])).value
        norms.append(np.linalg.norm(g))
    assert max(norms) <= bound * (1 + 1e-12)
    assert min(norms) < 0.99 * bound < max(norms)  # some rows are clipped, some are not


def _overflowing_model(form: str, y: np.ndarray, rng: np.random.Generator) -> pm.Model:
    """A model whose gradient overflows inside a product on half the rows (covariate 1e308)."""
    n = y.shape[0]
    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma", 1)
        if form == "scalar coefficients":
            x = rng.normal(size=n)
            x[: n // 2] = 1e308
            a = pm.Normal("a", 0, 5)
            b = pm.Normal("b", 0, 5)
            pm.Normal("y", a + b * pm.Data("x", x), sigma, observed=y)
        elif form == "vector coefficients":  # one (m, 2) block: a matrix product per chunk
            X = rng.normal(size=(n, 2))
            X[: n // 2, 0] = 1e308
            beta = pm.Normal("beta", 0, 5, shape=2)
            pm.Normal("y", pm.Data("X", X) @ beta, sigma, observed=y)
        else:  # "gathered coefficients": a (groups, 2) matrix read at each row's group
            X = rng.normal(size=(n, 2))
            X[: n // 2, 0] = 1e308
            idx = pm.Data("group_idx", rng.integers(0, 5, n))
            b = pm.Normal("b", 0, 1, shape=(5, 2))
            pm.Normal("y", (b[idx] * pm.Data("X", X)).sum(axis=1), sigma, observed=y)
    return model


@pytest.mark.parametrize("chunk_size", [None, 7, 6])
@pytest.mark.parametrize(
    "form", ["scalar coefficients", "vector coefficients", "gathered coefficients"]
)
def test_a_row_whose_gradient_overflows_moves_nothing_but_itself(form, chunk_size):
    # Half the rows' gradients overflow to ±∞ inside a product (covariate 1e308 times a
    # residual); substituting one *other* row, here one whose own gradient overflows too, must
    # still move the clipped sum by at most 2b. A compiled sum that let the product absorb the
    # ∞ (a scale of 0 multiplied in first) and re-summed a chunk only when its total was not
    # finite moved it by about 30 b here on PyMC 6 (a faster variant, reverted).
    n, bound = 61, 1.0  # 8 chunks of 7 and a 5-row one; 10 chunks of 6 and a 1-row one
    y = np.random.default_rng(2).normal(size=n)
    y[: n // 2] = 10.0
    neighbour = y.copy()
    neighbour[-1] = 1e300
    sums = []
    for data in (y, neighbour):
        oracle = RowLikelihood(
            _overflowing_model(form, data, np.random.default_rng(5)), chunk_size=chunk_size
        )
        theta = np.zeros(oracle.ndim)
        assert np.isinf(oracle.grad_rows(theta)[: n // 2]).any(axis=1).all()
        sums.append(oracle.clipped_grad_sum(theta, bound).value)
    assert np.all(np.isfinite(sums))
    assert np.linalg.norm(sums[0] - sums[1]) <= 2 * bound * (1 + 1e-9)


def _undefined_model(y: np.ndarray) -> pm.Model:
    """Half the rows' means are undefined: a coefficient times log(−1) = NaN."""
    n = y.shape[0]
    x = np.random.default_rng(7).uniform(1, 2, size=n)
    x[: n // 2] = -1.0
    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma", 1)
        a = pm.Normal("a", 0, 5)
        b = pm.Normal("b", 0, 5)
        pm.Normal("y", a + b * pm.math.log(pm.Data("x", x)), sigma, observed=y)
    return model


@pytest.mark.parametrize("chunk_size", [None, 7, 6])
@pytest.mark.parametrize(
    "form", ["scalar coefficients", "vector coefficients", "gathered coefficients", "undefined"]
)
def test_substituting_any_row_moves_the_sum_by_at_most_2b_next_to_overflowing_rows(
    form, chunk_size
):
    # Every position of the base rows (half of them overflow to ±∞ inside a product, or are
    # undefined, NaN), substituted by each of three other rows (one like them, one ordinary,
    # one with y = 1e300): the clipped sum moves by at most 2b each time, and each row alone
    # adds at most b. (The reverted variant above let a row's term depend on whether a
    # chunk-mate's total was finite.)
    n, bound = 61, 1.0
    y = np.random.default_rng(2).normal(size=n + 3)
    half = (n + 3) // 2  # the models' first half overflows
    y[:half] = 10.0
    y[n + 2] = 1e300
    rng = np.random.default_rng(5)
    model = _undefined_model(y) if form == "undefined" else _overflowing_model(form, y, rng)
    oracle = RowLikelihood(model, chunk_size=chunk_size)
    theta = np.zeros(oracle.ndim)
    base = np.arange(n)
    raw = oracle.grad_rows(theta, base)
    assert (~np.isfinite(raw[:half])).any(axis=1).all()  # the rows it is about
    assert np.isfinite(raw[half:]).all()
    total = oracle.clipped_grad_sum(theta, bound, rows=base).value
    assert np.all(np.isfinite(total))
    for extra in (0, n, n + 1, n + 2):  # row 0 overflows (or is undefined), n + 2: y = 1e300
        alone = oracle.clipped_grad_sum(theta, bound, rows=np.array([extra])).value
        assert np.linalg.norm(alone) <= bound * (1 + 1e-12)
        for position in range(n):
            other = base.copy()
            other[position] = extra
            moved = oracle.clipped_grad_sum(theta, bound, rows=other).value - total
            assert np.linalg.norm(moved) <= 2 * bound * (1 + 1e-9), (extra, position)


def test_an_infinite_entry_clips_its_row_towards_it_and_an_undefined_row_adds_nothing():
    # theory §2: a NaN entry counts as 0 and an entry beyond ±L (±∞ included) as ±L, before the
    # row is clipped; so a row whose gradient in b overflows to +∞ adds b along b's axis (with
    # ±∞ set to 0, as before, it added its other entries' direction instead), and a row whose
    # every entry is NaN adds nothing
    n, bound = 20, 0.5
    y = np.random.default_rng(2).normal(size=n)
    y[: n // 2] = 10.0
    oracle = RowLikelihood(_overflowing_model("scalar coefficients", y, np.random.default_rng(5)))
    names = [v.name for v, _, _ in oracle.space.slices]
    b = oracle.space.slices[names.index("b")][1].start
    theta = np.zeros(oracle.ndim)
    raw = oracle.grad_rows(theta)
    assert np.isposinf(raw[: n // 2, b]).all()
    assert np.isfinite(np.delete(raw[: n // 2], b, axis=1)).all()  # 10 and r² − 1 = 99
    along_b = np.zeros(oracle.ndim)
    along_b[b] = bound
    for i in range(n // 2):
        term = oracle.clipped_grad_sum(theta, bound, rows=np.array([i])).value
        np.testing.assert_allclose(term, along_b, rtol=0, atol=1e-12)
    undefined = RowLikelihood(_undefined_model(y))
    theta = np.zeros(undefined.ndim)
    assert np.isnan(undefined.grad_rows(theta)[: n // 2]).all()
    for i in range(n // 2):
        term = undefined.clipped_grad_sum(theta, bound, rows=np.array([i])).value
        np.testing.assert_array_equal(term, np.zeros(undefined.ndim))
    # the other rows are ordinary: clipped as NumPy clips them
    rows = np.arange(n // 2, n)
    per_row = undefined.grad_rows(theta, rows)
    expected = (per_row * np.minimum(1, bound / np.linalg.norm(per_row, axis=1))[:, None]).sum(0)
    np.testing.assert_allclose(
        undefined.clipped_grad_sum(theta, bound, rows=rows).value, expected, rtol=1e-10
    )


def _centred_oracle(first: tuple[float, float], gathered: bool, chunk_size) -> RowLikelihood:
    """A regression with five rows at y = 1e200 and a first row given as (x, y)."""
    rng = np.random.default_rng(0)
    x = np.r_[first[0], np.ones(5), rng.normal(size=10)]
    y = np.r_[first[1], np.full(5, 1e200), rng.normal(size=10)]
    with pm.Model() as model:
        b = pm.Normal("b")
        if gathered:  # group intercepts: the sum is formed in NumPy from the compact rows
            a = pm.Normal("a", shape=2)
            mu = a[pm.Data("g", np.arange(x.size) % 2)] + b * pm.Data("x", x)
        else:  # one compiled pass on PyMC 6 (NumPy on PyMC 5's C backend)
            a = pm.Normal("a")
            mu = a + b * pm.Data("x", x)
        pm.Normal("y", mu, 1.0, observed=y)
    return RowLikelihood(model, validate=False, chunk_size=chunk_size)


@pytest.mark.parametrize("chunk_size", [None, 7])
@pytest.mark.parametrize("gathered", [False, True])
def test_the_centred_gradient_sum_moves_at_most_2B_next_to_overflowing_rows(gathered, chunk_size):
    # DP HMC's centred gradient sum, Σ_i clip_B(Wᵀ(g_i − ĝ_i)), with a metric whose entries
    # are all at most 1: a first row whose gradient is finite (1.5e308 in both coordinates)
    # but overflows once mapped, beside rows whose mapped norms overflow (y = 1e200). The
    # compiled pass used to hand a chunk whose total was not finite to NumPy, whose norms are
    # rescaled, so the first row decided what the others added: substituting it moved the sum
    # by 4.9 B (found in review); now no row's term depends on another's.
    bound = 1.0
    sums = []
    for first in [(1.0, 1.5e308), (0.5, 1.0)]:
        oracle = _centred_oracle(first, gathered, chunk_size)
        theta = np.zeros(oracle.ndim)
        centre = Centre(theta, 1.0, np.eye(oracle.ndim))
        kept = np.ones(oracle.ndim, dtype=bool)
        correlated = np.eye(oracle.ndim)
        correlated[0, 1] = correlated[1, 0] = 0.6  # b with a (or a[0])
        metric = np.linalg.cholesky(correlated)
        sums.append(oracle.clipped_centred_grad_sum(theta, centre, metric, kept, bound).value)
    assert np.all(np.isfinite(sums))
    assert np.linalg.norm(sums[0] - sums[1]) <= 2 * bound * (1 + 1e-9)


def test_a_bound_on_the_rows_norms_outside_its_range_is_refused():
    oracle = linear_oracle()
    theta = np.zeros(oracle.ndim)
    for clip in (1e-60, 1e60):
        with pytest.raises(InvalidParameterError, match="grad_clip must be between"):
            oracle.clipped_grad_sum(theta, clip)
    with pytest.raises(InvalidParameterError, match="precond"):
        oracle.clipped_grad_sum(theta, 1.0, precond=np.full(oracle.ndim, 1e60))
    # an unclipped sum (non-private diagnostics) and a ratio's bound keep any positive value
    assert np.all(np.isfinite(oracle.clipped_grad_sum(theta, np.inf).value))
    assert np.isfinite(oracle.clipped_llr_sum(theta, theta + 1e-3, 1e-60).value)


def _grouped_oracle(first_y: float) -> RowLikelihood:
    """Group intercepts beside a slope (norms in the Gram form); row 0's y given."""
    rng = np.random.default_rng(0)
    n = 20
    g = np.r_[0, rng.integers(0, 4, n - 1)]
    x = np.r_[1.0, rng.normal(size=n - 1)]
    y = np.r_[first_y, rng.normal(size=n - 1)]
    with pm.Model() as model:
        a = pm.Normal("a", shape=4)
        b = pm.Normal("b")
        pm.Normal("y", a[pm.Data("g", g)] + b * pm.Data("x", x), 1.0, observed=y)
    return RowLikelihood(model, validate=False)


def test_a_row_whose_gram_norm_overflows_is_still_clipped():
    # With gathered variables a row's norm ‖A v‖ comes from AᵀA (the Gram form). With a metric
    # correlating a group intercept with the slope (−0.9) and a row whose gradient entries are
    # about 1.2e154, a cross term overflowed to −∞ while the squares did not, the clamp to 0
    # gave the row a norm of 0, and it entered unclipped: substituting it moved the centred
    # gradient sum, the centre's gradient sum and the Fisher information by about 5e153 times
    # their bound (found in review). Its norm is now computed again rescaled.
    pair = [_grouped_oracle(1.2e154), _grouped_oracle(0.3)]
    d = pair[0].ndim
    correlated = np.eye(d)
    correlated[0, d - 1] = correlated[d - 1, 0] = -0.9  # a[0] with b
    metric = np.linalg.cholesky(correlated)
    theta, bound, kept = np.zeros(d), 1.0, np.ones(d, dtype=bool)
    centre = Centre(theta, bound, np.eye(d))
    for count_clipped in (False, True):
        sums = [
            o.clipped_centred_grad_sum(
                theta, centre, metric, kept, bound, count_clipped=count_clipped
            ).value
            for o in pair
        ]
        assert np.linalg.norm(sums[0] - sums[1]) <= 2 * bound * (1 + 1e-9)
    whitening = metric.T  # ‖P v‖² = vᵀ Σ v
    centre = Centre(theta, bound, whitening)
    moved = whitening @ (pair[0].centre_grad_sum(centre) - pair[1].centre_grad_sum(centre))
    assert np.linalg.norm(moved) <= 2 * bound * (1 + 1e-9)
    fisher = [o.clipped_fisher(theta, bound, whitening) for o in pair]
    assert np.linalg.norm(fisher[0] - fisher[1]) <= np.sqrt(2) * bound**2 * (1 + 1e-9)


def test_a_metric_that_could_overflow_the_centred_sum_is_refused():
    # the NumPy path sums the rows' terms before mapping them: up to n B / σ_min(W) there
    oracle = _grouped_oracle(0.3)
    d = oracle.ndim
    theta = np.zeros(d)
    centre = Centre(theta, 1.0, np.eye(d))
    with pytest.raises(InvalidParameterError, match="metric"):
        oracle.clipped_centred_grad_sum(theta, centre, 1e-305 * np.eye(d), np.ones(d, bool), 1.0)
