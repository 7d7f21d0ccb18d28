"""Compiled functions are shared between graphs that compute the same, and only between those."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from scipy import stats

from pymc_dp.oracle import RowLikelihood


def _model(y: np.ndarray, obs_sigma: float = 1.5, prior_sd: float = 10.0) -> pm.Model:
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, prior_sd)
        pm.Normal("y", mu, obs_sigma, observed=y)
    return model


def _functions(oracle: RowLikelihood) -> tuple:
    return oracle._f_loglik, oracle._f_grad, oracle.space._f_public


Y = np.random.default_rng(0).normal(1.0, 1.0, 50)
THETA = np.array([0.7])


def test_the_same_model_built_again_reuses_every_compiled_function():
    first, second = RowLikelihood(_model(Y)), RowLikelihood(_model(Y))
    assert all(a is b for a, b in zip(_functions(first), _functions(second), strict=True))
    np.testing.assert_allclose(second.loglik_rows(THETA), stats.norm(0.7, 1.5).logpdf(Y))


def test_other_data_reuses_the_functions_and_reads_its_own_rows():
    # the rows are inputs of the per-row functions, not part of their graphs
    other = Y[::-1] + 3.0
    first, second = RowLikelihood(_model(Y)), RowLikelihood(_model(other))
    assert first._f_loglik is second._f_loglik
    np.testing.assert_allclose(second.loglik_rows(THETA), stats.norm(0.7, 1.5).logpdf(other))
    np.testing.assert_allclose(first.loglik_rows(THETA), stats.norm(0.7, 1.5).logpdf(Y))


@pytest.mark.parametrize(
    ("changed", "check"),
    [
        # (1.5 against 2.0: a σ of 1 would give PyMC's graph another shape, not only a value)
        ({"obs_sigma": 2.0}, "likelihood"),  # a constant of the likelihood
        ({"prior_sd": 3.0}, "prior"),  # a constant of the prior
    ],
)
def test_a_different_constant_compiles_afresh(changed, check):
    # the negative control: a cache keyed on the graph's shape alone would hand the second
    # model the first one's functions, and its values would be the first model's
    first, second = RowLikelihood(_model(Y)), RowLikelihood(_model(Y, **changed))
    if check == "likelihood":
        assert first._f_loglik is not second._f_loglik
        expected = stats.norm(0.7, changed["obs_sigma"]).logpdf(Y)
        np.testing.assert_allclose(second.loglik_rows(THETA), expected)
    else:
        assert first.space._f_public is not second.space._f_public
        expected = stats.norm(0.0, changed["prior_sd"]).logpdf(0.7)
        assert second.space.logprior(THETA) == pytest.approx(expected)
        assert first.space.logprior(THETA) == pytest.approx(stats.norm(0.0, 10.0).logpdf(0.7))


def test_inputs_listed_in_another_order_compile_afresh():
    # equal_computations takes an unpaired leaf as equal to itself: [a, b] and [b, a] of the
    # same graph must not share a function (it would read b as a)
    import pytensor.tensor as pt

    from pymc_dp._compile import compile_function

    a, b = pt.dscalar("a"), pt.dscalar("b")
    first, second = compile_function([a, b], a - 10 * b), compile_function([b, a], a - 10 * b)
    assert first is not second
    two, one = np.array(2.0), np.array(1.0)  # compiled to trust their inputs: arrays
    assert float(first(two, one)) == -8.0 and float(second(one, two)) == -8.0


def test_another_thread_gets_its_own_function():
    # a compiled function has one set of input slots: two threads must never share one
    import threading

    got = []
    thread = threading.Thread(target=lambda: got.append(RowLikelihood(_model(Y))._f_loglik))
    thread.start()
    thread.join()
    assert got and got[0] is not RowLikelihood(_model(Y))._f_loglik


@pytest.mark.parametrize("backend", [None, "JAX"])
def test_per_row_values_returned_earlier_are_not_overwritten_by_later_calls(backend):
    # a single chunk's values are returned without a copy and kept in the per-row caches; a
    # later call, also by another oracle sharing the compiled function, must not write into them
    first, second = RowLikelihood(_model(Y), backend=backend), RowLikelihood(_model(Y + 1.0))
    kept = first.loglik_rows(THETA)
    expected = stats.norm(0.7, 1.5).logpdf(Y)
    first.loglik_rows(THETA + 1.0)
    second.loglik_rows(THETA)
    np.testing.assert_allclose(kept, expected)


def _model_with_shared_values(y: np.ndarray, prior_sd: float) -> pm.Model:
    # PyMC's dimension lengths and pm.Data are shared variables: new objects in every model
    with pm.Model(coords={"obs": np.arange(y.size)}) as model:
        scale = pm.Data("prior_sd", prior_sd)
        mu = pm.Normal("mu", 0.0, scale)
        pm.Normal("y", mu, 1.5, observed=y, dims="obs")
    return model


def _cached_functions() -> int:
    from pymc_dp import _compile

    return sum(len(entries) for entries in _compile._cache.values())


def test_a_model_built_again_reuses_the_functions_and_reads_its_own_shared_values():
    # the second model's graphs differ from the first's only in their shared variables: its
    # functions are the first one's, copied to read its own (a cache that handed over the
    # first model's functions as they are would give the first model's prior scale)
    first_model = _model_with_shared_values(Y, 10.0)
    first = RowLikelihood(first_model)
    compiled = _cached_functions()
    second_model = _model_with_shared_values(Y, 3.0)
    second = RowLikelihood(second_model)
    assert _cached_functions() == compiled  # nothing compiled afresh
    assert second.space.logprior(THETA) == pytest.approx(stats.norm(0.0, 3.0).logpdf(0.7))
    assert first.space.logprior(THETA) == pytest.approx(stats.norm(0.0, 10.0).logpdf(0.7))
    # and after a change of its value (at another θ: the last θ's values are kept)
    pm.set_data({"prior_sd": 5.0}, model=second_model)
    other = THETA + 0.5
    assert second.space.logprior(other) == pytest.approx(stats.norm(0.0, 5.0).logpdf(1.2))
    assert first.space.logprior(other) == pytest.approx(stats.norm(0.0, 10.0).logpdf(1.2))
    np.testing.assert_allclose(second.loglik_rows(THETA), stats.norm(0.7, 1.5).logpdf(Y))
