"""The private initialisation's post-processing (NumPy only): the pooled mode and its
uncertainty, and the Hessian's off-diagonal noise, against a closed-form quadratic."""

from __future__ import annotations

import numpy as np
import pytest

from pymc_dp.kernels.initialization import (
    AscentParams,
    gradient_design,
    newton_from_designs,
    newton_step,
    noisy_gradient_ascent,
    pooled_mode,
    prior_exact_step,
    prior_hessian,
    secant_update,
)
from pymc_dp.releases import Release

MODE = np.array([1.0, -2.0, 0.5])
COV = np.array([[1.0, 0.6, 0.0], [0.6, 2.0, -0.3], [0.0, -0.3, 0.5]])
PRECISION = np.linalg.inv(COV)


def noisy_gradients(points: np.ndarray, noise_sd: np.ndarray, rng: np.random.Generator):
    """Gradients of ``N(MODE, COV)``'s log-density plus release noise of known sd."""
    exact = (MODE - points) @ PRECISION.T
    return exact + rng.standard_normal(points.shape) * noise_sd


def test_the_pooled_mode_is_unbiased_and_its_stated_covariance_covers_the_error():
    rng = np.random.default_rng(0)
    noise_sd = np.array([3.0, 1.0, 5.0])  # per coordinate, as a preconditioned release has
    estimates, stated = [], []
    for _ in range(400):
        points = MODE + rng.normal(scale=4.0, size=(60, 3))  # around the mode, far ones too
        grads = noisy_gradients(points, noise_sd, rng)
        variance = np.broadcast_to(noise_sd**2, points.shape)
        theta, covariance = pooled_mode(points, grads, variance, COV)
        estimates.append(theta)
        stated.append(np.diag(covariance))
    estimates, stated = np.array(estimates), np.array(stated).mean(axis=0)
    se = np.sqrt(stated / len(estimates))
    assert np.all(np.abs(estimates.mean(0) - MODE) < 4 * se)
    # the stated covariance is the sampling covariance (400 repeats: a ratio's sd is about 7 %)
    ratio = estimates.var(axis=0) / stated
    assert np.all(np.abs(ratio - 1.0) < 0.2), ratio
    # far from the mode, the curvature term carries the estimate; negative control: without
    # it (Σ → 0, the mean of the points) the estimate stays where the points are
    points = MODE + 3.0 + rng.normal(scale=0.1, size=(60, 3))
    grads = noisy_gradients(points, noise_sd, rng)
    theta, stated = pooled_mode(points, grads, np.broadcast_to(noise_sd**2, points.shape), COV)
    assert np.all(np.abs(theta - MODE) < 5 * np.sqrt(np.diag(stated)))
    no_curvature, _ = pooled_mode(points, grads, np.ones_like(points), np.eye(3) * 1e-9)
    assert np.max(np.abs(no_curvature - MODE)) > 2.0


def test_releases_noisier_than_stated_widen_the_stated_uncertainty():
    """Releases whose noise is twice what they state: the residuals' overdispersion (about 4)
    widens the stated variance to the sampling one; the releases' stated noise alone (the
    negative control) is four times too small."""
    rng = np.random.default_rng(2)
    noise_sd = np.array([3.0, 1.0, 5.0])
    errors, stated, noise_only = [], [], []
    for _ in range(400):
        points = MODE + rng.normal(scale=2.0, size=(80, 3))
        grads = noisy_gradients(points, 2.0 * noise_sd, rng)
        variance = np.broadcast_to(noise_sd**2, points.shape)
        theta, covariance = pooled_mode(points, grads, variance, COV)
        errors.append((theta - MODE) ** 2)
        stated.append(np.diag(covariance))
        noise_only.append(np.diag((COV / (1.0 / variance).sum(axis=0)) @ COV))
    mse = np.mean(errors, axis=0)
    assert np.allclose(mse / np.mean(stated, axis=0), 1.0, atol=0.2), mse / np.mean(stated, 0)
    assert np.all(mse / np.mean(noise_only, axis=0) > 3.0)


def test_a_secant_over_a_long_step_corrects_the_curvature_and_a_short_one_is_ignored():
    rng = np.random.default_rng(3)
    wrong = np.diag([3.0, 1.0, 0.5]) @ COV @ np.diag([3.0, 1.0, 0.5])  # 3× too wide in x₀
    step = np.array([12.0, 0.0, 0.0])
    noise = np.full(3, 0.05**2)
    start = MODE - step / 2

    def mean_gradient(x: np.ndarray) -> np.ndarray:
        return (MODE - x) @ PRECISION.T + rng.standard_normal(3) * 0.05

    change = mean_gradient(start + step) - mean_gradient(start)
    corrected = secant_update(wrong, step, change, 2 * noise)
    assert corrected is not None
    # along the step the precision is now the true one; a Newton step from the far end lands
    precision = np.linalg.inv(corrected)
    assert step @ precision @ step == pytest.approx(step @ PRECISION @ step, rel=0.02)
    far = start + step
    landed = far + corrected @ ((MODE - far) @ PRECISION.T)
    uncorrected = far + wrong @ ((MODE - far) @ PRECISION.T)
    assert np.abs(landed - MODE)[0] < 0.1 * np.abs(uncorrected - MODE)[0]
    # a step of the noise's size tells nothing: no update
    short = np.array([0.01, 0.0, 0.0])
    change = mean_gradient(start + short) - mean_gradient(start)
    assert secant_update(wrong, short, change, 2 * noise) is None


def test_an_unresolved_secant_bounds_an_overstated_curvature_and_keeps_it_above_the_truth():
    # a ridge: the model claims 199 times the true information along it (1.99 against 0.01:
    # a Fisher read far from the mode), and the gradients' change over the step is below 4
    # noise sds
    rng = np.random.default_rng(8)
    ridge = np.array([1.0, 1.0, 0.0]) / np.sqrt(2)
    truth = np.eye(3) + 0.01 * np.outer(ridge, ridge) - np.outer(ridge, ridge)  # 0.01 along it
    wrong = np.linalg.inv(np.eye(3) + 0.99 * np.outer(ridge, ridge))  # 1.99 along it
    step = 5.0 * ridge
    noise = np.full(3, 0.3**2)
    bounded = 0
    for _ in range(50):
        change = -(truth @ step) + rng.standard_normal(3) * 0.3 * np.sqrt(2)
        assert secant_update(wrong, step, change, 2 * noise) is None  # unresolved: as before
        updated = secant_update(wrong, step, change, 2 * noise, bound_unresolved=True)
        if updated is None:
            continue
        bounded += 1
        precision = np.linalg.inv(updated)
        along = float(step @ precision @ step)
        assert step @ truth @ step < along < 0.5 * (step @ np.linalg.inv(wrong) @ step)
        assert along == pytest.approx(
            max(-(step @ change), 0.0) + 2 * np.sqrt(step @ (2 * noise * step))
        )
        assert np.all(np.linalg.eigvalsh(updated) > 0)
        # across the step (orthogonal in the model's metric) nothing changes
        across = np.array([0.0, 0.0, 1.0])
        assert across @ precision @ across == pytest.approx(1.0)
    assert bounded == 50
    # a model that already claims no more than the gradients allow is left alone
    assert (
        secant_update(np.linalg.inv(truth), step, -(truth @ step), 2 * noise, bound_unresolved=True)
        is None
    )


def test_the_bound_of_an_unresolved_secant_lets_a_newton_step_overshoot_twofold_only_4_sd_out():
    # the measured curvature s^T q = c + xi * noise for a true curvature c of 3 to 8 noise sds
    # (a model claiming ten times it): every unresolved secant (s^T q below 4 noise sds) lowers
    # the model's curvature; below c (a Newton step past the mode) only where xi < -2, and
    # below c / 2 (past twice the mode's distance, where the iteration diverges) only where
    # xi < -4; and that happens there (the check is not empty)
    step = np.array([1.0, 0.0])
    variance = np.array([1.0, 1.0])  # noise sd of the change along s: 1
    for c in (3.0, 4.0, 6.0, 8.0):
        claimed = np.linalg.inv(np.diag([10.0 * c, 1.0]))
        below_half = 0
        for xi in np.linspace(-(c + 2.0), 4.0 - c - 1e-6, 400):
            change = np.array([-(c + xi), 0.0])
            updated = secant_update(claimed, step, change, variance, bound_unresolved=True)
            assert updated is not None  # unresolved, and the model claims more than the bound
            along = float(step @ np.linalg.inv(updated) @ step)
            assert along == pytest.approx(max(c + xi, 0.0) + 2.0)
            if along < c:
                assert xi < -2.0
            if along < 0.5 * c:
                assert xi < -4.0
                below_half += 1
        # with c > 4 sds a noise far enough below -(c/2 + 2) sds does lower it past c / 2
        assert (below_half > 0) == (c > 4.0)


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


def test_a_secant_reads_correlated_gradient_noise_from_its_covariance():
    # noise sd 1 per coordinate, correlation −0.99: along (1, 1) it nearly cancels, along (1, −1)
    # it doubles; a covariance matrix tells the two apart, its diagonal alone cannot
    covariance = np.eye(2)
    noise = np.array([[1.0, -0.99], [-0.99, 1.0]])
    step = np.array([1.0, 1.0])
    change = -np.array([1.0, 1.0])  # sᵀq = 2; the noise of sᵀΔg is √(sᵀVs) = √0.02 ≈ 0.14
    assert secant_update(covariance, step, change, noise) is not None
    assert secant_update(covariance, step, change, np.diag(noise)) is None  # √2 > 2 / 4
    across = np.array([1.0, -1.0])  # sᵀVs = 3.98: sᵀq = 2 is under 4 noise sds
    assert secant_update(covariance, across, -across, noise) is None


def test_a_design_point_outside_the_support_gives_no_newton_step_instead_of_an_error():
    """A release that is undefined there (NaN, nothing read) leaves θ and flags the curvature."""

    def release(x: np.ndarray) -> Release:
        value = (MODE - x) @ PRECISION.T
        return Release(np.full(3, np.nan) if x[0] > 1.2 else value, 0.1, None)

    start = MODE + 0.1
    design = gradient_design(start, np.full(3, 0.5), 2, release, lambda x: np.zeros(3), 0.1)
    result = newton_from_designs(start, [design], prior_hessian=-np.eye(3))
    assert np.array_equal(result.theta, start)
    assert np.all(np.isnan(result.covariance))


def test_a_large_design_keeps_no_spurious_correlations_and_its_newton_step_stays_put():
    """d = 40 without correlations: 780 off-diagonal pairs of pure noise. A two-sd threshold
    would keep about 36 of them (4.6 %: 24–40 here), and in the zoo's hierarchical model
    (d = 54) such spurious entries sent the initialisation's Newton step 130 sds away along
    the slope; the universal threshold ``σ √(2 log m)`` for ``m`` pairs keeps almost none."""
    rng = np.random.default_rng(3)
    d = 40
    precision = np.concatenate([[1e4, 1e4], np.ones(d - 2)])  # two sharp, the rest weak
    mode = np.zeros(d)
    noise = 2.0  # the weak coordinates' curvature (1) is below the entries' noise

    def release(x: np.ndarray) -> Release:
        return Release((mode - x) * precision + rng.standard_normal(d) * noise, noise, None)

    start = mode + 0.01 * np.sqrt(1.0 / precision)
    kept = []
    for _ in range(5):
        design = gradient_design(start, np.full(d, 1.0), 1, release, lambda x: np.zeros(d), noise)
        result = newton_from_designs(start, [design], prior_hessian=-np.eye(d))
        off = ~np.eye(d, dtype=bool)
        kept.append(int(np.count_nonzero(result.hessian[off])) // 2)
        assert np.all(np.abs(result.theta[:2] - mode[:2]) < 0.05)  # a few sds (0.01)
    assert max(kept) <= 3, kept


def test_the_prior_exact_step_is_the_newton_step_under_a_gaussian_prior():
    rng = np.random.default_rng(5)
    prior_precision = np.array([[2.0, 0.5], [0.5, 1.0]])
    prior_mean = np.array([1.0, -2.0])

    def logprior(x):
        u = x - prior_mean
        return -0.5 * u @ prior_precision @ u

    def logprior_grad(x):
        return -prior_precision @ (x - prior_mean)

    information = np.array([[30.0, -4.0], [-4.0, 10.0]])  # the likelihood's part
    theta, gradient = rng.normal(size=2), rng.normal(size=2) * 5
    covariance = np.linalg.inv(information + prior_precision)
    expected = theta + covariance @ (gradient + logprior_grad(theta))
    step = prior_exact_step(
        theta, gradient, information, logprior, logprior_grad, covariance, max_sd=100.0
    )
    np.testing.assert_allclose(step, expected, rtol=1e-6, atol=1e-8)
    # kept within max_sd posterior sds of θ
    short = prior_exact_step(
        theta, 100 * gradient, information, logprior, logprior_grad, covariance, max_sd=2.0
    )
    assert np.linalg.norm(np.linalg.solve(np.linalg.cholesky(covariance), short - theta)) <= 2.0


def test_the_prior_exact_step_finds_a_hierarchical_scale_a_newton_step_overshoots():
    # log p(s) of a group scale on the log scale: 50 groups with Σ(a_j − μ)² = 24.5, no
    # likelihood information along it; its maximum is at s* = ½ log(24.5 / 50)
    spread, groups = 24.5, 50

    def logprior(x):
        return float(-0.5 * spread * np.exp(-2 * x[0]) - groups * x[0])

    def logprior_grad(x):
        return np.array([spread * np.exp(-2 * x[0]) - groups])

    theta = np.array([2.0])  # σ_a 15 times too large: the prior's curvature there is 0.9
    curvature = 2 * spread * np.exp(-2 * theta[0])
    covariance = np.array([[1.0 / curvature]])
    best = 0.5 * np.log(spread / groups)
    zero = np.zeros((1, 1))
    step = prior_exact_step(
        theta, np.zeros(1), zero, logprior, logprior_grad, covariance, max_sd=50.0
    )
    assert abs(step[0] - best) < 1e-6
    # the Newton step with the curvature at θ lands tens of units beyond it
    newton = newton_step(theta, covariance, logprior_grad(theta), max_sd=50.0)
    assert newton[0] < best - 20


# A mode in a model's own units, far from PyMC's start at 0: an intercept near 1500 (a weight
# in grams), a slope near 40, a log scale near 6.
FAR_MODE = np.array([1500.0, 40.0, 6.0])
FAR_SD = np.array([40.0, 6.0, 1.0])


def _clipped_far_release(rng: np.random.Generator, clip: float = 5.0, noise_sd: float = 0.1):
    """A clipped, noised gradient sum of ``N(FAR_MODE, diag FAR_SD²)``: its norm saturates at
    ``clip`` far from the mode (all rows clipped) and its noise has sd ``noise_sd``."""

    def release(theta: np.ndarray) -> Release:
        exact = (FAR_MODE - theta) / FAR_SD**2
        norm = float(np.linalg.norm(exact))
        clipped = exact * min(1.0, clip / norm) if norm > 0 else exact
        return Release(clipped + rng.normal(0.0, noise_sd, size=theta.size), noise_sd, None)

    return release


def _ascent_end(start: np.ndarray, growth: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    params = AscentParams(iterations=100, growth=growth)
    result = noisy_gradient_ascent(
        start, params, _clipped_far_release(rng), lambda theta: np.zeros_like(theta)
    )
    return result.theta


def test_the_ascent_travels_to_a_mode_in_its_own_units_and_settles_there():
    """Adam moves a coordinate by about its learning rate per step, whatever its units: 100
    steps of 0.1 cannot reach an intercept of 1500. The per-coordinate step (× growth while the
    released gradient keeps the sign of the momentum, halved when it turns, never below the
    schedule's rate) travels there; near the mode the noise turns the sign about half the time
    and the step stays near the schedule's, as plain Adam's."""
    start = np.zeros(3)
    distance = np.abs(FAR_MODE - start)
    far = np.array([_ascent_end(start, 1.2, seed) for seed in range(8)])
    # every run, every coordinate, within a quarter of the way (the intercept overshoots and
    # returns at the decayed rate: 4-8 posterior sd of the 37.5 left, in this set of seeds)
    assert np.all(np.abs(far - FAR_MODE) <= 0.25 * distance), far
    plain = np.array([_ascent_end(start, 1.0, seed) for seed in range(8)])  # negative control
    assert np.all(np.abs(plain[:, 0] - FAR_MODE[0]) > 0.99 * distance[0]), plain
    # started at the mode, the noise alone moves it: 0.02-0.06 posterior sd without the gain,
    # 0.03-0.08 with it
    settled = np.array([_ascent_end(FAR_MODE, 1.2, seed) for seed in range(20)])
    spread = np.sqrt(np.mean((settled - FAR_MODE) ** 2, axis=0)) / FAR_SD
    assert np.all(spread <= 0.15), spread


def test_an_unresolved_group_curvature_does_not_move_a_hierarchys_hyperparameters():
    """A centred hierarchy ``a_j ~ N(μ, σ)``, 30 groups, each ``a_j`` read by the likelihood with
    information 300, ``μ`` and ``log σ`` by the prior alone; the design's noise on a group's
    curvature (sd about 530) hides it. From the exact mode the Newton step must stay put: each
    group's information is taken as at least twice its noise, not the prior's width. Negative
    control: without that floor (``reads`` all false) the unresolved groups' steps go as far as
    the trust region allows and, through the prior's coupling, carry ``μ`` and ``log σ`` with
    them (1.2, about ten posterior sds, in most seeds; on a 60-group logistic hierarchy the
    centring then fell into ``σ → 0``)."""
    groups, information = 30, 300.0
    a_hat = -0.5 + 0.6 * np.random.default_rng(0).standard_normal(groups)

    def logprior_grad(x: np.ndarray) -> np.ndarray:
        mu, log_sigma, a = x[0], x[1], x[2:]
        var = np.exp(2 * log_sigma)
        return np.concatenate(
            [
                [-mu / 4 + np.sum(a - mu) / var],  # μ ~ N(0, 2)
                [-groups + np.sum((a - mu) ** 2) / var - var + 1],  # σ ~ HalfNormal(1), log
                -(a - mu) / var,
            ]
        )

    def loglik_grad(x: np.ndarray) -> np.ndarray:
        return np.concatenate([[0.0, 0.0], -information * (x[2:] - a_hat)])

    # the exact mode: Newton iterations on the exact log posterior
    mode = np.concatenate([[a_hat.mean(), np.log(a_hat.std())], a_hat])
    for _ in range(50):
        gradient = logprior_grad(mode) + loglik_grad(mode)
        hessian = prior_hessian(logprior_grad, mode) - np.diag(np.r_[0, 0, [information] * groups])
        mode = mode - np.linalg.solve(hessian, gradient)
    assert np.max(np.abs(logprior_grad(mode) + loglik_grad(mode))) < 1e-6
    reads = np.r_[False, False, np.ones(groups, dtype=bool)]
    moved, unfloored = [], []
    for seed in range(8):
        for mask, out in ((reads, moved), (np.zeros_like(reads), unfloored)):
            rng = np.random.default_rng(seed)

            def release(x: np.ndarray, rng=rng) -> Release:
                noise = np.where(reads, rng.standard_normal(x.size) * 300.0, 0.0)
                return Release(loglik_grad(x) + noise, 300.0, None)

            design = gradient_design(
                mode, np.full(mode.size, 0.4), 1, release, logprior_grad, 300.0
            )
            result = newton_from_designs(
                mode, [design], prior_hessian=prior_hessian(logprior_grad, mode), reads=mask
            )
            out.append(np.max(np.abs(result.theta - mode)[:2]))
    # the posterior sds of μ and log σ are about 0.11 and 0.13
    assert max(moved) < 0.1, moved
    assert sum(m >= 1.0 for m in unfloored) >= 4, unfloored
