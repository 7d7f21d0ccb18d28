"""The centring's sharper Fisher reads at one point: pooled where they share a whitening and a
clip (post-processing), re-whitened where the last estimate rescales a direction by more than
``_POOL_CHANGE`` (:func:`~pymc_dp.step_methods.initialization.private_centring`, step 4)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pymc as pm
import pytest

import pymc_dp
from pymc_dp.kernels.initialization import relative_noise, unresolved_directions
from pymc_dp.step_methods import initialization
from pymc_dp.step_methods.initialization import _pooled_fisher, _whitening_change


class _Read(NamedTuple):  # what a FisherRelease returns, as the pooling reads it
    value: np.ndarray
    noise_std: float


def _symmetric_noise(rng: np.random.Generator, d: int, sd: float) -> np.ndarray:
    noise = rng.normal(scale=sd, size=(d, d))
    return np.triu(noise) + np.triu(noise, 1).T  # independent upper-triangle entries


def _truth(rng: np.random.Generator, d: int) -> np.ndarray:
    a = rng.normal(size=(d, d))
    return a @ a.T + d * np.eye(d)


@pytest.mark.parametrize("sds", [(2.0, 2.0, 2.0, 2.0), (1.0, 2.0, 0.5)])
def test_pooled_reads_are_unbiased_with_the_noise_they_state(sds):
    """Reads with independent entry noise ``σ_k`` pooled by precision: the mean error is zero
    and every upper-triangle entry's sd is the stated ``(Σ 1/σ_k²)^(-1/2)`` (within 5 %)."""
    rng = np.random.default_rng(0)
    d, reps = 5, 4000
    truth = _truth(rng, d)
    whitening = np.eye(d)
    errors = np.empty((reps, d, d))
    for r in range(reps):
        pool = None
        for sd in sds:
            read = _Read(truth + _symmetric_noise(rng, d, sd), sd)
            pool = _pooled_fisher(pool, read, whitening, 1.5)
        errors[r] = pool.value - truth
    stated = float(np.sum(np.asarray(sds) ** -2.0) ** -0.5)
    assert pool.reads == len(sds)
    assert pool.noise_std == pytest.approx(stated, rel=1e-12)
    upper = errors[:, *np.triu_indices(d)]
    np.testing.assert_allclose(upper.std(axis=0), stated, rtol=0.05)
    assert np.max(np.abs(upper.mean(axis=0))) < 4 * stated / np.sqrt(reps)
    # the best single read alone has the larger noise: pooling gains
    assert stated < min(sds)


def test_reads_in_another_whitening_or_clip_are_not_pooled():
    """A read in another whitening or with another clip estimates another matrix: it starts a
    new pool. One in an equal whitening (a copy) and the same clip is pooled."""
    rng = np.random.default_rng(1)
    d = 4
    first = _Read(_truth(rng, d), 1.0)
    second = _Read(_truth(rng, d), 1.0)
    whitening = np.eye(d)
    pool = _pooled_fisher(None, first, whitening, 2.0)
    stretched = np.diag([1.0, 1.0, 1.0, 1.5])
    for other_whitening, other_clip in [(stretched, 2.0), (np.ones(d), 2.0), (whitening, 2.5)]:
        alone = _pooled_fisher(pool, second, other_whitening, other_clip)
        assert alone.reads == 1
        np.testing.assert_array_equal(alone.value, second.value)
        assert alone.noise_std == 1.0
    pooled = _pooled_fisher(pool, second, whitening.copy(), 2.0)
    assert pooled.reads == 2
    np.testing.assert_allclose(pooled.value, 0.5 * (first.value + second.value))


def test_pooling_resolves_what_one_read_cannot():
    """Four reads pooled halve the noise: directions whose information is at one read's noise
    radius ``2σ√d`` are often unresolved by one read and always resolved by the pool (Weyl's
    bound on the pooled noise holds as for one release of that noise)."""
    rng = np.random.default_rng(2)
    d, sd = 10, 1.0
    basis, _ = np.linalg.qr(rng.normal(size=(d, d)))
    radius = 2 * sd * np.sqrt(d)  # ≈ 6.3
    truth = (basis * np.array([60.0] * 6 + [radius] * 4)) @ basis.T
    whitening = np.eye(d)
    single, pooled = [], []
    for _ in range(20):
        pool = None
        for _ in range(4):
            pool = _pooled_fisher(
                pool, _Read(truth + _symmetric_noise(rng, d, sd), sd), whitening, 1.0
            )
            if pool.reads == 1:
                single.append(unresolved_directions(pool.value, pool.noise_std))
        pooled.append(unresolved_directions(pool.value, pool.noise_std))
    assert np.mean(single) >= 1.0
    assert max(pooled) == 0


def test_whitening_change_is_the_largest_rescaling_of_a_direction():
    rng = np.random.default_rng(3)
    d = 5
    whitening = np.linalg.cholesky(_truth(rng, d)).T
    assert _whitening_change(whitening, whitening) == pytest.approx(0.0, abs=1e-12)
    rotation, _ = np.linalg.qr(rng.normal(size=(d, d)))
    assert _whitening_change(rotation @ whitening, whitening) == pytest.approx(0.0, abs=1e-10)
    stretch = np.diag([1.0, 1.0, 3.0, 1.0, 0.5])
    assert _whitening_change(stretch @ whitening, whitening) == pytest.approx(np.log(3.0))
    assert _whitening_change(np.array([1.0, 2.0]), np.array([1.0, 0.25])) == pytest.approx(
        np.log(8.0)
    )
    assert _whitening_change(np.eye(2), np.zeros((2, 2))) == np.inf
    assert initialization._POOL_CHANGE > 1.0


def _logistic(n: int, d: int) -> pm.Model:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(n, d - 1))
    beta = rng.normal(scale=0.5, size=d - 1)
    y = rng.binomial(1, 1 / (1 + np.exp(-(0.3 + X @ beta))))
    with pm.Model() as model:
        a = pm.Normal("a", 0, 2)
        b = pm.Normal("b", 0, 2, shape=d - 1)
        pm.Bernoulli("y", logit_p=a + pm.math.dot(X, b), observed=y)
    return model


def _metric_error(step) -> float:
    """rms of the log eigenvalues of the private metric against the exact posterior
    covariance at the centre (reads the data: evaluation only)."""
    oracle = step._channel._oracle
    space = oracle.space
    theta = step._centring.centre.theta.copy()

    def gradient(x):
        return oracle.grad_sum(x, _count=False) + space.logprior_grad(x)

    for _ in range(30):  # Newton on the exact log posterior: its mode
        columns = [
            (gradient(theta - 1e-6 * e) - gradient(theta + 1e-6 * e)) / 2e-6
            for e in np.eye(theta.size)
        ]
        information = 0.5 * (np.column_stack(columns) + np.column_stack(columns).T)
        theta = theta + np.linalg.solve(information, gradient(theta))
    root = np.linalg.cholesky(information)
    metric = step._centring.metric
    values = np.linalg.eigvalsh(root.T @ metric @ metric.T @ root)
    return float(np.sqrt(np.mean(np.log(values) ** 2)))


@pytest.mark.slow
def test_pooled_sharper_reads_give_a_closer_metric(monkeypatch):
    """41 parameters, where the sampler's metric is the Fisher reads' (no observed curvature):
    the sharper reads at the centre, pooled while their whitening barely moves and kept up while
    they are rough, against each read replacing the last (the negative control, the code before
    the pooling): on this regression at n = 10⁵, ε = 5, the metric's rms log error was
    0.16–0.17 against 0.25–0.26 (three preparations each; here one, 1–2 minutes)."""
    model = _logistic(100_000, 41)
    errors = {}
    for pooled in (True, False):
        if not pooled:
            monkeypatch.setattr(initialization, "_POOL_CHANGE", 1.0)  # always re-whitened
            monkeypatch.setattr(initialization, "_SHARPENING_PRECISION", np.inf)
        errors[pooled] = []
        for seed in (0,):
            with model:
                step = pymc_dp.DPPenalty(
                    budget=pymc_dp.PrivacyBudget(5.0, 1e-6), noise_rng=seed, rng=seed
                )
                step.prepare(chains=4)
            if pooled:
                assert step._centring.sharpened >= 2
            errors[pooled].append(_metric_error(step))
    assert np.mean(errors[True]) < 0.8 * np.mean(errors[False]), errors


def test_relative_noise_is_the_radius_over_the_median_stated_information():
    d, sigma = 4, 0.5  # radius 2σ√d = 2
    fisher = np.diag([10.0, 20.0, 40.0, 80.0])
    none = np.zeros((d, d))
    assert relative_noise(fisher, np.ones(d), sigma, none) == pytest.approx(2.0 / 30.0)
    # the prior's information adds along each direction (in the release's whitening)
    prior = -np.diag([10.0, 0.0, 0.0, 0.0])
    assert relative_noise(fisher, np.ones(d), sigma, prior) == pytest.approx(2.0 / 30.0)
    prior = -np.diag([10.0, 20.0, 0.0, 0.0])
    assert relative_noise(fisher, np.ones(d), sigma, prior) == pytest.approx(2.0 / 40.0)
    # a negative (noise) eigenvalue states no information
    fisher = np.diag([-5.0, 1.0, 1.0, 1.0])
    assert relative_noise(fisher, np.ones(d), sigma, none) == pytest.approx(2.0 / 1.0)
    # the likelihood's flat directions are left out; all flat: nothing to read
    flat = np.eye(d)[:, :1]
    fisher = np.diag([0.0, 10.0, 20.0, 30.0])
    assert relative_noise(fisher, np.ones(d), sigma, none, flat=flat) == pytest.approx(0.1)
    assert relative_noise(np.zeros((d, d)), np.ones(d), sigma, none, flat=np.eye(d)) == 0.0
    # the prior's information enters in the release's whitening: P Π Pᵀ
    fisher = np.diag([10.0, 20.0, 40.0, 80.0])
    prior = -np.diag([40.0, 80.0, 0.0, 0.0])  # 10 and 20 in the whitening diag(1/2, 1/2, 1, 1)
    whitening = np.array([0.5, 0.5, 1.0, 1.0])
    assert relative_noise(fisher, whitening, sigma, prior) == pytest.approx(2.0 / 40.0)
    assert relative_noise(fisher, np.ones(d), sigma, prior) == pytest.approx(2.0 / 65.0)
