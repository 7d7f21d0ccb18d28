"""The privacy audit: sound on the Gaussian mechanism, every step passes, broken ones are caught."""

from __future__ import annotations

import numpy as np
import pytest

from pymc_dp.accounting.gaussian import gaussian_epsilon
from pymc_dp.audit import SCENARIOS, audit_scenario, epsilon_lower_bound, replace_row
from pymc_dp.errors import InvalidParameterError
from pymc_dp.experiments.broken import BROKEN_VARIANTS, broken

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


#: Cells of the audit table (docs/security.md) that the built-in scenarios cannot show. All of
#: them are steps that release one accept/reject bit per iteration: uniform noise changes that
#: bit only near the edge of its support; the minibatch penalty and DP Barker with their noise
#: removed still subtract the noise's correction (σ²/2, the logistic correction's means), which
#: makes the same decisions on both datasets in these scenarios.
NOT_SHOWN = {
    ("DPPenalty", "uniform noise"),
    ("DPPenalty (minibatch)", "no noise"),
    ("DPPenalty (minibatch)", "noise / 10"),
    ("DPPenalty (minibatch)", "uniform noise"),
    *(("DPBarker", kind) for kind in BROKEN_VARIANTS),
}
FLAGGED = [
    (name, kind) for name in SCENARIOS for kind in BROKEN_VARIANTS if (name, kind) not in NOT_SHOWN
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "kind"), FLAGGED)
def test_a_broken_mechanism_is_flagged(name, kind):
    # the subtle leaks need the full 1000 runs of the documented table; the gross ones (bounds
    # of 3.2–4.9 against claims of 1.1–2.3 there) show with fewer
    runs = 1000 if kind in ("noise / 10", "uniform noise") else 600
    with broken(kind):
        result = audit_scenario(name, runs=runs)
    assert result.violated, str(result)


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
