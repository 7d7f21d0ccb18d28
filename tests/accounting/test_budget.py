"""``PrivacyBudget``: iteration counts, errors, reporting, reservations (theory §3)."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import _accounting_reference as ref
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymc_dp.accounting import (
    BarkerCost,
    GaussianCost,
    PrivacyBudget,
    SubsampledGaussianCost,
    compose,
    gaussian_delta,
    gaussian_epsilon,
)
from pymc_dp.errors import BudgetExceededError, InvalidParameterError

EPS, DELTA = 1.0, 1e-6


# ---------------------------------------------------------------------------------------------
# construction errors


@pytest.mark.parametrize(
    ("eps", "match"),
    [
        (0.0, "epsilon must be a positive finite number; got 0.0"),
        (-1.0, "epsilon must be a positive finite number"),
        (math.inf, "epsilon must be a positive finite number; got inf"),
        (math.nan, "epsilon must be a positive finite number; got nan"),
        ("1", "epsilon must be a positive finite number; got '1'"),
    ],
)
def test_bad_epsilon(eps: object, match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        PrivacyBudget(eps, DELTA)  # type: ignore[arg-type]


@pytest.mark.parametrize("dlt", [0.0, 1.0, 1.5, -1e-6, math.nan])
def test_bad_delta(dlt: float) -> None:
    with pytest.raises(InvalidParameterError, match=r"delta must lie strictly between 0 and 1"):
        PrivacyBudget(EPS, dlt)


def test_invalid_parameter_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="delta"):
        PrivacyBudget(EPS, 2.0)


def test_ledger_requires_dataset(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="dataset is required with ledger="):
        PrivacyBudget(EPS, DELTA, ledger=tmp_path / "l.sqlite")
    with pytest.raises(InvalidParameterError, match="dataset must be a non-empty string"):
        PrivacyBudget(EPS, DELTA, dataset="")


# ---------------------------------------------------------------------------------------------
# iteration counts


def test_iterations_gaussian_closed_form() -> None:
    budget = PrivacyBudget(EPS, DELTA)
    mu = 1 / (2 * 50.0**2)
    expected = ref.tight_iterations(EPS, DELTA, ref.mp.mpf(mu))
    assert budget.iterations(GaussianCost(mu)) == expected
    assert budget.iterations(mu) == expected  # float shorthand
    assert budget.capacity_mu == pytest.approx(float(ref.capacity(EPS, DELTA)), rel=1e-10)


@settings(max_examples=25, deadline=None)
@given(
    eps=st.floats(0.05, 20.0),
    dlt=st.floats(1e-12, 1e-2),
    mu=st.floats(1e-6, 0.05),
)
def test_budget_iterations_never_overshoot(eps: float, dlt: float, mu: float) -> None:
    budget = PrivacyBudget(eps, dlt)
    try:
        k = budget.iterations(mu)
    except InvalidParameterError:
        assert gaussian_delta(eps, mu) > dlt  # only when not even one iteration fits
        return
    assert gaussian_delta(eps, k * mu) <= dlt
    assert gaussian_delta(eps, (k + 1) * mu) > dlt


def test_iterations_per_chain_splits_the_total() -> None:
    budget = PrivacyBudget(EPS, DELTA)
    cost = GaussianCost.from_noise_multiplier(50.0)
    total = budget.iterations(cost)
    for chains in (1, 2, 3, 4, 7):
        assert budget.iterations_per_chain(cost, chains) == total // chains
    # chains compose: chains × per-chain iterations fit, one more round does not
    per = budget.iterations_per_chain(cost, 4)
    assert gaussian_delta(EPS, 4 * per * cost.mu) <= DELTA
    assert gaussian_delta(EPS, 4 * (per + 1) * cost.mu) > DELTA


@pytest.mark.parametrize(
    "cost", [GaussianCost.from_noise_multiplier(50.0), BarkerCost(1000, 100_000)], ids=str
)
def test_fits_agrees_with_the_largest_count(cost) -> None:
    budget = PrivacyBudget(2.0, DELTA)
    budget.reserve(cost, 10, mechanism="test")
    k = budget.iterations(cost)  # searched; fits() is one composition check
    assert budget.fits(cost, 0) and budget.fits(cost, k)
    assert not budget.fits(cost, k + 1)


@pytest.mark.parametrize("chains", [0, -1, 1.5, "4", None])
def test_iterations_per_chain_bad_chains(chains: object) -> None:
    with pytest.raises(InvalidParameterError, match="chains must be an integer >= 1"):
        PrivacyBudget(EPS, DELTA).iterations_per_chain(0.001, chains)  # type: ignore[arg-type]


def test_non_gaussian_iterations() -> None:
    budget = PrivacyBudget(2.0, DELTA)
    cost = BarkerCost(1000, 100_000)
    k = budget.iterations(cost)
    assert cost.epsilon(DELTA, k) <= 2.0 < cost.epsilon(DELTA, k + 1)
    budget.reserve(cost, k // 2, mechanism="DPBarker")
    k2 = budget.iterations(cost)
    assert k2 < k - k // 2 + 2  # composition of two RDP reservations is at least as costly


@pytest.mark.parametrize("bad", [0.0, -0.1, math.inf, math.nan, "x"])
def test_bad_costs(bad: object) -> None:
    with pytest.raises(InvalidParameterError, match=r"mu must be a positive finite|PrivacyCost"):
        PrivacyBudget(EPS, DELTA).iterations(bad)  # type: ignore[arg-type]


def test_budget_too_small_for_one_iteration_gaussian() -> None:
    budget = PrivacyBudget(0.01, DELTA)
    cost = GaussianCost.from_noise_multiplier(1.0)  # mu = 0.5
    needed = gaussian_epsilon(DELTA, 0.5)
    with pytest.raises(InvalidParameterError) as info:
        budget.iterations(cost)
    msg = str(info.value)
    assert "too small for a single iteration" in msg
    assert f"needs epsilon={needed:.4g}" in msg
    assert f"largest per-iteration mu that fits is {budget.capacity_mu:.4g}" in msg
    with pytest.raises(InvalidParameterError, match="too small for a single iteration"):
        budget.reserve(cost, 1)


def test_budget_too_small_for_one_iteration_per_chain() -> None:
    budget = PrivacyBudget(EPS, DELTA)
    mu = budget.capacity_mu / 2.5  # two iterations fit, not four
    assert budget.iterations(mu) == 2
    with pytest.raises(InvalidParameterError) as info:
        budget.iterations_per_chain(mu, 4)
    assert "one iteration in each of 4 chains" in str(info.value)
    assert f"{budget.capacity_mu / 4:.4g}" in str(info.value)


def test_budget_too_small_non_gaussian_message() -> None:
    cost = BarkerCost(16, 20)
    with pytest.raises(InvalidParameterError, match=r"needs epsilon=\d.*Increase the noise"):
        PrivacyBudget(0.01, DELTA).iterations(cost)
    sub = SubsampledGaussianCost(0.5, 1.0)  # q = 1: plain Gaussian, message gives the mu
    with pytest.raises(InvalidParameterError, match="largest per-iteration mu"):
        PrivacyBudget(0.01, DELTA).iterations(sub)


# ---------------------------------------------------------------------------------------------
# spending and reporting


def test_report_tracks_gaussian_spending() -> None:
    budget = PrivacyBudget(EPS, DELTA)
    fresh = budget.report()
    assert fresh.spent_epsilon == 0.0 and fresh.spent_mu == 0.0 and fresh.reservations == 0
    assert fresh.remaining_mu == pytest.approx(budget.capacity_mu)
    c1 = GaussianCost(1e-4)
    c2 = compose(  # DP HMC, z_l = 40, z_g = 200, L = 10
        GaussianCost.from_noise_multiplier(40.0), (GaussianCost.from_noise_multiplier(200.0), 11)
    )
    budget.reserve(c1, 50, mechanism="DPPenalty", chain=0)
    budget.reserve(c2, 20, mechanism="DPHMC", chains=2)
    spent = 50 * c1.mu + 20 * c2.mu
    report = budget.report()
    assert report.spent_mu == pytest.approx(spent)
    assert report.remaining_mu == pytest.approx(budget.capacity_mu - spent)
    assert report.spent_epsilon == pytest.approx(float(ref.epsilon(DELTA, spent)), rel=1e-9)
    assert report.spent_epsilon == pytest.approx(budget.epsilon_spent())
    assert report.reserved_iterations == 70 and report.method == "gaussian"
    text = str(report)
    assert "spent epsilon" in text and "remaining mu" in text and "reservations:        2" in text
    # remaining iterations follow from the remaining mu
    k = budget.iterations(c1)
    assert (
        gaussian_delta(EPS, spent + k * c1.mu)
        <= DELTA
        < gaussian_delta(EPS, spent + (k + 1) * c1.mu)
    )
    h = budget.history()
    assert [e.mechanism for e in h] == ["DPPenalty", "DPHMC"]
    assert (h[0].chain, h[0].chains, h[1].chain, h[1].chains) == (0, 1, None, 2)
    assert h[1].epsilon_total == pytest.approx(report.spent_epsilon)


def test_reservation_progress() -> None:
    budget = PrivacyBudget(EPS, DELTA)
    r = budget.reserve(1e-4, 10, mechanism="DPPenalty", chain=3)
    assert (r.iterations, r.spent, r.remaining, r.chain) == (10, 0, 10, 3)
    r.spend(4, flush=True)
    assert budget.history()[0].spent == 4
    r.spend()
    r.spend(5)  # used up: written without flush=True
    assert budget.history()[0].spent == 10 and r.remaining == 0
    with pytest.raises(BudgetExceededError, match="covers 10 iterations and 10 have run"):
        r.spend(1)
    # progress is reporting only: the whole reservation counted from the start
    assert budget.report().spent_mu == pytest.approx(10 * 1e-4)
    r2 = pickle.loads(pickle.dumps(r))
    assert r2.id == r.id and r2.spent == 10


def test_reserve_argument_errors() -> None:
    budget = PrivacyBudget(EPS, DELTA)
    with pytest.raises(InvalidParameterError, match="iterations must be an integer >= 1"):
        budget.reserve(1e-4, 0)
    with pytest.raises(InvalidParameterError, match="chains must be an integer >= 1"):
        budget.reserve(1e-4, 5, chains=0)
    with pytest.raises(InvalidParameterError, match="chain must be an integer >= 0"):
        budget.reserve(1e-4, 5, chain=-1)
    with pytest.raises(InvalidParameterError, match="mechanism must be a non-empty string"):
        budget.reserve(1e-4, 5, mechanism="")
    assert budget.history() == []


def test_pickled_budget_draws_from_the_same_ledger() -> None:
    budget = PrivacyBudget(EPS, DELTA)
    copy = pickle.loads(pickle.dumps(budget))
    assert copy.ledger_path == budget.ledger_path and copy.is_temporary
    copy.reserve(1e-4, 30)
    assert budget.report().reserved_iterations == 30
    assert "temporary ledger" in repr(budget)
