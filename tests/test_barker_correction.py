"""The correction distribution V_corr of the DP Barker test (theory §4.4)."""

from __future__ import annotations

import json
import math
from importlib.resources import files

import numpy as np
import pytest
from scipy import special

from pymc_dp.barker_correction import BarkerCorrection
from pymc_dp.errors import InvalidParameterError

C = 2.0
N_DRAWS = 1_000_000
# Tolerance of the Monte Carlo check. The sup distance between the empirical CDF of N draws
# and the logistic CDF is at most (sup distance of the true CDF of N(0, C) + V_corr to the
# logistic, < 1e-3 by requirement, 5.9e-4 shipped) + (sup distance of the empirical CDF to
# its true CDF). By the Dvoretzky–Kiefer–Wolfowitz inequality (Massart's constant) the
# latter exceeds sqrt(ln(2/α) / (2N)) with probability ≤ α; α = 0.001 gives 1.95e-3 for
# N = 10⁶. With a fixed seed the test is deterministic; the bound says a seed failing it
# would be a 1-in-1000 event if the approximation were as good as claimed.
DKW_BAND = math.sqrt(math.log(2 / 0.001) / (2 * N_DRAWS))
MC_TOLERANCE = 1e-3 + DKW_BAND
GRID = np.linspace(-40.0, 40.0, 20001)


def shipped_json() -> dict:
    resource = files("pymc_dp") / "data" / "barker_correction.json"
    return json.loads(resource.read_text(encoding="utf-8"))


def empirical_sup_error(draws: np.ndarray, points: np.ndarray) -> float:
    """max over ``points`` of |empirical CDF − logistic CDF| (right-continuous ECDF)."""
    ecdf = np.searchsorted(np.sort(draws), points, side="right") / draws.size
    return float(np.max(np.abs(ecdf - special.expit(points))))


@pytest.mark.parametrize("normal_variance", [1.0, 1.5, 2.0])
def test_shipped_fits_meet_the_error_bound(normal_variance):
    correction = BarkerCorrection.load(normal_variance)
    assert correction.normal_variance == normal_variance
    recomputed = correction.max_cdf_error(GRID)
    assert recomputed < 1e-3
    # recomputed from the stored parameters, not copied from the stored cdf_error
    assert abs(recomputed - correction.cdf_error) < 1e-6
    assert correction.max_cdf_error() == pytest.approx(recomputed, abs=1e-12)


def test_default_fit_is_for_c_2_and_the_error_grid_is_the_recorded_one():
    correction = BarkerCorrection.load()
    assert correction.normal_variance == C
    assert correction.cdf_error < 1e-3
    grid = shipped_json()["error_grid"]
    np.testing.assert_array_equal(np.linspace(grid["start"], grid["stop"], grid["num"]), GRID)
    # a finer grid does not uncover a larger error between the grid points
    fine = np.linspace(-40.0, 40.0, 200_001)
    assert correction.max_cdf_error(fine) < correction.cdf_error + 1e-6


def test_monte_carlo_draws_match_the_logistic():
    correction = BarkerCorrection.load(C)
    rng = np.random.default_rng(20240517)
    draws = math.sqrt(C) * rng.standard_normal(N_DRAWS) + correction.sample(rng, N_DRAWS)
    points = np.linspace(-12.0, 12.0, 2401)
    assert empirical_sup_error(draws, points) < MC_TOLERANCE
    # the sampler draws from the stated mixture: sample variance matches
    # C + Σ_j w_j (m_j² + s_j²) (standard error ≈ 0.01). This is not π²/3: the fit matches
    # the CDF in sup norm, not the moments (3.34 vs 3.29 for C = 2).
    w, m, s = correction.weights, correction.means, correction.sds
    assert np.var(draws) == pytest.approx(C + w @ (m**2 + s**2), abs=0.05)


@pytest.mark.parametrize(
    ("label", "extra_variance"),
    [("N(0, C) only", 0.0), ("moment-matched Gaussian", math.pi**2 / 3 - C)],
)
def test_negative_controls_are_clearly_further_from_the_logistic(label, extra_variance):
    # Gaussian noise in place of V_corr: N(0, C + extra) against the logistic CDF.
    points = np.linspace(-12.0, 12.0, 2401)
    sd = math.sqrt(C + extra_variance)
    analytic = float(np.max(np.abs(special.ndtr(points / sd) - special.expit(points))))
    assert analytic > 2 * MC_TOLERANCE, label
    rng = np.random.default_rng(7)
    draws = sd * rng.standard_normal(N_DRAWS)
    assert empirical_sup_error(draws, points) > MC_TOLERANCE, label


@pytest.mark.parametrize("normal_variance", [1.0, 1.5, 2.0])
def test_the_mixture_is_symmetric(normal_variance):
    correction = BarkerCorrection.load(normal_variance)
    w, m, s = correction.weights, correction.means, correction.sds
    assert w.shape == m.shape == s.shape
    assert np.all(w >= 0)
    assert w.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(s > 0)
    unmatched = list(range(w.size))
    while unmatched:
        j = unmatched.pop(0)
        if m[j] == 0:
            continue
        partners = [k for k in unmatched if m[k] == -m[j] and w[k] == w[j] and s[k] == s[j]]
        assert partners, f"component {j} (mean {m[j]}) has no mirror image"
        unmatched.remove(partners[0])
    # hence the CDF satisfies F(−x) = 1 − F(x)
    x = np.linspace(0.0, 20.0, 201)
    np.testing.assert_allclose(correction.cdf(-x), 1 - correction.cdf(x), atol=1e-14)


def test_sample_uses_only_the_generator_given():
    correction = BarkerCorrection.load(C)
    legacy_before = np.random.get_state()[1].copy()  # noqa: NPY002
    a = correction.sample(np.random.default_rng(11), 1000)
    b = correction.sample(np.random.default_rng(11), 1000)
    np.testing.assert_array_equal(a, b)
    # the legacy global generator is neither used nor advanced
    np.testing.assert_array_equal(np.random.get_state()[1], legacy_before)  # noqa: NPY002
    assert not np.array_equal(a, correction.sample(np.random.default_rng(12), 1000))
    # consecutive draws advance the generator
    rng = np.random.default_rng(3)
    assert correction.sample(rng) != correction.sample(rng)


@pytest.mark.parametrize(("size", "shape"), [(5, (5,)), ((2, 3), (2, 3)), ((0,), (0,))])
def test_sample_shapes_follow_size(size, shape):
    draws = BarkerCorrection.load(C).sample(np.random.default_rng(0), size)
    assert isinstance(draws, np.ndarray)
    assert draws.shape == shape
    assert draws.dtype == np.float64


def test_sample_without_size_returns_a_float():
    draw = BarkerCorrection.load(C).sample(np.random.default_rng(0))
    assert isinstance(draw, float)


def test_parameters_are_read_only():
    correction = BarkerCorrection.load(C)
    with pytest.raises(ValueError):
        correction.weights[0] = 0.5
    with pytest.raises(AttributeError):
        correction.normal_variance = 1.0  # type: ignore[misc]


def test_unsupported_normal_variance_names_the_available_values():
    with pytest.raises(InvalidParameterError) as info:
        BarkerCorrection.load(3.0)
    message = str(info.value)
    assert "3.0" in message
    for c in BarkerCorrection.available_normal_variances():
        assert repr(c) in message
    assert "fit_barker_correction.py" in message
    assert BarkerCorrection.available_normal_variances() == (1.0, 1.5, 2.0)


def test_invalid_parameters_are_rejected():
    with pytest.raises(InvalidParameterError, match="sum to 1"):
        BarkerCorrection(2.0, weights=[0.5, 0.6], means=[1.0, -1.0], sds=[0.1, 0.1])
    with pytest.raises(InvalidParameterError, match="same length"):
        BarkerCorrection(2.0, weights=[1.0], means=[0.0, 1.0], sds=[0.1])
    with pytest.raises(InvalidParameterError, match="normal_variance"):
        BarkerCorrection(0.0, weights=[1.0], means=[0.0], sds=[0.1])
