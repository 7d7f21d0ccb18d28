"""Shared fixtures: the model zoo the oracle must handle (issue: foundation/oracle)."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest

from pymc_dp.testing import Banana

warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")


def logistic_regression(n: int = 500, d: int = 4, seed: int = 1) -> pm.Model:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = rng.binomial(1, 1 / (1 + np.exp(-X @ rng.normal(size=d))))
    with pm.Model() as model:
        Xd = pm.Data("X", X)
        beta = pm.Normal("beta", 0, 2, shape=d)
        alpha = pm.Normal("alpha", 0, 2)
        pm.Bernoulli("y", logit_p=alpha + Xd @ beta, observed=y)
    return model


def linear_regression(n: int = 400, seed: int = 2) -> pm.Model:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = 1.0 + 2.0 * x + rng.normal(size=n) * 0.5
    with pm.Model() as model:
        xd = pm.Data("x", x)
        a = pm.Normal("a", 0, 5)
        b = pm.Normal("b", 0, 5)
        sigma = pm.HalfNormal("sigma", 1)  # log transform: the Jacobian belongs to the prior
        pm.Normal("y", a + b * xd, sigma, observed=y)
    return model


def hierarchical(n: int = 600, groups: int = 7, seed: int = 3) -> pm.Model:
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    y = rng.normal(size=groups)[g] + rng.normal(size=n)
    with pm.Model(coords={"group": range(groups)}) as model:
        idx = pm.Data("group_idx", g)
        mu_a = pm.Normal("mu_a", 0, 1)  # hyperpriors: not in the likelihood
        sigma_a = pm.HalfNormal("sigma_a", 1)
        a = pm.Normal("a", mu_a, sigma_a, dims="group")
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", a[idx], sigma, observed=y)
    return model


def group_slopes(n: int = 500, groups: int = 5, seed: int = 8) -> pm.Model:
    """Group-specific slopes, a (groups, 2) matrix indexed by a row-aligned group column."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    X = rng.normal(size=(n, 2))
    y = (rng.normal(size=(groups, 2))[g] * X).sum(axis=1) + rng.normal(size=n)
    with pm.Model() as model:
        idx = pm.Data("group_idx", g)
        Xd = pm.Data("X", X)
        b = pm.Normal("b", 0, 1, shape=(groups, 2))
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", (b[idx] * Xd).sum(axis=1), sigma, observed=y)
    return model


def noncentred(n: int = 500, groups: int = 6, seed: int = 9) -> pm.Model:
    """Non-centred group intercepts: the likelihood reads (mu + sigma_a * z)[idx]."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    y = rng.normal(size=groups)[g] + rng.normal(size=n)
    with pm.Model() as model:
        idx = pm.Data("group_idx", g)
        mu = pm.Normal("mu", 0, 1)
        sigma_a = pm.HalfNormal("sigma_a", 1)
        z = pm.Normal("z", 0, 1, shape=groups)
        a = pm.Deterministic("a", mu + sigma_a * z)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", a[idx], sigma, observed=y)
    return model


def mvnormal_rows(n: int = 300, k: int = 3, seed: int = 4) -> pm.Model:
    rng = np.random.default_rng(seed)
    y = rng.multivariate_normal(np.arange(k), np.eye(k) + 0.5, size=n)
    corr = np.full((k, k), 0.5) + 0.5 * np.eye(k)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 5, shape=k)
        scale = pm.HalfNormal("scale", 2)
        pm.MvNormal("y", mu=mu, cov=scale**2 * corr, observed=y)
    return model


def two_observed(n: int = 350, seed: int = 5) -> pm.Model:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y1 = 0.5 + x + rng.normal(size=n)
    y2 = rng.binomial(1, 1 / (1 + np.exp(-x)))
    with pm.Model() as model:
        xd = pm.Data("x", x)
        a = pm.Normal("a", 0, 3)
        b = pm.Normal("b", 0, 3)
        c = pm.Normal("c", 0, 3)
        sigma = pm.Exponential("sigma", 1)
        pm.Normal("y1", a + b * xd, sigma, observed=y1)
        pm.Bernoulli("y2", logit_p=c * xd, observed=y2)
    return model


def banana(n: int = 1000, seed: int = 6) -> pm.Model:
    spec = Banana(d=2, a=20.0)
    return spec.model(spec.simulate(n, np.random.default_rng(seed)))


def gaussian(n: int = 800, seed: int = 7) -> pm.Model:
    spec = Banana(d=3, a=0.0)
    return spec.model(spec.simulate(n, np.random.default_rng(seed)))


MODELS = {
    "logistic": logistic_regression,
    "linear_halfnormal": linear_regression,
    "hierarchical": hierarchical,
    "group_slopes": group_slopes,
    "noncentred": noncentred,
    "mvnormal_rows": mvnormal_rows,
    "two_observed": two_observed,
    "banana": banana,
    "gaussian": gaussian,
}


@pytest.fixture(params=sorted(MODELS))
def zoo_model(request) -> tuple[str, pm.Model]:
    return request.param, MODELS[request.param]()
