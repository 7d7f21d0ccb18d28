"""The private initialisation's post-processing (NumPy only): the pooled mode and its
uncertainty, and the Hessian's off-diagonal noise, against a closed-form quadratic."""

from __future__ import annotations

import numpy as np

from pymc_dp.kernels.initialization import gradient_design, newton_from_designs, pooled_mode
from pymc_dp.releases import Release

MODE = np.array([1.0, -2.0, 0.5])
COV = np.array([[1.0, 0.6, 0.0], [0.6, 2.0, -0.3], [0.0, -0.3, 0.5]])
PRECISION = np.linalg.inv(COV)


def noisy_gradients(points: np.ndarray, noise_sd: np.ndarray, rng: np.random.Generator):
    """Gradients of ``N(MODE, COV)``'s log-density plus release noise of known sd."""
    exact = (MODE - points) @ PRECISION.T
    return exact + rng.standard_normal(points.shape) * noise_sd


def test_the_pooled_mode_is_unbiased_with_the_stated_covariance():
    rng = np.random.default_rng(0)
    noise_sd = np.array([3.0, 1.0, 5.0])  # per coordinate, as a preconditioned release has
    estimates, stated = [], None
    for _ in range(400):
        points = MODE + rng.normal(scale=4.0, size=(60, 3))  # anywhere, far from the mode too
        grads = noisy_gradients(points, noise_sd, rng)
        variance = np.broadcast_to(noise_sd**2, points.shape)
        theta, stated = pooled_mode(points, grads, variance, COV)
        estimates.append(theta)
    estimates = np.array(estimates)
    spread = np.cov(estimates.T)
    se = np.sqrt(np.diag(stated) / len(estimates))
    assert np.all(np.abs(estimates.mean(0) - MODE) < 4 * se)
    # the stated covariance is the sampling covariance: diagonals within 15 % (400 repeats)
    assert np.allclose(np.diag(spread), np.diag(stated), rtol=0.15)
    # far from the mode, the curvature term carries the estimate; negative control: without
    # it (Σ → 0, the mean of the points) the estimate stays where the points are
    points = MODE + 3.0 + rng.normal(scale=0.1, size=(60, 3))
    grads = noisy_gradients(points, noise_sd, rng)
    theta, stated = pooled_mode(points, grads, np.broadcast_to(noise_sd**2, points.shape), COV)
    assert np.all(np.abs(theta - MODE) < 5 * np.sqrt(np.diag(stated)))
    no_curvature, _ = pooled_mode(points, grads, np.ones_like(points), np.eye(3) * 1e-9)
    assert np.max(np.abs(no_curvature - MODE)) > 2.0


def test_newton_from_a_design_recovers_the_mode_and_covariance_and_keeps_zero_correlations():
    rng = np.random.default_rng(1)
    cov = np.diag([1.0, 2.0, 0.5])  # no correlation: the noisy design must not invent one
    precision = np.linalg.inv(cov)
    noise = 0.05

    def release(x: np.ndarray) -> Release:
        value = (MODE - x) @ precision.T + rng.standard_normal(3) * noise
        return Release(value, noise, None)

    design = gradient_design(
        MODE + 0.3, np.sqrt(np.diag(cov)), 20, release, lambda x: np.zeros(3), noise
    )
    result = newton_from_designs(MODE + 0.3, [design])
    assert np.allclose(result.theta, MODE, atol=0.05)
    assert np.allclose(result.covariance, cov, atol=0.05)
    off = ~np.eye(3, dtype=bool)
    assert np.all(result.hessian[off] == 0.0)  # within two noise sd of zero: thresholded
