"""DP Barker (theory §4.4): exactness on a tempered Gaussian, a negative control, plumbing."""

from __future__ import annotations

import numpy as np
import pytest
from _tempered_gaussian import N0, SPEC, T, batch_means_se, small_model, tempered_setup

import pymc_dp
from pymc_dp import RowLikelihood
from pymc_dp.barker_correction import BarkerCorrection
from pymc_dp.errors import BarkerVarianceError, InvalidParameterError
from pymc_dp.kernels.barker import BarkerMechanisms, BarkerParams, BarkerState, barker_kernel
from pymc_dp.mechanisms import BarkerTest, PrivateChannel
from pymc_dp.noise import NoiseSource


def barker_test(oracle, source, theta, theta_new, *, log_prior_ratio, **kwargs):
    """One DP Barker test on a fresh channel with the given noise source."""
    return BarkerTest(PrivateChannel(oracle, source), **kwargs)(theta, theta_new, log_prior_ratio)


# b = 4000 rows and proposals of 0.2 posterior sds: the clip bound √b/n0 = 0.063 is above all
# but about 2 in 10⁵ per-row ratios (the typical largest of the 10⁵ rows is 0.03; measured
# below), so the test is exact up to the correction's approximation error. (With 0.3 sds,
# 0.2 % are clipped; with b = 1000, 1–4 %.)
BATCH = 4000
SCALE = 0.2


class NoCorrection:
    """Negative control: Gaussian noise N(0, C) only, no V_corr (not Barker's logistic test)."""

    normal_variance = 2.0

    @staticmethod
    def sample(generator, size=None):
        return 0.0


def run_chain(iterations: int, correction=None, seed: int = 2):
    oracle, mean, sd = tempered_setup()
    rng = np.random.default_rng(seed)
    test = BarkerTest(
        PrivateChannel(oracle, NoiseSource(seed + 1)),
        batch_size=BATCH,
        temperature=T,
        correction=correction or BarkerCorrection.load(2.0),
    )
    mechanisms = BarkerMechanisms(oracle.space.logprior, test)
    state = BarkerState(mean.copy(), oracle.space.logprior(mean))
    draws, accepted, clipped = [], 0, 0
    for _ in range(iterations):
        state, info = barker_kernel(state, BarkerParams(SCALE * sd), rng, mechanisms)
        draws.append(state.theta)
        accepted += info.accepted
        clipped += info.llr_clipped
    assert test.channel.counter.released[test.event] == iterations
    return np.array(draws)[iterations // 10 :], accepted / iterations, clipped


@pytest.mark.slow
def test_dp_barker_targets_the_tempered_posterior():
    _, mean, sd = tempered_setup()
    draws, acceptance, clipped = run_chain(30_000)
    assert clipped / (30_000 * BATCH) < 1e-4
    assert 0.3 < acceptance < 0.95
    for k in range(2):
        se = batch_means_se(draws[:, k])
        assert abs(draws[:, k].mean() - mean[k]) < 4 * se, (k, draws[:, k].mean(), mean[k], se)
    np.testing.assert_allclose(draws.var(0) / sd**2, 1.0, atol=0.15)


@pytest.mark.parametrize("corrected", [True, False], ids=["barker", "negative_control"])
def test_acceptance_probability_is_the_logistic_function_of_the_log_ratio(corrected):
    """Barker's test accepts with probability σ(λ) (logistic), which makes it exact.

    Identical rows make every per-row ratio equal, so the batch estimate of λ is exact and
    σ_b² = 0: the acceptance probability must be σ(λ) up to the correction's 6e-4 CDF error.
    Without V_corr (negative control) it is Φ(λ/√2), visibly different at λ = 1.5.
    """
    from scipy.special import expit
    from scipy.stats import norm

    data = np.full((1000, 2), [0.5, 3.0])
    oracle = RowLikelihood(SPEC.model(data))
    theta = np.array([0.0, 3.0])
    theta_new = np.array([0.4, 3.0])  # ℓ(θ') − ℓ(θ) = 1000 · (0.5² − 0.1²) / (2 · 20) = 6
    lam = float(np.sum(oracle.loglik_rows(theta_new) - oracle.loglik_rows(theta)))
    log_prior_ratio = 1.5 - lam  # a public term that sets λ = 1.5
    correction = BarkerCorrection.load(2.0) if corrected else NoCorrection()
    test = BarkerTest(
        PrivateChannel(oracle, NoiseSource(11)),
        batch_size=100,
        temperature=1.0,
        correction=correction,
    )
    draws = 20_000
    accepted = np.mean([test(theta, theta_new, log_prior_ratio).accepted for _ in range(draws)])
    se = np.sqrt(expit(1.5) * (1 - expit(1.5)) / draws)
    if corrected:
        assert abs(accepted - expit(1.5)) < 4 * se + 6e-4, (accepted, expit(1.5))
    else:  # Φ(1.5/√2) = 0.856 against σ(1.5) = 0.818: about 16 standard errors apart
        assert abs(accepted - norm.cdf(1.5 / np.sqrt(2))) < 4 * se
        assert abs(accepted - expit(1.5)) > 8 * se


def test_only_the_batch_is_read_and_batches_are_secret():
    oracle, mean, sd = tempered_setup()
    correction = BarkerCorrection.load(2.0)

    def decide(source, theta_new):
        before = oracle.rows_read
        result = barker_test(
            oracle,
            source,
            mean,
            theta_new,
            log_prior_ratio=0.0,
            batch_size=64,
            temperature=T,
            correction=correction,
        )
        assert oracle.rows_read - before == 2 * 64  # the batch at θ and at θ', nothing else
        return result

    decide(NoiseSource(), mean + 0.1 * sd)
    # the same noise seed gives the same batch and noise, hence the same decision stream
    a = [decide(NoiseSource(5), mean + 0.5 * sd).accepted for _ in range(5)]
    b = [decide(NoiseSource(5), mean + 0.5 * sd).accepted for _ in range(5)]
    assert a == b


def test_an_uncorrectable_batch_variance_raises_instead_of_deciding():
    oracle, mean, sd = tempered_setup()

    class SmallVariance(NoCorrection):
        normal_variance = 1e-9  # no batch variance fits under it

    with pytest.raises(BarkerVarianceError, match="exceeds the normal variance C"):
        barker_test(
            oracle,
            NoiseSource(0),
            mean,
            mean + sd,
            log_prior_ratio=0.0,
            batch_size=100,
            temperature=T,
            correction=SmallVariance(),
        )


def test_dp_barker_step_plumbing_and_accounting():
    model, data = small_model()
    mean, var = SPEC.posterior_params(data, temperature=0.1)
    budget = pymc_dp.PrivacyBudget(epsilon=2.0, delta=1e-6)
    with model:
        step = pymc_dp.DPBarker(
            budget=budget,
            batch_size=100,
            proposal_scale=0.3 * np.sqrt(var),
            temperature=0.1,
            noise_rng=4,
        )
    allowed = budget.iterations_per_chain(step.cost, 2)
    assert allowed == budget.iterations(step.cost) // 2
    before = step._channel._oracle.rows_read
    idata = pymc_dp.sample(
        step,
        chains=2,
        cores=1,
        progressbar=False,
        compute_convergence_checks=False,
        initvals={"theta": mean},
    )
    assert set(idata.sample_stats.data_vars) == {"accepted", "jump", "epsilon_spent"}
    per_chain = idata.posterior.sizes["draw"] + idata.posterior.attrs["tuning_steps"]
    assert per_chain == allowed
    assert step.counter.released[step.cost] == per_chain  # the last chain's own counter
    assert step._channel._oracle.rows_read - before <= 2 * 2 * per_chain * 100  # batches only
    report = pymc_dp.privacy_report(idata, show=False)
    assert report["dp_epsilon_spent"] <= 2.0
    assert report["dp_epsilon_spent"] == pytest.approx(step.cost.epsilon(1e-6, 2 * per_chain))
    assert report["dp_batch_size"] == 100 and report["dp_step"] == "DPBarker"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"normal_variance": 1.0}, "proved for C = 2 only"),
        ({"batch_size": 2.5}, "batch_size must be an integer"),
        ({"batch_size": 5}, "batch_size"),
        ({"temperature": 2.0}, r"temperature must be in \(0, 1\]"),
        ({"proposal_scale": -1.0}, "proposal_scale must be positive"),
    ],
)
def test_bad_arguments_get_clear_errors(kwargs, message):
    model, _ = small_model()
    args = {"budget": pymc_dp.PrivacyBudget(epsilon=1.0, delta=1e-6), "batch_size": 100}
    with model, pytest.raises(InvalidParameterError, match=message):
        pymc_dp.DPBarker(**{**args, **kwargs})


def test_few_ratios_reach_the_clip_bound_in_the_exactness_regime():
    oracle, mean, sd = tempered_setup()
    rng = np.random.default_rng(9)
    shares = []
    for _ in range(20):
        theta = mean + sd * rng.standard_normal(2)
        theta_new = theta + SCALE * sd * rng.standard_normal(2)
        ratio = oracle.loglik_rows(theta_new) - oracle.loglik_rows(theta)
        shares.append(np.mean(np.abs(ratio) > np.sqrt(BATCH) / N0))
    assert np.mean(shares) < 1e-4 and np.max(shares) < 1e-3, shares


@pytest.mark.slow
def test_parallel_dp_barker_chains_in_spawned_processes_respect_the_budget():
    model, data = small_model()
    mean, var = SPEC.posterior_params(data, temperature=0.1)
    budget = pymc_dp.PrivacyBudget(epsilon=3.0, delta=1e-6)
    with model:
        step = pymc_dp.DPBarker(
            budget=budget, batch_size=100, proposal_scale=0.3 * np.sqrt(var), temperature=0.1
        )
    per_chain = budget.iterations_per_chain(step.cost, 2)
    idata = pymc_dp.sample(
        step,
        chains=2,
        cores=2,
        mp_ctx="spawn",
        progressbar=False,
        compute_convergence_checks=False,
        initvals={"theta": mean},
    )
    assert idata.posterior.sizes["draw"] + idata.posterior.attrs["tuning_steps"] == per_chain
    report = budget.report()  # the parent sees the workers' reservations
    assert report.reserved_iterations == 2 * per_chain
    assert report.spent_epsilon <= 3.0
    assert budget.iterations(step.cost) < 2  # nothing left for another iteration per chain
    last = idata.sample_stats.epsilon_spent.values[:, -1]
    np.testing.assert_allclose(last, step.cost.epsilon(1e-6, per_chain), rtol=1e-9)
