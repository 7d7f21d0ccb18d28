"""DPPenalty as a PyMC step: budget plumbing, chains, noise policy, coverage and input errors."""

from __future__ import annotations

from functools import cache

import numpy as np
import pymc as pm
import pytest

import pymc_dp
from pymc_dp.errors import BudgetExceededError, InvalidParameterError, PrivacyLeakError
from pymc_dp.step_methods import DPPenalty
from pymc_dp.testing import Banana

SPEC = Banana(d=2, a=0.0)
ALLOWED_STATS = {"accepted", "jump", "mu_spent", "epsilon_spent"}


@cache
def data() -> np.ndarray:
    return SPEC.simulate(500, np.random.default_rng(1))


def make_step(epsilon=20.0, noise_rng=None, **kwargs):
    model = SPEC.model(data())
    with model:
        step = DPPenalty(
            budget=pymc_dp.PrivacyBudget(epsilon=epsilon, delta=1e-6),
            llr_clip=5.0,
            noise_multiplier=5.0,
            proposal_scale=0.1,
            noise_rng=noise_rng,
            **kwargs,
        )
    return model, step


def sample(model, step, **kwargs):
    kwargs = {"progressbar": False, "compute_convergence_checks": False, "random_seed": 3, **kwargs}
    with model:
        return pm.sample(step=step, **kwargs)


def test_releases_equal_what_the_budget_reserved_sequential_chains():
    model, step = make_step()
    plan = step.sampling_kwargs(chains=2, tune_fraction=0.25)
    per_chain = plan["draws"] + plan["tune"]
    assert per_chain == step.budget.iterations_per_chain(step.cost, 2)
    before = step._channel._oracle.calls
    idata = sample(model, step, cores=1, **plan)
    stats = idata.sample_stats
    assert set(stats.data_vars) == ALLOWED_STATS  # no clip counts, no exact log-likelihoods
    mu = step.cost.mu
    # the last stat of each chain: the chain's releases (tune included) times μ
    np.testing.assert_allclose(stats.mu_spent.values[:, -1], per_chain * mu)
    assert step.counter.released[step.cost] == per_chain  # the last chain's own counter
    report = step.budget.report()
    assert report.spent_mu == pytest.approx(2 * per_chain * mu)
    assert report.spent_epsilon <= step.budget.epsilon
    # one likelihood evaluation per iteration (the current state's is kept) plus the start
    # of each chain; zero-length jumps read nothing
    assert step._channel._oracle.calls - before <= 2 * (per_chain + 1)


def test_a_chain_longer_than_the_budget_is_refused_before_reading():
    """PyMC tells the chain its length: a chain that does not fit reserves and reads nothing."""
    model, step = make_step()
    plan = step.sampling_kwargs(chains=1)
    reads = []
    with pytest.raises(BudgetExceededError, match=r"only \d+ iterations of this cost still fit"):
        with model:
            pm.sample(
                step=step,
                chains=1,
                cores=1,
                draws=plan["draws"] + 5,
                tune=plan["tune"],
                progressbar=False,
                compute_convergence_checks=False,
                callback=lambda **_: reads.append(step._channel._oracle.calls),
            )
    assert reads == [] and step.budget.report().reservations == 0  # nothing ran, nothing spent


def test_plain_pm_sample_without_a_plan_cannot_overspend():
    model, step = make_step(epsilon=5.0)
    allowed = step.budget.iterations(step.cost)
    with pytest.raises(BudgetExceededError, match=f"only {allowed} iterations"):
        sample(model, step, chains=1, cores=1, draws=allowed + 50, tune=0)
    assert step.budget.report().spent_epsilon == 0  # refused before anything was reserved
    sample(model, step, chains=1, cores=1, draws=allowed, tune=0)  # what fits runs
    assert step.budget.iterations(step.cost) == 0
    with pytest.raises(BudgetExceededError, match="nothing more fits"):
        sample(model, step, chains=1, cores=1, draws=10, tune=0)


@pytest.mark.slow
def test_parallel_chains_in_spawned_processes_respect_the_budget():
    model, step = make_step(epsilon=10.0)
    plan = step.sampling_kwargs(chains=2)
    idata = sample(model, step, cores=2, mp_ctx="spawn", **plan)
    per_chain = plan["draws"] + plan["tune"]
    np.testing.assert_allclose(idata.sample_stats.mu_spent.values[:, -1], per_chain * step.cost.mu)
    report = step.budget.report()  # the parent's budget sees the children's reservations
    assert report.spent_mu == pytest.approx(2 * per_chain * step.cost.mu)
    assert report.spent_epsilon <= 10.0


def test_noise_policy_with_pm_sample():
    def draws(noise_rng):
        model, step = make_step(noise_rng=noise_rng)
        plan = step.sampling_kwargs(chains=1)
        return sample(model, step, cores=1, **plan).posterior.theta.values

    a, b = draws(None), draws(None)
    assert not np.array_equal(a, b)  # same random_seed, fresh secret noise: different chains
    np.testing.assert_array_equal(draws(11), draws(11))  # same noise seed: identical
    _, step = make_step(noise_rng=11)
    assert step.privacy_metadata()["dp_noise_reproducible"] == 1


def test_coverage_and_blocking_are_enforced():
    with pm.Model():
        mu = pm.Normal("mu")
        sigma = pm.HalfNormal("sigma")
        pm.Normal("y", mu, sigma, observed=np.arange(5.0))
        budget = pymc_dp.PrivacyBudget(epsilon=1.0, delta=1e-6)
        with pytest.raises(PrivacyLeakError, match=r"\['sigma_log__'\] are not in vars.*NUTS"):
            DPPenalty([mu], budget=budget, llr_clip=1.0, noise_multiplier=1.0)
        with pytest.raises(InvalidParameterError, match="blocked=True"):
            DPPenalty(budget=budget, llr_clip=1.0, noise_multiplier=1.0, blocked=False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"noise_multiplier": 1.0, "tau": 0.1}, "exactly one of noise_multiplier"),
        ({"batch_size": 10}, "no automatic settings yet: give llr_clip and noise_multiplier"),
        ({"noise_multiplier": 1.0, "llr_clip": 0.0}, "llr_clip must be positive"),
        ({"noise_multiplier": -1.0}, "noise_multiplier must be positive"),
        ({"noise_multiplier": 1.0, "proposal_scale": 0.0}, "proposal_scale must be positive"),
        ({"noise_multiplier": 1.0, "temperature": 1.5}, r"temperature must be in \(0, 1\]"),
        ({"noise_multiplier": 1.0, "budget": (1.0, 1e-6)}, "budget must be a pymc_dp.Privacy"),
    ],
)
def test_bad_arguments_get_clear_errors(kwargs, message):
    args = {"budget": pymc_dp.PrivacyBudget(epsilon=1.0, delta=1e-6), "llr_clip": 1.0, **kwargs}
    with SPEC.model(data()):
        with pytest.raises(InvalidParameterError, match=message):
            DPPenalty(**args)


def test_tau_is_the_seeds_parametrisation():
    _, step = make_step()
    with SPEC.model(data()):
        seeds = DPPenalty(budget=step.budget, llr_clip=5.0, tau=0.1)
    assert seeds.noise_multiplier == pytest.approx(0.1 * np.sqrt(500))


def test_discrete_or_observed_vars_and_rejected_models_get_clear_errors():
    budget = pymc_dp.PrivacyBudget(epsilon=1.0, delta=1e-6)
    with pm.Model() as model:
        k = pm.Poisson("k", 3)
        mu = pm.Normal("mu")
        pm.Normal("y", mu + k, 1, observed=np.arange(5.0))
        with pytest.raises(pymc_dp.ModelNotSupportedError, match=r"'k' is discrete.*Marginalise"):
            DPPenalty([mu, k], budget=budget, llr_clip=1.0, noise_multiplier=1.0)
        with pytest.raises(InvalidParameterError, match="'y' is not a free variable"):
            DPPenalty([model["y"], mu, k], budget=budget, llr_clip=1.0, noise_multiplier=1.0)
    with pm.Model():  # a potential that reads the row data: the oracle refuses the model
        x = np.arange(6.0)
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=x)
        pm.Potential("leak", pm.math.sum(pm.math.as_tensor(x) * mu))
        with pytest.raises(pymc_dp.PyMCDPError, match="Potential"):
            DPPenalty(budget=budget, llr_clip=1.0, noise_multiplier=1.0)


@pytest.mark.parametrize("name", ["linear", "hierarchical"])
def test_an_automatic_chain_continues_from_the_point_it_is_handed(name):
    # the automatic step reports noise-aware draws (a stretch of the chain's state) and, on
    # the non-centred hierarchy, samples centred coordinates and publishes the model's: the
    # point PyMC hands back is taken for the state it came from, a replaced value is read
    from pymc_dp.experiments import zoo

    model = zoo.get_model(name).model(2000)[1]
    with model:
        step = DPPenalty(budget=pymc_dp.PrivacyBudget(epsilon=5.0, delta=1e-6), noise_rng=1)
    step.prepare(chains=1)
    assert step._stretching()
    assert (step.centred_coordinates is not None) == (name == "hierarchical")
    step.setup_chain(np.random.default_rng(2), 0, 50)
    point = model.initial_point()
    for _ in range(5):
        point, _ = step.step(point)
    state = step._last_step[2]
    assert all(not v.flags.writeable for v in point.values() if isinstance(v, np.ndarray))
    moved = {**point}
    name_moved = next(v.name for v in model.value_vars if v.name in point)
    moved[name_moved] = np.asarray(point[name_moved]) + 0.01
    given = []
    iterate = step._iterate
    step._iterate = lambda theta: (given.append(np.array(theta)), iterate(theta))[1]
    step.step(point)
    np.testing.assert_array_equal(given[-1], state)  # the state, not a re-read of its draw
    step.step(moved)
    expected = step._chain_theta(step.space.ravel(step._sampled_point(moved)))
    np.testing.assert_allclose(given[-1], expected, rtol=1e-12)
    assert not np.allclose(given[-1], state)
