"""Tight Gaussian composition (theory §3): closed form, numerics, dp_accounting agreement."""

from __future__ import annotations

import math

import _accounting_reference as ref
import dp_accounting
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pymc_dp.accounting import (
    gaussian_capacity,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_epsilon_curve,
    gaussian_iterations,
    gaussian_log_delta,
    zcdp_capacity,
)
from pymc_dp.errors import InvalidParameterError

# ---------------------------------------------------------------------------------------------
# closed form against an independent high-precision implementation


@pytest.mark.parametrize(
    ("eps", "mu"),
    [
        (0.1, 1e-4),
        (0.5, 0.01),
        (1.0, 0.5),
        (1.0, 3.0),
        (2.0, 0.05),
        (6.0, 1.0),
        (12.0, 2.3),
        (12.0, 40.0),
        (50.0, 10.0),
        (100.0, 30.0),
        (200.0, 60.0),
        (200.0, 150.0),
        (200.0, 500.0),
        (0.0, 1e-8),
        (0.0, 2.0),
    ],
)
def test_delta_matches_high_precision_closed_form(eps: float, mu: float) -> None:
    expected = ref.delta(eps, mu)
    got = gaussian_delta(eps, mu)
    if expected > 1e-300:
        assert got == pytest.approx(float(expected), rel=1e-9)
    # log δ stays accurate where δ underflows
    assert gaussian_log_delta(eps, mu) == pytest.approx(float(ref.mp.log(expected)), rel=1e-9)


def test_large_epsilon_and_tiny_delta_are_finite_and_accurate() -> None:
    # ε up to 200: e^ε alone would overflow in the naive formula's e^ε · erfc(·) only at 710,
    # but the erfc term underflows long before; our form never forms either.
    eps = np.array([50.0, 100.0, 150.0, 200.0])
    for target in (1e-6, 1e-10, 1e-15):
        mus = gaussian_capacity(eps, target)
        assert np.all(np.isfinite(mus)) and np.all(mus > 0)
        deltas = gaussian_delta(eps, mus)
        # tight up to the 1e-9 relative safety margin on δ
        np.testing.assert_allclose(deltas, target, rtol=2e-9)
        assert np.all(deltas <= target)
        for e, m in zip(eps, mus, strict=True):
            assert float(ref.delta(e, m)) == pytest.approx(target, rel=1e-8)
    # beyond ε ≈ 709 e^ε itself overflows a double; the cancellation-free form does not need it
    for e, m in ((720.0, 400.0), (1000.0, 900.0)):
        assert gaussian_delta(e, m) == pytest.approx(float(ref.delta(e, m)), rel=1e-9)


def test_tiny_mu_no_cancellation() -> None:
    # δ(0; M) = 2Φ(√(M/2)) - 1 ≈ √(M/π) for tiny M: the two terms cancel to 1 part in 1e15
    for m in (1e-30, 1e-20, 1e-12):
        assert gaussian_delta(0.0, m) == pytest.approx(float(ref.delta(0.0, m)), rel=1e-10)


def test_vectorised_broadcasting() -> None:
    eps = np.array([[0.5], [1.0], [4.0]])
    mu = np.array([0.01, 0.1, 1.0, 10.0])
    out = gaussian_delta(eps, mu)
    assert out.shape == (3, 4)
    for i in range(3):
        for j in range(4):
            assert out[i, j] == pytest.approx(gaussian_delta(float(eps[i, 0]), float(mu[j])))
    assert isinstance(gaussian_delta(1.0, 0.1), float)
    assert gaussian_delta(1.0, 0.0) == 0.0
    eps_out = gaussian_epsilon(np.array([1e-3, 1e-6]), np.array([[0.1], [1.0]]))
    assert eps_out.shape == (2, 2)
    cap = gaussian_capacity(np.array([1.0, 2.0]), 1e-6)
    assert cap.shape == (2,) and cap[1] > cap[0]


# ---------------------------------------------------------------------------------------------
# capacity and iteration counts


@pytest.mark.parametrize(
    ("eps", "dlt"),
    [(0.1, 1e-3), (1.0, 1e-6), (2.0, 1e-6), (12.0, 1e-6), (1.0, 1e-12), (200.0, 1e-15)],
)
def test_capacity_matches_high_precision(eps: float, dlt: float) -> None:
    expected = ref.capacity(eps, dlt)
    got = gaussian_capacity(eps, dlt)
    assert got == pytest.approx(float(expected), rel=1e-10)
    assert gaussian_delta(eps, got) <= dlt
    assert gaussian_delta(eps, got * (1 + 1e-9)) > dlt
    # the zCDP capacity is feasible and smaller (thesis §6.1: tight accounting allows more)
    assert zcdp_capacity(eps, dlt) < got


def test_iterations_closed_form_and_guard() -> None:
    eps, dlt = 1.0, 1e-6
    mu = 1 / (2 * 50.0**2)
    k = gaussian_iterations(eps, dlt, mu)
    assert k == ref.tight_iterations(eps, dlt, ref.mp.mpf(mu))
    assert gaussian_delta(eps, k * mu) <= dlt < gaussian_delta(eps, (k + 1) * mu)
    # exactly on the capacity: μ = M*/k must allow k iterations, never k+1
    cap = gaussian_capacity(eps, dlt)
    for k0 in (1, 7, 1000, 123457):
        k1 = gaussian_iterations(eps, dlt, cap / k0)
        assert gaussian_delta(eps, k1 * (cap / k0)) <= dlt
        assert gaussian_delta(eps, (k1 + 1) * (cap / k0)) > dlt
        assert abs(k1 - k0) <= 1
    # spent mu
    k_half = gaussian_iterations(eps, dlt, mu, spent_mu=cap / 2)
    assert (
        gaussian_delta(eps, cap / 2 + k_half * mu)
        <= dlt
        < gaussian_delta(eps, cap / 2 + (k_half + 1) * mu)
    )
    assert gaussian_iterations(eps, dlt, mu, spent_mu=cap) == 0


# ---------------------------------------------------------------------------------------------
# agreement with dp_accounting's PLD accountant composing Gaussian events


def _dp_accounting_epsilon(z: float, k: int, dlt: float, discretization: float) -> float:
    acc = dp_accounting.pld.PLDAccountant(
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=discretization,
    )
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), k))
    return acc.get_epsilon(dlt)


_GRID = [
    (z, k, dlt)
    for z in (0.8, 3.0, 30.0, 300.0, 3000.0)
    for k in (1, 100, 10_000, 1_000_000)
    for dlt in (1e-3, 1e-6, 1e-9, 1e-12)
    if 1e-3 <= k / (2 * z * z) <= 30.0  # ε from ~0.02 to ~50: where 1e-3 relative is meaningful
]


@pytest.mark.parametrize(("z", "k", "dlt"), _GRID)
def test_agrees_with_dp_accounting_pld(z: float, k: int, dlt: float) -> None:
    mu = k / (2 * z * z)
    expected_hp = float(ref.epsilon(dlt, mu))  # independent closed form
    ours = gaussian_epsilon(dlt, mu)
    assert ours == pytest.approx(expected_hp, rel=1e-9)
    # dp_accounting's pessimistic grid error is about one grid step: make it ≪ 1e-3 relative
    h = 2e-5 * expected_hp
    theirs = _dp_accounting_epsilon(z, k, dlt, h)
    assert ours == pytest.approx(theirs, rel=1e-3)
    assert theirs >= ours * (1 - 1e-9)  # dp_accounting is pessimistic, never below the exact ε


def test_grid_covers_the_required_range() -> None:
    assert {k for _, k, _ in _GRID} == {1, 100, 10_000, 1_000_000}
    assert {d for _, _, d in _GRID} == {1e-3, 1e-6, 1e-9, 1e-12}
    assert len({z for z, _, _ in _GRID}) >= 4
    assert len(_GRID) >= 30


# ---------------------------------------------------------------------------------------------
# properties

_eps = st.floats(min_value=1e-3, max_value=200.0, allow_nan=False)
_mu = st.floats(min_value=1e-6, max_value=1e3, allow_nan=False)
_delta = st.floats(min_value=1e-15, max_value=0.5, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(eps=_eps, mu=_mu, factor=st.floats(min_value=1.001, max_value=10.0))
def test_delta_increases_with_mu(eps: float, mu: float, factor: float) -> None:
    lo, hi = gaussian_log_delta(eps, mu), gaussian_log_delta(eps, mu * factor)
    assume(np.isfinite(lo) and lo > -700)
    assert hi > lo


@settings(max_examples=200, deadline=None)
@given(eps=_eps, mu=_mu, step=st.floats(min_value=1e-3, max_value=10.0))
def test_delta_decreases_with_epsilon(eps: float, mu: float, step: float) -> None:
    lo, hi = gaussian_log_delta(eps + step, mu), gaussian_log_delta(eps, mu)
    assume(np.isfinite(lo) and hi > -700)
    assert lo < hi


@settings(max_examples=150, deadline=None)
@given(eps=_eps, ratio=st.floats(min_value=0.2, max_value=5.0))
def test_epsilon_inverts_delta(eps: float, ratio: float) -> None:
    mu = eps * ratio  # keeps δ in (1e-300, 1): the round trip is then well defined
    d = gaussian_delta(eps, mu)
    assume(1e-300 < d < 0.999)
    back = gaussian_epsilon(d, mu)
    # conservative (never below the true ε, up to float noise) and tight in δ up to the 1e-9
    # relative safety margin; in ε that margin is ~1e-7 relative where δ(ε) is flat
    assert back >= eps * (1 - 1e-12)
    assert back == pytest.approx(eps, rel=1e-6, abs=1e-9)
    assert d * (1 - 3e-9) <= gaussian_delta(back, mu) <= d


@settings(max_examples=60, deadline=None)
@given(
    dlt=st.floats(min_value=1e-12, max_value=0.5),
    mu_1=st.floats(min_value=1e-9, max_value=1.0),
    start=st.integers(0, 5000),
)
def test_the_epsilon_curve_of_a_chain_is_the_scalar_epsilon_at_each_iteration(dlt, mu_1, start):
    # the per-iteration stat: one vectorised solve for a block of iterations k·μ₁
    ks = np.arange(start, start + 40, dtype=float)
    curve = gaussian_epsilon_curve(dlt, ks * mu_1)
    scalar = np.array([gaussian_epsilon(dlt, float(k * mu_1)) for k in ks])
    np.testing.assert_allclose(curve, scalar, rtol=1e-9, atol=1e-15)
    assert np.all(np.diff(curve) >= 0)
    for k, e in zip(ks, curve, strict=True):  # never an ε whose δ exceeds the target
        assert gaussian_delta(e, k * mu_1) <= dlt


@settings(max_examples=150, deadline=None)
@given(eps=_eps, dlt=_delta)
def test_capacity_round_trip(eps: float, dlt: float) -> None:
    m = gaussian_capacity(eps, dlt)
    assert gaussian_delta(eps, m) <= dlt
    assert gaussian_delta(eps, m) == pytest.approx(dlt, rel=1e-8)
    assert gaussian_epsilon(dlt, m) == pytest.approx(eps, rel=1e-7)


@settings(max_examples=200, deadline=None)
@given(
    eps=st.floats(min_value=0.01, max_value=50.0),
    dlt=st.floats(min_value=1e-12, max_value=0.1),
    mu=st.floats(min_value=1e-7, max_value=5.0),
)
def test_iterations_never_overshoot(eps: float, dlt: float, mu: float) -> None:
    k = gaussian_iterations(eps, dlt, mu)
    assert gaussian_delta(eps, k * mu) <= dlt
    # tight up to the deliberate relative safety margin of 1e-9 on δ (float error in δ must
    # never overshoot): hypothesis found k + 1 inside that margin (ε = 21.5, δ = 0.0186,
    # μ = 1e-7, so k ≈ 1.2e8 and one more iteration moves δ by 7e-11 relative)
    assert gaussian_delta(eps, (k + 1) * mu) > dlt * (1 - 2e-9)


@pytest.mark.parametrize(("eps", "dlt", "mu"), [(21.542117170925284, 0.01856490104816571, 1e-7)])
def test_iterations_tight_within_the_safety_margin_regression(eps, dlt, mu):
    k = gaussian_iterations(eps, dlt, mu)
    assert gaussian_delta(eps, k * mu) <= dlt * (1 - 1e-9) < gaussian_delta(eps, (k + 2) * mu)


# ---------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: gaussian_delta(-1.0, 1.0), "epsilon must be finite and >= 0"),
        (lambda: gaussian_delta(1.0, -1.0), "mu .* must be finite and >= 0"),
        (lambda: gaussian_delta(np.inf, 1.0), "epsilon"),
        (lambda: gaussian_delta(1.0, np.nan), "mu contains NaN"),
        (lambda: gaussian_epsilon(0.0, 1.0), "delta must lie strictly between 0 and 1"),
        (lambda: gaussian_epsilon(1.0, 1.0), "delta must lie strictly between 0 and 1"),
        (lambda: gaussian_capacity(0.0, 1e-6), "epsilon must be finite and > 0"),
        (lambda: gaussian_capacity(1.0, 2.0), "delta must lie strictly between 0 and 1"),
        (lambda: gaussian_iterations(1.0, 1e-6, 0.0), "mu must be a positive finite number"),
        (lambda: gaussian_iterations(1.0, 1e-6, math.inf), "mu must be a positive finite"),
    ],
)
def test_errors_name_the_argument(call, match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        call()


@settings(max_examples=80, deadline=None)
@given(
    dlt=st.floats(min_value=1e-300, max_value=0.9),
    log_mu=st.floats(min_value=-40.0, max_value=10.0),
)
def test_the_newton_phase_keeps_a_valid_bracket(dlt, log_mu):
    # each end only ever moves to a point whose side was checked: log δ(lo) > target ≥ log δ(hi)
    from pymc_dp.accounting import gaussian

    m = np.exp(log_mu + np.linspace(0.0, 3.0, 64))
    log_target = math.log(dlt * (1.0 - gaussian._DELTA_MARGIN))
    lo = np.zeros_like(m)
    hi = m + 2.0 * np.sqrt(m * -log_target)
    keep = gaussian._log_delta_array(hi, m) <= log_target  # the zCDP bracket (as the curve)
    keep &= gaussian._log_delta_array(lo, m) > log_target
    assume(np.any(keep))
    lo, hi, m = lo[keep], hi[keep], m[keep]
    new_lo, new_hi = gaussian._newton_bracket(lo, hi, m, log_target)
    assert np.all((lo <= new_lo) & (new_lo < new_hi) & (new_hi <= hi))
    assert np.all(gaussian._log_delta_array(new_lo, m) > log_target)
    assert np.all(gaussian._log_delta_array(new_hi, m) <= log_target)


def test_an_epsilon_that_brent_leaves_far_below_its_root_is_found_at_once():
    # brentq's absolute tolerance stopped 10⁷ ulps short of a root near 5·10⁻⁸; stepping up one
    # float at a time took minutes
    eps = gaussian_epsilon(1e-12, 1e-16)
    assert gaussian_delta(eps, 1e-16) <= 1e-12
    assert gaussian_delta(math.nextafter(eps, 0.0), 1e-16) > 1e-12 * (1 - 1e-9)
