"""Budget-first calibration (``calibrate_noise``): the plan spends the budget, never more."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymc_dp.accounting import (
    BarkerCost,
    GaussianCost,
    PrivacyBudget,
    SubsampledGaussianCost,
    calibrate_noise,
    compose,
    compose_epsilon,
    composition_fits,
)
from pymc_dp.errors import BudgetExceededError


def hmc_like(steps: int, ratio: float):
    """DPHMC's cost as a function of one scale: z_l = s, z_g = ratio·s, steps + 1 gradients."""

    def cost_of(s: float):
        return compose(
            GaussianCost.from_noise_multiplier(s),
            (GaussianCost.from_noise_multiplier(ratio * s), steps + 1),
        )

    return cost_of


@settings(max_examples=300, deadline=None)
@given(
    epsilon=st.floats(0.05, 30.0),
    log10_delta=st.floats(-12.0, -3.0),
    iterations=st.integers(1, 10**6),
    steps=st.integers(0, 30),
    ratio=st.floats(0.2, 20.0),
    spent_share=st.sampled_from([0.0]) | st.floats(0.01, 0.9),
)
def test_a_gaussian_plan_spends_the_budget_exactly_and_never_more(
    epsilon, log10_delta, iterations, steps, ratio, spent_share
):
    delta = 10.0**log10_delta
    cost_of = hmc_like(steps, ratio)
    # something already reserved: a share of the budget, as plain Gaussian iterations
    spent = []
    if spent_share > 0:
        z0 = calibrate_noise(GaussianCost.from_noise_multiplier, spent_share * epsilon, delta, 50)
        spent = [(GaussianCost.from_noise_multiplier(z0), 50)]
    s = calibrate_noise(cost_of, epsilon, delta, iterations, spent=spent)
    plan = [*spent, (cost_of(s), iterations)]
    assert composition_fits(plan, epsilon, delta)  # never overshoots
    eps_spent, method = compose_epsilon(plan, delta)
    assert method == "gaussian"
    assert eps_spent == pytest.approx(epsilon, rel=1e-6)  # spends it exactly
    assert not composition_fits([*spent, (cost_of(s * (1 - 1e-6)), iterations)], epsilon, delta)


@pytest.mark.parametrize(
    ("epsilon", "q", "iterations"), [(1.0, 0.01, 2000), (5.0, 0.05, 500), (0.5, 0.2, 40)]
)
def test_a_subsampled_plan_fits_and_less_noise_would_not(epsilon, q, iterations):
    delta, rtol = 1e-6, 1e-3

    def cost_of(s: float):
        return SubsampledGaussianCost(s, q)

    s = calibrate_noise(cost_of, epsilon, delta, iterations, rtol=rtol)
    assert composition_fits([(cost_of(s), iterations)], epsilon, delta)
    assert not composition_fits([(cost_of(s / (1 + rtol)), iterations)], epsilon, delta)
    eps_spent, method = compose_epsilon([(cost_of(s), iterations)], delta)
    assert method == "pld" and 0.98 * epsilon <= eps_spent <= epsilon


def test_calibration_inverts_the_iteration_count_after_a_reservation():
    budget = PrivacyBudget(2.0, 1e-6)
    budget.reserve(GaussianCost.from_noise_multiplier(60.0), 400, mechanism="init")
    for planned in (1, 37, 4 * 1500):
        z = budget.calibrate_noise(GaussianCost.from_noise_multiplier, planned)
        assert budget.iterations(GaussianCost.from_noise_multiplier(z)) == planned
        assert budget.iterations(GaussianCost.from_noise_multiplier(z * (1 - 1e-6))) < planned


def test_non_gaussian_spending_uses_the_search_and_still_fits():
    spent = [(BarkerCost(1000, 100_000), 200)]
    s = calibrate_noise(GaussianCost.from_noise_multiplier, 3.0, 1e-6, 1000, spent=spent)
    assert composition_fits([*spent, (GaussianCost.from_noise_multiplier(s), 1000)], 3.0, 1e-6)
    smaller = GaussianCost.from_noise_multiplier(s / (1 + 1e-4))
    assert not composition_fits([*spent, (smaller, 1000)], 3.0, 1e-6)


def test_a_spent_budget_is_refused():
    budget = PrivacyBudget(1.0, 1e-6)
    z = budget.calibrate_noise(GaussianCost.from_noise_multiplier, 100)
    budget.reserve(GaussianCost.from_noise_multiplier(z), 100, mechanism="all of it")
    with pytest.raises(BudgetExceededError, match="whole budget"):
        budget.calibrate_noise(GaussianCost.from_noise_multiplier, 10)


def test_more_iterations_need_more_noise_as_the_square_root():
    z1 = calibrate_noise(GaussianCost.from_noise_multiplier, 1.0, 1e-6, 1000)
    z4 = calibrate_noise(GaussianCost.from_noise_multiplier, 1.0, 1e-6, 4000)
    assert z4 / z1 == pytest.approx(2.0, rel=1e-9)  # μ = k/(2 z²) is fixed by the capacity
    assert math.isfinite(z1) and z1 > 0
