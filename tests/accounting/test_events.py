"""Costs as composable events: atoms, compose(), SelfComposedCost, ComposedCost, covers."""

from __future__ import annotations

import itertools
import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest

from pymc_dp.accounting import (
    BarkerCost,
    ComposedCost,
    GaussianCost,
    PrivacyBudget,
    PrivacyCost,
    SelfComposedCost,
    SubsampledGaussianCost,
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
from pymc_dp.accounting.ledger import LedgerEntry, Reservation
from pymc_dp.errors import InvalidParameterError

DELTA = 1e-6
G = GaussianCost(0.001)
S = SubsampledGaussianCost(1.5, 0.02)
B = BarkerCost(500, 50_000)


def _z(z: float) -> GaussianCost:
    return GaussianCost.from_noise_multiplier(z)


# ---------------------------------------------------------------------------------------------
# normal form


@pytest.mark.parametrize(
    ("zl", "zg", "steps"), [(10.0, 50.0, 25), (31.6, 173.9, 25), (40.0, 200.0, 10), (0.7, 3.1, 1)]
)
def test_all_gaussian_compose_is_the_closed_form_mu(zl: float, zg: float, steps: int) -> None:
    cost = compose(_z(zl), (_z(zg), steps + 1))
    assert type(cost) is GaussianCost
    assert cost.mu == pytest.approx(1 / (2 * zl**2) + (steps + 1) / (2 * zg**2), rel=1e-15)
    assert cost.gaussian_mu() == cost.mu and cost.accountant_level() == "gaussian"


def test_seed_dp_hmc_cost_is_exactly_the_old_formula() -> None:
    n = 100_000
    zl, zg = 0.1 * math.sqrt(n), 0.55 * math.sqrt(n)
    assert compose(_z(zl), (_z(zg), 26)) == GaussianCost(1 / (2 * zl * zl) + 26 / (2 * zg * zg))


def test_nested_gaussian_compositions_flatten_into_one_gaussian() -> None:
    a, b, c = GaussianCost(0.1), GaussianCost(0.02), GaussianCost(0.003)
    inner = ComposedCost((a, SelfComposedCost(b, 2)))  # not normal form: built by hand
    cost = compose((inner, 3), SelfComposedCost(c, 5), (a, 0))
    assert type(cost) is GaussianCost
    assert cost.mu == pytest.approx(3 * (0.1 + 2 * 0.02) + 5 * 0.003, rel=1e-15)
    # the hand-built Gaussian composition has the same mu and the same epsilon
    assert inner.gaussian_mu() == pytest.approx(0.14, rel=1e-15)
    assert inner.epsilon(DELTA, 7) == pytest.approx(gaussian_epsilon(DELTA, 7 * 0.14), rel=1e-12)


def test_compose_single_atoms_and_counts() -> None:
    for atom in (G, S, B):
        assert compose(atom) is atom
        assert compose((atom, 1), (GaussianCost(0.5), 0)) is atom  # zero counts are dropped
    assert compose((G, 3)) == GaussianCost(0.003)
    assert compose((S, 3)) == SelfComposedCost(S, 3)
    assert compose((B, 2), (B, 2)) == SelfComposedCost(B, 4)
    assert compose((SelfComposedCost(S, 2), 3)) == SelfComposedCost(S, 6)
    assert compose(0.25) == GaussianCost(0.25)  # a float is a Gaussian mu, as everywhere


def test_compose_is_canonical() -> None:
    items = [G, (S, 2), B, SubsampledGaussianCost(3.0, 0.1), (GaussianCost(0.5), 2)]
    forms = {compose(*perm) for perm in itertools.permutations(items)}
    assert len(forms) == 1
    (form,) = forms
    assert isinstance(form, ComposedCost)
    # Gaussian atoms merged first, then the PLD atoms, then the RDP ones
    assert form.parts[0] == GaussianCost(0.001 + 2 * 0.5)
    assert form.parts[-1] == B
    assert compose(G, S) == compose(S, G) and hash(compose(G, S)) == hash(compose(S, G))
    # merging equal atoms: the same composition written twice over
    assert compose(S, S, B) == compose((S, 2), B) == compose(compose(S, B), S)


def test_atoms_flatten_and_merge() -> None:
    cost = ComposedCost((S, SelfComposedCost(ComposedCost((S, B)), 3), G, G))
    assert cost.atoms() == ((S, 4), (B, 3), (G, 2))
    assert G.atoms() == ((G, 1),)
    assert SelfComposedCost(SelfComposedCost(B, 2), 5).atoms() == ((B, 10),)


def test_levels_and_accountants() -> None:
    assert compose(G, S).accountant_level() == "pld"
    assert compose(G, S, B).accountant_level() == "rdp"
    assert compose(G, SubsampledGaussianCost(2.0, 1.0)).accountant_level() == "gaussian"
    assert compose(G, B).accountant == B.accountant and "PLD" in compose(G, S).accountant
    assert compose(G, S).gaussian_mu() is None
    assert SelfComposedCost(SubsampledGaussianCost(2.0, 1.0), 4).gaussian_mu() == 0.5


# ---------------------------------------------------------------------------------------------
# epsilon of composite costs


@pytest.mark.parametrize("atom", [G, S, B], ids=lambda c: c.kind)
def test_self_composed_equals_more_iterations(atom: PrivacyCost) -> None:
    k, m = 3, 40
    assert SelfComposedCost(atom, k).epsilon(DELTA, m) == pytest.approx(
        atom.epsilon(DELTA, k * m), rel=1e-12
    )
    assert SelfComposedCost(atom, k).epsilon(DELTA, 0) == 0.0


def test_composed_gaussian_and_subsampled_is_the_pld_of_the_flat_spending() -> None:
    m = 50
    cost = compose(G, S)
    assert isinstance(cost, ComposedCost)
    eps, method = compose_epsilon([(cost, m)], DELTA)
    assert method == "pld"
    assert eps == compose_epsilon([(G, m), (S, m)], DELTA)[0]
    assert cost.epsilon(DELTA, m) == eps
    # the Gaussian part alone is a lower bound, the sum of the separate epsilons an upper one
    assert G.epsilon(DELTA, m) < eps < G.epsilon(DELTA, m) + S.epsilon(DELTA, m)


def test_composed_with_barker_goes_through_rdp() -> None:
    m = 200
    cost = compose(G, (S, 2), B)
    eps, method = compose_epsilon([(cost, m)], DELTA)
    assert method == "rdp"
    assert eps == pytest.approx(compose_epsilon([(G, m), (S, 2 * m), (B, m)], DELTA)[0], rel=1e-12)
    # independently: add the curves by hand over the Barker orders
    orders, b_rdp = barker_rdp(500, 50_000)
    total = m * 0.001 * orders + 2 * m * subsampled_gaussian_rdp(orders, 1.5, 0.02) + m * b_rdp
    assert eps == pytest.approx(rdp_to_epsilon(orders, total, DELTA)[0], rel=1e-12)


def test_max_iterations_with_composed_cost_never_overshoots() -> None:
    eps = 2.0
    for spent, new in (
        ([(GaussianCost(0.002), 20)], compose(G, (B, 2))),
        ([(compose(G, B), 50)], compose(GaussianCost(0.004), B)),
        ([(GaussianCost(0.002), 20)], compose(G, S)),
    ):
        k = max_iterations(spent, new, eps, DELTA)
        assert k > 0
        assert composition_fits([*spent, (new, k)], eps, DELTA)
        assert not composition_fits([*spent, (new, k + 1)], eps, DELTA)


# ---------------------------------------------------------------------------------------------
# records, pickling, ledger

COMPOSITES: list[PrivacyCost] = [
    SelfComposedCost(S, 3),
    compose(G, (S, 2), B),
    ComposedCost((SelfComposedCost(ComposedCost((G, B)), 2), S)),  # nested, by hand
]


@pytest.mark.parametrize("cost", COMPOSITES, ids=lambda c: c.kind)
def test_composite_records_round_trip(cost: PrivacyCost) -> None:
    record = json.loads(json.dumps(cost.to_record()))
    assert cost_from_record(record) == cost
    assert hash(cost_from_record(record)) == hash(cost)
    assert pickle.loads(pickle.dumps(cost)) == cost
    with pytest.raises(AttributeError):
        cost.count = 3  # type: ignore[misc,union-attr]
    assert isinstance(cost.describe(), str) and cost.describe()


def test_bad_records_and_arguments() -> None:
    with pytest.raises(InvalidParameterError, match="lacks the field 'count'"):
        cost_from_record({"kind": "self_composed", "cost": G.to_record()})
    with pytest.raises(InvalidParameterError, match="unknown privacy cost record"):
        cost_from_record({"kind": "composed", "parts": [{"kind": "laplace"}]})
    with pytest.raises(InvalidParameterError, match="parts must hold at least one"):
        ComposedCost(())
    with pytest.raises(InvalidParameterError, match="parts must be a tuple of PrivacyCost"):
        ComposedCost(G)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="each of parts must be a PrivacyCost"):
        ComposedCost((G, 0.5))  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="cost must be a PrivacyCost"):
        SelfComposedCost(0.5, 2)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="cost with a count >= 1"):
        compose((G, 0))
    with pytest.raises(InvalidParameterError, match=r"a \(cost, count\) pair"):
        compose((G, 1, 2))  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="cost must be a PrivacyCost"):
        compose("G")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="accounted in RDP"):
        B.pld(1)
    with pytest.raises(InvalidParameterError, match="orders must lie in"):
        B.rdp(np.arange(2, 10), 1)


def test_ledger_stores_and_reads_back_composed_costs(tmp_path: Path) -> None:
    budget = PrivacyBudget(5.0, DELTA, ledger=tmp_path / "l.sqlite", dataset="d")
    cost = compose(G, (S, 2), B)
    gauss = ComposedCost((G, SelfComposedCost(GaussianCost(0.002), 3)))  # all Gaussian
    r1 = budget.reserve(gauss, 10, mechanism="Hand")
    r2 = budget.reserve(cost, 20, mechanism="Mixed", chains=2)
    history = budget.history()
    assert [e.cost for e in history] == [gauss, cost]
    assert history[0].mu == pytest.approx(10 * 0.007) and history[1].mu is None
    assert history[0].method == "gaussian" and history[1].method == "rdp"
    assert r2.cost == cost and r2.epsilon_total == pytest.approx(budget.epsilon_spent())
    assert budget.epsilon_spent() == pytest.approx(
        compose_epsilon([(G, 30), (GaussianCost(0.002), 30), (S, 40), (B, 20)], DELTA)[0],
        rel=1e-12,
    )
    reopened = PrivacyBudget.from_ledger(tmp_path / "l.sqlite", "d")
    assert reopened.history()[1].cost == cost
    # reservations read their fields from the entry, read-only
    assert isinstance(r1.entry, LedgerEntry) and r1.entry == history[0]
    assert (r1.id, r1.mechanism, r1.iterations, r1.chains) == (history[0].id, "Hand", 10, 1)
    with pytest.raises(AttributeError):
        r1.iterations = 99  # type: ignore[misc]


def test_reservation_pickles_and_spends(tmp_path: Path) -> None:
    budget = PrivacyBudget(5.0, DELTA, ledger=tmp_path / "l.sqlite", dataset="d")
    r = budget.reserve(compose(G, S), 5, mechanism="Mixed")
    copy = pickle.loads(pickle.dumps(r))
    assert isinstance(copy, Reservation) and copy == r and copy.cost == compose(G, S)
    copy.spend(3, flush=True)
    assert copy.remaining == 2 and budget.history()[0].spent == 3
    assert (copy.ledger_path, copy.timeout) == (r.ledger_path, r.timeout)


# ---------------------------------------------------------------------------------------------
# covers


@pytest.mark.parametrize(
    ("reserved", "released", "expected"),
    [
        (GaussianCost(0.01), GaussianCost(0.01), True),
        (GaussianCost(0.01), GaussianCost(0.005), True),
        (GaussianCost(0.01), GaussianCost(0.02), False),
        (GaussianCost(0.125), SubsampledGaussianCost(2.0, 1.0), True),  # q = 1 is Gaussian
        (GaussianCost(0.1), SubsampledGaussianCost(2.0, 1.0), False),
        (GaussianCost(1.0), S, False),
        (S, S, True),
        (S, SubsampledGaussianCost(2.0, 0.02), True),
        (S, SubsampledGaussianCost(1.0, 0.02), False),
        (S, SubsampledGaussianCost(2.0, 0.01), False),  # another ratio is another mechanism
        (S, GaussianCost(1e-9), False),
        (B, B, True),
        (B, BarkerCost(500, 60_000), False),
        (B, BarkerCost(400, 50_000), False),
        (B, G, False),
        (G, B, False),
    ],
)
def test_covers_truth_table(reserved: PrivacyCost, released: PrivacyCost, expected: bool) -> None:
    assert reserved.covers(released) is expected


def test_covers_needs_atoms() -> None:
    with pytest.raises(InvalidParameterError, match="covers compares atomic costs"):
        compose(G, S).covers(G)
    with pytest.raises(InvalidParameterError, match="other must be an atomic cost"):
        G.covers(compose(G, S))
