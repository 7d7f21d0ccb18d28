"""Per-row gradients in compact form (each row's own coordinates only) and what uses them.

A hierarchy's row reads a few of ``θ``'s coordinates (its group's entries and the shared ones);
the centring's reads and the centred releases (theory §4.3) hold and combine the rows in that
form instead of as an ``(n, d)`` matrix. The per-row gradients are checked against the compiled
gradient sum of each row alone (which does not use the compact form); every other quantity
against the dense formulas applied to those rows.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

from pymc_dp import RowLikelihood
from pymc_dp.errors import PrivateEvaluationError
from pymc_dp.oracle import _CompactLayout, _RowMap
from pymc_dp.releases import Centre, clipped_ratio_sum


def _slopes(n: int = 300, seed: int = 0) -> pm.Model:
    # varying intercepts and slopes of one grouping, a prior-only hyperparameter
    rng = np.random.default_rng(seed)
    g, x = rng.integers(0, 4, n), rng.normal(size=n)
    y = 0.5 + 0.3 * g + (1.0 - 0.2 * g) * x + rng.normal(size=n)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)  # the prior's only
        a = pm.Normal("a", mu, 1.0, shape=4)
        b = pm.Normal("b", 0.0, 1.0, shape=4)
        sigma = pm.HalfNormal("sigma", 2.0)
        group, cov = pm.Data("g", g), pm.Data("x", x)
        pm.Normal("y", a[group] + b[group] * cov, sigma, observed=y)
    return model


def _crossed(n: int = 300, seed: int = 1) -> pm.Model:
    # two groupings with different indices, a vector-valued shared coefficient
    rng = np.random.default_rng(seed)
    g, h, x = rng.integers(0, 5, n), rng.integers(0, 3, n), rng.normal(size=(n, 2))
    y = 0.2 * g - 0.4 * h + x @ [0.5, -1.0] + rng.normal(size=n)
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0, shape=5)
        c = pm.Normal("c", 0.0, 1.0, shape=3)
        beta = pm.Normal("beta", 0.0, 1.0, shape=2)
        pm.Normal(
            "y", a[pm.Data("g", g)] + c[pm.Data("h", h)] + pm.Data("x", x) @ beta, 1.0, observed=y
        )
    return model


def _regression(n: int = 300, seed: int = 2) -> pm.Model:
    # no gathered variable: every row on the same coordinates
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        sigma = pm.HalfNormal("sigma", 2.0)
        pm.Normal("y", pm.Data("x", x) @ beta, sigma, observed=x @ [1.0, 0.0, -1.0])
    return model


def _lengths(n: int = 300, seed: int = 3) -> pm.Model:
    # two variables read at the same index but of different lengths, with negative indices
    # (counted from each variable's end, as PyMC does)
    rng = np.random.default_rng(seed)
    g = rng.integers(-1, 3, n)
    y = 0.3 * g + rng.normal(size=n)
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0, shape=4)
        b = pm.Normal("b", 0.0, 1.0, shape=3)
        sigma = pm.HalfNormal("sigma", 2.0)
        group = pm.Data("g", g)
        pm.Normal("y", a[group] + b[group], sigma, observed=y)
    return model


def _matrix(n: int = 257, seed: int = 4) -> pm.Model:
    # a gathered (groups, 2) matrix read a row at a time; 257 rows in chunks of 64 leave a
    # last chunk of one row (its scatter-add once failed on PyTensor 2)
    rng = np.random.default_rng(seed)
    g, x = rng.integers(0, 3, n), rng.normal(size=n)
    with pm.Model() as model:
        ab = pm.Normal("ab", 0.0, 1.0, shape=(3, 2))
        row = ab[pm.Data("g", g)]
        pm.Normal("y", row[:, 0] + row[:, 1] * pm.Data("x", x), 1.0, observed=x + g)
    return model


MODELS = {
    "slopes": _slopes,
    "crossed": _crossed,
    "lengths": _lengths,
    "matrix": _matrix,
    "regression": _regression,
}


def _theta(oracle: RowLikelihood, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(scale=0.3, size=oracle.ndim)


@pytest.fixture(scope="module", params=list(MODELS))
def oracle(request):
    # small chunks: every pass reads several
    return RowLikelihood(MODELS[request.param](), chunk_size=64)


def test_each_rows_gradient_is_its_own_gradient_sum(oracle):
    theta = _theta(oracle, 0)
    rows = oracle.grad_rows(theta)
    for i in (0, 1, 77, oracle.n_rows - 1):
        np.testing.assert_allclose(rows[i], oracle.grad_sum(theta, np.array([i])), atol=1e-12)
    np.testing.assert_allclose(rows.sum(axis=0), oracle.grad_sum(theta), rtol=1e-10)
    assert not rows[:, ~oracle.likelihood_coordinates].any()


def _centre(oracle: RowLikelihood, seed: int) -> tuple[Centre, np.ndarray]:
    """A centre with a dense whitening and a clip that cuts some rows, and the rows' clipped
    gradients there computed densely."""
    rng = np.random.default_rng(seed)
    d = oracle.ndim
    whitening = np.eye(d) + 0.3 * rng.normal(size=(d, d))
    theta = _theta(oracle, seed)
    norms = np.linalg.norm(oracle.grad_rows(theta) @ whitening.T, axis=1)
    clip = float(np.quantile(norms, 0.7))
    centre = Centre(theta, clip, whitening)
    grads = oracle.grad_rows(theta)
    return centre, grads * np.minimum(1.0, clip / norms)[:, None]


def test_the_centre_gradients_are_the_rows_clipped_in_the_whitening(oracle):
    centre, expected = _centre(oracle, 3)
    np.testing.assert_allclose(oracle.centre_rows(centre), expected, atol=1e-12)
    np.testing.assert_allclose(oracle.centre_grad_sum(centre), expected.sum(axis=0), atol=1e-10)


@pytest.mark.parametrize("subset", [False, True])
def test_the_centred_gradient_sum_is_the_dense_formula(oracle, subset):
    centre, centre_rows = _centre(oracle, 4)
    kept = oracle.likelihood_coordinates.copy()
    if subset:  # a metric on fewer coordinates than the likelihood's
        kept[np.flatnonzero(kept)[0]] = False
    rng = np.random.default_rng(5)
    metric = np.tril(rng.normal(size=(kept.sum(), kept.sum()))) + 2 * np.eye(kept.sum())
    theta = _theta(oracle, 6)
    differences = (oracle.grad_rows(theta) - centre_rows)[:, kept] @ metric
    norms = np.linalg.norm(differences, axis=1)
    bound = float(np.median(norms))
    expected = (differences * np.minimum(1.0, bound / norms)[:, None]).sum(axis=0)
    got = oracle.clipped_centred_grad_sum(theta, centre, metric, kept, bound, count_clipped=True)
    np.testing.assert_allclose(got.value, expected, rtol=1e-9, atol=1e-10)
    assert got.n_clipped == int(np.sum(norms > bound))
    # without the count (one compiled pass where no variable is gathered, off the C backend)
    plain = oracle.clipped_centred_grad_sum(theta, centre, metric, kept, bound)
    np.testing.assert_allclose(plain.value, expected, rtol=1e-9, atol=1e-10)
    assert plain.n_clipped is None


def test_the_centred_ratio_is_the_dense_formula(oracle):
    centre, centre_rows = _centre(oracle, 7)
    theta, theta_new = _theta(oracle, 8), _theta(oracle, 9)
    expected = (
        oracle.loglik_rows(theta_new)
        - oracle.loglik_rows(theta)
        - centre_rows @ (theta_new - theta)
    )
    np.testing.assert_allclose(
        oracle.centred_ratio_rows(theta, theta_new, centre), expected, atol=1e-9
    )
    bound = float(np.quantile(np.abs(expected), 0.6))
    got = oracle.clipped_centred_llr_sum(theta, theta_new, centre, bound).value
    assert got == pytest.approx(clipped_ratio_sum(expected, bound), abs=1e-8)


def test_a_group_index_outside_the_groups_is_refused_without_its_value():
    model = _slopes(50)
    oracle = RowLikelihood(model, validate=False)
    oracle._rows[[r.name for r in oracle._rows].index("g")].data[7] = 11  # 4 groups
    with pytest.raises(PrivateEvaluationError) as info:
        oracle.grad_rows(np.zeros(oracle.ndim))
    assert "11" not in str(info.value) and "IndexError" in str(info.value)


LAYOUTS = {
    # a shared column, an intercept and a slope of one grouping (2 groups)
    "one index": _CompactLayout(
        first=np.array([0, 3, 4]),
        stride=np.array([0, 2, 2]),
        group=np.array([-1, 0, 0]),
        groups=np.array([2]),
    ),
    # two groupings (3 and 2 groups) beside two shared columns
    "two indices": _CompactLayout(
        first=np.array([0, 3, 4, 6]),
        stride=np.array([1, 0, 1, 0]),
        group=np.array([0, -1, 1, -1]),
        groups=np.array([3, 2]),
    ),
}


@pytest.mark.parametrize("gram", [True, False])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_row_map_agrees_with_the_dense_rows(gram, name):
    # the Gram tables (few coordinates per row) and the dense rows give the dense results
    layout = LAYOUTS[name]
    rng = np.random.default_rng(10)
    d, r, m = 9, 12, 40
    matrix = rng.normal(size=(r, d))
    mapped = _RowMap(matrix, layout)
    assert mapped.gram is not None
    if not gram:
        mapped.gram = None
    values = rng.normal(size=(m, layout.first.size))
    index = np.stack([rng.integers(0, g, m) for g in layout.groups], axis=1)
    dense = layout.dense(values, index, d)
    coords = layout.coordinates(index)
    assert np.all(dense[np.arange(m)[:, None], coords] == values)
    assert np.count_nonzero(dense) == values.size
    weights = rng.uniform(size=m)
    np.testing.assert_allclose(
        mapped.norms(values, index), np.linalg.norm(dense @ matrix.T, axis=1), rtol=1e-12
    )
    np.testing.assert_allclose(
        mapped.weighted_sum(weights, values, index), matrix @ (weights @ dense), rtol=1e-12
    )
    step = rng.normal(size=d)
    np.testing.assert_allclose(layout.dot(values, index, step), dense @ step, rtol=1e-12)
    np.testing.assert_allclose(layout.total(values, index, d), dense.sum(axis=0), rtol=1e-12)


def test_the_clipped_fisher_is_the_dense_formula(oracle):
    rng = np.random.default_rng(11)
    d = oracle.ndim
    whitening = np.eye(d) + 0.3 * rng.normal(size=(d, d))
    theta = _theta(oracle, 12)
    scaled = oracle.grad_rows(theta) @ whitening.T
    norms = np.linalg.norm(scaled, axis=1)
    clip = float(np.quantile(norms, 0.6))
    scaled *= np.minimum(1.0, clip / norms)[:, None]
    np.testing.assert_allclose(
        oracle.clipped_fisher(theta, clip, whitening), scaled.T @ scaled, rtol=1e-9, atol=1e-9
    )


@pytest.mark.parametrize("kind", ["plain", "precond", "whitening", "directions"])
def test_the_norm_counts_are_those_of_the_dense_rows(oracle, kind):
    rng = np.random.default_rng(13)
    d = oracle.ndim
    theta = _theta(oracle, 14)
    grads = oracle.grad_rows(theta)
    options = {}
    if kind == "precond":
        options["precond"] = rng.uniform(0.5, 2.0, d)
        values = np.linalg.norm(grads * options["precond"], axis=1)
    elif kind == "plain":
        values = np.linalg.norm(grads, axis=1)
    else:
        options["whitening"] = np.eye(d) + 0.3 * rng.normal(size=(d, d))
        values = np.linalg.norm(grads @ options["whitening"].T, axis=1)
    if kind == "directions":
        units = rng.normal(size=(3, d))
        options["directions"] = units / np.linalg.norm(units, axis=1, keepdims=True)
        values = np.abs(grads @ options["whitening"].T @ options["directions"].T).ravel()
    edges = np.quantile(values, [0.1, 0.3, 0.5, 0.7, 0.9])
    expected = np.bincount(np.searchsorted(edges, values, side="left"), minlength=6)
    got = oracle.grad_norm_counts(theta, edges, **options)
    assert np.abs(got - expected).sum() <= 2  # a value at an edge may fall either side
    assert got.sum() == expected.sum()


@pytest.mark.parametrize("name", ["slopes", "regression"])
def test_gradients_too_large_to_square_give_a_finite_clipped_sum(name):
    # a leapfrog far out in the tails: σ = e^-300 makes each row's gradient about 1e260, whose
    # square overflows; the rows are clipped to B along their direction, never NaN
    oracle = RowLikelihood(MODELS[name](), chunk_size=64)
    theta = _theta(oracle, 15)
    theta[-1] = -300.0  # log σ (the last coordinate of both models)
    centre = Centre(_theta(oracle, 16), 1.0, np.eye(oracle.ndim))
    kept = oracle.likelihood_coordinates
    metric = np.eye(kept.sum()) + 0.2 * np.tril(np.ones((kept.sum(), kept.sum())), -1)
    rows = (oracle.grad_rows(theta) - oracle.centre_rows(centre))[:, kept]
    largest = np.abs(rows).max(axis=1)
    assert np.all(np.isfinite(rows)) and largest.max() > 1e200
    directions = (rows / largest[:, None]) @ metric
    bound = 0.5
    expected = (bound * directions / np.linalg.norm(directions, axis=1)[:, None]).sum(axis=0)
    exact = oracle.clipped_centred_grad_sum(theta, centre, metric, kept, bound, count_clipped=True)
    np.testing.assert_allclose(exact.value, expected, rtol=1e-9)
    # one compiled pass (no gathered variable) drops a row whose squared norm overflows, as
    # the plain clipped gradient sum does: each row still moves the sum by at most B
    fast = oracle.clipped_centred_grad_sum(theta, centre, metric, kept, bound).value
    if oracle._centred_grad_graph is None:  # the same NumPy path
        np.testing.assert_allclose(fast, expected, rtol=1e-9)
    else:
        assert np.all(np.isfinite(fast))
        assert np.linalg.norm(fast) <= bound * oracle.n_rows * (1 + 1e-9)


def test_an_ill_conditioned_map_never_understates_a_norm():
    # two nearly parallel columns (condition number about 2e9) and a row along their
    # difference: ‖A v‖ = 3 exactly, but vᵀ(AᵀA)v rounds to 0. The Gram form is refused
    # there and the row is mapped directly, so a row scaled to a bound cannot exceed it.
    layout = _CompactLayout(
        first=np.array([0, 1, 2]),
        stride=np.array([0, 0, 1]),
        group=np.array([-1, -1, 0]),
        groups=np.array([2]),
    )
    d = 4
    matrix = np.eye(d)
    matrix[0, 1], matrix[1, 1] = 1.0, 1e-9
    mapped = _RowMap(matrix, layout)
    assert mapped.gram is None
    values = np.array([[3e9, -3e9, 0.5], [3e9, -3e9, -2.0]])
    index = np.array([[0], [1]])
    exact = np.sqrt(9.0 + values[:, 2] ** 2)
    assert np.all(mapped.norms(values, index) >= exact * (1 - 1e-9))
    # a well-conditioned map keeps the Gram form, its norms raised by its error bound only
    mapped = _RowMap(np.eye(d) + 0.1, layout)
    assert mapped.gram is not None and 1.0 < mapped.inflation < 1.0 + 1e-12
