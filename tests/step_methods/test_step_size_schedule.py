"""The stochastic-gradient samplers' decreasing step size (theory §4.5).

``η_t = η (1 + t/t₀)^{-γ}`` is followed in stages of constant step on the grid ``η 2^{-k/2}``.
Checked here: the stages follow the formula; a chain reserves its stages in the ledger and
spends exactly what a per-iteration composition of its releases costs (computed from the
formula, not from the step); the plan is the longest that fits; the draws have the variance
that the scheduled Langevin recursion predicts, with a negative control whose noise does not
follow the schedule; errors for bad settings.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pymc as pm
import pytest
from scipy import stats

import pymc_dp
import pymc_dp.step_methods.stochastic_gradient as sg_module
from pymc_dp.accounting.subsampled import subsampled_gaussian_schedule_epsilon
from pymc_dp.kernels.stochastic_gradient import StepSizeSchedule

from ._hooks import releases_allowed, releases_made

DELTA = 1e-6
GRID = 2.0**0.5


def quiet(**kwargs):
    return {"progressbar": False, "compute_convergence_checks": False, **kwargs}


def formula_stage(t: np.ndarray, decay: float, offset: float) -> np.ndarray:
    """``k(t) = ⌊γ log(1 + t/t₀) / log √2⌋``, written out independently of the step."""
    return np.floor(decay * np.log1p(t / offset) / np.log(GRID) + 1e-12).astype(int)


def normal_model(y: np.ndarray, prior_sd: float = 10.0) -> pm.Model:
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, prior_sd, shape=y.shape[1:])
        pm.Normal("y", mu, 1.0, observed=y)
    return model


def small_sgld(epsilon: float, **schedule) -> tuple[pm.Model, pymc_dp.DPSGLD]:
    """DP-SGLD on 400 rows with batches of 40 (q = 0.1) and the given schedule."""
    y = np.random.default_rng(3).normal(1.0, 1.0, 400)
    with normal_model(y) as model:
        step = pymc_dp.DPSGLD(
            budget=pymc_dp.PrivacyBudget(epsilon, DELTA),
            step_size=0.05,
            grad_clip=4.0,
            batch_size=40,
            **schedule,
        )
    return model, step


# ---------------------------------------------------------------- the stages


@pytest.mark.parametrize(("decay", "offset"), [(0.55, 100.0), (1.0, 3.0), (0.2, 1000.0)])
def test_the_stages_follow_the_formula_from_above(decay, offset):
    schedule = StepSizeSchedule(decay, offset)
    t = np.arange(20_000)
    stage = np.array([schedule.stage(int(i)) for i in t])
    exact = (1.0 + t / offset) ** -decay
    factor = GRID ** (-stage.astype(float))
    # the stage's step is the grid point at or just above the formula: less than 41 % above
    assert np.all(factor >= exact * (1 - 1e-12)) and np.all(factor / GRID < exact * (1 + 1e-12))
    assert np.all(np.diff(stage) >= 0) and np.array_equal(stage, formula_stage(t, decay, offset))
    pieces = schedule.stages(37, 20_000)  # a partition of the iterations, in order
    assert sum(k for _, k in pieces) == 20_000 - 37
    assert [s for s, _ in pieces] == sorted(set(stage[37:]))


# ---------------------------------------------------------------- accounting and enforcement


def run_scheduled(*, decay=0.6, offset=20.0, chains=2, tune=40, draws=160, epsilon=50.0):
    y = np.random.default_rng(3).normal(1.0, 1.0, (400,))
    budget = pymc_dp.PrivacyBudget(epsilon, DELTA)
    settings = {"step_size": 0.05, "grad_clip": 4.0, "batch_size": 40}
    with normal_model(y):
        step = pymc_dp.DPSGLD(
            budget=budget, step_size_decay=decay, decay_offset=offset, noise_rng=2, **settings
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pymc_dp.sample(
                step, chains=chains, tune=tune, draws=draws, cores=1, random_seed=1, **quiet()
            )
    return step, idata, settings


def test_a_scheduled_chain_spends_what_its_releases_cost_one_by_one():
    step, idata, settings = run_scheduled()
    n, b, clip, eta = 400, settings["batch_size"], settings["grad_clip"], settings["step_size"]
    t = np.arange(200)
    stage = formula_stage(t, 0.6, 20.0)
    # the stats say which step each draw used: η · 2^{-k(t)/2}
    used = idata.sample_stats["step_size"].values  # (chain, draw): draws are t = 40 … 199
    assert np.allclose(used, eta * GRID ** -stage[40:].astype(float), rtol=1e-12)
    # every iteration its own event: z_t = (b/n) √(2/h_t) / (2C), h_t = η_t / n
    z = b / n * np.sqrt(2.0 / (eta * GRID ** -stage.astype(float) / n)) / (2.0 * clip)
    one_by_one = subsampled_gaussian_schedule_epsilon(np.tile(z, 2), b / n, DELTA)
    ledger = step.budget.report()
    assert ledger.spent_epsilon == pytest.approx(one_by_one, rel=1e-6)
    assert ledger.reservations == 2 * len(set(stage)) and ledger.reserved_iterations == 400
    report = pymc_dp.privacy_report(idata)
    assert report["dp_epsilon_spent"] == pytest.approx(one_by_one, rel=1e-6)
    assert "step_size (1 + t/20)^-0.6" in report["dp_step_size_schedule"]
    # each release was covered by the reservation, and the last chain released exactly it
    made, allowed = releases_made(step), releases_allowed(step)
    assert made == allowed
    # cheaper than the constant step η for as long; each release at most as noisy as the
    # unrounded formula's (so never cheaper than it)
    constant = subsampled_gaussian_schedule_epsilon(np.full(400, z[0]), b / n, DELTA)
    assert one_by_one < 0.8 * constant
    unrounded = b / n * np.sqrt(2.0 / (eta * (1.0 + t / 20.0) ** -0.6 / n)) / (2.0 * clip)
    assert np.all(z <= unrounded * (1 + 1e-12)) and np.all(z * GRID**0.5 > unrounded)


@pytest.mark.parametrize(
    ("cls", "extra"),
    [
        (pymc_dp.DPSGNHT, {"diffusion": 10.0}),
        (pymc_dp.DPSGHMC, {"friction": 30.0, "n_steps": 3}),
    ],
)
def test_every_stochastic_gradient_sampler_follows_its_schedule(cls, extra):
    y = np.random.default_rng(3).normal(1.0, 1.0, 400)
    with normal_model(y):
        step = cls(
            budget=pymc_dp.PrivacyBudget(1e4, DELTA),
            step_size=2.0,
            grad_clip=6.0,
            batch_size=100,
            step_size_decay=0.8,
            decay_offset=5.0,
            **extra,
        )
        idata = pm.sample(step=step, chains=1, tune=10, draws=90, random_seed=4, **quiet())
    used = idata.sample_stats["step_size"].values[0]  # iterations t = 10 … 99
    stage = formula_stage(np.arange(100), 0.8, 5.0)
    assert np.allclose(used, 2.0 * GRID ** -stage[10:].astype(float), rtol=1e-12)
    assert releases_made(step) == releases_allowed(step)  # n_steps releases per iteration
    assert step.budget.report().reservations == len(set(stage))
    assert np.isfinite(idata.posterior["mu"].values).all()


def test_the_plan_is_the_longest_schedule_that_fits_and_beats_the_constant_step():
    _, constant = small_sgld(10.0)
    _, scheduled = small_sgld(10.0, step_size_decay=0.7, decay_offset=10.0)
    flat = constant.sampling_kwargs(chains=2)
    plan = scheduled.sampling_kwargs(chains=2)
    length = plan["tune"] + plan["draws"]
    assert length > 1.5 * (flat["tune"] + flat["draws"])

    def fits(iterations):
        spending = scheduled.chain_spending(0, iterations)
        return scheduled.budget.fits_spending([(cost, 2 * k) for cost, k in spending])

    assert fits(length) and not fits(math.ceil(1.002 * length))  # within the 0.1 % search unit
    assert sum(k for _, k in scheduled.chain_spending(0, length)) == length


def test_the_default_plan_stops_at_its_cap_and_says_so(monkeypatch):
    import pymc_dp.planning as planning

    monkeypatch.setattr(planning, "MAX_SCHEDULED_CHAIN_LENGTH", 300)
    _, step = small_sgld(10.0, step_size_decay=1.0, decay_offset=10.0)
    with pytest.warns(UserWarning, match="plan stops at 300"):
        plan = step.sampling_kwargs(chains=2)
    assert plan["tune"] + plan["draws"] == 300
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # given draws: no search, no warning
        assert step.prepare(chains=2, tune=100, draws=200) == (100, 200)


def test_a_chain_cannot_outrun_its_scheduled_reservation():
    model, step = small_sgld(50.0, step_size_decay=0.6, decay_offset=5.0)
    step.plan(tune=0, draws=30)
    point = model.initial_point()
    for _ in range(30):
        point, _ = step.step(point)
    reads = step._channel.reads
    with pytest.raises(pymc_dp.BudgetExceededError, match="reserved 30 iterations"):
        step.step(point)
    assert step._channel.reads == reads  # refused before reading


def test_reserving_stages_is_all_or_nothing():
    from pymc_dp.accounting import SubsampledGaussianCost

    budget = pymc_dp.PrivacyBudget(4.0, DELTA)
    first, later = SubsampledGaussianCost(1.0, 0.1), SubsampledGaussianCost(2.0, 0.1)
    allowed = budget.iterations(first)
    with pytest.raises(pymc_dp.BudgetExceededError, match="2 stages"):
        budget.reserve_parts([(first, allowed), (later, 10 * allowed)], mechanism="DPSGLD")
    assert budget.report().reservations == 0
    parts = budget.reserve_parts([(first, allowed // 2), (later, allowed // 2)], mechanism="X")
    assert [p.iterations for p in parts] == [allowed // 2, allowed // 2]
    assert budget.report().reservations == 2
    assert (
        parts[0].epsilon_total
        == parts[1].epsilon_total
        == pytest.approx(budget.report().spent_epsilon)
    )


# ---------------------------------------------------------------- the draws


def scheduled_variances(monkeypatch=None, *, noise_stays_at_first_stage=False):
    """Full batches on a 400-d Normal mean: coordinates are independent chains, so the spread of
    one draw across them estimates the chain's variance at that iteration."""
    if noise_stays_at_first_stage:

        def first_stage_noise(self, stage):
            return self._release

        monkeypatch.setattr(sg_module._StochasticGradientStep, "_stage_release", first_stage_noise)
    n, d, prior_sd = 100, 400, 10.0
    y = np.random.default_rng(8).normal(0.5, 1.0, (n, d))
    precision = n + prior_sd**-2
    post_mean = y.sum(axis=0) / precision
    eta, decay, offset, draws = 1.0, 1.0, 20.0, 1500
    with normal_model(y, prior_sd):
        step = pymc_dp.DPSGLD(
            budget=pymc_dp.PrivacyBudget(1e9, DELTA),
            step_size=eta,
            grad_clip=200.0,  # ‖∇ℓ_i‖ ≈ √d: nothing is clipped
            batch_size=n,
            step_size_decay=decay,
            decay_offset=offset,
            noise_rng=5,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pymc_dp.sample(
                step,
                chains=1,
                tune=0,
                draws=draws,
                initvals={"mu": post_mean},
                random_seed=2,
                **quiet(),
            )
    x = (idata.posterior["mu"].values[0] - post_mean) * np.sqrt(precision)  # standardised
    # Langevin recursion on a Gaussian: v ← (1 − h_t/s²)² v + 2 h_t/s², from v = 0
    h = eta * GRID ** -formula_stage(np.arange(draws), decay, offset).astype(float) / n
    v, predicted = 0.0, []
    for ht in h * precision:  # h_t / s²
        v = (1.0 - ht) ** 2 * v + 2.0 * ht
        predicted.append(v)
    return x, np.array(predicted)


def variance_test_p(x: np.ndarray, predicted: np.ndarray, at: int) -> float:
    """Two-sided χ² test of the spread over coordinates of draw ``at`` against the prediction."""
    d = x.shape[1]
    statistic = (x[at] ** 2).sum() / predicted[at]
    cdf = stats.chi2.cdf(statistic, d)
    return 2 * min(cdf, 1 - cdf)


@pytest.mark.slow
def test_the_draws_have_the_variance_the_schedule_predicts():
    x, predicted = scheduled_variances()
    assert predicted[10] > 1.5 and predicted[-1] < 1.01  # large bias early, little at the end
    for at in (10, 50, 400, len(predicted) - 1):
        assert variance_test_p(x, predicted, at) > 1e-4, (at, (x[at] ** 2).mean(), predicted[at])


@pytest.mark.slow
def test_negative_control_noise_that_ignores_the_schedule_is_detected(monkeypatch):
    x, predicted = scheduled_variances(monkeypatch, noise_stays_at_first_stage=True)
    assert variance_test_p(x, predicted, len(predicted) - 1) < 1e-6


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"step_size_decay": -0.5}, "step_size_decay must be in"),
        ({"step_size_decay": 1.5}, "step_size_decay must be in"),
        ({"step_size_decay": "fast"}, "step_size_decay must be a number"),
        ({"step_size_decay": 0.5, "decay_offset": 0.0}, "decay_offset"),
        ({"decay_offset": 10.0}, "decay_offset applies only with step_size_decay"),
    ],
)
@pytest.mark.parametrize("cls", [pymc_dp.DPSGLD, pymc_dp.DPSGNHT, pymc_dp.DPSGHMC])
def test_bad_schedules_are_refused_by_name(cls, kwargs, match):
    with normal_model(np.zeros(100)):
        with pytest.raises(pymc_dp.InvalidParameterError, match=match):
            cls(
                budget=pymc_dp.PrivacyBudget(1.0, DELTA),
                step_size=1.0,
                grad_clip=1.0,
                batch_size=10,
                **kwargs,
            )
