"""zCDP comparator (theory §3; thesis Thm 2.5, 3.1)."""

from __future__ import annotations

import _accounting_reference as ref
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymc_dp.accounting import (
    gaussian_capacity,
    zcdp_capacity,
    zcdp_epsilon,
    zcdp_iterations,
)
from pymc_dp.errors import InvalidParameterError


@pytest.mark.parametrize(("eps", "dlt"), [(1e-6, 1e-6), (0.1, 1e-3), (1.0, 1e-6), (12.0, 1e-6)])
def test_capacity_formula(eps: float, dlt: float) -> None:
    assert zcdp_capacity(eps, dlt) == pytest.approx(float(ref.zcdp_rho(eps, dlt)), rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(eps=st.floats(1e-4, 100.0), dlt=st.floats(1e-15, 0.5))
def test_capacity_inverts_conversion_and_is_below_tight(eps: float, dlt: float) -> None:
    rho = zcdp_capacity(eps, dlt)
    assert zcdp_epsilon(rho, dlt) == pytest.approx(eps, rel=1e-10)
    assert rho <= gaussian_capacity(eps, dlt)


def test_vectorised() -> None:
    out = zcdp_capacity(np.array([0.5, 1.0, 2.0]), 1e-6)
    assert out.shape == (3,) and np.all(np.diff(out) > 0)
    assert zcdp_epsilon(np.array([0.0, 1.0]), 1e-6)[0] == 0.0


@settings(max_examples=100, deadline=None)
@given(eps=st.floats(0.01, 50.0), dlt=st.floats(1e-12, 0.1), mu=st.floats(1e-7, 5.0))
def test_iterations_never_overshoot(eps: float, dlt: float, mu: float) -> None:
    k = zcdp_iterations(eps, dlt, mu)
    assert zcdp_epsilon(k * mu, dlt) <= eps < zcdp_epsilon((k + 1) * mu, dlt)
    assert (
        k == int(ref.mp.floor(ref.zcdp_rho(eps, dlt) / ref.mp.mpf(mu)))
        or abs(
            float(ref.zcdp_rho(eps, dlt) / ref.mp.mpf(mu))
            - round(float(ref.zcdp_rho(eps, dlt) / mu))
        )
        < 1e-6
    )


def test_errors() -> None:
    with pytest.raises(InvalidParameterError, match="epsilon must be finite and > 0"):
        zcdp_capacity(0.0, 1e-6)
    with pytest.raises(InvalidParameterError, match="delta must lie strictly between 0 and 1"):
        zcdp_capacity(1.0, 0.0)
    with pytest.raises(InvalidParameterError, match="rho must be finite and >= 0"):
        zcdp_epsilon(-1.0, 1e-6)
    with pytest.raises(InvalidParameterError, match="mu must be a positive finite number"):
        zcdp_iterations(1.0, 1e-6, 0.0)
