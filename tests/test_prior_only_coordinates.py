"""Parameters only the prior reads (a centred hierarchy's ``μ``, ``τ``): public zeros.

The likelihood's gradient is 0 along them for every dataset, and a row's centred remainder does
not depend on them (theory §4.1). So the gradient releases return 0 there (the centre's, with
its other coordinates conditioned on that known noise), and the centred ratio's bound measures
the likelihood's coordinates only: a move of the hyperparameters alone reads nothing.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pymc as pm
import pytest

from pymc_dp import RowLikelihood
from pymc_dp.mechanisms import (
    CentredLLRRelease,
    CentreGradientRelease,
    GradientRelease,
    PrivateChannel,
    conditioned_on_zeros,
)
from pymc_dp.noise import NoiseSource
from pymc_dp.prediction import centred_bound_rms
from pymc_dp.releases import Centre

GROUPS = 3


@cache
def hierarchy() -> RowLikelihood:
    rng = np.random.default_rng(4)
    group = rng.integers(0, GROUPS, 300)
    y = rng.normal(1.0 + 0.5 * group, 1.0)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        tau = pm.HalfNormal("tau", 1.0)
        a = pm.Normal("a", mu, tau, shape=GROUPS)
        pm.Normal("y", a[group], 1.0, observed=y)
    return RowLikelihood(model)


def _slices(oracle: RowLikelihood) -> dict[str, slice]:
    return {v.name: sl for v, sl, _ in oracle.space.slices}


def _lower(rng: np.random.Generator, d: int) -> np.ndarray:
    """A dense lower-triangular whitening: it mixes every coordinate into every other."""
    return np.tril(rng.normal(0.0, 0.6, (d, d)), -1) + np.diag(rng.uniform(0.5, 2.0, d))


def test_the_likelihood_coordinates_are_the_ones_its_graph_reads():
    oracle = hierarchy()
    expected = np.zeros(oracle.space.ndim, dtype=bool)
    expected[_slices(oracle)["a"]] = True
    np.testing.assert_array_equal(oracle.likelihood_coordinates, expected)
    np.testing.assert_array_equal(PrivateChannel(oracle).likelihood_coordinates, expected)
    with pm.Model() as flat:  # every parameter in the likelihood
        m = pm.Normal("m", 0.0, 1.0)
        pm.Normal("y", m, pm.HalfNormal("s", 1.0), observed=np.arange(5.0))
    assert RowLikelihood(flat).likelihood_coordinates.all()


def test_conditioning_on_known_zeros_gives_the_conditional_gaussian():
    rng = np.random.default_rng(0)
    root = _lower(rng, 4)
    covariance = root @ root.T
    kept = np.array([True, False, True, False])
    exact = np.array([1.5, 0.0, -2.0, 0.0])
    noise = rng.standard_normal((20_000, 4)) @ root.T
    conditioned = np.array([conditioned_on_zeros(exact + xi, covariance, kept)[0] for xi in noise])
    _, conditional = conditioned_on_zeros(np.zeros(4), covariance, kept)
    assert np.all(conditioned[:, ~kept] == 0.0)
    assert np.all(conditional[~kept] == 0.0) and np.all(conditional[:, ~kept] == 0.0)
    np.testing.assert_allclose(conditioned.mean(axis=0), exact, atol=0.05)
    np.testing.assert_allclose(np.cov(conditioned.T), conditional, atol=0.06)
    # the negative control: the release's own noise along the kept coordinates is larger
    plain = covariance[np.ix_(kept, kept)]
    assert np.trace(conditional) < 0.8 * np.trace(plain)


def test_the_centre_gradient_is_zero_off_the_likelihood_and_conditioned_on_it():
    oracle = hierarchy()
    d = oracle.space.ndim
    kept = oracle.likelihood_coordinates
    channel = PrivateChannel(oracle, NoiseSource(8))
    centre = Centre(np.linspace(-0.5, 0.5, d), 30.0, _lower(np.random.default_rng(1), d))
    release = CentreGradientRelease(channel, centre=centre, noise_multiplier=0.5)
    channel.counter.allow(release.event, 3000)
    exact = oracle.centre_rows(centre).sum(axis=0)
    assert np.all(exact[~kept] == 0.0)
    draws = np.array([release().value for _ in range(3000)])
    assert np.all(draws[:, ~kept] == 0.0)
    covariance = release.noise_covariance
    assert np.all(covariance[~kept] == 0.0)
    np.testing.assert_allclose(np.cov(draws[:, kept].T), covariance[np.ix_(kept, kept)], rtol=0.15)
    sd = np.sqrt(np.diag(covariance)[kept])
    assert np.all(np.abs(draws[:, kept].mean(axis=0) - exact[kept]) < 4 * sd / np.sqrt(3000))
    inverse = np.linalg.inv(centre.whitening)  # the release's noise before conditioning
    unconditioned = release.noise_std**2 * inverse @ inverse.T
    assert np.trace(covariance) < np.trace(unconditioned[np.ix_(kept, kept)])


def test_a_gradient_release_is_zero_where_the_likelihood_reads_nothing():
    oracle = hierarchy()
    kept = oracle.likelihood_coordinates
    channel = PrivateChannel(oracle, NoiseSource(9))
    release = GradientRelease(channel, grad_clip=5.0, noise_multiplier=1.0)
    channel.counter.allow(release.event, 50)
    theta = np.full(oracle.space.ndim, 0.2)
    values = np.array([release(theta).value for _ in range(50)])
    assert np.all(values[:, ~kept] == 0.0)
    assert np.all(np.std(values[:, kept], axis=0) > 0.5 * release.noise_multiplier * 2 * 5.0)


def _centred(channel: PrivateChannel, metric: np.ndarray) -> CentredLLRRelease:
    d = channel.space.ndim
    return CentredLLRRelease(
        channel,
        centre=Centre(np.zeros(d), 30.0, np.eye(d)),
        centre_gradient=np.linspace(1.0, 2.0, d),
        metric=metric,
        remainder_clip=0.4,
        noise_multiplier=2.0,
    )


def test_the_centred_bound_measures_the_likelihood_coordinates_in_their_marginal_metric():
    oracle = hierarchy()
    d, kept = oracle.space.ndim, oracle.likelihood_coordinates
    channel = PrivateChannel(oracle, NoiseSource(10))
    metric = _lower(np.random.default_rng(2), d)
    release = _centred(channel, metric)
    rng = np.random.default_rng(3)
    covariance = metric @ metric.T
    marginal = np.linalg.cholesky(covariance[np.ix_(kept, kept)])
    blocks = oracle.row_blocks  # each group's rows: its effect and the shared coefficients
    assert blocks is not None and blocks.shape[0] > 1

    def scale(factor, x, x_new):
        u, u_new = np.linalg.solve(factor, x), np.linalg.solve(factor, x_new)
        return 0.2 * np.linalg.norm(u_new - u) * (np.linalg.norm(u) + np.linalg.norm(u_new))

    for _ in range(20):
        theta, theta_new = rng.normal(size=d), rng.normal(size=d)
        per_group = max(
            scale(np.linalg.cholesky(covariance[np.ix_(b, b)]), theta[b], theta_new[b])
            for b in blocks
        )
        assert release.bound(theta, theta_new) == pytest.approx(per_group, rel=1e-10)
        # never above the bound on all the likelihood's coordinates, nor the full metric's
        assert per_group <= scale(marginal, theta[kept], theta_new[kept]) * (1 + 1e-12)
        w, w_new = np.linalg.solve(metric, theta), np.linalg.solve(metric, theta_new)
        full = 0.2 * np.linalg.norm(w_new - w) * (np.linalg.norm(w) + np.linalg.norm(w_new))
        assert release.bound(theta, theta_new) <= full * (1 + 1e-12)


def test_a_move_of_the_hyperparameters_alone_reads_nothing_and_is_the_linear_term():
    oracle = hierarchy()
    d, kept = oracle.space.ndim, oracle.likelihood_coordinates
    channel = PrivateChannel(oracle, NoiseSource(11))
    release = _centred(channel, _lower(np.random.default_rng(5), d))
    channel.counter.allow(release.event, 2)
    theta = np.full(d, 0.3)
    theta_new = theta.copy()
    theta_new[~kept] += np.array([1.0, -0.7])  # μ and log τ
    reads = channel.reads
    out = release(theta, theta_new)
    assert channel.reads == reads and out.noise_std == 0.0
    assert out.value == pytest.approx(np.linspace(1.0, 2.0, d) @ (theta_new - theta))
    theta_new[kept] += 0.1  # a move of the group effects reads the data
    assert release(theta, theta_new).noise_std > 0 and channel.reads > reads


def test_the_planned_bound_measures_the_likelihood_coordinates_too():
    rng = np.random.default_rng(6)
    d = 5
    metric = np.diag(rng.uniform(0.5, 2.0, d))
    centre, scale = np.zeros(d), np.full(d, 0.3)
    every = centred_bound_rms(metric, centre, scale, None)
    kept = np.array([True, True, True, False, False])
    some = centred_bound_rms(metric, centre, scale, None, coordinates=kept)
    # the marginal problem in three dimensions: the same distribution of the bound
    alone = centred_bound_rms(metric[:3, :3], centre[:3], scale[:3], None, seed=1)
    assert some == pytest.approx(alone, rel=0.05) and some < 0.8 * every


def test_the_bound_on_the_likelihood_coordinates_bounds_every_row_remainder():
    # y_i ~ N(a_g, 1): row i's Hessian is −e_g e_gᵀ, whose norm in the metric W_L is
    # (Σ_LL)_gg; with h their largest, |r_i| ≤ h ‖δ‖ (‖u‖ + ‖u'‖)/2 for every row and pair
    oracle = hierarchy()
    d, kept = oracle.space.ndim, oracle.likelihood_coordinates
    metric = _lower(np.random.default_rng(7), d)
    h = float(np.max(np.diag((metric @ metric.T)[np.ix_(kept, kept)])))
    channel = PrivateChannel(oracle, NoiseSource(12))
    centre = Centre(np.linspace(-0.4, 0.6, d), 1e9, np.eye(d))  # no row clipped at the centre
    release = CentredLLRRelease(
        channel,
        centre=centre,
        centre_gradient=np.zeros(d),
        metric=metric,
        remainder_clip=h,
        noise_multiplier=1.0,
    )
    rng = np.random.default_rng(8)
    worst = 0.0
    for _ in range(30):
        theta, theta_new = rng.normal(0.0, 2.0, (2, d))
        remainders = oracle.centred_ratio_rows(theta, theta_new, centre)
        worst = max(worst, float(np.max(np.abs(remainders))) / release.bound(theta, theta_new))
    assert worst <= 1.0 + 1e-9
    assert worst > 0.5  # and not loose: with half of h some remainder would exceed it
