"""Per-iteration costs and their composition (theory §3, §4.1–§4.5)."""

from __future__ import annotations

import json
import math
import pickle

import _accounting_reference as ref
import numpy as np
import pytest

from pymc_dp.accounting import (
    BarkerCost,
    GaussianCost,
    PrivacyCost,
    SelfComposedCost,
    SubsampledGaussianCost,
    as_cost,
    barker_rdp,
    compose,
    compose_epsilon,
    composition_fits,
    gaussian_epsilon,
    max_iterations,
    rdp_to_epsilon,
    subsampled_gaussian_rdp,
)
from pymc_dp.accounting.costs import cost_from_record
from pymc_dp.errors import InvalidParameterError

DELTA = 1e-6
ALL_COSTS: list[PrivacyCost] = [
    GaussianCost(0.001),
    SubsampledGaussianCost(1.5, 0.02),
    BarkerCost(500, 50_000),
]


def test_gaussian_cost_constructors() -> None:
    assert GaussianCost.from_noise_multiplier(10.0).mu == pytest.approx(1 / 200)
    hmc = compose(GaussianCost.from_noise_multiplier(10.0), (GaussianCost(1 / 5000), 26))
    assert type(hmc) is GaussianCost and hmc.mu == pytest.approx(1 / 200 + 26 / 5000)
    assert GaussianCost(np.float64(0.5)).mu == 0.5 and type(GaussianCost(1).mu) is float


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan, "0.1", None, True])
def test_gaussian_cost_rejects(bad: object) -> None:
    with pytest.raises(InvalidParameterError, match="mu must be a positive finite number"):
        GaussianCost(bad)  # type: ignore[arg-type]


def test_constructor_errors_name_arguments() -> None:
    with pytest.raises(InvalidParameterError, match="noise_multiplier must be a positive"):
        GaussianCost.from_noise_multiplier(0.0)
    with pytest.raises(InvalidParameterError, match="count must be an integer >= 0"):
        compose((GaussianCost(1.0), -1))
    with pytest.raises(InvalidParameterError, match="count must be an integer >= 1"):
        SelfComposedCost(GaussianCost(1.0), 0)


@pytest.mark.parametrize("cost", ALL_COSTS, ids=lambda c: c.kind)
def test_costs_are_frozen_picklable_and_serialisable(cost: PrivacyCost) -> None:
    assert pickle.loads(pickle.dumps(cost)) == cost
    assert hash(cost) == hash(pickle.loads(pickle.dumps(cost)))
    record = json.loads(json.dumps(cost.to_record()))
    assert cost_from_record(record) == cost
    with pytest.raises(AttributeError):
        cost.mu = 3.0  # type: ignore[attr-defined,misc]
    assert isinstance(cost.describe(), str) and cost.describe()


def test_cost_from_record_unknown() -> None:
    with pytest.raises(InvalidParameterError, match="unknown privacy cost record"):
        cost_from_record({"kind": "laplace", "b": 1.0})


def test_as_cost() -> None:
    assert as_cost(0.25) == GaussianCost(0.25)
    assert as_cost(ALL_COSTS[1]) is ALL_COSTS[1]
    with pytest.raises(InvalidParameterError, match="cost must be a PrivacyCost"):
        as_cost("0.1")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="cost must be a PrivacyCost"):
        as_cost(True)
    with pytest.raises(InvalidParameterError, match="mu must be a positive finite number"):
        as_cost(-0.5)


def test_gaussian_flags() -> None:
    assert GaussianCost(0.1).gaussian_mu() == 0.1
    assert SubsampledGaussianCost(2.0, 1.0).gaussian_mu() == pytest.approx(1 / 8)
    assert SubsampledGaussianCost(2.0, 0.5).gaussian_mu() is None
    assert not BarkerCost(100, 1000).is_gaussian()


# ---------------------------------------------------------------------------------------------
# composition


def test_gaussian_composition_is_sum_of_mu() -> None:
    spending = [(GaussianCost(0.001), 300), (0.002, 100), (SubsampledGaussianCost(10.0, 1.0), 50)]
    total = 300 * 0.001 + 100 * 0.002 + 50 / 200
    eps, method = compose_epsilon(spending, DELTA)
    assert method == "gaussian"
    assert eps == pytest.approx(float(ref.epsilon(DELTA, total)), rel=1e-9)
    assert compose_epsilon([], DELTA) == (0.0, "gaussian")
    assert compose_epsilon([(GaussianCost(0.1), 0)], DELTA)[0] == 0.0


def test_rdp_composition_adds_curves() -> None:
    g, s, b = GaussianCost(0.001), SubsampledGaussianCost(1.5, 0.02), BarkerCost(500, 50_000)
    eps, method = compose_epsilon([(g, 200), (s, 30), (b, 400)], DELTA)
    assert method == "rdp"
    orders, b_rdp = barker_rdp(500, 50_000)
    total = 200 * 0.001 * orders + 30 * subsampled_gaussian_rdp(orders, 1.5, 0.02) + 400 * b_rdp
    assert eps == pytest.approx(rdp_to_epsilon(orders, total, DELTA)[0], rel=1e-12)
    # valid bound: never below the exact ε of the Gaussian part alone
    assert eps > gaussian_epsilon(DELTA, 0.2)


def test_composition_fits_agrees_with_compose_epsilon() -> None:
    for spending in (
        [(GaussianCost(0.001), 500)],
        [(GaussianCost(0.001), 100), (SubsampledGaussianCost(1.5, 0.02), 50)],
        [(GaussianCost(0.001), 100), (BarkerCost(500, 50_000), 100)],
    ):
        eps, _ = compose_epsilon(spending, DELTA)
        assert composition_fits(spending, eps * 1.001, DELTA)
        assert not composition_fits(spending, eps * 0.99, DELTA)


@pytest.mark.parametrize(
    ("spent", "new"),
    [
        ([], GaussianCost(0.001)),
        ([(GaussianCost(0.002), 20)], GaussianCost(0.001)),
        ([(GaussianCost(0.002), 20)], BarkerCost(500, 50_000)),
        ([(BarkerCost(500, 50_000), 1000)], GaussianCost(0.001)),
        ([(GaussianCost(0.002), 20)], SubsampledGaussianCost(1.5, 0.02)),
    ],
)
def test_max_iterations_never_overshoots(spent: list, new: PrivacyCost) -> None:
    eps = 2.0
    k = max_iterations(spent, new, eps, DELTA)
    assert k > 0
    assert composition_fits([*spent, (new, k)], eps, DELTA)
    assert not composition_fits([*spent, (new, k + 1)], eps, DELTA)


def test_max_iterations_when_already_over() -> None:
    assert max_iterations([(GaussianCost(1.0), 100)], GaussianCost(0.001), 1.0, DELTA) == 0
