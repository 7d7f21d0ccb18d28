"""RDP accounting: conversion, WBK subsampling amplification, DP Barker (theory §3, §4.4)."""

from __future__ import annotations

import itertools
import math

import _accounting_reference as ref
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pymc_dp.accounting import (
    BarkerCost,
    barker_base_rdp,
    barker_epsilon,
    barker_rdp,
    gaussian_epsilon,
    max_iterations,
    rdp_to_epsilon,
    wbk_subsampled_rdp,
)
from pymc_dp.accounting.rdp import barker_orders
from pymc_dp.errors import InvalidParameterError

# ---------------------------------------------------------------------------------------------
# RDP -> (ε, δ)


@settings(max_examples=100, deadline=None)
@given(
    rdp0=st.floats(min_value=1e-6, max_value=10.0),
    slope=st.floats(min_value=0.0, max_value=2.0),
    dlt=st.floats(min_value=1e-12, max_value=0.1),
)
@example(rdp0=1e-6, slope=0.0, dlt=1e-3)  # the KL bound gives ε = 0 (found by hypothesis)
def test_improved_conversion_never_worse_than_classic(
    rdp0: float, slope: float, dlt: float
) -> None:
    orders = np.array([1.5, 2, 3, 4, 8, 16, 32, 64, 128, 256], dtype=float)
    rdp = rdp0 + slope * orders
    improved, _ = rdp_to_epsilon(orders, rdp, dlt)
    classic, _ = rdp_to_epsilon(orders, rdp, dlt, method="classic")
    assert improved <= classic
    # independent per-order formulas
    assert improved == pytest.approx(
        max(0.0, min(ref.improved_conversion(r, a, dlt) for r, a in zip(rdp, orders, strict=True))),
        rel=1e-12,
        abs=1e-15,
    )
    assert classic == pytest.approx(
        min(ref.classic_conversion(r, a, dlt) for r, a in zip(rdp, orders, strict=True)), rel=1e-12
    )
    # dp_accounting's implementation of the same conversion agrees
    theirs, _ = dpa_rdp.compute_epsilon(orders, rdp, dlt)
    assert improved == pytest.approx(theirs, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("mu", [1e-3, 0.05, 1.0, 20.0])
@pytest.mark.parametrize("dlt", [1e-3, 1e-6, 1e-10])
def test_rdp_of_gaussian_is_looser_than_tight_pld(mu: float, dlt: float) -> None:
    # A Gaussian with PLD parameter μ has RDP αμ; no RDP conversion can beat the tight curve.
    orders = np.concatenate([np.linspace(1.01, 10, 400), np.arange(11, 2000)])
    eps_rdp, _ = rdp_to_epsilon(orders, orders * mu, dlt)
    eps_tight = gaussian_epsilon(dlt, mu)
    assert eps_rdp >= eps_tight
    assert eps_rdp <= eps_tight * 1.6 + 0.05  # ... and is not absurdly loose either


def test_conversion_input_errors() -> None:
    with pytest.raises(InvalidParameterError, match="orders must be finite and > 1"):
        rdp_to_epsilon([1.0, 2.0], [0.1, 0.2], 1e-6)
    with pytest.raises(InvalidParameterError, match="same length"):
        rdp_to_epsilon([2.0, 3.0], [0.1], 1e-6)
    with pytest.raises(InvalidParameterError, match="method"):
        rdp_to_epsilon([2.0], [0.1], 1e-6, method="magic")
    with pytest.raises(InvalidParameterError, match="delta"):
        rdp_to_epsilon([2.0], [0.1], 0.0)
    assert rdp_to_epsilon([2.0, 3.0], [np.inf, np.inf], 1e-6)[0] == math.inf


# ---------------------------------------------------------------------------------------------
# WBK19 Thm 9 (thesis Thm 3.3 form)


@pytest.mark.parametrize(("z", "q"), [(1.0, 0.01), (2.0, 0.1), (0.8, 0.001), (5.0, 0.5)])
@pytest.mark.parametrize("alpha", [2, 3, 4, 7, 16, 40])
def test_wbk_matches_high_precision(z: float, q: float, alpha: int) -> None:
    def base(j: int) -> ref.mp.mpf:
        return ref.mp.mpf(j) / (2 * ref.mp.mpf(z) ** 2)

    expected = min(float(ref.wbk_thm9(alpha, q, base)), alpha / (2 * z * z))
    got = wbk_subsampled_rdp(np.array([alpha]), lambda j: j / (2 * z * z), q)[0]
    assert got == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize(("z", "q"), [(1.0, 0.01), (2.0, 0.1), (0.8, 0.001)])
def test_wbk_against_dp_accounting_wor_gaussian(z: float, q: float) -> None:
    # dp_accounting uses WBK Thm 27 (tighter, Gaussian-specific) up to order 256 and the generic
    # Thm 9 above it: equal there, never below Thm 27 elsewhere.
    low = np.arange(2, 60)
    high = np.array([257, 300, 400])
    ours_low = wbk_subsampled_rdp(low, lambda j: j / (2 * z * z), q)
    theirs_low = dpa_rdp._compute_rdp_sample_wor_gaussian(q, z, low)
    assert np.all(ours_low >= theirs_low * (1 - 1e-12))
    ours_high = wbk_subsampled_rdp(high, lambda j: j / (2 * z * z), q)
    theirs_high = dpa_rdp._compute_rdp_sample_wor_gaussian(q, z, high)
    np.testing.assert_allclose(ours_high, np.minimum(theirs_high, high / (2 * z * z)), rtol=1e-9)


def test_wbk_amplifies() -> None:
    orders = np.arange(2, 30)
    base = orders / (2 * 1.0**2)
    amplified = wbk_subsampled_rdp(orders, lambda j: j / 2.0, 0.01)
    assert np.all(amplified < base)
    assert np.all(np.diff(amplified) > 0)


# ---------------------------------------------------------------------------------------------
# DP Barker


@pytest.mark.parametrize("b", [16, 50, 200, 1000, 5000])
def test_barker_base_formula(b: int) -> None:
    for alpha in barker_orders(b)[:20]:
        assert barker_base_rdp(float(alpha), b) == pytest.approx(
            float(ref.barker_base(int(alpha), b)), rel=1e-12
        )
    assert barker_base_rdp(b / 5, b) == math.inf


def test_barker_orders_range() -> None:
    assert list(barker_orders(16)) == [3]  # 3 < 16/5 = 3.2
    assert list(barker_orders(20)) == [3]  # 4 is not < 4
    assert list(barker_orders(21)) == [3, 4]
    assert barker_orders(1000)[-1] == 199
    with pytest.raises(InvalidParameterError, match="batch_size"):
        barker_orders(15)


def _barker_reference(alpha: int, b: int, n: int) -> float:
    """Monotone-envelope form documented in pymc_dp.accounting.rdp, computed independently."""
    top = math.ceil(b / 5) - 1
    base = {a: ref.barker_base(a, b) for a in range(3, top + 1)}

    def env(j: int) -> ref.mp.mpf:
        return min(base[a] for a in range(max(j, 3), top + 1))

    return min(float(ref.wbk_thm9(alpha, b / n, env)), float(env(alpha)))


@pytest.mark.parametrize(("b", "n"), [(100, 10_000), (1000, 100_000), (40, 1000)])
def test_barker_rdp_matches_reference(b: int, n: int) -> None:
    orders, rdp = barker_rdp(b, n)
    for idx in (0, 1, 2, len(orders) // 2, len(orders) - 1):
        assert rdp[idx] == pytest.approx(_barker_reference(int(orders[idx]), b, n), rel=1e-9)


def test_barker_envelope_is_below_thesis_literal_for_usual_batches() -> None:
    # The thesis plugs ε'(2) (outside its stated range 2 < α) into Thm 9; the envelope uses only
    # proven orders. For usual batch sizes ε' decreases from α = 2 to 3, so we are tighter.
    b, n = 1000, 100_000
    orders, rdp = barker_rdp(b, n)
    for idx in (0, 5, 20):
        alpha = int(orders[idx])
        literal = float(ref.wbk_thm9(alpha, b / n, lambda j: ref.barker_base(j, b)))
        assert rdp[idx] <= literal
    assert barker_base_rdp(3.0, b) < barker_base_rdp(2.0, b)


def test_barker_epsilon_monotone_and_composes() -> None:
    b, n, dlt = 500, 50_000, 1e-5
    eps = [barker_epsilon(k, b, n, dlt) for k in (0, 1, 10, 100, 1000, 10_000)]
    assert eps[0] == 0.0
    assert all(x < y for x, y in itertools.pairwise(eps))
    orders, rdp = barker_rdp(b, n)
    assert eps[4] == pytest.approx(
        min(ref.improved_conversion(1000 * r, a, dlt) for r, a in zip(rdp, orders, strict=True)),
        rel=1e-12,
    )


def test_barker_iterations_never_overshoot() -> None:
    cost = BarkerCost(1000, 100_000)
    for eps in (0.5, 2.0, 8.0):
        k = max_iterations([], cost, eps, 1e-6)
        assert cost.epsilon(1e-6, k) <= eps < cost.epsilon(1e-6, k + 1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 15, "n": 1000}, "batch_size must be an integer >= 16"),
        ({"batch_size": 100.5, "n": 1000}, "batch_size must be an integer"),
        ({"batch_size": 2000, "n": 1000}, r"batch_size \(2000\) cannot exceed .* n \(1000\)"),
        ({"batch_size": 100, "n": 0}, "n must be an integer >= 1"),
    ],
)
def test_barker_cost_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        BarkerCost(**kwargs)


def test_barker_thesis_literal_option() -> None:
    b, n = 1000, 100_000
    orders, literal = barker_rdp(b, n, envelope=False)
    for idx in (0, 7, 50):
        alpha = int(orders[idx])
        expected = min(
            float(ref.wbk_thm9(alpha, b / n, lambda j: ref.barker_base(j, b))),
            float(ref.barker_base(alpha, b)),
        )
        assert literal[idx] == pytest.approx(expected, rel=1e-9)
    # documented in docs/accounting.md: the envelope allows several times more iterations here
    assert barker_epsilon(5336, b, n, 1e-6) <= 2.0 < barker_epsilon(5337, b, n, 1e-6)
    assert barker_epsilon(972, b, n, 1e-6, envelope=False) <= 2.0
    assert barker_epsilon(973, b, n, 1e-6, envelope=False) > 2.0
