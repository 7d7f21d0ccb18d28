"""DP penalty kernel (theory §4.1) and the Gaussian mechanisms it uses.

Exactness: with visible noise and no clipped ratio, the chain matches the closed-form posterior of
the seeds' Gaussian model; without the −σ²/2 penalty (negative control) it does not.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from _gaussian_models import gaussian_setup
from scipy import stats

from pymc_dp.errors import InvalidParameterError
from pymc_dp.kernels.penalty import (
    IndependenceProposal,
    PenaltyMechanisms,
    PenaltyParams,
    PenaltyState,
    penalty_kernel,
    propose,
)
from pymc_dp.mechanisms import LLRRelease, PrivateChannel
from pymc_dp.noise import NoiseSource
from pymc_dp.releases import Release
from pymc_dp.testing import Banana

SPEC = Banana(d=2, a=0.0)  # Gaussian model with known covariance (T§5.1)


def run_chain(params: PenaltyParams, iterations: int, seed: int = 2):
    oracle, mean, _ = gaussian_setup()
    rng = np.random.default_rng(seed)
    channel = PrivateChannel(oracle, NoiseSource(seed + 1))
    # llr_clip = 5 per unit jump: no ratio is clipped on this data (asserted below);
    # z = 1.3 gives noise σ ≈ 1.4 on the log ratio: far from negligible.
    release = LLRRelease(channel, llr_clip=5.0, noise_multiplier=1.3, count_clipped=True)
    mechanisms = PenaltyMechanisms(oracle.space.logprior, release)
    state = PenaltyState(mean.copy(), oracle.space.logprior(mean), np.ones(2))
    draws, accepted, clipped, sigmas = [], 0, 0, []
    for _ in range(iterations):
        state, info = penalty_kernel(state, params, rng, mechanisms)
        draws.append(state.theta)
        accepted += info.accepted
        clipped += info.llr_clipped
        sigmas.append(info.noise_std)
    assert channel.counter.released[release.event] == iterations
    return np.array(draws)[iterations // 10 :], accepted / iterations, clipped, np.median(sigmas)


def matches_posterior(draws: np.ndarray, thin: int) -> tuple[bool, list[float]]:
    _, mean, sd = gaussian_setup()
    pvalues = [
        stats.kstest(draws[::thin, k], stats.norm(mean[k], sd[k]).cdf).pvalue for k in range(2)
    ]
    return min(pvalues) > 0.01, pvalues


@pytest.mark.slow
@pytest.mark.parametrize(
    ("one_component", "guided"),
    [(False, False), (True, False), (True, True)],
    ids=["random_walk", "one_component", "guided"],
)
def test_penalty_chain_targets_the_exact_posterior(one_component, guided):
    _, mean, sd = gaussian_setup()
    params = PenaltyParams(sd * (1.0 if not one_component else 1.5), one_component, guided)
    draws, acceptance, clipped, sigma = run_chain(params, 30_000)
    assert clipped == 0  # the regime where the penalty method is exact
    assert sigma > 0.5  # the noise is not negligible
    assert 0.1 < acceptance < 0.9
    ok, pvalues = matches_posterior(draws, thin=20)
    assert ok, pvalues
    np.testing.assert_allclose(draws.mean(0), mean, atol=0.1 * sd.max())
    np.testing.assert_allclose(draws.var(0) / sd**2, 1.0, atol=0.15)


@pytest.mark.slow
def test_negative_control_without_the_penalty_term_is_wrong():
    _, _, sd = gaussian_setup()
    draws, _, clipped, _ = run_chain(PenaltyParams(sd, penalty=False), 30_000)
    assert clipped == 0
    ok, pvalues = matches_posterior(draws, thin=20)
    assert not ok, pvalues
    assert np.max(draws.var(0) / sd**2) > 1.3  # noise without the penalty inflates the variance


def fixed_release(value: float) -> PenaltyMechanisms:
    return PenaltyMechanisms(lambda theta: 0.0, lambda theta, theta_new: Release(value, 0.0, 0))


def test_one_component_updates_change_one_coordinate():
    rng = np.random.default_rng(0)
    state = PenaltyState(np.zeros(5), 0.0, np.ones(5))
    params = PenaltyParams(np.ones(5), one_component=True)
    for _ in range(50):
        new, j = propose(state, params, rng)
        changed = np.flatnonzero(new != state.theta)
        assert list(changed) == [j]


def test_guided_walk_flips_direction_on_reject_and_keeps_it_on_accept():
    rng = np.random.default_rng(0)
    params = PenaltyParams(np.ones(3), one_component=True, guided=True)
    state = PenaltyState(np.zeros(3), 0.0, np.array([1.0, -1.0, 1.0]))
    for _ in range(20):  # always accept: directions never change, moves follow them
        new_state, info = penalty_kernel(state, params, rng, fixed_release(1e9))
        assert info.accepted
        step = new_state.theta - state.theta
        j = int(np.flatnonzero(step)[0])
        assert np.sign(step[j]) == state.directions[j]
        np.testing.assert_array_equal(new_state.directions, state.directions)
        state = new_state
    for _ in range(20):  # always reject: the moved coordinate's direction flips, nothing else
        new_state, info = penalty_kernel(state, params, rng, fixed_release(-1e9))
        assert not info.accepted
        np.testing.assert_array_equal(new_state.theta, state.theta)
        flipped = np.flatnonzero(new_state.directions != state.directions)
        assert len(flipped) == 1
        state = new_state


def test_llr_release_noise_scale_and_counting():
    oracle, mean, _ = gaussian_setup()
    channel = PrivateChannel(oracle)
    release = LLRRelease(channel, llr_clip=5.0, noise_multiplier=2.0, temperature=0.5)
    theta_new = mean + np.array([0.03, -0.04])  # jump 0.05
    values = []
    for seed in range(400):
        channel.noise = NoiseSource(seed)
        r = release(mean, theta_new)
        assert r.noise_std == pytest.approx(2.0 * 2 * 0.5 * 5.0 * 0.05)  # z · 2 T b_l ‖Δθ‖
        values.append(r.value)
    exact = 0.5 * oracle.clipped_llr_sum(mean, theta_new, 0.25).value
    assert abs(np.mean(values) - exact) < 4 * 0.5 / np.sqrt(400)
    assert np.std(values) == pytest.approx(0.5, rel=0.15)
    counter = channel.counter
    assert counter.total() == 400 and counter.mu == pytest.approx(400 / (2 * 2.0**2))


def test_zero_jump_reads_no_data_but_still_counts():
    oracle, mean, _ = gaussian_setup()
    channel = PrivateChannel(oracle, NoiseSource(0))
    before = oracle.rows_read
    r = LLRRelease(channel, llr_clip=5.0, noise_multiplier=1.0)(mean, mean.copy())
    assert r.value == 0.0 and oracle.rows_read == before and channel.counter.total() == 1


def test_noise_policy():
    oracle, mean, _ = gaussian_setup()
    theta_new = mean + 0.05

    def draw(source):
        release = LLRRelease(PrivateChannel(oracle, source), llr_clip=5.0, noise_multiplier=1.0)
        return release(mean, theta_new).value

    assert draw(NoiseSource(7)) == draw(NoiseSource(7))  # a noise seed reproduces the noise
    # default: fresh OS entropy. A snapped release lies on a grid of about sd/400, so two
    # fresh draws coincide about once in 1400 pairs: ask that five are not all equal
    assert len({draw(NoiseSource()) for _ in range(5)}) > 1
    assert not NoiseSource().reproducible and NoiseSource(7).reproducible
    children = NoiseSource(7).spawn(2)
    assert all(c.reproducible for c in children)
    assert draw(children[0]) != draw(children[1])
    with pytest.raises(InvalidParameterError, match="noise_multiplier must be a positive"):
        LLRRelease(PrivateChannel(oracle), llr_clip=1.0, noise_multiplier=0.0)


class _NoHastings(IndependenceProposal):
    """Negative control: the independence proposal without its Hastings term."""

    def logpdf(self, theta):
        return 0.0

    def log_ratio(self, theta, theta_new):
        return 0.0


def _independence(sd: np.ndarray, cls=IndependenceProposal, correlation: float = 0.0):
    """Centred one sd off the mode, wider than the posterior: the Hastings term matters. With
    ``correlation`` the Crank–Nicolson move around it, keeping that share of the distance."""
    _, mean, _ = gaussian_setup()
    proposal = cls(mean + sd, np.diag(1.5 * sd), df=7.0, probability=0.7)
    return proposal.with_correlation(correlation)


@pytest.mark.slow
@pytest.mark.parametrize("correlation", [0.0, 0.6], ids=["t", "crank_nicolson"])
def test_independence_mixture_targets_the_exact_posterior(correlation):
    _, mean, sd = gaussian_setup()
    params = PenaltyParams(sd, independence=_independence(sd, correlation=correlation))
    draws, acceptance, clipped, sigma = run_chain(params, 30_000)
    assert clipped == 0
    assert sigma > 0.5
    assert 0.1 < acceptance < 0.9
    ok, pvalues = matches_posterior(draws, thin=20)
    assert ok, pvalues
    np.testing.assert_allclose(draws.mean(0), mean, atol=0.1 * sd.max())
    np.testing.assert_allclose(draws.var(0) / sd**2, 1.0, atol=0.15)


@pytest.mark.slow
@pytest.mark.parametrize("correlation", [0.0, 0.6], ids=["t", "crank_nicolson"])
def test_negative_control_independence_without_hastings_is_wrong(correlation):
    """Without its Hastings term the mixture is pulled toward the proposal's centre; the
    Crank–Nicolson move then leaves ``π·φ`` invariant instead of ``π``, narrower too."""
    _, mean, sd = gaussian_setup()
    proposal = _independence(sd, _NoHastings, correlation)
    draws, _, clipped, _ = run_chain(PenaltyParams(sd, independence=proposal), 30_000)
    assert clipped == 0
    ok, pvalues = matches_posterior(draws, thin=20)
    assert not ok, pvalues
    assert np.max(np.abs(draws.mean(0) - mean) / sd) > 0.2
    if correlation > 0:
        assert np.max(draws.var(0) / sd**2) < 0.85


def test_correlated_proposal_moves_and_hastings_term():
    """``θ' = m + ρ(θ − m) + √(1 − ρ²) L ξ``: mean ``m + ρ(θ − m)``, covariance
    ``(1 − ρ²) L Lᵀ``; the Hastings term is the Gaussian ``N(m, L Lᵀ)``'s log-density ratio."""
    rng = np.random.default_rng(4)
    root = np.array([[2.0, 0.0], [0.5, 1.0]])
    centre = np.array([1.0, -1.0])
    q = IndependenceProposal(centre, root, df=5.0, probability=1.0, correlation=0.7)
    theta = np.array([3.0, 2.0])
    draws = np.array([q.sample(rng, theta) for _ in range(20_000)])
    np.testing.assert_allclose(draws.mean(0), centre + 0.7 * (theta - centre), atol=0.05)
    np.testing.assert_allclose(np.cov(draws.T), 0.51 * root @ root.T, rtol=0.05, atol=0.02)
    reference = stats.multivariate_normal(centre, root @ root.T)
    pairs = list(itertools.pairwise(draws[:6]))
    np.testing.assert_allclose(
        [q.log_ratio(x, y) for x, y in pairs],
        [reference.logpdf(x) - reference.logpdf(y) for x, y in pairs],
        rtol=1e-12,
        atol=1e-12,
    )
    assert q.with_correlation(0.0).log_ratio(*pairs[0]) != pytest.approx(q.log_ratio(*pairs[0]))


def test_independence_proposal_density_is_the_t_density():
    rng = np.random.default_rng(3)
    root = np.array([[2.0, 0.0], [0.5, 1.0]])
    q = IndependenceProposal(np.array([1.0, -1.0]), root, df=5.0, probability=1.0)
    points = np.array([q.sample(rng) for _ in range(5)])
    exact = stats.multivariate_t(loc=q.centre, shape=root @ root.T, df=5.0)
    differences = [q.logpdf(x) - exact.logpdf(x) for x in points]
    np.testing.assert_allclose(differences, differences[0])  # equal up to the constant
    # the kernel's Hastings term: log q(θ) − log q(θ')
    pairs = list(itertools.pairwise(points))
    ratios = [q.log_ratio(x, y) for x, y in pairs]
    expected = [exact.logpdf(x) - exact.logpdf(y) for x, y in pairs]
    np.testing.assert_allclose(ratios, expected, rtol=1e-12, atol=1e-12)
    draws = np.array([q.sample(rng) for _ in range(20_000)])
    np.testing.assert_allclose(np.cov(draws.T), 5.0 / 3.0 * root @ root.T, rtol=0.1)
