"""Honest warnings for free: a release that is not a usable posterior says so."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest
import xarray as xr

import pymc_dp
from pymc_dp.convergence import check_convergence


def release(posterior: np.ndarray, **stats: np.ndarray) -> dict[str, xr.Dataset]:
    """The groups check_convergence reads, as a mapping of datasets."""
    dims = ("chain", "draw")
    return {
        "posterior": xr.Dataset({"mu": (dims, posterior)}),
        "sample_stats": xr.Dataset({k: (dims, v) for k, v in stats.items()}),
    }


def test_independent_draws_pass():
    draws = np.random.default_rng(0).normal(size=(4, 500))
    check = check_convergence(release(draws, accepted=np.ones((4, 500), bool)))
    assert check.converged, check
    assert check.rhat_max < 1.02 and check.ess_bulk_min > 1000
    assert check.summary().startswith("convergence: no problem found")


def test_chains_that_disagree_fail():
    rng = np.random.default_rng(1)
    draws = rng.normal(size=(4, 500)) + np.arange(4)[:, None]  # each chain elsewhere
    check = check_convergence(release(draws, accepted=np.ones((4, 500), bool)))
    assert not check.converged
    assert any("R̂" in p for p in check.problems) and check.rhat_max > 1.5


def test_a_chain_that_never_moves_fails():
    draws = np.zeros((1, 300))  # one chain: no R̂, but no effective draws either
    check = check_convergence(release(draws, accepted=np.zeros((1, 300), bool)))
    assert not check.converged
    assert np.isnan(check.rhat_max)
    assert any("acceptance" in p for p in check.problems)
    assert any("effective sample size" in p for p in check.problems)


def test_all_divergent_draws_never_look_clean():
    draws = np.random.default_rng(2).normal(size=(4, 500))  # the draws alone look fine
    check = check_convergence(
        release(draws, accepted=np.ones((4, 500), bool), diverging=np.ones((4, 500), bool))
    )
    assert not check.converged and "100% of the iterations diverged" in check.summary()


def test_a_sampler_without_accept_reject_gets_advice_about_its_step_size():
    """SG samplers: the step size, not the plan, sets the noise; sampling longer costs ε."""
    rng = np.random.default_rng(3)
    draws = rng.normal(size=(4, 500)) + np.arange(4)[:, None]
    check = check_convergence(release(draws, jump=np.ones((4, 500))))  # no `accepted` stat
    assert not check.converged and not check.accept_reject
    text = check.summary()
    assert "no accept/reject" in text and "smaller step_size" in text
    assert "sampling longer does not help" not in text and "acceptance nan" not in text
    with_test = check_convergence(release(draws, accepted=np.ones((4, 500), bool)))
    assert "sampling longer does not help" in with_test.summary()


def test_a_constant_of_the_model_is_not_a_chain_that_never_moved():
    """An LKJ correlation matrix's unit diagonal is the same in every draw: not a problem."""
    rng = np.random.default_rng(5)
    dims = ("chain", "draw")
    corr = np.ones((4, 500, 2, 2))
    corr[:, :, 0, 1] = corr[:, :, 1, 0] = np.tanh(rng.normal(size=(4, 500)))
    posterior = xr.Dataset(
        {
            "mu": (dims, rng.normal(size=(4, 500))),
            "corr": ((*dims, "i", "j"), corr),
            "fixed": (dims, np.full((4, 500), 2.0)),  # a deterministic that is a constant
        }
    )
    stats = xr.Dataset({"accepted": (dims, np.ones((4, 500), bool))})
    check = check_convergence({"posterior": posterior, "sample_stats": stats})
    assert check.converged, check
    assert np.isfinite(check.rhat_max) and check.rhat_max < 1.02


def test_what_never_moved_is_still_a_problem():
    rng = np.random.default_rng(6)
    dims = ("chain", "draw")
    stats = xr.Dataset({"accepted": (dims, np.ones((4, 500), bool))})

    def check(**variables):
        posterior = xr.Dataset({k: ((*dims, "k")[: v.ndim], v) for k, v in variables.items()})
        return check_convergence({"posterior": posterior, "sample_stats": stats})

    moving = rng.normal(size=(4, 500))
    # a component frozen in each chain, at the value that chain started from
    frozen = np.stack([moving, np.repeat(rng.normal(size=(4, 1)), 500, axis=1)], axis=-1)
    result = check(mu=frozen)
    assert not result.converged and result.rhat_max > 1.5
    # every chain at one value that none of them ever left
    result = check(mu=np.zeros((4, 500)), sigma=np.ones((4, 500)))
    assert not result.converged and result.rhat_max == np.inf
    # one chain: a scalar that never moved (a constant entry beside one that moved is left out)
    one = xr.Dataset(
        {
            "mu": (dims, moving[:1]),
            "fixed": (dims, np.full((1, 500), 2.0)),
            "corr": ((*dims, "k"), np.stack([moving[:1], np.ones((1, 500))], axis=-1)),
        }
    )
    result = check_convergence({"posterior": one, "sample_stats": stats.isel(chain=[0])})
    assert not result.converged and result.ess_bulk_min == 1.0
    without_fixed = one.drop_vars("fixed")
    assert check_convergence(
        {"posterior": without_fixed, "sample_stats": stats.isel(chain=[0])}
    ).converged
    # a release without draws is not a clean one
    empty = check_convergence({"posterior": xr.Dataset(), "sample_stats": stats})
    assert not empty.converged and "no draws" in empty.summary()


def normal_mean_step(
    seed: int, n: int, epsilon: float, constant: bool = False, **options: float
) -> pymc_dp.DPPenalty:
    """DPPenalty on a Normal-mean model, as PyMC's docs write one (``constant``: with a
    deterministic one of whose entries is a constant)."""
    data = np.random.default_rng(seed).normal(1.0, 1.0, n)
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 10.0)
        if constant:
            pm.Deterministic("mu_and_one", pm.math.stack([mu, pm.math.constant(1.0)]))
            pm.Deterministic("one", pm.math.constant(1.0))
        pm.Normal("y", mu, 1.0, observed=data)
        budget = pymc_dp.PrivacyBudget(epsilon=epsilon, delta=1e-6)
        return pymc_dp.DPPenalty(budget=budget, **options)


def test_pymc_dp_sample_warns_and_the_report_says_so(capsys):
    # ε = 0.1, so huge noise per iteration: the chains never move from PyMC's start
    step = normal_mean_step(3, 500, 0.1, llr_clip=5.0, noise_multiplier=300.0, proposal_scale=0.05)
    with pytest.warns(pymc_dp.ConvergenceWarning, match="NOT CONVERGED.*larger epsilon"):
        idata = pymc_dp.sample(
            step, chains=2, cores=1, progressbar=False, compute_convergence_checks=False
        )
    pymc_dp.privacy_report(idata)
    assert "NOT CONVERGED" in capsys.readouterr().out.splitlines()[-1]


def sample_without_warnings(step: pymc_dp.DPPenalty):
    """4 chains of 2000 draws from μ = 1; a ConvergenceWarning is an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", pymc_dp.ConvergenceWarning)
        idata = pymc_dp.sample(
            step,
            chains=4,
            tune=100,
            draws=2000,
            cores=1,
            initvals={"mu": np.array(1.0)},
            progressbar=False,
            compute_convergence_checks=False,
        )
    return idata


def test_a_converged_release_raises_no_warning(capsys):
    # small release noise and a well-scaled walk: bulk ESS 720–910 in three runs (the
    # threshold is 100; an earlier setting at ESS ≈ 100 was flaky)
    step = normal_mean_step(4, 400, 1e4, llr_clip=6.0, noise_multiplier=1.0, proposal_scale=0.12)
    idata = sample_without_warnings(step)
    pymc_dp.privacy_report(idata)
    assert capsys.readouterr().out.splitlines()[-1].startswith("convergence: no problem found")


def test_pymc_dp_sample_leaves_a_constant_deterministic_out(capsys):
    """A constant deterministic, and a constant entry of one, raise no warning from
    ``pymc_dp.sample`` and no problem in the privacy report."""
    step = normal_mean_step(
        6, 400, 1e4, constant=True, llr_clip=6.0, noise_multiplier=1.0, proposal_scale=0.12
    )
    idata = sample_without_warnings(step)
    assert np.all(idata.posterior["mu_and_one"].values[..., 1] == 1.0)
    assert np.all(idata.posterior["one"].values == 1.0)
    pymc_dp.privacy_report(idata)
    assert capsys.readouterr().out.splitlines()[-1].startswith("convergence: no problem found")
