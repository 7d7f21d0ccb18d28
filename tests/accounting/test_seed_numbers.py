"""Reproduce the seeds' iteration counts: tight PLD vs zCDP accounting (thesis §6.1, theory §3).

Settings of the 2-d banana experiments (thesis Table 5.1, §6.1): n = 100 000, δ = 0.1/n, seeds'
noise parametrisation σ = τ √n Δ, i.e. z = τ √n and μ = 1/(2 τ² n) per release.
DP penalty: τ = 0.1. DP HMC: τ_l = 0.1, τ_g = 0.55, L = 25 (μ = 1/(2τ_l²n) + (L+1)/(2τ_g²n)).
Expected counts come from :mod:`_accounting_reference` (mpmath, plain theory §3 formulas).
"""

from __future__ import annotations

import math

import _accounting_reference as ref
import pytest

from pymc_dp.accounting import (
    GaussianCost,
    PrivacyBudget,
    compose,
    gaussian_iterations,
    zcdp_iterations,
)

N = 100_000
DELTA = 0.1 / N
TAU, TAU_L, TAU_G, L = 0.1, 0.1, 0.55, 25


def _mu_penalty_hp() -> ref.mp.mpf:
    return 1 / (2 * ref.mp.mpf(TAU) ** 2 * N)


def _mu_hmc_hp() -> ref.mp.mpf:
    return 1 / (2 * ref.mp.mpf(TAU_L) ** 2 * N) + (L + 1) / (2 * ref.mp.mpf(TAU_G) ** 2 * N)


def _penalty_cost() -> GaussianCost:
    return GaussianCost.from_noise_multiplier(TAU * math.sqrt(N))


def _hmc_cost() -> GaussianCost:
    cost = compose(
        GaussianCost.from_noise_multiplier(TAU_L * math.sqrt(N)),
        (GaussianCost.from_noise_multiplier(TAU_G * math.sqrt(N)), L + 1),
    )
    assert isinstance(cost, GaussianCost)
    return cost


def test_per_iteration_mu_matches_seed_parametrisation() -> None:
    assert _penalty_cost().mu == pytest.approx(float(_mu_penalty_hp()), rel=1e-14)
    assert _hmc_cost().mu == pytest.approx(float(_mu_hmc_hp()), rel=1e-14)


def test_dp_hmc_epsilon_12_counts() -> None:
    """The headline DP-HMC setting: ε = 12, δ = 1e-6."""
    mu_hp = _mu_hmc_hp()
    tight_expected = ref.tight_iterations(12.0, DELTA, mu_hp)
    zcdp_expected = ref.zcdp_iterations(12.0, DELTA, mu_hp)
    assert (tight_expected, zcdp_expected) == (2483, 2000)  # regression anchor
    budget = PrivacyBudget(12.0, DELTA)
    assert budget.iterations(_hmc_cost()) == tight_expected
    assert zcdp_iterations(12.0, DELTA, _hmc_cost().mu) == zcdp_expected


def test_dp_penalty_epsilon_12_counts() -> None:
    mu_hp = _mu_penalty_hp()
    tight_expected = ref.tight_iterations(12.0, DELTA, mu_hp)
    zcdp_expected = ref.zcdp_iterations(12.0, DELTA, mu_hp)
    assert (tight_expected, zcdp_expected) == (4618, 3720)  # regression anchor
    assert PrivacyBudget(12.0, DELTA).iterations(_penalty_cost()) == tight_expected
    assert zcdp_iterations(12.0, DELTA, _penalty_cost().mu) == zcdp_expected


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 4.0, 6.0, 12.0])
@pytest.mark.parametrize("which", ["penalty", "hmc"])
def test_counts_over_epsilon(eps: float, which: str) -> None:
    mu_hp = _mu_penalty_hp() if which == "penalty" else _mu_hmc_hp()
    cost = _penalty_cost() if which == "penalty" else _hmc_cost()
    tight = gaussian_iterations(eps, DELTA, cost.mu)
    zcdp = zcdp_iterations(eps, DELTA, cost.mu)
    assert tight == ref.tight_iterations(eps, DELTA, mu_hp)
    assert zcdp == ref.zcdp_iterations(eps, DELTA, mu_hp)
    # thesis §6.1: tight accounting allows more iterations, the more so the smaller ε
    assert tight > zcdp


def test_advantage_grows_as_epsilon_shrinks() -> None:
    mu = _hmc_cost().mu
    ratios = [
        gaussian_iterations(e, DELTA, mu) / zcdp_iterations(e, DELTA, mu) for e in (12.0, 4.0, 1.0)
    ]
    assert ratios[0] < ratios[1] < ratios[2]
    assert ratios[0] == pytest.approx(2483 / 2000) and ratios[2] == pytest.approx(30 / 18)
