"""Regression tests for the outside audit: each test replays one attack or bad input.

Every test is written as the user (or the attacker) would write the code, and asserts the
fixed behaviour: a leak is refused when the step is built, a release is checked against what
was reserved, a failed parameter check becomes a rejection, bad inputs get a
:class:`pymc_dp.PyMCDPError` naming the argument or variable. New exception classes
(``InitialPointError``, ``DataChangedError``, ``ReadOnlyParameterError``, ``PrivacyWarning``)
are looked up on ``pymc_dp`` inside the tests, so that the module imports while they are being
added.
"""

from __future__ import annotations

import re
import time
import warnings

import numpy as np
import pymc as pm
import pytest
import xarray as xr
from pymc.sampling.parallel import ParallelSamplingError
from scipy import optimize

import pymc_dp
from pymc_dp._compat import add_group, group_names
from pymc_dp.accounting import gaussian_capacity
from pymc_dp.errors import (
    BudgetExceededError,
    InvalidParameterError,
    PrivacyLeakError,
    PyMCDPError,
)

ALLOWED_STATS = {"accepted", "jump", "mu_spent", "epsilon_spent", "diverging", "step_size"}
DELTA = 1e-6


def quiet(**kwargs):
    return {"progressbar": False, "compute_convergence_checks": False, **kwargs}


def observations(n: int = 300, seed: int = 0, loc: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(loc, 1.0, size=n)


def normal_mean_model(n: int = 300, seed: int = 0) -> pm.Model:
    """``mu ~ N(0, 10)``, ``y ~ N(mu, 1)``: one free variable."""
    y = observations(n, seed)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1, observed=y)
    return model


def location_scale_model(
    n: int = 500, seed: int = 0, loc: float = 2.0, spread: float = 1.0
) -> pm.Model:
    """``mu ~ N(0, 10)``, ``sd_y ~ HalfNormal(1)``, ``y ~ N(mu, sd_y)``."""
    y = loc + spread * np.random.default_rng(seed).normal(size=n)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 10)
        sd_y = pm.HalfNormal("sd_y", 1)
        pm.Normal("y", mu, sd_y, observed=y)
    return model


def penalty(model: pm.Model, epsilon: float = 20.0, **kwargs) -> pymc_dp.DPPenalty:
    args = {
        "budget": pymc_dp.PrivacyBudget(epsilon=epsilon, delta=DELTA),
        "llr_clip": 5.0,
        "noise_multiplier": 5.0,
        "noise_rng": 1,
        **kwargs,
    }
    with model:
        return pymc_dp.DPPenalty(**args)


def hmc(model: pm.Model, epsilon: float = 200.0, **kwargs) -> pymc_dp.DPHMC:
    args = {
        "budget": pymc_dp.PrivacyBudget(epsilon=epsilon, delta=DELTA),
        "step_size": 0.1,
        "n_steps": 3,
        "grad_clip": 5.0,
        "llr_clip": 5.0,
        "grad_noise_multiplier": 5.0,
        "llr_noise_multiplier": 5.0,
        "noise_rng": 1,
        **kwargs,
    }
    with model:
        return pymc_dp.DPHMC(**args)


def barker(model: pm.Model, **kwargs) -> pymc_dp.DPBarker:
    args = {
        "budget": pymc_dp.PrivacyBudget(epsilon=20.0, delta=DELTA),
        "batch_size": 50,
        "temperature": 0.1,
        "noise_rng": 1,
        **kwargs,
    }
    with model:
        return pymc_dp.DPBarker(**args)


def budget_for(iterations: int, noise_multiplier: float, delta: float = DELTA) -> float:
    """The ε at which exactly ``iterations`` Gaussian releases of multiplier ``z`` fit."""
    target = (iterations + 0.5) / (2 * noise_multiplier**2)  # M* between k·μ and (k + 1)·μ
    return optimize.brentq(lambda e: gaussian_capacity(e, delta) - target, 1e-3, 1e3, xtol=1e-12)


def penalty_with_room_for(iterations: int, model: pm.Model | None = None) -> pymc_dp.DPPenalty:
    model = model or normal_mean_model()
    step = penalty(model, epsilon=budget_for(iterations, 5.0))
    assert step.budget.iterations(step.cost) == iterations
    return step


# ---------------------------------------------------------------- 1. leaks outside the likelihood


def leak_data_container_in_potential():
    y = observations()
    secret = np.random.default_rng(9).normal(size=y.size)
    with pm.Model() as model:
        z = pm.Data("secret_z", secret)  # row-aligned, never read by the likelihood
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1, observed=y)
        pm.Potential("leaky_potential", -((mu - z) ** 2).sum())
    return model, ["leaky_potential", "secret_z"]


def leak_observed_copy_in_potential():
    y = observations()
    with pm.Model() as model:
        y_copy = pm.Data("y_copy", y)
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1, observed=y)
        pm.Potential("copy_potential", -((mu - y_copy) ** 2).sum())
    return model, ["copy_potential", "y_copy"]


def leak_numpy_constant_in_potential():
    y = observations()
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1, observed=y)
        pm.Potential("constant_potential", -((mu - y) ** 2).sum())  # y as a NumPy constant
    return model, ["constant_potential"]


def leak_data_container_in_prior():
    y = observations()
    z = np.random.default_rng(9).normal(size=y.size)
    with pm.Model() as model:
        z_data = pm.Data("z_data", z)
        mu = pm.Normal("mu_centre", pm.math.mean(z_data), 1)
        pm.Normal("y", mu, 1, observed=y)
    return model, ["mu_centre", "z_data"]


def leak_reshaped_copy_in_potential():
    y = observations()
    with pm.Model() as model:
        y_row = pm.Data("y_row", y.reshape(1, -1))  # leading length 1, not n: equal in value
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1, observed=y)
        pm.Potential("reshaped_potential", -((mu - y_row) ** 2).sum())
    return model, ["reshaped_potential", "y_row"]


def leak_transposed_covariates_in_potential():
    rng = np.random.default_rng(13)
    X = rng.normal(size=(300, 2))
    y = X @ [1.0, -1.0] + rng.normal(size=300)
    with pm.Model() as model:
        b = pm.Normal("b", 0, 5, shape=2)
        pm.Normal("y", pm.math.dot(X, b), 1, observed=y)
        pm.Potential("transposed_potential", -(pm.math.dot(b, X.T) ** 2).sum())  # (2, n) copy
    return model, ["transposed_potential", "unnamed array of shape (2×300)"]


def leak_cast_padded_copy_in_potential():
    y = observations()
    with pm.Model() as model:
        padded = pm.Data("padded", np.append(y, 0.0).astype("float32"))  # n + 1 numbers
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1, observed=y)
        pm.Potential("padded_potential", -((mu - padded) ** 2).sum())
    return model, ["padded_potential", "padded"]


@pytest.mark.parametrize(
    "build",
    [
        leak_data_container_in_potential,
        leak_observed_copy_in_potential,
        leak_numpy_constant_in_potential,
        leak_data_container_in_prior,
        leak_reshaped_copy_in_potential,
        leak_transposed_covariates_in_potential,
        leak_cast_padded_copy_in_potential,
    ],
)
def test_terms_outside_the_likelihood_that_read_private_data_are_refused(build):
    """Audit 1a–e: a Potential or prior reading a row-aligned container, a pm.Data copy of the
    observed values, a NumPy constant equal to them, or a reshaped copy, would enter the
    log-density without clipping or noise. The step must refuse the model, naming the term and
    the input."""
    model, names = build()
    with pytest.raises(PrivacyLeakError) as info:
        penalty(model)
    for name in names:
        assert name in str(info.value), (name, str(info.value))


def test_potentials_on_parameters_and_public_scalars_are_fine():
    """Audit 1, negative control: a Potential of parameters only and a scalar pm.Data are
    public; the step builds."""
    y = observations()
    with pm.Model() as model:
        scale = pm.Data("prior_scale", 10.0)
        mu = pm.Normal("mu", 0, scale)
        pm.Normal("y", mu, 1, observed=y)
        pm.Potential("pen", -(mu**2))
    step = penalty(model)
    assert step._channel._oracle.n_rows == y.size


# ---------------------------------------------------------------- 2. attach_privacy_metadata


def test_a_dp_step_refuses_to_share_a_compound_step_with_nuts():
    """Audit 2a: pm.sample(step=[dp_step, pm.NUTS([mu])]) would let NUTS read the raw data and
    the release would still be labelled DP. The DP step refuses to run in such a compound."""
    model = normal_mean_model()
    step = penalty(model)
    with model:
        nuts = pm.NUTS([model["mu"]])
        with pytest.raises(PrivacyLeakError):
            pm.sample(
                step=[step, nuts], draws=10, tune=0, chains=1, cores=1, random_seed=1, **quiet()
            )


def test_attach_refuses_sample_stats_the_dp_step_did_not_produce():
    """Audit 2b: an InferenceData carrying an extra stat (here a log-density ``lp``) is not what
    the DP step released; labelling it DP would be false."""
    step = penalty(normal_mean_model(), epsilon=5.0)
    idata = pymc_dp.sample(step, chains=1, tune=0, cores=1, random_seed=1, **quiet())
    idata.sample_stats["lp"] = idata.sample_stats["jump"] * 0.0 - 1.0
    with pytest.raises(PrivacyLeakError, match="lp"):
        pymc_dp.attach_privacy_metadata(idata, step)


def test_attach_refuses_a_log_likelihood_group():
    """Audit 2c: ``idata_kwargs={"log_likelihood": True}`` stores every row's exact
    log-likelihood; attach_privacy_metadata must refuse, not silently relabel."""
    model = normal_mean_model()
    step = penalty(model, epsilon=5.0)
    plan = step.sampling_kwargs(chains=1)
    with model:
        idata = pm.sample(
            step=step,
            **plan,
            cores=1,
            random_seed=1,
            idata_kwargs={"log_likelihood": True},
            **quiet(),
        )
    assert "log_likelihood" in group_names(idata)
    with pytest.raises(PrivacyLeakError, match="log_likelihood"):
        pymc_dp.attach_privacy_metadata(idata, step)


def test_attach_refuses_a_hand_made_log_likelihood_group():
    """Audit 2c (variant): a log_likelihood group added after sampling is refused too."""
    step = penalty(normal_mean_model(), epsilon=5.0)
    idata = pymc_dp.sample(step, chains=1, tune=0, cores=1, random_seed=1, **quiet())
    chains, draws = idata.posterior.sizes["chain"], idata.posterior.sizes["draw"]
    values = np.zeros((chains, draws, step._channel._oracle.n_rows))
    add_group(idata, "log_likelihood", xr.Dataset({"y": (("chain", "draw", "y_dim_0"), values)}))
    with pytest.raises(PrivacyLeakError, match="log_likelihood"):
        pymc_dp.attach_privacy_metadata(idata, step)


def test_deterministics_that_read_row_data_are_refused_when_the_step_is_built():
    """Audit 2d: plain pm.sample stores a Deterministic computed from the data at every draw
    (here ``mu + 0 * x``, row-aligned), which attach_privacy_metadata cannot undo. The step
    refuses the model at construction, before any sampler sees it."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=300)
    y = 1.0 + x + rng.normal(size=300)
    with pm.Model() as model:
        x_data = pm.Data("x_data", x)
        mu = pm.Normal("mu", 0, 10)
        b = pm.Normal("b", 0, 10)
        pm.Normal("y", mu + b * x_data, 1, observed=y)
        pm.Deterministic("fitted", mu + 0 * x_data)
    with pytest.raises(PrivacyLeakError, match="fitted"):
        penalty(model)


def test_the_documented_plain_pm_sample_path_is_labelled_correctly():
    """Audit 2e: the documented path, pm.sample(step=step, **step.sampling_kwargs(...)) then
    attach_privacy_metadata, still works and keeps only private groups and stats."""
    model = normal_mean_model()
    step = penalty(model, epsilon=5.0)
    with model:
        idata = pm.sample(
            step=step, **step.sampling_kwargs(chains=2), cores=1, random_seed=1, **quiet()
        )
    out = pymc_dp.attach_privacy_metadata(idata, step)
    groups = set(group_names(out))
    assert {"posterior", "sample_stats"} <= groups
    assert groups <= {"posterior", "sample_stats", "warmup_posterior", "warmup_sample_stats"}
    assert out.posterior.attrs["dp_step"] == "DPPenalty"
    assert set(out.sample_stats.data_vars) <= ALLOWED_STATS


@pytest.mark.parametrize("cores", [1, 2])
def test_a_deterministic_added_after_the_build_is_refused_by_plain_pm_sample(cores):
    """Review of audit 2: a per-row Deterministic added to the model after the step was built
    would be stored by plain pm.sample; the step refuses before reading (sequential chains)
    or when PyMC pickles it for its workers (parallel chains), and nothing is charged."""
    model, _ = set_data_model()
    step = penalty(model)
    # a refusal in a worker process reaches the caller wrapped by PyMC (ParallelSamplingError)
    refused = (PrivacyLeakError, ParallelSamplingError)
    with model:
        pm.Deterministic("eta", model["a"] + model["b"] * model["x"])
        with pytest.raises(refused, match="Deterministic 'eta' depends on row data"):
            pm.sample(step=step, draws=10, tune=0, chains=2, cores=cores, **quiet())
    assert step.budget.report().reservations == 0


def test_attach_refuses_draws_of_another_step():
    """Review of audit 2: draws sampled with one step (little noise) cannot be labelled with
    another step's parameters: the draws' recorded spend must be the labelling step's, and its
    budget must have paid for them."""
    model = normal_mean_model()
    loud = penalty(model, epsilon=50.0, noise_multiplier=2.0)
    quiet_step = penalty(model, epsilon=1.0, noise_multiplier=50.0)
    with model:
        idata = pm.sample(step=loud, draws=20, tune=0, chains=1, cores=1, **quiet())
    with pytest.raises(PrivacyLeakError, match="another step"):
        pymc_dp.attach_privacy_metadata(idata, quiet_step)
    twin = penalty(model, epsilon=50.0, noise_multiplier=2.0)  # same parameters, unpaid budget
    with pytest.raises(PrivacyLeakError, match="not produced under this budget"):
        pymc_dp.attach_privacy_metadata(idata, twin)


# ---------------------------------------------------------------- 3. exception text


def assert_no_data_in(err: BaseException, values: np.ndarray) -> None:
    text = str(err)
    for v in np.asarray(values, dtype=float).ravel():
        assert repr(float(v)) not in text, (v, text)
        assert f"{v:.4g}" not in text, (v, text)
    assert err.__cause__ is None  # and no context that a traceback would print
    assert err.__context__ is None or err.__suppress_context__ is True


def test_a_failing_likelihood_evaluation_does_not_leak_row_values():
    """Audit 3: ``sigma = exp(x * b)`` underflows to 0 for rows with extreme covariates, so
    PyTensor's parameter check fails inside the oracle; its error (and the chained
    exceptions) printed the inputs, i.e. private rows. Fixed: the failed check is a rejection
    (the run completes), or a clean PyMCDPError with no data in it and no chained cause."""
    rng = np.random.default_rng(11)
    n = 400
    x = np.where(np.arange(n) % 2 == 0, 800.0, -800.0) + rng.uniform(0.01, 0.99, n)
    y = 12.3 + 3.7 * rng.normal(size=n)  # values with four significant digits or more
    with pm.Model() as model:
        xd = pm.Data("x", x)
        mu = pm.Normal("mu", 12, 5)
        b = pm.Normal("b", 0, 1)
        pm.Normal("y", mu, sigma=pm.math.exp(xd * b), observed=y)
    try:
        # a subsampled cost: keep ε small, its PLD accounting grows with the iteration count
        step = penalty(model, epsilon=1.0, noise_multiplier=3.0, batch_size=4, proposal_scale=3.0)
        idata = pymc_dp.sample(step, chains=1, tune=0, draws=20, cores=1, random_seed=2, **quiet())
    except PyMCDPError as err:
        assert_no_data_in(err, np.concatenate([y, x]))
    else:
        assert np.all(np.isfinite(idata.posterior.mu.values))
        assert np.all(np.isfinite(idata.posterior.b.values))


def test_an_out_of_range_index_column_is_refused_without_its_values():
    """Audit 3 (an error that cannot become -inf): a group index column with a value beyond the
    number of groups made NumPy raise "index 7 is out of bounds ..." — a data value — and
    PyTensor 3 reads past the array without an error. The build refuses the model naming the
    indexed variable, with no data value in the message."""
    rng = np.random.default_rng(12)
    n = 200
    group = rng.integers(0, 5, n)
    group[17] = 7  # the secret row: its group does not exist
    y = rng.normal(size=n) + 0.123456
    with pm.Model() as model:
        idx = pm.Data("group_idx", group)
        a = pm.Normal("a", 0, 1, shape=5)
        pm.Normal("y_obs", a[idx], 1.0, observed=y)
    with pytest.raises(pymc_dp.ModelNotSupportedError, match="outside the range") as info:
        penalty(model)
    err = info.value
    assert "'a'" in str(err) and "7" not in str(err)
    assert_no_data_in(err, y)


def test_an_error_on_the_private_data_comes_back_without_its_text():
    """Audit 3: whatever a compiled function raises on private data (PyTensor lists the failing
    node's input values in its message) reaches the caller as PrivateEvaluationError naming the
    observed variable, with neither the original text nor a chained cause or context."""
    step = penalty(normal_mean_model())

    def failing(*_):
        raise ValueError("Inputs values: [array([0.123456, 1.234567])]")  # a data-bearing text

    with pytest.raises(pymc_dp.PrivateEvaluationError) as info:
        step._channel._oracle._private_call(failing)
    err = info.value
    assert "'y'" in str(err) and "ValueError" in str(err) and "0.123456" not in str(err)
    assert err.__cause__ is None and err.__context__ is None


def test_a_proposal_outside_the_support_is_rejected_without_reading_data():
    """Audit 8 (mechanism): sd_y = exp(-1000) underflows to 0, so the likelihood's parameter
    check ``sigma > 0`` fails for every dataset. The ratio release is then -inf (a rejection),
    decided without reading any row and without counting a release."""
    from pymc_dp.mechanisms import LLRRelease, PrivateChannel
    from pymc_dp.noise import NoiseSource

    step = penalty(location_scale_model(n=300))
    oracle = step._channel._oracle
    theta = oracle.space.ravel(oracle.model.initial_point())
    far = theta.copy()
    far[[v.name for v, _, _ in oracle.space.slices].index("sd_y_log__")] = -1000.0
    assert oracle.space.in_support(theta) and not oracle.space.in_support(far)
    assert oracle.space.failed_checks(far) == ["sigma > 0"]
    calls, channel = oracle.calls, PrivateChannel(oracle, NoiseSource(0))
    released = LLRRelease(channel, llr_clip=1.0, noise_multiplier=5.0)(theta, far)
    assert released.value == -np.inf and released.noise_std == 0.0
    assert oracle.calls == calls and channel.counter.total() == 0


def test_two_dp_steps_with_different_budgets_cannot_share_a_run():
    """Audit 2a (variant): two DP steps on the same data under different budgets would each
    account only their own releases; pm.sample with both is refused before reading."""
    model = location_scale_model(n=300)
    with model:
        first = pymc_dp.DPPenalty(
            [model["mu"], model["sd_y"]],
            budget=pymc_dp.PrivacyBudget(epsilon=20.0, delta=DELTA),
            llr_clip=5.0,
            noise_multiplier=5.0,
        )
        second = pymc_dp.DPPenalty(
            budget=pymc_dp.PrivacyBudget(epsilon=20.0, delta=DELTA),
            llr_clip=5.0,
            noise_multiplier=5.0,
        )
        with pytest.raises(PrivacyLeakError, match="different privacy budgets"):
            pm.sample(step=[first, second], draws=5, tune=0, chains=1, cores=1, **quiet())
    assert first._channel._oracle.calls == 0 and second._channel._oracle.calls == 0


# ---------------------------------------------------------------- 4. budget binding


def _step(kind: str):
    model = location_scale_model(n=300)
    if kind == "DPPenalty":
        return penalty(model)
    if kind == "DPPenalty_batch":
        return penalty(model, batch_size=50)
    return hmc(model)


READ_ONLY = [
    ("DPPenalty", "noise_multiplier", 1e-3),
    ("DPPenalty", "llr_clip", 1e6),
    ("DPPenalty", "temperature", 0.5),
    ("DPPenalty", "budget", "new budget"),
    ("DPPenalty_batch", "batch_size", 300),
    ("DPPenalty_batch", "noise_multiplier", 1e-3),
    ("DPHMC", "grad_noise_multiplier", 1e-3),
    ("DPHMC", "llr_noise_multiplier", 1e-3),
    ("DPHMC", "grad_clip", 1e6),
    ("DPHMC", "llr_clip", 1e6),
    ("DPHMC", "n_steps", 50),
    ("DPHMC", "temperature", 0.5),
    ("DPHMC", "budget", "new budget"),
]


@pytest.mark.parametrize(("kind", "attr", "value"), READ_ONLY)
def test_privacy_parameters_are_read_only_after_construction(kind, attr, value):
    """Audit 4: ``step.noise_multiplier = 1e-3`` after building the step changed the noise
    without changing what was accounted. Privacy parameters are read-only."""
    step = _step(kind)
    if value == "new budget":
        value = pymc_dp.PrivacyBudget(epsilon=1e6, delta=DELTA)
    before = getattr(step, attr)
    with pytest.raises(pymc_dp.ReadOnlyParameterError, match=attr):
        setattr(step, attr, value)
    assert getattr(step, attr) is before or getattr(step, attr) == before


def _mechanisms(step):
    from pymc_dp.mechanisms import Mechanism

    return [value for value in vars(step).values() if isinstance(value, Mechanism)]


@pytest.mark.parametrize("kind", ["DPPenalty", "DPHMC"])
def test_a_step_attribute_written_behind_its_back_does_not_change_the_releases(kind):
    """The step's own ``noise_multiplier`` attributes only describe it: the releases and the
    cost come from its mechanisms, so writing the attribute's ``__dict__`` entry changes
    neither what is released nor what is charged."""
    step = _step(kind)
    cost = step.cost
    for key in [key for key in vars(step) if "noise_multiplier" in key]:
        step.__dict__[key] = 1e-3
    assert step.cost == cost
    assert all(m.noise_multiplier > 1e-3 for m in _mechanisms(step))


@pytest.mark.parametrize("kind", ["DPPenalty", "DPHMC"])
def test_bypassing_read_only_noise_is_caught_against_the_reservation(kind):
    """Audit 4 (bypass): the attacker writes a smaller noise multiplier straight into
    ``__dict__`` of the step's mechanisms (which make the releases) in the middle of a chain,
    after its reservation. The next release is checked against what the chain reserved and
    stops with BudgetExceededError before reading; the ledger never records more than the
    budget."""
    step = _step(kind)
    mechanisms = _mechanisms(step)
    assert mechanisms, f"no mechanism in the step's __dict__: {sorted(vars(step))}"
    plan = step.sampling_kwargs(chains=1)
    reads_at_attack = []

    def attack(draw, **_):
        if draw.draw_idx == 2:
            reads_at_attack.append(step._channel._oracle.calls)
            for mechanism in mechanisms:
                mechanism.__dict__["noise_multiplier"] = 1e-3

    with step.model, pytest.raises(BudgetExceededError, match="does not cover"):
        pm.sample(step=step, cores=1, callback=attack, random_seed=1, **plan, **quiet())
    assert step._channel._oracle.calls == reads_at_attack[0]  # nothing was read after the change
    assert step.budget.report().spent_epsilon <= step.budget.epsilon


@pytest.mark.parametrize("kind", ["DPPenalty", "DPHMC"])
def test_bypassing_read_only_noise_before_sampling_is_accounted(kind):
    """Audit 4 (bypass before sampling): the step's cost is computed from what it will release,
    so a lowered multiplier is charged as such, and a run the budget cannot pay for is refused
    before any data are read."""
    step = _step(kind)
    for mechanism in _mechanisms(step):
        mechanism.__dict__["noise_multiplier"] = 1e-3
    calls = step._channel._oracle.calls
    with pytest.raises((BudgetExceededError, pymc_dp.InvalidParameterError)):
        pymc_dp.sample(step, chains=1, tune=0, cores=1, random_seed=1, **quiet())
    assert step._channel._oracle.calls == calls and step.budget.report().reservations == 0


# ---------------------------------------------------------------- 5. plain pm.sample reservations


@pytest.mark.parametrize("cores", [1, 2])
def test_plain_pm_sample_reserves_exactly_what_runs(cores):
    """Audit 5: without a plan, plain pm.sample reserved blocks of 100 iterations, so a budget
    sized for exactly 2 × 70 iterations failed on the second chain (the first chain's block was
    charged in full). Each chain reserves its own tune + draws."""
    step = penalty_with_room_for(140)
    with step.model:
        idata = pm.sample(
            step=step, draws=60, tune=10, chains=2, cores=cores, random_seed=1, **quiet()
        )
    assert idata.posterior.sizes["draw"] == 60
    assert step.budget.report().reserved_iterations == 140


def test_plain_pm_sample_that_does_not_fit_is_charged_only_for_what_ran():
    """Audit 5 (over-long run): 2 × 110 iterations on a 140-iteration budget must fail with
    BudgetExceededError, no reservation may exceed what fits, and the ledger must not be
    charged for more iterations than actually ran."""
    step = penalty_with_room_for(140)
    ran = []
    with step.model, pytest.raises(BudgetExceededError):
        pm.sample(
            step=step,
            draws=100,
            tune=10,
            chains=2,
            cores=1,
            random_seed=1,
            callback=lambda **_: ran.append(1),
            **quiet(),
        )
    report = step.budget.report()
    assert report.reserved_iterations <= 140
    assert all(entry.iterations <= 140 for entry in step.budget.history())
    assert report.reserved_iterations <= len(ran), (report.reserved_iterations, len(ran))
    assert report.spent_epsilon <= step.budget.epsilon


# ---------------------------------------------------------------- 6. budget hints


NOTHING_FITS = r"(nothing|no more|0 (more )?iterations)"


def _assert_truthful_hint(err: BudgetExceededError) -> None:
    text = str(err)
    assert "tune=0, draws=0" not in text, text
    assert not re.search(r"draws=-\d", text), text
    assert not re.search(r"-\d+ draws", text), text
    assert "140 more iterations fit" not in text, text
    assert re.search(NOTHING_FITS, text), text


@pytest.mark.parametrize("how", ["plan_iterations", "pymc_dp.sample", "pm.sample"])
def test_budget_hints_say_nothing_more_fits_once_the_budget_is_spent(how):
    """Audit 6: after the whole budget was spent the error suggested ``tune=0, draws=0``, a
    negative number of draws, or "140 more iterations fit". It must say nothing more fits."""
    step = penalty_with_room_for(140)
    pymc_dp.sample(step, chains=2, tune=0, cores=1, random_seed=1, **quiet())
    assert step.budget.report().reserved_iterations == 140
    assert step.budget.iterations(step.cost) == 0
    with pytest.raises(BudgetExceededError) as info:
        if how == "plan_iterations":
            pymc_dp.plan_iterations(step, chains=2)
        elif how == "pymc_dp.sample":
            pymc_dp.sample(step, chains=2, cores=1, **quiet())
        else:
            model = step.model
            with model:
                fresh = pymc_dp.DPPenalty(budget=step.budget, llr_clip=5.0, noise_multiplier=5.0)
                pm.sample(step=fresh, draws=10, tune=0, chains=1, cores=1, **quiet())
    _assert_truthful_hint(info.value)


# ---------------------------------------------------------------- 7. delta >= 1/n


def _privacy_warnings(delta: float) -> list[warnings.WarningMessage]:
    model = normal_mean_model(n=200)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with model:
            pymc_dp.DPPenalty(
                budget=pymc_dp.PrivacyBudget(epsilon=1.0, delta=delta),
                llr_clip=5.0,
                noise_multiplier=5.0,
            )
    return [w for w in caught if issubclass(w.category, pymc_dp.PrivacyWarning)]


def test_a_delta_of_at_least_one_over_n_is_warned_about():
    """Audit 7: δ = 0.01 ≥ 1/n on n = 200 rows. Publishing one random row in full is already
    (0, 1/n)-DP, so such a δ protects nobody; building the step warns once, saying δ should be
    well below 1/n."""
    caught = _privacy_warnings(0.01)
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert "δ" in message or "delta" in message, message
    assert "1/n" in message, message


def test_a_small_delta_is_not_warned_about():
    """Audit 7, negative control: δ = 1e-6 on n = 200 rows gives no PrivacyWarning."""
    assert _privacy_warnings(1e-6) == []


# ---------------------------------------------------------------- 8. failed parameter checks


def assert_finite_posterior(idata) -> None:
    for name, values in idata.posterior.data_vars.items():
        assert np.all(np.isfinite(values.values)), name


def test_dphmc_trajectories_to_extreme_scales_diverge_instead_of_crashing():
    """Audit 8: with a large step size the leapfrog flies to sd_y = exp(±1000). Upwards the
    prior is -inf (a divergence already); downwards sd_y underflows to 0 where the prior is
    finite and PyMC's ``sigma > 0`` check raised ParameterValueError and killed the run. The
    data are tightly spread around the initial mu = 0, so the gradient pushes log sd_y down
    from the start. Such trajectories are divergences: the run completes with finite draws."""
    step = hmc(
        location_scale_model(n=500, loc=0.0, spread=0.05),
        epsilon=1e4,
        step_size=5.0,
        n_steps=5,
        grad_noise_multiplier=1.0,
        llr_noise_multiplier=1.0,
        step_jitter=False,
    )
    idata = pymc_dp.sample(step, chains=1, tune=0, draws=30, cores=1, random_seed=1, **quiet())
    assert idata.sample_stats.diverging.values.any()
    assert_finite_posterior(idata)


def test_dppenalty_far_proposals_are_rejected_instead_of_crashing():
    """Audit 8: random-walk proposals with scale 500 reach sd_y = exp(±1000); the failed
    parameter check is a rejection, not a crash."""
    step = penalty(location_scale_model(n=500), epsilon=1e4, proposal_scale=500.0)
    idata = pymc_dp.sample(step, chains=1, tune=0, draws=40, cores=1, random_seed=1, **quiet())
    assert_finite_posterior(idata)


def mixture_model(n: int = 400, seed: int = 5) -> pm.Model:
    rng = np.random.default_rng(seed)
    y = np.where(rng.uniform(size=n) < 0.3, rng.normal(-2, 1, n), rng.normal(2, 1, n))
    with pm.Model() as model:
        w = pm.Dirichlet("w", a=np.ones(2))
        mus = pm.Normal("mus", 0, 5, shape=2)
        sigmas = pm.HalfNormal("sigmas", 2, shape=2)
        pm.NormalMixture("y", w=w, mu=mus, sigma=sigmas, observed=y)
    return model


def censored_model(n: int = 400, seed: int = 6) -> pm.Model:
    y = np.clip(np.random.default_rng(seed).normal(0.3, 1.0, n), -1, 1)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 5)
        s = pm.HalfNormal("s", 2)
        pm.Censored("y", pm.Normal.dist(mu, s), lower=-1, upper=1, observed=y)
    return model


@pytest.mark.parametrize("build", [mixture_model, censored_model])
def test_far_proposals_on_mixture_and_censored_likelihoods_complete(build):
    """Audit 8: a Gaussian mixture and a censored likelihood with far-out proposals; failed
    parameter checks and -inf/NaN terms are rejections, and the run completes."""
    step = penalty(build(), epsilon=1e4, proposal_scale=500.0)
    idata = pymc_dp.sample(step, chains=1, tune=0, draws=30, cores=1, random_seed=1, **quiet())
    assert_finite_posterior(idata)


# ---------------------------------------------------------------- 9. bad initial values


@pytest.mark.parametrize(
    "initvals",
    [{"sd_y": -1.0}, {"sd_y": np.nan}, {"mu": np.inf}, {"sd_y": 1e308}],
    ids=["negative-scale", "nan-scale", "infinite-mean", "huge-scale"],
)
def test_bad_initial_values_are_refused_before_any_reservation(initvals):
    """Audit 9: an initial value outside the support, NaN, infinite, or of zero prior density
    must be refused (naming the variable) before the chain reserves budget or reads data."""
    step = penalty(location_scale_model(n=300))
    (name,) = initvals
    with pytest.raises(pymc_dp.InitialPointError, match=name):
        pymc_dp.sample(step, chains=1, cores=1, initvals=initvals, random_seed=1, **quiet())
    assert step.budget.report().reserved_iterations == 0


# ---------------------------------------------------------------- 10. pm.set_data after building


def set_data_model(n: int = 300, seed: int = 7) -> tuple[pm.Model, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = 1.0 + 2.0 * x + rng.normal(size=n)
    with pm.Model() as model:
        xd = pm.Data("x", x)
        yd = pm.Data("y_obs", y)
        a = pm.Normal("a", 0, 5)
        b = pm.Normal("b", 0, 5)
        pm.Normal("y", a + b * xd, 1.0, observed=yd)
    new_x = rng.normal(size=n)
    new = {"x": new_x, "y_obs": -1.0 + 0.5 * new_x + rng.normal(size=n)}
    return model, new


def test_set_data_after_building_the_step_is_refused_by_pymc_dp_sample():
    """Audit 10: the step validated and sized itself on one dataset; pm.set_data then swaps in
    another (same shape) that was never checked. Sampling must refuse before any reservation."""
    model, new = set_data_model()
    step = penalty(model)
    with model:
        pm.set_data(new)
    with pytest.raises(pymc_dp.DataChangedError):
        pymc_dp.sample(step, chains=1, cores=1, random_seed=1, **quiet())
    assert step.budget.report().reserved_iterations == 0


def test_set_data_after_building_the_step_is_refused_by_plain_pm_sample():
    """Audit 10, plain pm.sample: the same swap is refused by the step itself."""
    model, new = set_data_model()
    step = penalty(model)
    with model:
        pm.set_data(new)
        with pytest.raises(pymc_dp.DataChangedError):
            pm.sample(step=step, draws=10, tune=0, chains=1, cores=1, random_seed=1, **quiet())


def test_set_data_on_a_public_container_is_refused():
    """Review of audit 10: a container the prior reads live (public and short when the step
    was built) is given n private values with pm.set_data; sampling is refused."""
    y = observations()
    with pm.Model() as model:
        w = pm.Data("w", np.zeros(3))
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1, observed=y)
        pm.Potential("shrink", -((mu - w) ** 2).sum())
    step = penalty(model)
    with model:
        pm.set_data({"w": np.random.default_rng(3).normal(5, 1, y.size)})
    with pytest.raises(pymc_dp.DataChangedError, match="'w'"):
        pymc_dp.sample(step, chains=1, cores=1, random_seed=1, **quiet())
    assert step.budget.report().reservations == 0


# ---------------------------------------------------------------- 11. NumPy covariates


def regression_data(n: int = 400, seed: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    return x, 0.5 + 1.5 * x + rng.normal(size=n) * 0.7


def numpy_linear():
    x, y = regression_data()
    with pm.Model() as model:
        a = pm.Normal("a", 0, 5)
        b = pm.Normal("b", 0, 5)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", a + b * x, sigma, observed=y)
    return model


def numpy_censored():
    x, y = regression_data()
    lo, hi = -1.0, 2.0
    with pm.Model() as model:
        a = pm.Normal("a", 0, 5)
        b = pm.Normal("b", 0, 5)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Censored(
            "y", pm.Normal.dist(a + b * x, sigma), lower=lo, upper=hi, observed=np.clip(y, lo, hi)
        )
    return model


def numpy_truncated():
    x, y = regression_data()
    lo = -1.0
    keep = y > lo
    x, y = x[keep], y[keep]
    with pm.Model() as model:
        a = pm.Normal("a", 0, 5)
        b = pm.Normal("b", 0, 5)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Truncated("y", pm.Normal.dist(a + b * x, sigma), lower=lo, observed=y)
    return model


@pytest.mark.parametrize("build", [numpy_linear, numpy_censored, numpy_truncated])
def test_numpy_covariates_build_and_sample(build):
    """Audit 11: covariates given as plain NumPy arrays (not pm.Data) are baked into the graph
    as constants; linear, censored and truncated regressions written that way must build and
    sample."""
    step = penalty(build(), epsilon=50.0)
    idata = pymc_dp.sample(step, chains=1, tune=20, draws=20, cores=1, random_seed=1, **quiet())
    assert idata.posterior.sizes["draw"] == 20
    assert_finite_posterior(idata)


# ---------------------------------------------------------------- 12. OrderedLogistic


def ordered_logistic_model(compute_p: bool, n: int = 300, seed: int = 10) -> pm.Model:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    latent = 1.2 * x + rng.logistic(size=n)
    y = np.digitize(latent, [-1.0, 1.0])
    with pm.Model() as model:
        x = pm.Data("x", x)  # a container, so that only y_probs is at stake (NumPy: item 11)
        b = pm.Normal("b", 0, 2)
        cutpoints = pm.Normal(
            "cutpoints",
            mu=[-1.0, 1.0],
            sigma=2.0,
            shape=2,
            transform=pm.distributions.transforms.ordered,
            initval=[-1.0, 1.0],
        )
        pm.OrderedLogistic("y", eta=b * x, cutpoints=cutpoints, observed=y, compute_p=compute_p)
    return model


def test_ordered_logistic_with_per_row_probabilities_is_refused_quickly():
    """Audit 12: OrderedLogistic's default compute_p=True adds a per-row ``y_probs``
    Deterministic that pm.sample would store. The step refuses it, quickly, and says how to
    fix it (compute_p=False)."""
    model = ordered_logistic_model(compute_p=True)
    start = time.perf_counter()
    with pytest.raises(PrivacyLeakError) as info:
        penalty(model)
    assert time.perf_counter() - start < 10
    assert "compute_p=False" in str(info.value)


def test_ordered_logistic_without_probabilities_builds():
    """Audit 12, the fix the message suggests: compute_p=False builds."""
    step = penalty(ordered_logistic_model(compute_p=False))
    assert step._channel._oracle.n_rows == 300


# ---------------------------------------------------------------- 13. argument checks


BAD_COMMON = [
    ("target_accept", 0),
    ("target_accept", 5),
    ("target_accept", 1.0),
    ("target_accept", -0.1),
    ("noise_rng", "x"),
    ("noise_rng", 1.5),
    ("noise_rng", True),
]
BAD_PENALTY = [
    ("llr_clip", 0),
    ("llr_clip", np.nan),
    ("noise_multiplier", -1),
    ("nonprivate_diagnostics", "yes"),
]


@pytest.mark.parametrize("method", ["DPPenalty", "DPHMC", "DPBarker"])
@pytest.mark.parametrize(("argument", "value"), BAD_COMMON)
def test_bad_target_accept_and_noise_rng_are_refused(method, argument, value):
    """Audit 13: ``target_accept=0`` was silently replaced by the default, ``noise_rng="x"``
    crashed with a bare ValueError, ``noise_rng=1.5`` and ``True`` were accepted as seeds.
    Each is an InvalidParameterError naming the argument."""
    model = normal_mean_model()
    build = {"DPPenalty": penalty, "DPHMC": hmc, "DPBarker": barker}[method]
    with pytest.raises(InvalidParameterError, match=argument):
        build(model, **{argument: value})


@pytest.mark.parametrize(("argument", "value"), BAD_PENALTY)
def test_bad_penalty_arguments_are_refused(argument, value):
    """Audit 13: a zero or NaN clip, a negative noise multiplier, a non-bool diagnostics flag
    are InvalidParameterErrors naming the argument."""
    with pytest.raises(InvalidParameterError, match=argument):
        penalty(normal_mean_model(), **{argument: value})
