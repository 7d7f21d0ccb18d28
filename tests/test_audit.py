"""The privacy audit: sound on the Gaussian mechanism, every step passes, broken ones are caught."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit

from pymc_dp.accounting.gaussian import gaussian_epsilon
from pymc_dp.audit import SCENARIOS, audit_scenario, epsilon_lower_bound, replace_row
from pymc_dp.barker_correction import BarkerCorrection
from pymc_dp.errors import InvalidParameterError
from pymc_dp.experiments.broken import (
    BROKEN_VARIANTS,
    barker_accept_probability,
    broken,
    one_bit_audit_limit,
)

DELTA = 1e-5


def test_the_bound_is_sound_on_the_gaussian_mechanism():
    # N(0, 1) against N(Δ, 1): the Gaussian mechanism with μ = Δ²/2 (PLD parameter)
    rng = np.random.default_rng(1)
    for shift in (0.5, 1.0, 2.0):
        true_epsilon = float(gaussian_epsilon(DELTA, shift**2 / 2))
        for _ in range(5):
            x, y = rng.normal(0, 1, 2000), rng.normal(shift, 1, 2000)
            assert epsilon_lower_bound(x, y, delta=DELTA) <= true_epsilon


def test_the_bound_sees_separated_outputs_and_nothing_in_identical_ones():
    rng = np.random.default_rng(2)
    x, y = rng.normal(0, 1, 1000), rng.normal(12, 1, 1000)
    assert epsilon_lower_bound(x, y, delta=DELTA) > 4.5  # log(500 / 3.7) = 4.9 is the most
    assert epsilon_lower_bound(y, x, delta=DELTA) > 4.5  # either direction
    same = rng.normal(0, 1, 1000)
    assert epsilon_lower_bound(same, rng.normal(0, 1, 1000), delta=DELTA) < 0.5
    # bounded support shows: uniform noise shifted by a third of its width
    u = rng.uniform(-1, 1, 2000)
    assert epsilon_lower_bound(u, rng.uniform(-1, 1, 2000) + 0.6, delta=DELTA) > 3


def test_bad_arguments_are_refused():
    with pytest.raises(InvalidParameterError, match="20 runs"):
        epsilon_lower_bound(np.zeros(5), np.zeros(5), delta=DELTA)
    with pytest.raises(InvalidParameterError, match="confidence"):
        epsilon_lower_bound(np.zeros(50), np.zeros(50), delta=DELTA, confidence=1.5)
    with pytest.raises(InvalidParameterError, match="kind"):
        with broken("a little broken"):
            pass
    with pytest.raises(InvalidParameterError, match="name"):
        audit_scenario("NUTS")
    assert replace_row(np.zeros(3), 1, 5.0).tolist() == [0.0, 5.0, 0.0]


@pytest.mark.slow
@pytest.mark.parametrize("name", SCENARIOS)
def test_every_step_passes_its_audit(name):
    result = audit_scenario(name, runs=600)  # the bounds were 0–0.14 with 1000 runs
    assert 0.5 < result.claimed_epsilon < 4.5  # a claim the audit could refute
    assert not result.violated, str(result)


#: Cells of the audit table (docs/security.md) that no audit of this size can show. DP Barker
#: releases one bit per iteration, and its correction V_corr is nearly discrete (atoms at 0,
#: ±2.95, ±9.23): with a tenth of the noise, or uniform noise, the leak beyond the claim sits on
#: events of probability ~1e-3 or less (test_the_unflagged_barker_variants_hide_in_rare_events).
NOT_SHOWN = {("DPBarker", "noise / 10"), ("DPBarker", "uniform noise")}
FLAGGED = [
    (name, kind) for name in SCENARIOS for kind in BROKEN_VARIANTS if (name, kind) not in NOT_SHOWN
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "kind"), FLAGGED)
def test_a_broken_mechanism_is_flagged(name, kind):
    # the subtle leaks need the 2000 runs of the documented table (with 1000, DPHMC's uniform
    # noise showed 1.37–2.48 against its claim of 1.88); the gross ones (bounds of 3.3–5.6
    # against claims of 1.1–2.0 there) show with fewer
    runs = 2000 if kind in ("noise / 10", "uniform noise") or name == "DPBarker" else 600
    with broken(kind):
        result = audit_scenario(name, runs=runs)
    assert result.violated, str(result)


def test_a_one_bit_audit_limit_of_threshold_bits_is_the_gaussian_mechanisms_epsilon():
    # the bits 1{N(0,1) > t} against 1{N(μ,1) > t} over all t carry the whole Gaussian
    # mechanism's privacy profile (its optimal tests are thresholds)
    from scipy import special

    t = np.linspace(-10, 14, 48001)
    for shift in (0.5, 1.0, 2.0):
        true, shown = one_bit_audit_limit(
            special.ndtr(-t), special.ndtr(shift - t), runs=1000, delta=DELTA
        )
        assert true == pytest.approx(float(gaussian_epsilon(DELTA, shift**2 / 2)), rel=2e-3)
        assert 0 < shown < true


def test_the_barker_accept_probability_is_the_logistic_test_as_built():
    lam = np.linspace(-12, 12, 241)
    error = BarkerCorrection.load(2.0).cdf_error
    built = barker_accept_probability("as built", lam)
    assert np.max(np.abs(built - expit(lam))) <= error + 1e-12
    # a tenth of the noise makes the decision nearly a step at each atom of V_corr
    tenth = barker_accept_probability("noise / 10", lam)
    assert tenth[lam == -1.0] < 0.07 < 0.93 < tenth[lam == 1.0]
    uniform = barker_accept_probability("uniform noise", np.array([-2.5, 0.0, 2.5]))
    assert uniform[1] == pytest.approx(0.5, abs=1e-9) and uniform[0] < expit(-2.5)


def test_the_unflagged_barker_variants_hide_in_rare_events():
    # DP Barker's audit scenario: full batch (n = b = 100), one iteration, claimed ε 1.40; a
    # neighbour moves λ by at most 2/√b = 0.2. The exact accept probabilities over every λ
    # (every start an auditor could pick) give the variant's true ε and the best bound an audit
    # with the expected counts could show.
    claim = 1.4046644721406356  # BarkerCost(100, 100).epsilon(1e-5, 1), checked below
    from pymc_dp.accounting.costs import BarkerCost

    assert BarkerCost(100, 100).epsilon(DELTA, 1) == pytest.approx(claim)
    lam = np.linspace(-15, 15, 30001)

    def limits(kind, runs):
        p = barker_accept_probability(kind, lam, batch_variance=0.01)
        q = barker_accept_probability(kind, lam + 0.2, batch_variance=0.01)
        return one_bit_audit_limit(p, q, runs=runs, delta=DELTA)

    assert limits("as built", 10**6)[0] < 0.3 < claim  # the claim holds with room
    for kind in ("noise / 10", "uniform noise"):
        true, shown = limits(kind, 1000)
        assert true > claim  # a real violation ...
        assert shown < claim  # ... that 1000 runs per dataset cannot show
    assert limits("noise / 10", 10**5)[1] > claim  # 10⁵ runs would
    assert limits("uniform noise", 10**6)[1] < claim  # 10⁶ would not


def test_broken_restores_the_mechanisms():
    from pymc_dp import noise, oracle, releases

    before = (
        noise.NoiseSource.standard_normal,
        oracle.RowLikelihood.clipped_grad_sum,
        oracle.RowLikelihood.clipped_llr_sum,
        releases.clip_ratio,
    )
    for kind in BROKEN_VARIANTS:
        with broken(kind):
            pass
    after = (
        noise.NoiseSource.standard_normal,
        oracle.RowLikelihood.clipped_grad_sum,
        oracle.RowLikelihood.clipped_llr_sum,
        releases.clip_ratio,
    )
    assert before == after
    assert noise.NoiseSource(0).standard_normal(1000).std() > 0.9


def test_seeded_noise_is_refused_by_the_audit():
    import pymc_dp
    from pymc_dp.audit import _audit_data, _audit_model, audit_step

    data, neighbour = _audit_data()
    with pytest.raises(InvalidParameterError, match="noise_rng"):
        audit_step(
            _audit_model,
            data,
            neighbour,
            lambda b: pymc_dp.DPSGLD(
                budget=b, step_size=1.0, grad_clip=2.0, batch_size=100, noise_rng=1
            ),
            runs=20,
        )
