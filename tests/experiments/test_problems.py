"""The evaluation models' exact posterior samplers agree with their PyMC models.

Stein's identity: under the posterior π, ``E_π[∇log π(θ)] = 0``. The PyMC model gives the
score ``∇log π`` (prior plus per-row likelihood gradients, through the DP oracle); the exact
sampler gives the draws. If the two describe the same posterior, each coordinate's mean score
over the draws is within Monte Carlo error of zero. A sample shifted by half a posterior sd
(along its narrowest direction) is the negative control: the same statistic must see it.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from pymc_dp.experiments.problems import PROBLEMS
from pymc_dp.oracle import RowLikelihood

_N_ROWS = 2000
_N_DRAWS = 1500
EXACT = [
    name for name, p in PROBLEMS.items() if p.has_exact_sample and not p.tempered
]  # tempered posteriors need the tempered score, which the plain model does not give


def _score_statistic(model, draws: np.ndarray) -> float:
    """Hotelling's ``T² = N m̄ᵀ S⁻¹ m̄`` of the scores at the draws (χ²_d when E[score] = 0)."""
    oracle = RowLikelihood(model)
    scores = np.array(
        [oracle.space.logprior_grad(t) + oracle.grad_rows(t).sum(axis=0) for t in draws]
    )
    mean = scores.mean(0)
    return float(len(draws) * mean @ np.linalg.solve(np.cov(scores, rowvar=False), mean))


@pytest.mark.parametrize("name", EXACT)
def test_exact_sampler_matches_the_model(name):
    problem = PROBLEMS[name].resized(_N_ROWS)
    rng = np.random.default_rng(7)
    data = problem.simulate(rng)
    model = problem.model(data)
    draws = problem.exact_sample(data, _N_DRAWS, rng)
    threshold = stats.chi2.ppf(1 - 1e-4, problem.d)  # 1e-4 false alarms per test
    assert _score_statistic(model, draws) < threshold
    # negative control: half a posterior sd along the narrowest principal direction moves the
    # mean score by half a standard deviation: T² ≈ N / 4 = 375
    variances, vectors = np.linalg.eigh(np.cov(draws, rowvar=False))
    shifted = draws + 0.5 * np.sqrt(variances[0]) * vectors[:, 0]
    assert _score_statistic(model, shifted) > 3 * threshold


def test_the_paper_models_are_those_of_the_dphmc_paper():
    """Paper §4: 2-d banana with σ₁² = 2000, σ₂² = 2500; 10-d Gaussian, Gamma(1/2) spectrum."""
    from pymc_dp.experiments.problems import _G10_COV

    banana = PROBLEMS["paper_banana"]
    assert (banana.n, banana.d, banana.tempered) == (100_000, 2, False)
    data = banana.simulate(np.random.default_rng(0))
    assert np.allclose(data.var(0), [2000.0, 2500.0], rtol=0.02)
    gauss = PROBLEMS["gaussian_10d"]
    assert (gauss.n, gauss.d) == (100_000, 10)
    eigenvalues = np.linalg.eigvalsh(_G10_COV)
    assert np.allclose(_G10_COV, _G10_COV.T) and eigenvalues.min() > 0
    assert eigenvalues.max() / eigenvalues.min() > 100  # ill-conditioned, as the paper's
    data = gauss.simulate(np.random.default_rng(1))
    assert np.allclose(data.mean(0), np.r_[0.0, 3.0, np.zeros(8)], atol=0.02)  # true θ
    assert np.allclose(np.cov(data, rowvar=False), _G10_COV, atol=0.03)
    with gauss.model(data[:10]) as model:  # prior N(0, 100²) on every coordinate
        prior = model["theta"].owner.inputs[-1].eval()  # sigma of pm.Normal
    assert np.allclose(prior, 100.0)
