"""Models the oracle cannot handle privately get a clear error naming the variable and the fix."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from conftest import MODELS

from pymc_dp.errors import (
    CoupledRowsError,
    InvalidParameterError,
    ModelNotSupportedError,
    PrivacyLeakError,
    PyMCDPError,
)
from pymc_dp.oracle import RowLikelihood

rng = np.random.default_rng(0)
Y = rng.normal(size=50)


def test_no_observed_variables():
    with pm.Model() as model:
        pm.Normal("mu")
    with pytest.raises(ModelNotSupportedError, match="no observed variables"):
        RowLikelihood(model)


def test_observed_variables_with_different_row_counts():
    with pm.Model() as model:
        mu = pm.Normal("mu")
        pm.Normal("a", mu, observed=Y)
        pm.Normal("b", mu, observed=Y[:30])
    with pytest.raises(
        ModelNotSupportedError, match=r"different numbers of rows.*'a': 50.*'b': 30"
    ):
        RowLikelihood(model)


def test_scalar_observed():
    with pm.Model() as model:
        mu = pm.Normal("mu")
        pm.Normal("y", mu, observed=1.5)
    with pytest.raises(ModelNotSupportedError, match="'y' is a scalar"):
        RowLikelihood(model)


def test_discrete_free_variable():
    with pm.Model() as model:
        k = pm.Poisson("k", 3)
        pm.Normal("y", k, observed=Y)
    with pytest.raises(ModelNotSupportedError, match="'k' is discrete"):
        RowLikelihood(model)


def test_missing_observed_values_are_refused():
    y = Y.copy()
    y[3] = np.nan
    with pm.Model() as model:
        mu = pm.Normal("mu")
        pm.Normal("y", mu, observed=y)
    with pytest.raises(ModelNotSupportedError, match=r"'y' has missing values.*'y_unobserved'"):
        RowLikelihood(model)


def test_infinite_observed_values_are_refused():
    y = Y.copy()
    y[7] = np.inf
    with pm.Model() as model:
        mu = pm.Normal("mu")
        pm.Normal("y", mu, observed=y)
    with pytest.raises(ModelNotSupportedError, match="'y' contains NaN or infinite"):
        RowLikelihood(model)


def test_non_finite_covariates_are_refused():
    x = rng.normal(size=50)
    x[0] = np.inf  # PyMC itself refuses NaN in pm.Data, but not inf
    with pm.Model() as model:
        xd = pm.Data("x", x)
        b = pm.Normal("b")
        pm.Normal("y", b * xd, observed=Y)
    with pytest.raises(ModelNotSupportedError, match="Row data 'x' contains NaN"):
        RowLikelihood(model)


def test_potential_reading_data_is_a_privacy_leak():
    with pm.Model() as model:
        xd = pm.Data("x", rng.normal(size=50))
        b = pm.Normal("b")
        pm.Normal("y", b * xd, observed=Y)
        pm.Potential("penalty", -((b * xd) ** 2).sum())
    with pytest.raises(PrivacyLeakError, match=r"pm.Potential 'penalty' reads row data \('x'\)"):
        RowLikelihood(model)


def test_potential_reading_observed_values_is_a_privacy_leak():
    with pm.Model() as model:
        mu = pm.Normal("mu")
        y = pm.Normal("y", mu, observed=Y)
        pm.Potential("extra", -((y - mu) ** 2).sum())
    with pytest.raises(PrivacyLeakError, match=r"pm\.Potential 'extra' reads row data"):
        RowLikelihood(model)


def test_prior_reading_data_is_a_privacy_leak():
    with pm.Model() as model:
        xd = pm.Data("x", rng.normal(size=50))
        mu = pm.Normal("mu", xd.mean(), 1)
        pm.Normal("y", mu * xd, observed=Y)
    with pytest.raises(PrivacyLeakError, match="The prior of 'mu' reads row data"):
        RowLikelihood(model)


def test_potential_on_parameters_only_is_fine():
    with pm.Model() as model:
        mu = pm.Flat("mu")
        pm.Potential("prior", -0.5 * mu**2)
        pm.Normal("y", mu, observed=Y)
    oracle = RowLikelihood(model)
    assert oracle.space.logprior(np.array([2.0])) == pytest.approx(-2.0)


def test_cross_row_statistic_couples_rows():
    with pm.Model() as model:
        xd = pm.Data("x", rng.normal(size=50))
        b = pm.Normal("b")
        pm.Normal("y", b * (xd - xd.mean()), observed=Y)
    with pytest.raises(CoupledRowsError, match=r"one row only.*x - x.mean\(\)"):
        RowLikelihood(model)


def test_one_multivariate_draw_across_rows_couples_rows():
    with pm.Model() as model:
        mu = pm.Normal("mu")
        pm.MvNormal("y", mu=mu * np.ones(50), cov=np.eye(50) + 0.1, observed=Y)
    with pytest.raises(CoupledRowsError, match="'y' is a single multivariate draw over all rows"):
        RowLikelihood(model)


def test_vars_with_observed_or_unknown_variables():
    model = MODELS["linear_halfnormal"]()
    with pytest.raises(InvalidParameterError, match="vars: 'y' is observed"):
        RowLikelihood(model, vars=["y"])
    with pytest.raises(InvalidParameterError, match=r"no variable named 'beta'.*'a', 'b', 'sigma'"):
        RowLikelihood(model, vars=["beta"])


def test_row_data_of_the_wrong_length():
    with pm.Model() as model:
        xd = pm.Data("x", rng.normal(size=50))
        w = pm.Data("w", np.ones(3))
        b = pm.Normal("b")
        pm.Normal("y", b * xd + w.sum(), observed=Y)
    with pytest.raises(InvalidParameterError, match=r"row_data: 'w' has shape \(3,\).*50 rows"):
        RowLikelihood(model, row_data=["x", "w"])


def test_undeclared_row_data_fails_validation():
    # 'x' is read per row, but the user declared no row data besides the observed values
    with pm.Model() as model:
        xd = pm.Data("x", rng.normal(size=50))
        b = pm.Normal("b")
        pm.Normal("y", b * xd, observed=Y)
    with pytest.raises(PyMCDPError, match="one row only"):
        RowLikelihood(model, row_data=[])


def test_bad_arguments_at_call_time():
    oracle = RowLikelihood(MODELS["linear_halfnormal"]())
    theta = np.zeros(oracle.ndim)
    with pytest.raises(InvalidParameterError, match="grad_clip must be positive"):
        oracle.clipped_grad_sum(theta, 0.0)
    with pytest.raises(InvalidParameterError, match="llr_clip must be positive"):
        oracle.clipped_llr_sum(theta, theta, float("nan"))
    with pytest.raises(InvalidParameterError, match=r"theta has shape \(2,\); expected \(3,\)"):
        oracle.loglik_rows(np.zeros(2))
    with pytest.raises(InvalidParameterError, match="gradient_method"):
        RowLikelihood(oracle.model, gradient_method="finite_differences")
