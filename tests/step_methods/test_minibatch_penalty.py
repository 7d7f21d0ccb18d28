"""Minibatch DP penalty (theory §4.2): exactness on a tempered Gaussian, sensitivity, plumbing."""

from __future__ import annotations

import numpy as np
import pytest
from _tempered_gaussian import SPEC, N, T, batch_means_se, small_model, tempered_setup
from hypothesis import given, settings
from hypothesis import strategies as st

import pymc_dp
from pymc_dp import RowLikelihood
from pymc_dp.errors import InvalidParameterError
from pymc_dp.kernels.penalty import PenaltyMechanisms, PenaltyParams, PenaltyState, penalty_kernel
from pymc_dp.mechanisms import (
    LLRRelease,
    MinibatchLLRRelease,
    PrivateChannel,
    minibatch_llr_estimate,
    minibatch_llr_sensitivity,
)
from pymc_dp.noise import NoiseSource


def minibatch_release(oracle, source, **kwargs) -> MinibatchLLRRelease:
    return MinibatchLLRRelease(PrivateChannel(oracle, source), **kwargs)


# b = 300 rows, proposals of one posterior sd, b_l = 5 (no ratio is clipped: the largest
# per-row ratio per unit jump is about 3 here) and a small noise multiplier z = 0.05, so that
# the batch-variance term ½σ_b² is large next to the DP noise (σ ≈ 0.7): leaving it out doubles
# the variance of the chain (measured over seeds 2–5: 1.76–2.10), while with it the variance
# ratio was 0.94–1.06.
BATCH, SCALE, LLR_CLIP, Z = 300, 1.0, 5.0, 0.05


def run_chain(iterations: int, seed: int = 2, variance_correction: bool = True):
    oracle, mean, sd = tempered_setup()
    rng = np.random.default_rng(seed)
    release = minibatch_release(
        oracle,
        NoiseSource(seed + 1),
        batch_size=BATCH,
        llr_clip=LLR_CLIP,
        noise_multiplier=Z,
        temperature=T,
        variance_correction=variance_correction,
        count_clipped=True,
    )
    counter = release.channel.counter
    state = PenaltyState(mean.copy(), oracle.space.logprior(mean), np.ones(2))
    params = PenaltyParams(SCALE * sd)
    draws, accepted, clipped = [], 0, 0
    for _ in range(iterations):
        state, info = penalty_kernel(
            state, params, rng, PenaltyMechanisms(oracle.space.logprior, release)
        )
        draws.append(state.theta)
        accepted += info.accepted
        clipped += info.llr_clipped
    assert counter.released[release.event] == iterations and counter.mu == 0.0
    return np.array(draws)[iterations // 10 :], accepted / iterations, clipped


@pytest.mark.parametrize("corrected", [True, False], ids=["minibatch_penalty", "no_variance_term"])
def test_minibatch_penalty_targets_the_tempered_posterior(corrected):
    _, mean, sd = tempered_setup()
    draws, acceptance, clipped = run_chain(20_000, variance_correction=corrected)
    assert clipped == 0
    assert 0.1 < acceptance < 0.7
    ratio = draws.var(0) / sd**2
    if corrected:
        for k in range(2):
            se = batch_means_se(draws[:, k])
            assert abs(draws[:, k].mean() - mean[k]) < 4 * se, (k, draws[:, k].mean(), mean[k])
        np.testing.assert_allclose(ratio, 1.0, atol=0.15)
    else:  # the missing −½σ_b² inflates the posterior
        assert np.all(ratio > 1.4), ratio


@settings(max_examples=300, deadline=None)
@given(
    b=st.integers(2, 60),
    n_factor=st.integers(1, 50),
    temperature=st.floats(0.01, 1.0),
    bound=st.floats(1e-3, 10.0),
    fractions=st.lists(st.floats(-1.0, 1.0), min_size=60, max_size=60),
    swap=st.tuples(st.integers(0, 59), st.sampled_from([-1.0, 1.0, 0.0])),
)
def test_the_released_statistic_moves_by_at_most_its_sensitivity(
    b, n_factor, temperature, bound, fractions, swap
):
    # a batch and its neighbour differ in one row; every clipped ratio lies in [−B, B]
    n = b * n_factor
    ratio = bound * np.asarray(fractions[:b])
    other = ratio.copy()
    other[swap[0] % b] = bound * swap[1] if swap[1] else -np.sign(ratio[swap[0] % b]) * bound

    def released(r):
        estimate, variance = minibatch_llr_estimate(r, n_rows=n, temperature=temperature)
        return estimate - 0.5 * variance

    c = minibatch_llr_sensitivity(bound, batch_size=b, n_rows=n, temperature=temperature)
    assert abs(released(ratio) - released(other)) <= c * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize(("b", "n"), [(2, 10), (50, 1000), (300, 100_000)])
def test_the_sensitivity_is_reached(b, n):
    # shared rows all at +B and the substituted ratio going from −B to +B: |Δ| = c exactly
    bound, temperature = 0.7, 0.3
    before = np.full(b, bound)
    before[0] = -bound
    after = np.full(b, bound)

    def released(r):
        estimate, variance = minibatch_llr_estimate(r, n_rows=n, temperature=temperature)
        return estimate - 0.5 * variance

    c = minibatch_llr_sensitivity(bound, batch_size=b, n_rows=n, temperature=temperature)
    assert abs(released(after) - released(before)) == pytest.approx(c, rel=1e-12)


def test_only_the_batch_is_read_and_batches_are_secret():
    oracle, mean, sd = tempered_setup()

    def release(source, theta_new):
        before = oracle.rows_read
        release = minibatch_release(
            oracle, source, batch_size=64, llr_clip=LLR_CLIP, noise_multiplier=1.0, temperature=T
        )
        value = release(mean, theta_new)
        assert oracle.rows_read - before == 2 * 64  # the batch at θ and at θ', nothing else
        return value.value

    release(NoiseSource(), mean + 0.1 * sd)
    a = [release(NoiseSource(5), mean + 0.5 * sd) for _ in range(3)]
    b = [release(NoiseSource(5), mean + 0.5 * sd) for _ in range(3)]
    assert a == b  # batch and noise come from the noise source only


def test_a_full_batch_is_the_full_data_penalty_release():
    # b = n: the variance term vanishes (finite-population factor) and c = 2TB, as theory §4.1
    data = SPEC.simulate(500, np.random.default_rng(4))
    oracle = RowLikelihood(SPEC.model(data))
    theta, theta_new = np.array([1.0, 2.0]), np.array([1.1, 1.9])
    kwargs = {"llr_clip": 0.5, "noise_multiplier": 2.0, "temperature": 0.3}
    full = LLRRelease(PrivateChannel(oracle, NoiseSource(7)), **kwargs)(theta, theta_new)
    batch = minibatch_release(oracle, NoiseSource(8), batch_size=500, **kwargs)(theta, theta_new)
    assert batch.noise_std == pytest.approx(full.noise_std)
    exact = 0.3 * oracle.clipped_llr_sum(theta, theta_new, 0.5 * np.sqrt(0.02)).value
    draws = [
        minibatch_release(oracle, NoiseSource(s), batch_size=500, **kwargs)(theta, theta_new).value
        for s in range(400)
    ]
    assert abs(np.mean(draws) - exact) < 4 * full.noise_std / np.sqrt(400)
    assert np.std(draws) == pytest.approx(full.noise_std, rel=0.15)


@pytest.mark.parametrize("batch_size", [1, N + 1])
def test_the_mechanism_refuses_a_batch_it_cannot_draw(batch_size):
    oracle, _, _ = tempered_setup()
    with pytest.raises(InvalidParameterError, match="between 2 and the number of rows"):
        minibatch_release(
            oracle,
            NoiseSource(0),
            batch_size=batch_size,
            llr_clip=1.0,
            noise_multiplier=1.0,
            temperature=T,
        )


def test_minibatch_dp_penalty_step_plumbing_and_accounting():
    model, data = small_model()
    mean, var = SPEC.posterior_params(data, temperature=0.1)
    budget = pymc_dp.PrivacyBudget(epsilon=1.0, delta=1e-6)
    with model:
        step = pymc_dp.DPPenalty(
            budget=budget,
            batch_size=100,
            llr_clip=5.0,
            noise_multiplier=3.0,
            proposal_scale=0.5 * np.sqrt(var),
            temperature=0.1,
            noise_rng=4,
        )
    assert step.cost == pymc_dp.SubsampledGaussianCost(3.0, 100 / 2000)
    allowed = budget.iterations_per_chain(step.cost, 2)
    assert step.cost.epsilon(1e-6, 2 * allowed) <= 1.0 < step.cost.epsilon(1e-6, 2 * allowed + 2)
    before = step._channel._oracle.rows_read
    idata = pymc_dp.sample(
        step,
        chains=2,
        cores=1,
        progressbar=False,
        compute_convergence_checks=False,
        initvals={"theta": mean},
    )
    stats = idata.sample_stats
    assert set(stats.data_vars) == {"accepted", "jump", "epsilon_spent"}  # no μ, no clip counts
    per_chain = idata.posterior.sizes["draw"] + idata.posterior.attrs["tuning_steps"]
    assert per_chain == allowed
    assert step.counter.released[step.cost] == per_chain  # the last chain's own counter
    assert step._channel._oracle.rows_read - before <= 2 * 2 * per_chain * 100  # batches only
    eps = stats.epsilon_spent.values  # the draws: iterations tune + 1, ..., tune + draws
    tune = idata.posterior.attrs["tuning_steps"]
    assert np.all(np.diff(eps, axis=1) >= 0)  # never decreasing, and an upper bound ...
    for j in (0, 5, eps.shape[1] - 1):
        assert eps[0, j] >= step.cost.epsilon(1e-6, tune + j + 1) - 1e-12
    assert eps[0, -1] == pytest.approx(step.cost.epsilon(1e-6, per_chain))  # ... exact at the end
    report = pymc_dp.privacy_report(idata, show=False)
    assert report["dp_epsilon_spent"] == pytest.approx(step.cost.epsilon(1e-6, 2 * per_chain))
    assert report["dp_epsilon_spent"] <= 1.0
    assert report["dp_batch_size"] == 100 and "PLD" in report["dp_accountant"]
    assert "dp_mu_spent" not in report


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 2.5}, "batch_size must be an integer"),
        ({"batch_size": 1}, "between 2 and the number of rows"),
        ({"batch_size": 5000}, "between 2 and the number of rows n = 2000"),
        ({"noise_multiplier": None, "tau": 0.1}, "with batch_size give noise_multiplier"),
    ],
)
def test_bad_arguments_get_clear_errors(kwargs, message):
    model, _ = small_model()
    args = {
        "budget": pymc_dp.PrivacyBudget(epsilon=1.0, delta=1e-6),
        "batch_size": 100,
        "llr_clip": 1.0,
        "noise_multiplier": 1.0,
    }
    with model, pytest.raises(InvalidParameterError, match=message):
        pymc_dp.DPPenalty(**{**args, **kwargs})
