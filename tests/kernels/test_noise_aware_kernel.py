"""The noise-aware stretch: it maps a Gaussian tilted target onto the noise-aware posterior, the
likelihood's centre known only up to the release's noise (``N(m̃; θ, F⁻¹ + F⁻¹VF⁻¹)``)."""

from __future__ import annotations

import numpy as np
import pytest

from pymc_dp.kernels.noise_aware import noise_aware_stretch, widening_information


def _spd(rng: np.random.Generator, d: int, scale: float) -> np.ndarray:
    a = rng.normal(size=(d, d))
    return scale * (a @ a.T / d + 0.2 * np.eye(d))


def _case(seed: int, prior_scale: float):
    """A Gaussian prior N(μ₀, Π⁻¹), likelihood information F, release noise V, centre θ_c and
    released gradient Ĝ: the tilted target N(m̂, Σ̂) and the noise-aware posterior."""
    rng = np.random.default_rng(seed)
    d = 4
    information, noise = _spd(rng, d, 50.0), _spd(rng, d, 20.0)
    prior = _spd(rng, d, prior_scale)
    prior_mean, centre, gradient = rng.normal(size=d), rng.normal(size=d), rng.normal(size=d) * 5
    likelihood_centre = centre + np.linalg.solve(information, gradient)  # m̃
    covariance = np.linalg.inv(information + prior)  # Σ̂
    mode = covariance @ (information @ likelihood_centre + prior @ prior_mean)  # m̂
    aware_information = information @ np.linalg.solve(information + noise, information)
    aware_covariance = np.linalg.inv(aware_information + prior)
    aware_mean = aware_covariance @ (aware_information @ likelihood_centre + prior @ prior_mean)
    stretch = noise_aware_stretch(mode, centre, gradient, noise, information, covariance)
    return rng, stretch, mode, covariance, aware_mean, aware_covariance


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("prior_scale", [1e-6, 20.0])  # flat, and as informative as the data
def test_a_gaussian_target_is_mapped_onto_the_noise_aware_posterior(seed, prior_scale):
    rng, stretch, mode, covariance, aware_mean, aware_covariance = _case(seed, prior_scale)
    k = stretch.matrix
    np.testing.assert_allclose(k @ covariance @ k.T, aware_covariance, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(stretch.reported(mode), aware_mean, rtol=1e-8, atol=1e-10)
    if prior_scale < 1e-3:  # a flat prior: the mean stays
        np.testing.assert_allclose(aware_mean, mode, atol=1e-4)
    else:  # an informative one: the blurred likelihood gives way to it (a missing shift shows)
        assert np.max(np.abs(aware_mean - mode) / np.sqrt(np.diag(aware_covariance))) > 0.05
    theta = mode + rng.normal(size=mode.size) * 0.1
    np.testing.assert_allclose(stretch.internal(stretch.reported(theta)), theta, atol=1e-12)
    # a sample of the tilted target, mapped, has the noise-aware covariance
    draws = rng.multivariate_normal(mode, covariance, size=200_000)
    mapped = mode + stretch.shift + (draws - mode) @ k.T
    root = np.linalg.cholesky(aware_covariance)
    whitened = np.linalg.solve(root, np.linalg.solve(root, np.cov(mapped.T)).T)
    np.testing.assert_allclose(whitened, np.eye(mode.size), atol=0.02)  # 0.003 sampling error
    # the variance factor: the largest variance ratio over all directions, not negligible here
    inner = np.linalg.cholesky(covariance)
    ratio = np.linalg.solve(inner, np.linalg.solve(inner, aware_covariance).T)
    factor = np.max(np.linalg.eigvalsh(0.5 * (ratio + ratio.T)))
    assert stretch.variance_factor == pytest.approx(factor, rel=1e-8)
    assert factor > 1.05


def test_a_direction_the_likelihood_does_not_inform_is_not_stretched():
    # F = 0 along e₂ (the prior alone informs it): the release's noise takes nothing there
    information = np.diag([40.0, 0.0])
    noise = np.diag([4.0, 4.0])
    covariance = np.diag([1 / 41.0, 1.0])  # the prior's information 1 in both directions
    root = np.sqrt(covariance)
    taken = widening_information(root @ noise @ root, root @ information @ root)
    assert taken[0, 0] == pytest.approx((40.0 / 41) * (4.0 / 41) / (44.0 / 41))  # f v / (f + v)
    np.testing.assert_allclose(taken[1], 0.0, atol=1e-12)
    stretch = noise_aware_stretch(
        np.zeros(2), np.zeros(2), np.zeros(2), noise, information, covariance
    )
    assert stretch.matrix[1, 1] == pytest.approx(1.0)
    widened = 1.0 / (41.0 - 40.0 * 4.0 / 44.0)  # the precision less what the noise takes
    assert stretch.matrix[0, 0] ** 2 / 41.0 == pytest.approx(widened)


def test_a_coordinate_the_likelihood_does_not_read_is_not_stretched_and_gives_no_nan():
    # neither information nor noise along e₂ (the release conditioned on its known zero there):
    # f + v is singular, and the pseudo-inverse takes nothing along e₂ (a solve would fail)
    information = np.diag([40.0, 0.0])
    noise = np.diag([4.0, 0.0])
    covariance = np.diag([1 / 41.0, 1.0])
    gradient = np.array([3.0, 0.0])
    stretch = noise_aware_stretch(
        np.zeros(2), np.zeros(2), gradient, noise, information, covariance
    )
    assert np.all(np.isfinite(stretch.matrix)) and np.all(np.isfinite(stretch.shift))
    assert stretch.matrix[1, 1] == pytest.approx(1.0) and stretch.matrix[0, 1] == 0.0
    assert stretch.shift[1] == 0.0
    widened = 1.0 / (41.0 - 40.0 * 4.0 / 44.0)
    assert stretch.matrix[0, 0] ** 2 / 41.0 == pytest.approx(widened)


@pytest.mark.parametrize("seed", range(5))
def test_a_released_fisher_below_the_prior_does_not_stretch_beyond_the_noise(seed):
    # F = Σ̂⁻¹ − Π indefinite (Π larger than Σ̂⁻¹ along some direction: the Fisher's noise). With
    # V = Σ̂⁻¹ (s = 1 at most) the variance factor is at most 2, not the cap
    rng = np.random.default_rng(seed)
    precision, prior = _spd(rng, 2, 1.0), _spd(rng, 2, 1.0)
    covariance = np.linalg.inv(precision)
    stretch = noise_aware_stretch(
        np.zeros(2), np.zeros(2), np.zeros(2), precision, precision - prior, covariance
    )
    assert 1.0 <= stretch.variance_factor <= 2.0 + 1e-9


def test_the_stretch_is_capped_where_the_noise_swamps_the_information():
    information, noise = np.eye(2) * 1.0, np.eye(2) * 1e6
    stretch = noise_aware_stretch(
        np.zeros(2), np.zeros(2), np.zeros(2), noise, information, np.eye(2)
    )
    assert stretch.variance_factor == pytest.approx(100.0)
    assert np.all(np.isfinite(stretch.matrix)) and np.all(np.isfinite(stretch.inverse))
