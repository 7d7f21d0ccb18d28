"""The stochastic-gradient kernels on a closed-form Gaussian posterior (theory §4.5).

Full batches and no clipping, so the only noise is the release noise that the step size
implies (:func:`diffusion_noise_multiplier`): the draws then follow the discretised dynamics,
whose stationary variance for a Gaussian target is known (SGLD in closed form, SGHMC from the
covariance recursion of its linear update). Each test has a negative control with one term
wrong — the seeds' Langevin noise, the printed friction sign, the printed ``h`` noise scaling, a
missing thermostat noise — that the same check must reject.
"""

from __future__ import annotations

import numpy as np
import pytest

from pymc_dp.kernels.stochastic_gradient import (
    SGMechanisms,
    SGState,
    diffusion_noise_multiplier,
    sghmc_kernel,
    sgld_kernel,
    sgnht_kernel,
)
from pymc_dp.releases import Release

N_ROWS = 1000
DIM = 200  # independent coordinates: 200 draws of the same posterior per iteration
SD = N_ROWS**-0.5  # posterior sd of N(ȳ, 1/n) (unit-variance rows, flat prior)
CLIP = 1.0
YBAR = np.random.default_rng(0).normal(0.0, 1.0, DIM)


def mechanisms(time_step: float, diffusion: float, noise_factor: float = 1.0, seed: int = 1):
    """A full-data release of ``Σ_i (y_i − θ)`` with the noise the dynamics need (times
    ``noise_factor``: the negative controls)."""
    z = diffusion_noise_multiplier(
        time_step=time_step, diffusion=diffusion, batch_size=N_ROWS, n_rows=N_ROWS, grad_clip=CLIP
    )
    sigma = noise_factor * z * 2.0 * CLIP
    noise = np.random.default_rng(seed)

    def release(theta):
        return Release(N_ROWS * (YBAR - theta) + noise.normal(0.0, sigma, DIM), sigma, None)

    return SGMechanisms(lambda theta: np.zeros(DIM), release, 1.0)


def variance_ratio(kernel, iterations: int, burn_in: int) -> tuple[float, float]:
    """Mean (in sd) and variance (in s²) of the draws after burn-in, pooled over coordinates."""
    state = SGState(YBAR + SD * np.random.default_rng(2).standard_normal(DIM))
    draws = []
    for i in range(iterations):
        state = kernel(state)
        if i >= burn_in:
            draws.append(state.theta - YBAR)
    x = np.asarray(draws)
    return float(x.mean() / SD), float(x.var() / SD**2)


# ---------------------------------------------------------------- DP-SGLD

SGLD_A = 0.1  # h / s²
SGLD_STEP = SGLD_A * SD**2


def sgld_ratio(noise_factor: float = 1.0) -> tuple[float, float]:
    mech = mechanisms(SGLD_STEP, 1.0, noise_factor)
    return variance_ratio(lambda s: sgld_kernel(s, SGLD_STEP, mech)[0], 3000, 300)


def test_sgld_draws_have_the_variance_its_step_predicts():
    # θ' − ȳ = (1 − a)(θ − ȳ) + N(0, 2h), a = h/s²: stationary variance s²/(1 − a/2)
    predicted = 1.0 / (1.0 - SGLD_A / 2)
    mean, ratio = sgld_ratio()
    assert abs(mean) < 0.05
    assert abs(ratio - predicted) < 0.035, (ratio, predicted)  # about 4 Monte Carlo sds


def test_negative_control_the_seeds_langevin_noise_halves_the_variance():
    # the DP-HMC paper's code adds N(0, h) to the drift h·g̃: its chain targets π²
    _, ratio = sgld_ratio(noise_factor=1 / np.sqrt(2))
    assert abs(ratio - 1.0 / (1.0 - SGLD_A / 2)) > 0.035
    assert ratio == pytest.approx(0.5 / (1.0 - SGLD_A / 4), abs=0.035)


# ---------------------------------------------------------------- DP-SGHMC

SGHMC_STEP = 0.1 * SD
FRICTION = 30.0
SGHMC_STEPS = 10


def sghmc_predicted_ratio(time_step: float, friction: float, n_steps: int) -> float:
    """Stationary variance / s² of the SGHMC iteration on N(ȳ, s²), from its linear update.

    One iteration maps ``(θ, p₀ ~ N(0, 1))`` through ``J`` steps
    ``p ← p − hθ/s² − hFp + N(0, 2Fh)``, then ``θ ← θ + hp``: ``Var θ' = α² Var θ + c``, so
    the fixed point is ``c / (1 − α²)``.
    """
    step = np.array([[1.0, time_step], [0.0, 1.0]])
    kick = np.array([[1.0, 0.0], [-time_step / SD**2, 1.0 - time_step * friction]])
    q = np.diag([0.0, 2.0 * friction * time_step])

    def final_var(var0: float) -> float:
        cov = np.diag([var0, 1.0])
        for _ in range(n_steps):
            cov = step @ (kick @ cov @ kick.T + q) @ step.T
        return cov[0, 0]

    c = final_var(0.0)
    alpha2 = final_var(1.0) - c
    return c / (1.0 - alpha2) / SD**2


def sghmc_ratio(friction: float, noise_factor: float = 1.0) -> tuple[float, float]:
    mech = mechanisms(SGHMC_STEP, FRICTION, noise_factor)
    rng = np.random.default_rng(3)
    return variance_ratio(
        lambda s: sghmc_kernel(s, SGHMC_STEP, friction, SGHMC_STEPS, rng, mech)[0], 600, 60
    )


def test_sghmc_draws_have_the_variance_its_step_predicts():
    predicted = sghmc_predicted_ratio(SGHMC_STEP, FRICTION, SGHMC_STEPS)
    assert abs(predicted - 1.0) < 0.1  # a small step: nearly the posterior
    mean, ratio = sghmc_ratio(FRICTION)
    assert abs(mean) < 0.05
    assert abs(ratio - predicted) < 0.04, (ratio, predicted)


def test_negative_control_the_printed_friction_sign_fails():
    # L Algorithm 2 as printed: p ← p − h(∇Ũ − F p + …) adds momentum instead of removing it
    _, ratio = sghmc_ratio(-FRICTION)
    assert abs(ratio - sghmc_predicted_ratio(SGHMC_STEP, FRICTION, SGHMC_STEPS)) > 0.5


def test_negative_control_the_printed_noise_scaling_fails():
    # L Algorithm 2 scales N(0, 2F) by h (variance 2F h²) where its accounting assumes √h
    _, ratio = sghmc_ratio(FRICTION, noise_factor=np.sqrt(SGHMC_STEP))
    assert abs(ratio - sghmc_predicted_ratio(SGHMC_STEP, FRICTION, SGHMC_STEPS)) > 0.2


# ---------------------------------------------------------------- DP-SGNHT

DIFFUSION = 30.0


def sgnht_ratio(noise_factor: float = 1.0) -> tuple[float, float]:
    mech = mechanisms(SGHMC_STEP, DIFFUSION, noise_factor)
    momentum = np.random.default_rng(4).standard_normal(DIM)

    def step(state: SGState) -> SGState:
        if state.momentum is None:
            state = SGState(state.theta, momentum, DIFFUSION)
        return sgnht_kernel(state, SGHMC_STEP, DIFFUSION, mech)[0]

    return variance_ratio(step, 6000, 600)


def test_sgnht_draws_follow_the_posterior_at_a_small_step():
    mean, ratio = sgnht_ratio()
    assert abs(mean) < 0.05
    assert abs(ratio - 1.0) < 0.05, ratio  # h = s/10: a bias of O(h²/s²)


def test_negative_control_sgnht_without_its_diffusion_fails():
    _, ratio = sgnht_ratio(noise_factor=0.0)
    assert abs(ratio - 1.0) > 0.5


# ---------------------------------------------------------------- the noise multiplier


@pytest.mark.parametrize("diffusion", [1.0, 30.0])
def test_the_release_noise_is_the_dynamics_noise(diffusion):
    # h (n/b) N(0, σ²) with σ = 2Cz must have variance 2Dh
    h, b, n, clip = 1e-4, 50, 2000, 0.7
    z = diffusion_noise_multiplier(
        time_step=h, diffusion=diffusion, batch_size=b, n_rows=n, grad_clip=clip
    )
    assert (h * n / b * 2 * clip * z) ** 2 == pytest.approx(2 * diffusion * h)


def test_a_diverging_sgld_step_stays_put():
    def release(theta):
        return Release(np.full(DIM, np.inf), 1.0, None)

    mech = SGMechanisms(lambda theta: np.zeros(DIM), release, 1.0)
    start = SGState(YBAR.copy())
    state, info = sgld_kernel(start, 1e-3, mech)
    assert info.diverging and np.array_equal(state.theta, YBAR) and info.jump == 0.0
