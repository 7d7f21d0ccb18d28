"""DP-SGLD, DP-SGNHT and DP-SGHMC as PyMC steps (theory §4.5).

The properties every DP step has are in the conformance suite; the dynamics on a closed-form
posterior in tests/kernels/test_stochastic_gradient_kernel.py. Here: the batches are drawn the
way the accountant assumes, one substituted row moves a release by at most ``2C``, SGHMC costs
``J`` releases per iteration, the SGHMC thesis' normal-mean experiment (with the friction sign
flipped as a negative control), and errors for bad input.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest
from scipy import stats

import pymc_dp
import pymc_dp.step_methods.stochastic_gradient as sg_module
from pymc_dp.accounting import SubsampledGaussianCost, compose
from pymc_dp.mechanisms import MinibatchGradientRelease, PrivateChannel
from pymc_dp.noise import NoiseSource
from pymc_dp.oracle import RowLikelihood

DELTA = 1e-6


def normal_model(y: np.ndarray, prior_sd: float = 10.0, sigma: float = 1.0) -> pm.Model:
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, prior_sd)
        pm.Normal("y", mu, sigma, observed=y)
    return model


# ---------------------------------------------------------------- batches and sensitivity


def test_batches_are_drawn_as_the_accountant_assumes():
    # fixed size b, without replacement, uniform: each row in a batch with probability q = b/n,
    # which is the sampling_ratio of the subsampled-Gaussian event the ledger composes
    n, b, releases = 200, 20, 3000
    oracle = RowLikelihood(normal_model(np.random.default_rng(1).normal(size=n)))
    channel = PrivateChannel(oracle, NoiseSource(5))
    release = MinibatchGradientRelease(channel, batch_size=b, grad_clip=1.0, noise_multiplier=1.0)
    batches = []
    original = oracle.clipped_grad_sum

    def spy(theta, clip, rows=None, **kwargs):
        batches.append(np.asarray(rows))
        return original(theta, clip, rows, **kwargs)

    oracle.clipped_grad_sum = spy
    for _ in range(releases):
        release(np.array([0.0]))
    assert all(batch.size == b and np.unique(batch).size == b for batch in batches)
    counts = np.bincount(np.concatenate(batches), minlength=n)
    q = b / n
    assert release.event == SubsampledGaussianCost(1.0, q)
    # every row's inclusion count is Binomial(releases, q): a χ² test of uniformity
    chi2 = float(np.sum((counts - releases * q) ** 2 / (releases * q * (1 - q))))
    assert stats.chi2.sf(chi2, n - 1) > 1e-3
    assert channel.counter.released[release.event] == releases


@pytest.mark.parametrize("seed", range(5))
def test_substituting_one_row_moves_a_release_by_at_most_twice_the_clip(seed):
    # same secret generator (same batch, same noise) on neighbouring data sets: the releases
    # differ only through the substituted row's clipped gradient, at most 2C apart
    rng = np.random.default_rng(seed)
    n, clip = 50, 0.5
    y = rng.normal(size=n)
    y_neighbour = y.copy()
    y_neighbour[rng.integers(n)] = rng.choice([-1e6, 1e6, 0.0])
    theta = np.array([rng.normal()])
    released = []
    for data in (y, y_neighbour):
        channel = PrivateChannel(RowLikelihood(normal_model(data)), NoiseSource(seed))
        release = MinibatchGradientRelease(
            channel, batch_size=n, grad_clip=clip, noise_multiplier=1
        )
        released.append(release(theta).value)
    assert np.linalg.norm(released[0] - released[1]) <= 2 * clip + 1e-9


# ---------------------------------------------------------------- costs


def test_sghmc_costs_one_release_per_step():
    y = np.random.default_rng(2).normal(size=300)
    with normal_model(y):
        step = pymc_dp.DPSGHMC(
            budget=pymc_dp.PrivacyBudget(1e3, DELTA),
            step_size=1.0,
            friction=5.0,
            n_steps=4,
            grad_clip=2.0,
            batch_size=30,
        )
    event = SubsampledGaussianCost(step.noise_multiplier, 0.1)
    assert step.cost == compose((event, 4))
    point = {"mu": np.array(0.0)}
    step.setup_chain(np.random.default_rng(0), 0, 3)
    for _ in range(3):
        point, _ = step.step(point)
    assert step.counter.released[event] == 12
    meta = step.privacy_metadata()
    assert meta["dp_gradient_releases_per_iteration"] == 4
    assert "without replacement" in meta["dp_sampling"]


def test_the_step_size_sets_the_noise_and_the_budget_the_length():
    y = np.random.default_rng(2).normal(size=300)
    budget = pymc_dp.PrivacyBudget(2.0, DELTA)
    with normal_model(y):
        small = pymc_dp.DPSGLD(budget=budget, step_size=0.01, grad_clip=2.0, batch_size=30)
        large = pymc_dp.DPSGLD(budget=budget, step_size=0.04, grad_clip=2.0, batch_size=30)
    # four times the step: half the noise per release, fewer releases per budget
    assert small.noise_multiplier == pytest.approx(2 * large.noise_multiplier)
    assert budget.iterations(small.cost) > budget.iterations(large.cost)


# ---------------------------------------------------------------- the thesis' normal mean


def lode_normal_mean(monkeypatch=None, flip_friction: bool = False) -> np.ndarray:
    """L §6.2: N = 500 rows from N(1, 2²), prior N(0, 1), clip 0.7, q = 0.1, J = N/B = 10,
    T = 500 iterations, the first half discarded. Our units: time step h = η/n a tenth of the
    posterior sd, friction 40 (the thesis' η_t = t^{-1/3} and C = 0.005 are in its units)."""
    if flip_friction:
        original = sg_module.sghmc_kernel

        def flipped(state, time_step, friction, *args):
            return original(state, time_step, -friction, *args)

        monkeypatch.setattr(sg_module, "sghmc_kernel", flipped)
    y = np.random.default_rng(61).normal(1.0, 2.0, 500)
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 1.0)
        pm.Normal("y", mu, 2.0, observed=y)
        step = pymc_dp.DPSGHMC(
            budget=pymc_dp.PrivacyBudget(50.0, 1e-5),
            step_size=4.5,
            friction=40.0,
            n_steps=10,
            grad_clip=0.7,
            batch_size=50,
            noise_rng=8,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pymc_dp.sample(
                step,
                chains=2,
                tune=250,
                draws=250,
                random_seed=3,
                initvals={"mu": 0.0},
                progressbar=False,
                compute_convergence_checks=False,
            )
    return idata.posterior["mu"].values.ravel(), y


@pytest.mark.slow
def test_the_thesis_normal_mean_is_recovered():
    draws, y = lode_normal_mean()
    precision = 1.0 + y.size / 4.0
    mean, sd = y.sum() / 4.0 / precision, precision**-0.5
    assert abs(draws.mean() - mean) < 0.5 * sd, (draws.mean(), mean, sd)
    assert 0.7 < draws.std() / sd < 1.5, draws.std() / sd


@pytest.mark.slow
def test_negative_control_the_printed_friction_sign_is_detected(monkeypatch):
    draws, y = lode_normal_mean(monkeypatch, flip_friction=True)
    precision = 1.0 + y.size / 4.0
    mean, sd = y.sum() / 4.0 / precision, precision**-0.5
    off = abs(draws.mean() - mean) >= 0.5 * sd or not 0.7 < draws.std() / sd < 1.5
    assert off or not np.isfinite(draws).all()


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"step_size": -1.0}, "step_size"),
        ({"grad_clip": 0.0}, "grad_clip"),
        ({"batch_size": 1}, "batch_size"),
        ({"batch_size": 10_000}, "batch_size=10000 must be between 2 and"),
        ({"friction": -2.0}, "friction"),
        ({"n_steps": 0}, "n_steps"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, match):
    settings = {"step_size": 1.0, "grad_clip": 1.0, "batch_size": 10, **kwargs}
    with normal_model(np.zeros(100)):
        with pytest.raises(pymc_dp.InvalidParameterError, match=match):
            pymc_dp.DPSGHMC(budget=pymc_dp.PrivacyBudget(1.0, DELTA), **settings)


def test_a_missing_setting_is_a_clear_error():
    with normal_model(np.zeros(100)):
        with pytest.raises(TypeError, match="step_size"):
            pymc_dp.DPSGLD(budget=pymc_dp.PrivacyBudget(1.0, DELTA), grad_clip=1.0, batch_size=10)


# ---------------------------------------------------------------- private start


def test_a_private_start_is_composed_into_the_reported_spend():
    y = np.random.default_rng(4).normal(1.0, 1.0, 2000)
    budget = pymc_dp.PrivacyBudget(3.0, DELTA)
    with normal_model(y):
        step = pymc_dp.DPSGLD(
            budget=budget, step_size=0.05, grad_clip=3.0, batch_size=200, init_share=0.1
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pymc_dp.sample(step, chains=2, progressbar=False)
    report = pymc_dp.privacy_report(idata)
    assert report["dp_private_initialization"] == 1
    phases = report["dp_phase_tuning_epsilon"], report["dp_phase_sampling_epsilon"]
    assert max(phases) < report["dp_epsilon_spent"] <= budget.epsilon
    # the ledger composes the same events: the report and the ledger agree
    assert report["dp_epsilon_spent"] == pytest.approx(budget.report().spent_epsilon, rel=1e-3)
    # the start is private: the chains begin near the posterior, not at PyMC's μ = 0
    assert abs(float(idata.posterior["mu"].isel(draw=0).mean()) - y.mean()) < 0.2
