"""DP HMC kernel (theory §4.3): exactness with visible noise, a negative control, divergences.

Exactness: on the seeds' Gaussian model (n = 10 000) with noisy gradients and a noisy ratio test
but nothing clipped, the chain matches the closed-form posterior; without the −σ_l²/2 penalty
(negative control) it does not.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from _gaussian_models import gaussian_setup
from scipy import stats

from pymc_dp.kernels.hmc import HMCMechanisms, HMCParams, HMCState, hmc_kernel, leapfrog
from pymc_dp.mechanisms import GradientRelease, LLRRelease, PrivateChannel
from pymc_dp.noise import NoiseSource
from pymc_dp.releases import Release

GRAD_CLIP = 5.0  # per-row gradient norms stay below 3 on this data (asserted: nothing clipped)
LLR_CLIP = 5.0  # per unit jump


def run_chain(iterations: int, *, penalty: bool = True, z_l: float = 3.0, seed: int = 2):
    oracle, mean, sd = gaussian_setup(10_000)
    rng = np.random.default_rng(seed)
    channel = PrivateChannel(oracle, NoiseSource(seed + 1))
    # z_g = 3: gradient noise of sd 30 per coordinate, next to a posterior gradient of
    # about 22 and 63 per posterior standard deviation: far from negligible
    grad = GradientRelease(channel, grad_clip=GRAD_CLIP, noise_multiplier=3.0, count_clipped=True)
    llr = LLRRelease(channel, llr_clip=LLR_CLIP, noise_multiplier=z_l, count_clipped=True)
    clipped = [0]

    def counted(release):
        def call(*args):
            r = release(*args)
            clipped[0] += r.n_clipped
            return r

        return call

    mechanisms = HMCMechanisms(
        oracle.space.logprior, oracle.space.logprior_grad, counted(grad), counted(llr)
    )

    # M⁻¹ = posterior variance: an isotropic target; η L = 1.5 posterior sds per trajectory
    params = HMCParams(0.3, 5, sd**2, penalty=penalty)
    state = HMCState(mean.copy(), oracle.space.logprior(mean))
    draws, accepted, sigmas = [], 0, []
    for _ in range(iterations):
        state, info = hmc_kernel(state, params, rng, mechanisms)
        assert not info.diverging and info.grad_releases == 6
        draws.append(state.theta)
        accepted += info.accepted
        sigmas.append(info.noise_std)
    released = channel.counter.released
    if grad.event == llr.event:  # same noise multiplier: one event
        assert released[grad.event] == 7 * iterations
    else:
        assert released[grad.event] == 6 * iterations and released[llr.event] == iterations
    return np.array(draws)[iterations // 10 :], accepted / iterations, clipped[0], np.median(sigmas)


def ks_pvalues(draws: np.ndarray, thin: int) -> list[float]:
    _, mean, sd = gaussian_setup(10_000)
    return [stats.kstest(draws[::thin, k], stats.norm(mean[k], sd[k]).cdf).pvalue for k in range(2)]


@pytest.mark.slow
def test_dp_hmc_targets_the_exact_posterior():
    _, mean, sd = gaussian_setup(10_000)
    draws, acceptance, clipped, sigma = run_chain(8000)
    assert clipped == 0  # the regime where DP HMC is exact
    assert sigma > 0.7  # the ratio noise is far from negligible
    assert 0.2 < acceptance < 0.95
    pvalues = ks_pvalues(draws, thin=5)
    assert min(pvalues) > 0.01, pvalues
    np.testing.assert_allclose(draws.mean(0), mean, atol=0.1 * sd.max())
    np.testing.assert_allclose(draws.var(0) / sd**2, 1.0, atol=0.15)


@pytest.mark.slow
def test_negative_control_without_the_penalty_term_is_wrong():
    _, _, sd = gaussian_setup(10_000)
    # ratio noise σ_l ≈ 5: without the penalty the chain still accepts about 60 % of proposals
    # (it mixes well) but too many of them lead outward
    draws, acceptance, clipped, sigma = run_chain(8000, penalty=False, z_l=10.0)
    assert clipped == 0 and sigma > 4 and acceptance > 0.4
    # it fails the exactness test's variance criterion (|ratio − 1| ≤ 0.15) with a margin: the
    # ratio is about 1.37 over seeds, against 1.0–1.1 for the penalised chain
    ratio = draws.var(0) / sd**2
    assert np.max(ratio) > 1.25, (ratio, ks_pvalues(draws, thin=5))


def test_leapfrog_is_reversible_and_makes_l_plus_one_gradient_calls():
    inv_mass = np.array([0.5, 2.0])
    calls = []

    def grad(theta):
        calls.append(theta.copy())
        return -theta / np.array([1.0, 4.0])

    params = HMCParams(0.1, 7, inv_mass)
    theta0, p0 = np.array([0.3, -1.0]), np.array([1.0, 0.5])
    theta1, p1, evaluations, finite = leapfrog(theta0, p0, params, grad)
    assert finite and evaluations == len(calls) == 8
    back, p_back, _, _ = leapfrog(theta1, -p1, params, grad)
    np.testing.assert_allclose(back, theta0, atol=1e-12)
    np.testing.assert_allclose(-p_back, p0, atol=1e-12)


def test_a_diverging_trajectory_is_rejected_stops_reading_and_releases_no_ratio():
    calls = []

    def exploding_grad(theta):
        calls.append(1)
        with np.errstate(over="ignore", invalid="ignore"):
            return theta * 1e200  # overflows after a few steps

    def ratio(theta, theta_new):  # pragma: no cover - must not be called
        raise AssertionError("a diverged trajectory must not release the ratio")

    state = HMCState(np.ones(2), 0.0)
    params = HMCParams(1.0, 20, np.ones(2))
    mechanisms = HMCMechanisms(
        lambda t: 0.0, np.zeros_like, lambda t: Release(exploding_grad(t), 0.0, None), ratio
    )
    new_state, info = hmc_kernel(state, params, np.random.default_rng(0), mechanisms)
    assert info.diverging and not info.accepted
    assert new_state is state
    assert info.grad_releases == len(calls) < 21  # stopped early


def test_a_hugely_negative_released_energy_change_is_a_divergence():
    state = HMCState(np.zeros(2), 0.0)
    params = HMCParams(0.1, 3, np.ones(2))
    mechanisms = HMCMechanisms(
        lambda t: 0.0,
        np.zeros_like,
        lambda t: Release(np.zeros(2), 0.0, None),
        lambda theta, theta_new: Release(-5e3, 0.0, 0),
    )
    _, info = hmc_kernel(state, params, np.random.default_rng(0), mechanisms)
    assert info.diverging and not info.accepted


def test_gradient_release_noise_scale_temperature_and_counting():
    oracle, mean, _ = gaussian_setup(10_000)
    channel = PrivateChannel(oracle)
    release = GradientRelease(channel, grad_clip=GRAD_CLIP, noise_multiplier=2.0, temperature=0.5)
    theta = mean + np.array([0.02, -0.01])
    values = []
    for seed in range(400):
        channel.noise = NoiseSource(seed)
        r = release(theta)
        assert r.noise_std == pytest.approx(0.5 * 2.0 * 2 * GRAD_CLIP)  # T · z · 2 b_g
        values.append(r.value)
    values = np.array(values)
    exact = 0.5 * oracle.clipped_grad_sum(theta, GRAD_CLIP).value  # T · G(θ)
    sigma = 0.5 * 2.0 * 2 * GRAD_CLIP
    assert np.all(np.abs(values.mean(0) - exact) < 4 * sigma / np.sqrt(400))
    np.testing.assert_allclose(values.std(0), sigma, rtol=0.15)
    counter = channel.counter
    assert counter.total() == 400 and counter.mu == pytest.approx(400 / (2 * 2.0**2))


def _huge_gradient(gradient: float, steps: int) -> tuple[HMCParams, HMCMechanisms]:
    """A dense metric and a constant, finite but huge, released gradient."""
    root = np.array([[10.0, 0.0], [5.0, 10.0]])
    mechanisms = HMCMechanisms(
        lambda t: 0.0,
        np.zeros_like,
        lambda t: Release(np.full(2, gradient), 0.0, None),
        lambda theta, theta_new: Release(0.0, 0.0, 0),
    )
    return HMCParams(1.0, steps, np.ones(2), root=root), mechanisms


@pytest.mark.parametrize(
    ("where", "gradient", "steps"), [("velocity", 1e307, 5), ("kinetic energy", 1e200, 1)]
)
def test_an_overflow_is_a_divergence_not_a_numpy_warning(where, gradient, steps):
    # a finite gradient so large that the metric's velocity overflows (the trajectory stops),
    # or, one step of a smaller one, that the final momentum's kinetic energy does (the energy
    # change is −∞): a divergence either way, and no RuntimeWarning from NumPy for the user
    params, mechanisms = _huge_gradient(gradient, steps)
    state = HMCState(np.zeros(2), 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        theta, _, evaluations, finite = leapfrog(
            np.zeros(2), np.zeros(2), params, mechanisms.noisy_grad
        )
        _, info = hmc_kernel(state, params, np.random.default_rng(0), mechanisms)
    if where == "velocity":
        assert not finite and evaluations == 1 and not np.all(np.isfinite(theta))
    else:
        assert finite and np.all(np.isfinite(theta))
    assert info.diverging and not info.accepted
