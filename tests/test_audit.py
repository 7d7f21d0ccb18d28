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
    # log(0.990 / 0.0095) = 4.64 is the most: 500 of 500 against 0 of 500 at three sets' level
    assert epsilon_lower_bound(x, y, delta=DELTA) > 4.5
    assert epsilon_lower_bound(y, x, delta=DELTA) > 4.5  # either direction
    same = rng.normal(0, 1, 1000)
    assert epsilon_lower_bound(same, rng.normal(0, 1, 1000), delta=DELTA) < 0.5
    # bounded support shows: uniform noise shifted by a third of its width
    u = rng.uniform(-1, 1, 2000)
    assert epsilon_lower_bound(u, rng.uniform(-1, 1, 2000) + 0.6, delta=DELTA) > 3


@pytest.mark.slow
def test_a_few_sets_keep_the_bound_off_the_edge_of_the_first_halfs_sample():
    # bounded support shifted by a tenth of its width (true ε infinite for δ < 0.1): the set
    # that separates the first halves best is often a threshold at the edge of the other
    # sample, which the second half's runs then enter. Over the first 64 seeds one set gave
    # 1.91–2.27 in seeds 43, 47 and 60 (median 3.04); the three best sets, Bonferroni-
    # corrected, 2.47 at the lowest of 200 seeds (median 2.79)
    one, three = [], []
    for seed in range(40, 64):
        rng = np.random.default_rng(seed)
        x, y = rng.uniform(0, 1, 2000), rng.uniform(0, 1, 2000) + 0.1
        one.append(epsilon_lower_bound(x, y, delta=DELTA, sets=1))
        three.append(epsilon_lower_bound(x, y, delta=DELTA))
    assert min(one) < 2.3  # the negative control: one set falls off the edge
    assert min(three) > 2.4


def test_bad_arguments_are_refused():
    with pytest.raises(InvalidParameterError, match="20 runs"):
        epsilon_lower_bound(np.zeros(5), np.zeros(5), delta=DELTA)
    with pytest.raises(InvalidParameterError, match="confidence"):
        epsilon_lower_bound(np.zeros(50), np.zeros(50), delta=DELTA, confidence=1.5)
    for sets in (0, 1.5, True):
        with pytest.raises(InvalidParameterError, match="sets must be a positive integer"):
            epsilon_lower_bound(np.zeros(50), np.zeros(50), delta=DELTA, sets=sets)
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
    # against claims of 1.1–2.0 there) show with fewer. DPHMC's uniform noise is the cell
    # closest to its claim: with the one best set of the first half its bound fell below the
    # claim in about 1 audit in 100 (1.75 in a CI run, 1.82 the lowest of 181 here); with the
    # three best (the default) it was 2.40–3.05 in 101 audits
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


@pytest.mark.parametrize("k", [1, 3])
def test_each_evaluated_set_is_bounded_at_the_bonferroni_level(monkeypatch, k):
    # k sets evaluated: 2k Clopper–Pearson bounds, each failing with probability (1 − c)/2k,
    # so that all hold together with probability c (a level of (1 + c)/2 each would not)
    from pymc_dp import audit

    levels = []
    real = audit._clopper_pearson

    def recording(count, n, level):
        levels.append(level)
        return real(count, n, level)

    monkeypatch.setattr(audit, "_clopper_pearson", recording)
    rng = np.random.default_rng(3)
    x, y = rng.normal(0, 1, 400), rng.normal(1, 1, 400)
    chosen = [(1.0, lambda s, t=t: s > t, t > 0) for t in (-0.5, 0.0, 0.5)[:k]]
    audit._evaluate(x, y, chosen, DELTA, 0.9)
    assert len(levels) == 2 * k
    assert levels == pytest.approx([1 - 0.1 / (2 * k)] * (2 * k))


def test_a_grid_of_starts_is_audited_with_its_best_sets():
    import pymc_dp
    from pymc_dp.audit import _audit_data, _audit_model, audit_step

    data, neighbour = _audit_data()
    starts = [{"mu": np.array(-0.3)}, {"mu": np.array(0.3)}]

    def make_step(b):
        return pymc_dp.DPSGLD(budget=b, step_size=1.0, grad_clip=2.0, batch_size=100)

    with broken("no noise"):  # every run of a dataset lands on one point: the sets see it
        result = audit_step(
            _audit_model, data, neighbour, make_step, runs=60, start=starts, pilot_runs=30
        )
    # two sets separate the pilots, one each way (three would need a third that shows
    # something): 60 of 60 against 0 of 60 at 1 − 0.05/4 gives log(0.930 / 0.070) = 2.58
    assert result.start in starts and result.epsilon_lower_bound == pytest.approx(2.58, abs=0.01)
    with pytest.raises(InvalidParameterError, match="sets must be a positive integer"):
        audit_step(_audit_model, data, neighbour, make_step, runs=60, start=starts, sets=0)
