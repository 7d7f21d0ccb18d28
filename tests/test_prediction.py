"""The bound as a feature: predicted effective draws from public quantities (pymc_dp.prediction)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import pymc_dp
from pymc_dp.kernels.penalty import IndependenceProposal
from pymc_dp.prediction import independence_acceptance, predict_penalty_ess


def simulated_acceptance(z: float, clip: float, cov: np.ndarray, steps: int = 40_000) -> float:
    """An independence Metropolis chain on N(0, Σ) with the penalty test's noise, run directly."""
    rng = np.random.default_rng(11)
    root = np.linalg.cholesky(cov)
    q = IndependenceProposal(np.zeros(cov.shape[0]), root, df=7.0, probability=1.0)
    target = stats.multivariate_normal(np.zeros(cov.shape[0]), cov)
    theta, accepted = np.zeros(cov.shape[0]), 0
    for _ in range(steps):
        new = q.sample(rng)
        sigma = 2 * z * clip * np.linalg.norm(new - theta)
        log_ratio = target.logpdf(new) - target.logpdf(theta) + q.logpdf(theta) - q.logpdf(new)
        log_ratio += rng.normal(0.0, sigma) - 0.5 * sigma**2
        if np.log(rng.uniform()) < log_ratio:
            theta, accepted = new, accepted + 1
    return accepted / steps


@pytest.mark.parametrize("z", [0.0, 20.0, 60.0])
def test_the_predicted_acceptance_is_that_of_the_chain(z):
    cov = np.array([[4e-4, 1e-4], [1e-4, 1e-4]])
    predicted = independence_acceptance(z, 3.0, cov)
    assert predicted == pytest.approx(simulated_acceptance(z, 3.0, cov), abs=0.02)


def test_more_noise_buys_less_acceptance_and_the_ess_formula():
    cov = np.eye(3) * 1e-4
    values = [independence_acceptance(z, 2.0, cov) for z in (1.0, 30.0, 100.0, 300.0)]
    assert values == sorted(values, reverse=True) and values[-1] < 0.05 < 0.6 < values[0]
    prediction = predict_penalty_ess(
        noise_multiplier=30.0, llr_clip=2.0, covariance=cov, chains=4, draws=100
    )
    a = 0.5 * prediction.independence_acceptance
    assert prediction.ess == pytest.approx(400 * a / (2 - a))


def test_predict_ess_grows_with_epsilon_and_rows():
    def ess(epsilon, n):
        sd = 2.5 / np.sqrt(n)  # the quickstart's posterior sd is about 2.5/√n
        return pymc_dp.predict_ess(epsilon, 0.1 / n, scale=sd, d=3, llr_clip=2.83).ess

    assert ess(1, 1e5) < ess(5, 1e5) < ess(10, 1e5)
    assert ess(1, 1e5) < ess(1, 1e6)
    assert ess(1, 1e5) < 10  # the quickstart at ε = 1: a handful, as measured
