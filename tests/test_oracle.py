"""The oracle agrees with PyMC and with finite differences on the model zoo (theory §2)."""

from __future__ import annotations

import pickle
from functools import cache

import numpy as np
import pytensor
import pytest
from conftest import MODELS

from pymc_dp.oracle import RowLikelihood

PYTENSOR_3 = int(pytensor.__version__.split(".")[0]) >= 3

# The fast path on every model; the exact fallback on models that cover its distinct
# constructions (dense covariates, group indexing, multivariate rows, a potential prior).
FALLBACK_MODELS = ("banana", "group_slopes", "hierarchical", "logistic", "mvnormal_rows")
CASES = [(name, "vectorize") for name in sorted(MODELS)] + [
    (name, "jacobian") for name in FALLBACK_MODELS
]


@cache
def built(name: str, method: str) -> RowLikelihood:
    return RowLikelihood(MODELS[name](), gradient_method=method)


def random_theta(oracle: RowLikelihood, seed: int = 0, scale: float = 0.3) -> np.ndarray:
    start = oracle.space.ravel(oracle.model.initial_point())
    return start + np.random.default_rng(seed).normal(0, scale, oracle.ndim)


def pymc_point(oracle: RowLikelihood, theta: np.ndarray) -> dict:
    return {**oracle.model.initial_point(), **oracle.space.unravel(theta)}


@pytest.mark.parametrize(("name", "method"), CASES)
def test_sums_match_pymc(name, method):
    oracle = built(name, method)
    model = oracle.model
    assert oracle.gradient_method == method
    theta = random_theta(oracle, seed=11)
    point = pymc_point(oracle, theta)

    ell = oracle.loglik_rows(theta)
    assert ell.shape == (oracle.n_rows,)
    obs_logp = model.compile_logp(vars=model.observed_RVs)(point)
    np.testing.assert_allclose(ell.sum(), obs_logp, rtol=1e-8)
    np.testing.assert_allclose(
        ell.sum() + oracle.space.logprior(theta), model.compile_logp()(point), rtol=1e-8
    )

    dlogp = model.compile_dlogp()(point)  # raveled in model.value_vars order, as ours
    grad = oracle.grad_sum(theta) + oracle.space.logprior_grad(theta)
    np.testing.assert_allclose(grad, dlogp, rtol=1e-8, atol=1e-8)
    # the unclipped sum is the clipped sum with an infinite bound
    np.testing.assert_allclose(
        oracle.clipped_grad_sum(theta, np.inf).value,
        grad - oracle.space.logprior_grad(theta),
        rtol=1e-8,
        atol=1e-8,
    )


def _row_shaped_array_model(form: str):
    """A likelihood that builds an array with one entry per row from public values."""
    import pymc as pm
    import pytensor.tensor as pt

    rng = np.random.default_rng(3)
    n = 240
    X = rng.normal(size=(n, 2))
    with pm.Model() as model:
        X_data = pm.Data("X", X)
        beta = pm.Normal("beta", 0, 1, shape=(2, 2))
        if form == "zeros column, X.shape[0]":  # a multinomial logit's reference category
            eta = pt.concatenate([pt.zeros((X_data.shape[0], 1)), X_data @ beta], axis=1)
            pm.Categorical("y", logit_p=eta, observed=rng.integers(0, 3, n))
        elif form == "zeros column, a Python int":
            eta = pt.concatenate([pt.zeros((n, 1)), X_data @ beta], axis=1)
            pm.Categorical("y", logit_p=eta, observed=rng.integers(0, 3, n))
        else:  # "ones(n) times a parameter"
            a = pm.Normal("a", 0, 1)
            mu = pt.ones(X_data.shape[0]) * a + (X_data @ beta).sum(axis=1)
            pm.Normal("y", mu, 1.0, observed=rng.normal(size=n))
    return model


@pytest.mark.parametrize("method", ["vectorize", "jacobian"])
@pytest.mark.parametrize(
    "form",
    ["zeros column, X.shape[0]", "zeros column, a Python int", "ones(n) times a parameter"],
)
def test_an_array_made_with_the_row_count_follows_the_rows(form, method):
    # Rewritten with placeholders of the true length, X.shape[0] folds to the constant n: such
    # an array (pt.zeros((X.shape[0], 1))) must be made with the rows a pass reads. It used to
    # fail the build (ModelNotSupportedError, or CoupledRowsError for the last form).
    model = _row_shaped_array_model(form)
    oracle = RowLikelihood(model, gradient_method=method)
    theta = random_theta(oracle, seed=4)
    point = pymc_point(oracle, theta)
    expected = model.compile_logp(vars=model.observed_RVs, sum=False)(point)[0]
    np.testing.assert_allclose(oracle.loglik_rows(theta), expected, rtol=1e-10)
    rows = np.array([5, 17, 200])
    np.testing.assert_allclose(oracle.loglik_rows(theta, rows=rows), expected[rows], rtol=1e-10)
    dlogp = model.compile_dlogp()(point)
    grad = oracle.grad_sum(theta) + oracle.space.logprior_grad(theta)
    np.testing.assert_allclose(grad, dlogp, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("method", ["vectorize", "jacobian"])
@pytest.mark.parametrize("link", ["logit_p", "p"])
def test_a_logistic_rows_log_likelihood_and_gradient_stay_exact_far_out(link, method):
    """A row's ``log σ(η)`` and ``log(1 − σ(η))`` are taken as ``−softplus(∓η)`` before the
    rows are vectorised, as PyMC stabilises before it differentiates: the per-row form used to
    compute ``log(1 − σ(η))`` from ``σ(η)`` itself, −∞ from ``η ≈ 37`` on (the gradient NaN
    on PyTensor 2), where the log-likelihood is −η."""
    import pymc as pm

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = rng.integers(0, 2, 200)
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 2.5)
        b = pm.Normal("b", 0.0, 1.0, shape=3)
        eta = a + pm.math.dot(X, b)
        if link == "logit_p":
            pm.Bernoulli("y", logit_p=eta, observed=y)
        else:
            pm.Bernoulli("y", p=pm.math.invlogit(eta), observed=y)
    oracle = RowLikelihood(model, gradient_method=method)
    for scale in (20.0, 100.0):  # |η| up to about 150 and 700
        theta = np.array([0.0, scale, -scale, scale])
        eta = X @ theta[1:]
        exact = y * eta - np.logaddexp(0.0, eta)
        np.testing.assert_allclose(oracle.loglik_rows(theta), exact, rtol=1e-12, atol=1e-12)
        gradient = (y - 1.0 / (1.0 + np.exp(-eta)))[:, None] * np.c_[np.ones(200), X]
        np.testing.assert_allclose(oracle.grad_rows(theta), gradient, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_per_row_gradients_match_finite_differences(name):
    oracle = built(name, "vectorize")
    theta = random_theta(oracle, seed=12)
    rows = np.array([0, 3, oracle.n_rows - 1])
    analytic = oracle.grad_rows(theta, rows)
    assert analytic.shape == (3, oracle.ndim)
    eps = 1e-6
    numeric = np.empty_like(analytic)
    for j in range(oracle.ndim):
        step = np.zeros(oracle.ndim)
        step[j] = eps
        up = oracle.loglik_rows(theta + step, rows)
        down = oracle.loglik_rows(theta - step, rows)
        numeric[:, j] = (up - down) / (2 * eps)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-5)
    if name in FALLBACK_MODELS:  # and the two constructions agree row by row
        np.testing.assert_allclose(
            built(name, "jacobian").grad_rows(theta, rows), analytic, rtol=1e-9, atol=1e-10
        )


@pytest.mark.parametrize("name", ["logistic", "hierarchical", "banana"])
def test_clipped_sums_match_brute_force(name):
    oracle = built(name, "vectorize")
    theta = random_theta(oracle, seed=13)
    theta_new = theta + np.random.default_rng(14).normal(0, 0.05, oracle.ndim)
    per_row = oracle.grad_rows(theta)
    norms = np.linalg.norm(per_row, axis=1)
    bound = float(np.median(norms))  # half the rows are clipped
    expected = (per_row * np.minimum(1, bound / norms)[:, None]).sum(axis=0)
    result = oracle.clipped_grad_sum(theta, bound, count_clipped=True)
    np.testing.assert_allclose(result.value, expected, rtol=1e-10, atol=1e-10)
    assert result.n_clipped == int(np.sum(norms > bound))
    assert 0 < result.n_clipped < oracle.n_rows
    # the count is a non-private diagnostic: computed only when asked for
    uncounted = oracle.clipped_grad_sum(theta, bound)
    assert uncounted.n_clipped is None
    np.testing.assert_allclose(uncounted.value, result.value, rtol=1e-12)  # up to rounding

    ratios = oracle.loglik_rows(theta_new) - oracle.loglik_rows(theta)
    llr_bound = float(np.median(np.abs(ratios)))
    for rows in (None, np.arange(oracle.n_rows)):  # cached and compiled paths
        result = oracle.clipped_llr_sum(theta, theta_new, llr_bound, rows, count_clipped=True)
        np.testing.assert_allclose(
            result.value, np.clip(ratios, -llr_bound, llr_bound).sum(), rtol=1e-10, atol=1e-10
        )
        assert result.n_clipped == int(np.sum(np.abs(ratios) > llr_bound))
        assert oracle.clipped_llr_sum(theta, theta_new, llr_bound, rows).n_clipped is None


def test_llr_over_all_rows_reuses_the_current_state_and_matches_the_compiled_ratio():
    oracle = RowLikelihood(MODELS["logistic"](n=2000), chunk_size=300)
    everything = np.arange(oracle.n_rows)  # a row subset takes the compiled, uncached path
    rng = np.random.default_rng(21)
    theta = random_theta(oracle, seed=22)
    for i in range(6):  # a Metropolis chain: accept some proposals, reject others
        theta_new = theta + rng.normal(0, 0.05, oracle.ndim)
        before = oracle.calls
        fast = oracle.clipped_llr_sum(theta, theta_new, 0.02, count_clipped=True)
        assert oracle.calls - before == (2 if i == 0 else 1)  # after the start, only θ' is new
        slow = oracle.clipped_llr_sum(theta, theta_new, 0.02, rows=everything, count_clipped=True)
        np.testing.assert_allclose(fast.value, slow.value, rtol=1e-10)
        assert fast.n_clipped == slow.n_clipped > 0
        theta = theta_new if rng.uniform() < 0.5 else theta


def test_llr_cache_follows_the_fixed_values():
    model = MODELS["linear_halfnormal"]()
    oracle = RowLikelihood(model, vars=["a", "b"])
    theta, theta_new = np.array([0.3, 1.5]), np.array([0.35, 1.45])
    for sigma in (0.7, 2.0):
        oracle.set_fixed_values({"sigma_log__": np.log(sigma)})
        expected = oracle.loglik_rows(theta_new) - oracle.loglik_rows(theta)
        result = oracle.clipped_llr_sum(theta, theta_new, 1e6)
        np.testing.assert_allclose(result.value, expected.sum(), rtol=1e-10)


def test_the_prior_follows_the_fixed_values_at_the_same_theta():
    # The log-prior of θ = (a) reads the fixed hyperparameters (a ~ N(mu_a, sigma_a)); the last
    # θ's prior values are kept, so changing the fixed values must forget them.
    model = MODELS["hierarchical"]()
    space = RowLikelihood(model, vars=["a"]).space
    theta = np.linspace(-1.0, 1.0, space.ndim)
    prior = model.compile_logp(vars=model.free_RVs)  # every prior term, Jacobians included
    values = []
    for mu_a in (0.0, 2.0):
        point = {**model.initial_point(), "mu_a": np.array(mu_a), **space.unravel(theta)}
        space.set_fixed_values(point)
        values.append(space.logprior(theta))
        assert values[-1] == pytest.approx(float(prior(point)), rel=1e-10)
    assert values[0] != values[1]


def test_subsets_and_chunks_read_only_what_they_need():
    oracle = RowLikelihood(MODELS["logistic"](n=1000), chunk_size=64)
    theta = random_theta(oracle, seed=15)
    full = oracle.loglik_rows(theta)
    rows = np.random.default_rng(16).choice(oracle.n_rows, size=37, replace=False)
    before = oracle.rows_read
    sub = oracle.clipped_grad_sum(theta, 1.0, rows=rows)
    assert oracle.rows_read - before == 37
    np.testing.assert_allclose(oracle.loglik_rows(theta, rows), full[rows], rtol=1e-12)
    per_row = oracle.grad_rows(theta, rows)
    norms = np.linalg.norm(per_row, axis=1)
    np.testing.assert_allclose(
        sub.value, (per_row / np.maximum(1, norms)[:, None]).sum(0), rtol=1e-10
    )
    # chunked evaluation (64 rows a call) equals one call over all rows
    whole = RowLikelihood(oracle.model, chunk_size=10_000, validate=False)
    np.testing.assert_allclose(
        oracle.clipped_grad_sum(theta, 0.5).value,
        whole.clipped_grad_sum(theta, 0.5).value,
        rtol=1e-10,
    )


@pytest.mark.parametrize(
    ("name", "gathered"),
    [("hierarchical", ["a"]), ("group_slopes", ["b"]), ("noncentred", ["z"])],
)
def test_group_indexed_parameters_keep_sparse_per_row_gradients(name, gathered):
    # a row reads one group's entry, so its gradient is kept as that entry's gradient and the
    # row's index (one column per row, not one per group); the other tests check the values
    # against PyMC, finite differences and, row by row, the dense fallback
    oracle, dense = built(name, "vectorize"), built(name, "jacobian")
    assert oracle.gathered_vars == gathered
    assert dense.gathered_vars == []
    assert oracle.chunk_size > dense.chunk_size  # narrower per-row gradients: bigger chunks
    theta = random_theta(oracle, seed=19)
    for bound in (0.3, np.inf):
        np.testing.assert_allclose(
            oracle.clipped_grad_sum(theta, bound).value,
            dense.clipped_grad_sum(theta, bound).value,
            rtol=1e-9,
            atol=1e-10,
        )


def test_hyperpriors_are_not_in_the_likelihood():
    oracle = built("hierarchical", "vectorize")
    theta = random_theta(oracle, seed=17)
    per_row = oracle.grad_rows(theta)
    names = [v.name for v in oracle.value_vars]
    point = oracle.space.unravel(np.arange(oracle.ndim, dtype=float))
    for hyper in ("mu_a", "sigma_a_log__"):
        assert hyper in names
        cols = np.atleast_1d(point[hyper]).astype(int)
        assert np.all(per_row[:, cols] == 0)


def test_vars_subset_holds_the_rest_fixed():
    model = MODELS["linear_halfnormal"]()
    oracle = RowLikelihood(model, vars=["a", "b"])
    assert [v.name for v in oracle.value_vars] == ["a", "b"]
    point = {**model.initial_point(), "a": 0.3, "b": 1.5, "sigma_log__": np.log(0.7)}
    oracle.set_fixed_values(point)
    theta = oracle.space.ravel(point)
    np.testing.assert_allclose(
        oracle.grad_sum(theta) + oracle.space.logprior_grad(theta),
        model.compile_dlogp(vars=[model["a"], model["b"]])(point),
        rtol=1e-8,
    )


def test_oracle_pickles():
    oracle = built("linear_halfnormal", "vectorize")
    copy = pickle.loads(pickle.dumps(oracle))
    theta = random_theta(oracle, seed=18)
    np.testing.assert_allclose(
        copy.clipped_grad_sum(theta, 1.0).value, oracle.clipped_grad_sum(theta, 1.0).value
    )
    assert copy.space.logprior(theta) == oracle.space.logprior(theta)


def test_explicit_row_data_matches_auto_detection():
    model = MODELS["two_observed"]()
    auto = RowLikelihood(model)
    explicit = RowLikelihood(model, row_data=["x"])
    theta = random_theta(auto, seed=19)
    np.testing.assert_allclose(auto.loglik_rows(theta), explicit.loglik_rows(theta))


def test_rows_are_defined_by_the_observed_leading_axis():
    oracle = built("mvnormal_rows", "vectorize")
    model = oracle.model
    assert oracle.n_rows == model["y"].eval().shape[0]
    theta = random_theta(oracle, seed=20)
    point = pymc_point(oracle, theta)
    # each row's term is the full MvNormal density of that row
    elementwise = model.compile_fn(model.logp(vars=[model["y"]], sum=False)[0], point_fn=True)(
        point
    )
    np.testing.assert_allclose(oracle.loglik_rows(theta), elementwise, rtol=1e-10)


def _small_regression(n: int = 300, seed: int = 0):
    import pymc as pm

    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    with pm.Model() as model:
        xd = pm.Data("x", x)
        beta = pm.Normal("beta", 0, 1)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", beta * xd, sigma, observed=0.5 * x + rng.normal(size=n), shape=xd.shape)
    return model


def test_steps_on_one_model_share_its_oracle_until_the_model_or_its_data_change():
    import pymc as pm

    import pymc_dp

    model = _small_regression()
    budget = pymc_dp.PrivacyBudget(epsilon=1.0, delta=1e-6)
    with model:
        first = pymc_dp.DPPenalty(budget=budget)._channel._oracle
        assert pymc_dp.DPHMC(budget=budget)._channel._oracle is first  # compiled once
        assert RowLikelihood.for_model(model) is first
        # a step that moves some variables holds the others fixed at its own values: its own
        assert RowLikelihood.for_model(model, ["beta"]) is not first
        # new data (same shape): a new oracle, validated on them
        pm.set_data({"x": np.random.default_rng(1).normal(size=300)})
        second = RowLikelihood.for_model(model)
        assert second is not first
        second.check_data_unchanged()  # built on the new data
        # a variable added since the build: a new oracle (the model is not the same)
        pm.Normal("unused", 0, 1)
        third = RowLikelihood.for_model(model)
        assert third is not second and third.ndim == second.ndim + 1


def test_a_deterministic_added_after_the_build_is_refused_by_the_shared_oracle_too():
    import pymc as pm

    from pymc_dp.errors import PrivacyLeakError

    model = _small_regression()
    with model:
        RowLikelihood.for_model(model)
        pm.Deterministic("fitted", model["beta"] * model["x"])
        with pytest.raises(PrivacyLeakError, match="fitted"):
            RowLikelihood.for_model(model)


@pytest.mark.parametrize("name", ["ordinal_no_p", "mixture", "hierarchical"])
def test_no_per_row_function_loops_over_rows_in_python_and_each_pickles(name):
    # A Blockwise left in a compiled per-row function loops over the rows in Python: the
    # ordinal regression's per-row category probabilities p_i[y_i] and the Split of its
    # gradient cost 160x PyMC's logp+dlogp that way. Constant folding of such an op also left a
    # closure behind that made the oracle unpicklable (pm.sample's worker processes).
    from pytensor.tensor.blockwise import Blockwise

    from pymc_dp.experiments.zoo import ZOO

    model = ZOO[name].model(400, seed=1)[1]
    oracle = RowLikelihood(model)
    assert oracle.gradient_method == "vectorize"
    functions = {"loglik": oracle._f_loglik, "grad": oracle._f_grad}
    functions["grad rows"] = oracle._compact_fn()
    for label, fn in functions.items():
        looped = [n.op for n in fn.maker.fgraph.apply_nodes if isinstance(n.op, Blockwise)]
        assert not looped, (label, looped)
    theta = random_theta(oracle, seed=5, scale=0.1)
    if PYTENSOR_3 and name == "mixture":
        # PyTensor 3 keeps a closure of its own on this model's graph (an OpFromGraph's
        # gradient): docs/limitations.md, pm.sample(cores=1) for it. (A folded Blockwise's
        # closure stays in the graph the oracle's group of functions is rewritten in, which
        # does not travel, so the ordinal model pickles.)
        with pytest.raises(AttributeError, match="pickle"):
            pickle.dumps(oracle)
        return
    copy = pickle.loads(pickle.dumps(oracle))
    np.testing.assert_array_equal(copy.loglik_rows(theta), oracle.loglik_rows(theta))
    np.testing.assert_array_equal(
        copy.clipped_grad_sum(theta, 1.0).value, oracle.clipped_grad_sum(theta, 1.0).value
    )
