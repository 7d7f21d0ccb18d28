"""DPHMC with centred releases (control variate; theory §4.3): sensitivity, noise, the target.

* Substituting one row moves the clipped centred gradient sum by at most ``2B`` in norm.
* The release is ``T (Ĝ + W⁻ᵀ(clipped differences + N(0, σ² I)))`` with ``σ = 2 z B``,
  ``B = h ‖u‖``, accounted before the data are read; at the centre it reads nothing.
* The dense-metric leapfrog with centred gradients and the centred ratio targets the exact
  posterior (the centre 3 sd off the mode); without the centre's linear term (negative
  control) it does not.
* The default ``DPHMC(budget=...)`` runs the centring and samples the tilted posterior.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pymc as pm
import pytest
from _gaussian_models import gaussian_setup, neighbouring_oracles, normal_model
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import pymc_dp
from pymc_dp import RowLikelihood
from pymc_dp.accounting import GaussianCost
from pymc_dp.convergence import check_convergence
from pymc_dp.errors import BudgetExceededError, ConvergenceWarning
from pymc_dp.kernels.hmc import HMCMechanisms, HMCParams, HMCState, hmc_kernel
from pymc_dp.mechanisms import CentredGradientRelease, CentredLLRRelease, PrivateChannel
from pymc_dp.noise import NoiseSource
from pymc_dp.releases import Centre
from pymc_dp.testing import Banana

SPEC = Banana(d=2, a=0.0)
ROWS = 60
ALL = np.ones(SPEC.d, dtype=bool)


@st.composite
def gradient_cases(draw):
    coords = st.floats(-3, 3, allow_nan=False)
    point = st.lists(coords, min_size=SPEC.d, max_size=SPEC.d).map(np.array)
    theta, centre = draw(point), draw(point)
    diagonal = draw(st.lists(st.floats(0.05, 20.0), min_size=SPEC.d, max_size=SPEC.d))
    metric = np.diag(diagonal) + np.array([[0.0, 0.0], [draw(st.floats(-5.0, 5.0)), 0.0]])
    clip = draw(st.floats(1e-2, 1e3))
    bound = draw(st.floats(1e-4, 1e3))
    return theta, Centre(centre, clip, np.eye(SPEC.d)), metric, bound, draw(st.integers(0, 3))


@settings(max_examples=60, deadline=None)
@given(gradient_cases())
def test_substituting_one_row_moves_the_centred_gradient_sum_by_at_most_2B(case):
    theta, centre, metric, bound, k = case
    base, neighbours = neighbouring_oracles(31)
    a = base.clipped_centred_grad_sum(theta, centre, metric, ALL, bound).value
    b = neighbours[k].clipped_centred_grad_sum(theta, centre, metric, ALL, bound).value
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(b))
    assert np.linalg.norm(a - b) <= 2 * bound * (1 + 1e-9) + 1e-12 * ROWS * bound


def test_without_the_clip_one_row_moves_the_sum_by_more():  # negative control for the above
    # (a Gaussian row's gradient difference does not depend on its data: the centre's clip
    # of the extreme row's gradient makes it differ)
    theta, centre = np.array([1.0, -1.0]), Centre(np.zeros(SPEC.d), 1.0, np.eye(SPEC.d))
    base, neighbours = neighbouring_oracles(31)
    a = base.clipped_centred_grad_sum(theta, centre, np.eye(SPEC.d), ALL, 1e9).value
    b = neighbours[3].clipped_centred_grad_sum(theta, centre, np.eye(SPEC.d), ALL, 1e9).value
    assert np.linalg.norm(a - b) > 2 * 0.5  # a bound of 0.5 would have been broken


def test_the_centred_gradient_sum_is_the_whitened_gradient_less_the_clipped_centre_gradients():
    base, _ = neighbouring_oracles(31)
    theta = np.array([0.4, -0.3])
    centre = Centre(np.array([1.0, -1.0]), 0.2, np.eye(SPEC.d))
    metric = np.array([[0.5, 0.0], [0.3, 2.0]])
    grads = base.grad_rows(theta)
    centre_rows = base.centre_rows(centre)
    assert np.any(np.linalg.norm(base.grad_rows(centre.theta), axis=1) > 0.2)  # some clipped
    differences = (grads - centre_rows) @ metric
    np.testing.assert_allclose(
        base.clipped_centred_grad_sum(theta, centre, metric, ALL, 1e9).value,
        differences.sum(axis=0),
    )
    bound = 0.5 * np.median(np.linalg.norm(differences, axis=1))
    norms = np.linalg.norm(differences, axis=1)
    expected = (differences * np.minimum(1.0, bound / norms)[:, None]).sum(axis=0)
    out = base.clipped_centred_grad_sum(theta, centre, metric, ALL, bound, count_clipped=True)
    np.testing.assert_allclose(out.value, expected)
    assert out.n_clipped == int(np.sum(norms > bound))


def _release(channel: PrivateChannel, **overrides) -> CentredGradientRelease:
    options = dict(
        centre=Centre(np.zeros(SPEC.d), 10.0, np.eye(SPEC.d)),
        centre_gradient=np.array([3.0, -2.0]),
        metric=np.array([[0.5, 0.0], [0.4, 2.0]]),
        remainder_clip=0.3,
        noise_multiplier=1.5,
        temperature=0.5,
    )
    return CentredGradientRelease(channel, **{**options, **overrides})


def test_the_centred_gradient_release_is_the_centre_gradient_plus_noisy_clipped_differences():
    base, _ = neighbouring_oracles(31)
    channel = PrivateChannel(base, NoiseSource(3))
    release = _release(channel)
    assert release.event == GaussianCost(1 / (2 * 1.5**2))
    metric = release.metric
    theta = np.array([0.3, 1.0])
    u = np.linalg.solve(metric, theta)  # W⁻¹(θ − θ_c)
    bound = 0.3 * np.linalg.norm(u)
    assert release.bound(theta) == pytest.approx(bound)
    clipped = base.clipped_centred_grad_sum(theta, release.centre, metric, ALL, bound).value
    residuals = []
    for _ in range(400):
        out = release(theta)
        assert out.noise_std == pytest.approx(0.5 * 1.5 * 2 * bound)
        # back in the metric's coordinates: Wᵀ (value / T − Ĝ) = clipped + noise
        residuals.append(metric.T @ (out.value / 0.5 - np.array([3.0, -2.0])) - clipped)
    residuals = np.array(residuals)
    assert channel.counter.released[release.event] == 400
    sigma = 1.5 * 2 * bound
    assert np.all(np.abs(residuals.mean(axis=0)) < 4 * sigma / np.sqrt(400))
    np.testing.assert_allclose(residuals.std(axis=0), sigma, rtol=0.15)
    assert abs(np.corrcoef(residuals.T)[0, 1]) < 0.15  # white in the metric's coordinates
    # at the centre: a release (accounted) that reads nothing
    reads = channel.reads
    at_centre = release(np.zeros(SPEC.d))
    np.testing.assert_array_equal(at_centre.value, 0.5 * np.array([3.0, -2.0]))
    assert channel.counter.released[release.event] == 401 and channel.reads == reads


def test_the_centred_gradient_release_is_refused_before_reading_when_not_reserved():
    base, _ = neighbouring_oracles(31)
    channel = PrivateChannel(base, NoiseSource(4))
    release = _release(channel)
    channel.counter.allow(release.event, 2)
    release(np.array([0.1, 0.2]))
    release(np.array([0.3, 0.4]))
    reads = channel.reads
    with pytest.raises(BudgetExceededError):
        release(np.array([0.2, 0.4]))
    assert channel.reads == reads


def test_a_point_whose_bound_overflows_is_a_divergence_that_reads_nothing():
    # a diverging leapfrog can reach a θ so far out that the clip B = h‖W⁻¹(θ − θ_c)‖ is
    # infinite; the release then has no finite noise: NaN (a divergence), nothing read or spent
    base, _ = neighbouring_oracles(31)
    channel = PrivateChannel(base, NoiseSource(5))
    release = _release(channel)
    far = np.array([1e308, -1e308])
    assert not np.isfinite(release.bound(far))
    reads = channel.reads
    out = release(far)
    assert np.isnan(out.value).all()
    assert channel.reads == reads and channel.counter.released[release.event] == 0


def run_centred_hmc(linear_term: bool, iterations: int, seed: int = 2):
    """A dense-metric DP-HMC chain on the centred releases, the centre 3 sd off the mode."""
    oracle, mean, sd = gaussian_setup()
    rng = np.random.default_rng(seed)
    channel = PrivateChannel(oracle, NoiseSource(seed + 1))
    centre = Centre(mean + 3.0 * sd, 1e6, np.eye(SPEC.d))  # nothing clipped at the centre
    exact = oracle.centre_rows(centre).sum(axis=0)
    # a correlated metric, so that the dense kinetic energy matters
    metric = np.linalg.cholesky(np.array([[1.0, 0.6], [0.6, 1.0]]) * np.outer(sd, sd))
    common = dict(
        centre=centre,
        centre_gradient=exact if linear_term else np.zeros(SPEC.d),
        metric=metric,
        remainder_clip=4.0 / oracle.n_rows,  # clips no remainder here
        count_clipped=True,
    )
    ratio = CentredLLRRelease(channel, noise_multiplier=30.0, **common)
    gradient = CentredGradientRelease(channel, noise_multiplier=30.0, **common)
    mechanisms = HMCMechanisms(oracle.space.logprior, oracle.space.logprior_grad, gradient, ratio)
    params = HMCParams(0.6, 3, np.ones(SPEC.d), root=metric)
    state = HMCState(mean.copy(), oracle.space.logprior(mean))
    draws, clipped, sigmas, accepted = [], 0, [], 0
    for _ in range(iterations):
        state, info = hmc_kernel(state, params, rng, mechanisms)
        draws.append(state.theta)
        clipped += info.llr_clipped
        sigmas.append(info.noise_std)
        accepted += info.accepted
    return np.array(draws)[iterations // 10 :], clipped, float(np.median(sigmas)), accepted


@pytest.mark.slow
def test_a_dense_metric_hmc_chain_on_the_centred_releases_targets_the_exact_posterior():
    _, mean, sd = gaussian_setup()
    draws, clipped, sigma, accepted = run_centred_hmc(True, 6000)
    assert clipped == 0  # the regime where the method is exact
    assert sigma > 0.3  # the ratio's noise is not negligible: the penalty term matters
    assert 0.2 < accepted / 6000 < 0.95
    pvalues = [stats.kstest(draws[::5, k], stats.norm(mean[k], sd[k]).cdf).pvalue for k in (0, 1)]
    assert min(pvalues) > 0.01, pvalues


@pytest.mark.slow
def test_without_the_centre_gradient_the_hmc_chain_misses_the_posterior():  # negative control
    _, mean, sd = gaussian_setup()
    draws, _, _, _ = run_centred_hmc(False, 6000)
    pvalues = [stats.kstest(draws[::5, k], stats.norm(mean[k], sd[k]).cdf).pvalue for k in (0, 1)]
    assert max(pvalues) < 1e-6, pvalues


@pytest.mark.slow
def test_the_default_dphmc_samples_the_posterior_tilted_by_the_centre_noise():
    model, mean, sd = normal_model(20_000)
    with model:
        step = pymc_dp.DPHMC(
            budget=pymc_dp.PrivacyBudget(5.0, 1e-6), noise_rng=5, noise_aware=False
        )
        idata = pymc_dp.sample(
            step, chains=2, random_seed=2, progressbar=False, compute_convergence_checks=False
        )
    post = idata.posterior
    draws = np.c_[post["mu"].values.ravel(), np.log(post["sigma"].values.ravel())]
    meta = pymc_dp.privacy_report(idata, show=False)
    assert meta["dp_control_variate"] == 1 and meta["dp_epsilon_spent"] <= 5.0 + 1e-9
    assert isinstance(step._release_grad, CentredGradientRelease)
    centring = step._centring
    oracle = step._channel._oracle  # the test reads the data: the exact tilt, never released
    tilt = np.diag(sd**2) @ (centring.gradient - oracle.centre_rows(centring.centre).sum(axis=0))
    error = (draws.mean(axis=0) - mean - tilt) / sd
    assert np.all(np.abs(error) < 0.5), error
    assert np.all(np.abs(draws.std(axis=0) / sd - 1) < 0.25), draws.std(axis=0) / sd
    check = check_convergence(idata)
    assert check.rhat_max < 1.1 and check.ess_bulk_min > 100, check
    # the budget affords the target noise (within what the mode's distance from the centre
    # adds where the chains sample): the plan's rough prediction is of the right size
    assert step.noise_excess() <= 1.1
    assert 0.3 < step.predicted_ess() / check.ess_bulk_min < 3.0


def test_a_budget_short_of_the_centred_target_is_warned_before_sampling():
    # 3000 rows at ε = 1 (5000 was short until the initialisation stopped spending a ratio
    # clip's histogram that the centred releases do not use: 69 effective draws predicted)
    model, _, _ = normal_model(3_000)
    with model:
        step = pymc_dp.DPHMC(budget=pymc_dp.PrivacyBudget(1.0, 1e-6), noise_rng=1)
        with pytest.warns(ConvergenceWarning) as caught:
            idata = pymc_dp.sample(
                step, chains=2, random_seed=1, progressbar=False, compute_convergence_checks=False
            )
    messages = [str(w.message) for w in caught]
    assert step.noise_excess() > 1.5  # each release gets more noise than the sampler needs
    assert step.predicted_ess() < 50
    assert any("effective draws" in m and "before sampling" in m for m in messages), messages
    report = pymc_dp.privacy_report(idata, show=False)
    assert report["dp_noise_excess"] == pytest.approx(step.noise_excess())


@cache
def scale_model_oracles() -> tuple[RowLikelihood, list[RowLikelihood]]:
    """``y ~ N(μ, σ)`` with σ unknown (a row's gradient difference depends on its data), 200
    rows read in chunks of 64, and four neighbours with one row replaced by an extreme one."""

    def oracle(y: np.ndarray) -> RowLikelihood:
        with pm.Model() as model:
            mu = pm.Normal("mu", 0.0, 10.0)
            sigma = pm.HalfNormal("sigma", 5.0)
            pm.Normal("y", mu, sigma, observed=y)
        out = RowLikelihood(model)
        out.chunk_size = 64
        return out

    rng = np.random.default_rng(41)
    y = rng.normal(1.0, 2.0, 200)
    neighbours = []
    for k, value in enumerate((30.0, -300.0, 3e3, 1e-3)):
        other = y.copy()
        other[[5, 70, 140, 199][k]] = value
        neighbours.append(oracle(other))
    return oracle(y), neighbours


@settings(max_examples=40, deadline=None)
@given(gradient_cases())
def test_with_data_dependent_differences_one_row_moves_the_sum_by_at_most_2B(case):
    theta, centre, metric, bound, k = case
    base, neighbours = scale_model_oracles()
    theta = np.clip(theta, -2.0, 2.0)  # (μ, log σ)
    a = base.clipped_centred_grad_sum(theta, centre, metric, ALL, bound).value
    b = neighbours[k].clipped_centred_grad_sum(theta, centre, metric, ALL, bound).value
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(b))
    assert np.linalg.norm(a - b) <= 2 * bound * (1 + 1e-9) + 1e-12 * 200 * bound


def test_the_chunked_centred_gradient_sum_matches_the_rows_in_order():
    base, _ = scale_model_oracles()
    theta, centre = np.array([0.7, 0.4]), Centre(np.array([1.0, 0.7]), 0.5, np.eye(2))
    metric = np.array([[0.3, 0.0], [0.1, 0.05]])
    differences = (base.grad_rows(theta) - base.centre_rows(centre)) @ metric
    norms = np.linalg.norm(differences, axis=1)
    bound = float(np.median(norms))
    expected = (differences * np.minimum(1.0, bound / norms)[:, None]).sum(axis=0)
    got = base.clipped_centred_grad_sum(theta, centre, metric, ALL, bound).value
    np.testing.assert_allclose(got, expected, rtol=1e-10)
    assert base.n_rows > 3 * base.chunk_size  # several chunks were read


def _grouped_model(y: np.ndarray, g: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        mu_a = pm.Normal("mu_a", 0.0, 1.0)  # read by the prior only
        a = pm.Normal("a", mu_a, 1.0, shape=3)
        pm.Normal("y", a[pm.Data("g", g)], 1.0, observed=y)
    return model


def test_the_release_with_group_blocks_is_zero_off_the_likelihood_and_bounded_per_row():
    rng = np.random.default_rng(5)
    g = rng.integers(3, size=90)
    y = rng.normal(g - 1.0, 1.0)
    other = y.copy()
    other[17] = 400.0
    channels = [
        PrivateChannel(RowLikelihood(_grouped_model(v, g)), NoiseSource(7)) for v in (y, other)
    ]
    assert channels[0].row_blocks is not None  # each group's rows read their own a_j
    kept = channels[0].likelihood_coordinates
    assert not kept.all()  # μ_a is the prior's only
    metric = np.linalg.cholesky(np.eye(4) * 0.04 + 0.01)
    centre = Centre(np.zeros(4), 3.0, np.eye(4))
    releases = [
        CentredGradientRelease(
            c,
            centre=centre,
            centre_gradient=np.where(kept, 1.0, 0.0),
            metric=metric,
            remainder_clip=0.5,
            noise_multiplier=2.0,
        )
        for c in channels
    ]
    theta = np.array([0.3, -0.2, 0.5, 0.1])
    bound = releases[0].bound(theta)
    u = releases[0].scale.whiten(theta)
    assert bound == pytest.approx(0.5 * np.max(np.linalg.norm(u, axis=-1)))
    sums = [
        c._oracle.clipped_centred_grad_sum(theta, centre, r.marginal, kept, bound).value
        for c, r in zip(channels, releases, strict=True)
    ]
    assert np.linalg.norm(sums[0] - sums[1]) <= 2 * bound * (1 + 1e-9)
    assert np.linalg.norm(sums[0] - sums[1]) > 0.5 * bound  # the replaced row was clipped
    channels[0].counter.allow(releases[0].event, 1)
    out = releases[0](theta)
    assert np.all(out.value[~kept] == 0.0)  # noise only where the likelihood reads


def test_a_given_mass_or_control_variate_false_keeps_the_plain_releases():
    model, _, _ = normal_model(5_000)
    budget = pymc_dp.PrivacyBudget(5.0, 1e-6)
    with model:
        steps = [
            pymc_dp.DPHMC(budget=budget, noise_rng=1, control_variate=False),
            pymc_dp.DPHMC(budget=budget, noise_rng=1, mass_diag=[4.0, 4.0]),
        ]
    for step in steps:
        step.prepare(chains=2)
        assert step._centring is None and step._root is None
        assert type(step._release_grad).__name__ == "GradientRelease"
        assert "dp_grad_clip" in step.privacy_metadata()
    np.testing.assert_array_equal(steps[1].mass_diag, [4.0, 4.0])
