"""``pymc_dp.sample``: budget-driven plans, private output, metadata round trip, ArviZ."""

from __future__ import annotations

import warnings
from functools import cache

import arviz as az
import numpy as np
import pymc as pm
import pytest
from scipy.stats import norm

import pymc_dp
from pymc_dp._compat import ARVIZ_1, group_names, posterior_figure, trace_figure
from pymc_dp.errors import BudgetExceededError, InvalidParameterError, PrivacyLeakError
from pymc_dp.testing import Banana

SPEC = Banana(d=2, a=0.0)
ALLOWED_STATS = {
    *("accepted", "jump", "mu_spent", "epsilon_spent", "diverging", "step_size"),
    "proposal_correlation",
}


@cache
def data() -> np.ndarray:
    return SPEC.simulate(500, np.random.default_rng(1))


def penalty_step(model, epsilon=20.0, noise_rng=None):
    with model:
        return pymc_dp.DPPenalty(
            budget=pymc_dp.PrivacyBudget(epsilon=epsilon, delta=1e-6),
            llr_clip=5.0,
            noise_multiplier=5.0,
            noise_rng=noise_rng,
        )


def quiet(**kwargs):
    return {"progressbar": False, "compute_convergence_checks": False, **kwargs}


def gaussian_delta(epsilon: float, mu_total: float) -> float:
    """δ(ε) of a Gaussian mechanism with GDP parameter √(2μ) (Balle & Wang 2018), by hand."""
    m = np.sqrt(2 * mu_total)
    return norm.cdf(-epsilon / m + m / 2) - np.exp(epsilon) * norm.cdf(-epsilon / m - m / 2)


def test_round_trip_through_netcdf_matches_an_independent_computation(tmp_path, capsys):
    model = SPEC.model(data())
    step = penalty_step(model)
    idata = pymc_dp.sample(step, chains=2, tune=0.3, cores=1, **quiet())
    assert set(group_names(idata)) == {"posterior", "sample_stats"}  # no observed/constant data
    path = tmp_path / "release.nc"
    idata.to_netcdf(path)
    report = pymc_dp.privacy_report(az.from_netcdf(path))
    printed = capsys.readouterr().out
    assert report == pymc_dp.privacy_report(idata, show=False)
    assert printed.startswith("DPPenalty: (ε = ")
    # independent: the budget's per-chain share, μ = 1/(2z²) per iteration, δ(ε) by hand
    per_chain = report["dp_iterations_per_chain"]
    assert per_chain == idata.posterior.sizes["draw"] + report["dp_tune_per_chain"]
    assert report["dp_tune_per_chain"] == int(0.3 * per_chain)
    mu_total = 2 * per_chain / (2 * 5.0**2)
    assert report["dp_mu_spent"] == pytest.approx(mu_total)
    assert report["dp_epsilon_spent"] <= 20.0
    assert gaussian_delta(report["dp_epsilon_spent"], mu_total) == pytest.approx(1e-6, rel=1e-4)
    # one more iteration per chain would not fit (equal shares: fewer than `chains` are left)
    assert gaussian_delta(20.0, mu_total + 2 / (2 * 5.0**2)) > 1e-6
    np.testing.assert_allclose(idata.sample_stats.mu_spent.values[:, -1], per_chain / 50)
    assert report["dp_noise_reproducible"] == 0 and report["dp_nonprivate_diagnostics"] == 0
    assert report["dp_llr_clip"] == 5.0 and report["dp_noise_multiplier"] == 5.0
    assert report["dp_n_rows"] == 500 and report["dp_chains"] == 2
    assert all(isinstance(v, str | int | float) for v in report.values())


@pytest.mark.skipif(
    not ARVIZ_1, reason="ArviZ 0.2x writes zarr 2 only, which current xarray no longer opens"
)
def test_round_trip_through_zarr_on_arviz_1(tmp_path):
    idata = pymc_dp.sample(penalty_step(SPEC.model(data())), chains=2, cores=1, **quiet())
    idata.to_zarr(str(tmp_path / "release.zarr"))
    back = az.from_zarr(str(tmp_path / "release.zarr"))
    assert set(group_names(back)) == {"posterior", "sample_stats"}
    assert pymc_dp.privacy_report(back, show=False) == pymc_dp.privacy_report(idata, show=False)
    np.testing.assert_array_equal(back.posterior["theta"], idata.posterior["theta"])


def test_too_many_draws_raise_before_any_data_is_read():
    model = SPEC.model(data())
    step = penalty_step(model, epsilon=5.0)
    before = step._channel._oracle.calls
    allowed = step.budget.iterations_per_chain(step.cost, 2)
    with pytest.raises(BudgetExceededError, match=rf"allows {allowed} iterations per chain"):
        pymc_dp.sample(step, chains=2, tune=10, draws=allowed, cores=1, **quiet())
    assert step._channel._oracle.calls == before
    assert step.budget.report().reservations == 0


def test_default_output_has_only_private_statistics():
    model = SPEC.model(data())
    mean, var = SPEC.posterior_params(data())
    with model:
        step = pymc_dp.DPHMC(
            budget=pymc_dp.PrivacyBudget(epsilon=50.0, delta=1e-6),
            step_size=0.3,
            n_steps=3,
            grad_clip=5.0,
            llr_clip=5.0,
            grad_noise_multiplier=5.0,
            llr_noise_multiplier=5.0,
            mass_diag=1 / var,
        )
    idata = pymc_dp.sample(step, chains=2, cores=1, initvals={"theta": mean}, **quiet())
    for name in idata.sample_stats.data_vars:  # walk everything: an allow-list, not a deny-list
        assert name in ALLOWED_STATS, name
    assert set(group_names(idata)) == {"posterior", "sample_stats"}
    assert idata.sample_stats.attrs["dp_step"] == "DPHMC"
    assert idata.posterior.attrs["dp_leapfrog_steps"] == 3


def test_sampling_passes_pymc_no_deprecated_log_likelihood_option():
    # PyMC 6 deprecates idata_kwargs["log_likelihood"] (a FutureWarning on every run); PyMC's
    # default already stores none, and pymc_dp refuses True and drops the group anyway
    step = penalty_step(SPEC.model(data()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pymc_dp.sample(
            step, chains=1, cores=1, idata_kwargs={"log_likelihood": False}, **quiet()
        )
    messages = [str(w.message) for w in caught if "log_likelihood" in str(w.message)]
    assert not messages, messages
    assert "log_likelihood" not in group_names(idata)


def test_arviz_runs_without_warnings_from_pymc_dp():
    import matplotlib

    matplotlib.use("Agg")
    model = SPEC.model(data())
    idata = pymc_dp.sample(penalty_step(model), chains=2, cores=1, **quiet())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        az.summary(idata)
        az.rhat(idata)
        az.ess(idata)
        trace_figure(idata)  # plot_trace (ArviZ 0.2x) / arviz_plots.plot_trace_dist (ArviZ 1)
        posterior_figure(idata)  # plot_posterior / arviz_plots.plot_dist
    ours = [w for w in caught if "pymc_dp" in str(w.filename) or "dp_" in str(w.message)]
    assert not ours, [str(w.message) for w in ours]


def test_deterministics_that_read_row_data_are_refused():
    x = data()
    with pm.Model() as model:
        theta = pm.Flat("theta", shape=2)
        pm.Potential("prior", -0.5 * (theta**2).sum() / 1000)
        X = pm.Data("X", x)
        pm.Normal("x", theta, np.sqrt(SPEC.lik_var), observed=X)
        pm.Deterministic("residual_mean", (X - theta).mean(axis=0))  # reads the data
    # refused when the step is built, before anything is compiled or read
    with pytest.raises(PrivacyLeakError, match=r"Deterministic 'residual_mean' depends on row"):
        penalty_step(model)

    with pm.Model() as fine:
        theta = pm.Flat("theta", shape=2)
        pm.Potential("prior", -0.5 * (theta**2).sum() / 1000)
        pm.Normal("x", theta, np.sqrt(SPEC.lik_var), observed=x)
        pm.Deterministic("theta_sum", theta.sum())  # parameters only: public
    idata = pymc_dp.sample(penalty_step(fine), chains=1, cores=1, **quiet())
    assert "theta_sum" in idata.posterior


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"idata_kwargs": {"log_likelihood": True}}, PrivacyLeakError, "log_likelihood"),
        ({"return_inferencedata": False}, PrivacyLeakError, "return_inferencedata=False"),
        ({"trace": object()}, PrivacyLeakError, "trace backends"),
        ({"tune": 1.5}, InvalidParameterError, r"tune=1\.5: give a fraction"),
        ({"draws": 0}, InvalidParameterError, "draws must be a positive integer"),
        ({"chains": 0}, InvalidParameterError, "chains must be a positive integer"),
    ],
)
def test_leaky_or_bad_options_are_refused(kwargs, error, message):
    step = penalty_step(SPEC.model(data()))
    before = step._channel._oracle.calls
    with pytest.raises(error, match=message):
        pymc_dp.sample(step, **{"cores": 1, **quiet(), **kwargs})
    assert step._channel._oracle.calls == before and step.budget.report().reservations == 0


def test_plain_pm_sample_can_be_labelled_in_one_call(capsys):
    model = SPEC.model(data())
    step = penalty_step(model, noise_rng=3)
    plan = step.sampling_kwargs(chains=2)
    with model:
        idata = pm.sample(step=step, **plan, cores=1, **quiet())
    assert "observed_data" in group_names(idata)  # what plain pm.sample keeps
    pymc_dp.attach_privacy_metadata(idata, step)
    assert set(group_names(idata)) == {"posterior", "sample_stats"}
    report = pymc_dp.privacy_report(idata)
    assert report["dp_tune_per_chain"] == plan["tune"]
    assert report["dp_iterations_per_chain"] == plan["tune"] + plan["draws"]
    # seeded noise is flagged before anything else
    assert capsys.readouterr().out.startswith("WARNING: the DP noise was seeded")


def test_progress_bar_shows_each_chains_privacy_spend():
    step = penalty_step(SPEC.model(data()))
    columns, stats = step._progressbar_config(n_chains=3)
    assert [c.get_table_column().header for c in columns] == ["ε spent"]
    assert stats == {"epsilon_spent": [0.0, 0.0, 0.0]}
    (update,) = step._make_progressbar_update_functions()
    assert update({"epsilon_spent": 0.25, "accepted": True, "jump": 0.1}) == {"epsilon_spent": 0.25}


@pytest.mark.parametrize("method", ["DPPenalty", "DPHMC"])
def test_nonprivate_diagnostics_are_opt_in_and_loud(method, capsys):
    model = SPEC.model(data())
    mean, var = SPEC.posterior_params(data())
    budget = pymc_dp.PrivacyBudget(epsilon=20.0, delta=1e-6)
    loud = pytest.warns(pymc_dp.PrivacyWarning, match="NOT differentially private")
    with model, loud:
        if method == "DPPenalty":
            # llr_clip 0.5: some ratios are clipped
            step = pymc_dp.DPPenalty(
                budget=budget, llr_clip=0.5, noise_multiplier=5.0, nonprivate_diagnostics=True
            )
            extra = {"llr_clipped_fraction"}
        else:
            step = pymc_dp.DPHMC(
                budget=budget,
                step_size=0.3,
                n_steps=3,
                grad_clip=0.5,  # most per-row gradients are clipped
                llr_clip=5.0,
                grad_noise_multiplier=5.0,
                llr_noise_multiplier=5.0,
                mass_diag=1 / var,
                nonprivate_diagnostics=True,
            )
            extra = {"llr_clipped_fraction", "grad_clipped_fraction"}
    idata = pymc_dp.sample(step, chains=1, cores=1, initvals={"theta": mean}, **quiet())
    stats = idata.sample_stats
    assert extra <= set(stats.data_vars)
    for name in extra:
        values = stats[name].values
        assert np.all((values >= 0) & (values <= 1))
    assert stats[sorted(extra)[0]].values.max() > 0  # they measure something
    report = pymc_dp.privacy_report(idata)
    assert report["dp_nonprivate_diagnostics"] == 1
    assert capsys.readouterr().out.startswith("NOT DIFFERENTIALLY PRIVATE")
