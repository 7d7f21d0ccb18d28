"""Subsampled Gaussian (without replacement, substitute relation): PLD accounting, conventions."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import NeighboringRelation as NR
from scipy import integrate

from pymc_dp.accounting import (
    GaussianCost,
    SubsampledGaussianCost,
    compose_epsilon,
    gaussian_epsilon,
    max_iterations,
    rdp_to_epsilon,
    subsampled_gaussian_delta,
    subsampled_gaussian_epsilon,
)
from pymc_dp.accounting.subsampled import _symmetric_pld_and_mean
from pymc_dp.errors import InvalidParameterError

DELTA = 1e-6


def _pld_eps(
    event: dp_accounting.DpEvent, relation: NR, delta: float = DELTA, h: float = 1e-4
) -> float:
    acc = dp_accounting.pld.PLDAccountant(relation, value_discretization_interval=h)
    acc.compose(event)
    return acc.get_epsilon(delta)


# ---------------------------------------------------------------------------------------------
# neighbouring-relation conventions (google/differential-privacy#378), pinned


@pytest.mark.parametrize(("z", "k"), [(1.0, 1), (3.0, 50), (20.0, 2000)])
def test_our_noise_multiplier_is_gaussian_event_under_add_or_remove(z: float, k: int) -> None:
    """z = σ/Δ (Δ: substitute sensitivity) ⇔ GaussianDpEvent(z) under ADD_OR_REMOVE_ONE."""
    mu = k / (2 * z * z)
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), k)
    ours = gaussian_epsilon(DELTA, mu)
    h = 1e-5 * ours  # grid fine enough for a 1e-3 relative comparison
    assert _pld_eps(event, NR.ADD_OR_REMOVE_ONE, h=h) == pytest.approx(ours, rel=1e-3)
    # REPLACE_ONE moves the mean by twice the event's sensitivity: GaussianDpEvent(2z) there ...
    event2 = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2 * z), k)
    assert _pld_eps(event2, NR.REPLACE_ONE, h=h) == pytest.approx(ours, rel=1e-3)
    # ... and GaussianDpEvent(z) under REPLACE_ONE is four times our mu
    four = gaussian_epsilon(DELTA, 4 * mu)
    assert _pld_eps(event, NR.REPLACE_ONE, h=1e-5 * four) == pytest.approx(four, rel=1e-3)


def test_rdp_accountant_wor_uses_replace_one_sensitivity() -> None:
    """dp_accounting's RDP accountant (WOR, REPLACE_ONE) reads the multiplier as our z."""
    z, k, n = 2.0, 100, 1000
    orders = np.arange(2, 200)
    acc = dp_accounting.rdp.RdpAccountant(orders=list(orders), neighboring_relation=NR.REPLACE_ONE)
    acc.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.SampledWithoutReplacementDpEvent(n, n, dp_accounting.GaussianDpEvent(z)),
            k,
        )
    )
    expected, _ = rdp_to_epsilon(orders, k * orders / (2 * z * z), DELTA)
    assert acc.get_epsilon(DELTA) == pytest.approx(expected, rel=1e-9)


# ---------------------------------------------------------------------------------------------
# the dominating pair


def test_full_batch_is_the_plain_gaussian() -> None:
    for z, k in [(1.0, 10), (5.0, 1000)]:
        assert subsampled_gaussian_epsilon(z, 1.0, k, DELTA) == gaussian_epsilon(
            DELTA, k / (2 * z * z)
        )
        # the symmetrisation itself (not the q = 1 shortcut) tends to the Gaussian as q -> 1
        near = subsampled_gaussian_epsilon(z, 1 - 1e-9, k, DELTA)
        assert near == pytest.approx(gaussian_epsilon(DELTA, k / (2 * z * z)), rel=2e-3)


def _hockey_stick(p, q, eps: float) -> float:
    f = lambda x: max(p(x) - math.exp(eps) * q(x), 0.0)  # noqa: E731
    return integrate.quad(f, -40, 40, points=[0.0, 1.0], limit=400, epsabs=1e-14)[0]


@pytest.mark.parametrize(("z", "q"), [(1.0, 0.1), (2.0, 0.3)])
def test_one_step_profile_is_max_of_remove_and_add(z: float, q: float) -> None:
    """C_q(G_{1/z}) has the (ε, δ) profile max(δ_remove, δ_add) (Dong, Roth & Su, Thm 9)."""
    d = 1.0 / z  # sensitivity in units of σ
    c = 1.0 / math.sqrt(2.0 * math.pi)
    p0 = lambda x: c * math.exp(-0.5 * x * x)  # noqa: E731
    mix = lambda x: (1 - q) * p0(x) + q * p0(x - d)  # noqa: E731
    for eps in (0.0, 0.05, 0.3, 1.0):
        expected = max(_hockey_stick(mix, p0, eps), _hockey_stick(p0, mix, eps))
        got = subsampled_gaussian_delta(z, q, 1, eps)
        assert got >= expected - 1e-10  # pessimistic discretisation: never below (quad error)
        assert got == pytest.approx(expected, rel=2e-3, abs=1e-9)


@pytest.mark.parametrize(("z", "q", "k"), [(1.0, 0.01, 1000), (2.0, 0.1, 500)])
def test_composition_between_add_remove_and_looser_bounds(z: float, q: float, k: int) -> None:
    ours = subsampled_gaussian_epsilon(z, q, k, DELTA)
    poisson = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), k
    )
    # a fixed-direction (add/remove) analysis is not enough for substitution: we are above it
    add_remove = _pld_eps(poisson, NR.ADD_OR_REMOVE_ONE)
    assert ours > add_remove
    # ... and below the looser valid bounds: REPLACE_ONE Poisson pair with ±Δ, RDP (WBK Thm 27)
    assert ours < _pld_eps(poisson, NR.REPLACE_ONE)
    n = 100_000
    rdp = dp_accounting.rdp.RdpAccountant(neighboring_relation=NR.REPLACE_ONE)
    rdp.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.SampledWithoutReplacementDpEvent(
                n, round(q * n), dp_accounting.GaussianDpEvent(z)
            ),
            k,
        )
    )
    assert ours < rdp.get_epsilon(DELTA)


def test_single_step_equals_dp_accounting_add_remove() -> None:
    for z, q in [(1.0, 0.01), (2.0, 0.2)]:
        poisson = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
        assert subsampled_gaussian_epsilon(z, q, 1, DELTA) == pytest.approx(
            _pld_eps(poisson, NR.ADD_OR_REMOVE_ONE), rel=1e-6
        )


def test_symmetrised_pmf_is_a_valid_symmetric_pld() -> None:
    pld, mean = _symmetric_pld_and_mean(1.0, 0.01, 1e-4)
    pmf = pld._pmf_remove.to_dense_pmf()
    probs = np.asarray(pmf._probs)
    losses = (np.arange(probs.size) + pmf._lower_loss) * 1e-4
    assert probs.min() >= 0
    assert probs.sum() + pmf._infinity_mass == pytest.approx(1.0, abs=1e-12)
    # symmetric pair: ω(-ℓ) = e^{-ℓ} ω(ℓ)
    pos = losses > 0
    mirrored = probs[::-1][pos]  # losses are symmetric around 0
    np.testing.assert_allclose(mirrored, probs[pos] * np.exp(-losses[pos]), rtol=1e-12, atol=0)
    assert mean > 0 and mean == pytest.approx(float(np.dot(losses, probs)))


def test_iterations_never_overshoot() -> None:
    cost = SubsampledGaussianCost(1.0, 0.01)
    k = max_iterations([], cost, 2.0, DELTA)
    assert cost.epsilon(DELTA, k) <= 2.0 < cost.epsilon(DELTA, k + 1)


def test_mixed_gaussian_and_subsampled_composition() -> None:
    g, s = GaussianCost(0.0005), SubsampledGaussianCost(1.0, 0.01)
    eps, method = compose_epsilon([(g, 1000), (s, 300)], DELTA)
    assert method == "pld"
    alone = [g.epsilon(DELTA, 1000), s.epsilon(DELTA, 300)]
    assert max(alone) < eps < sum(alone)
    # the Gaussian part alone through the PLD path matches the closed form
    eps_g, method_g = compose_epsilon([(g, 1000), (SubsampledGaussianCost(1.0, 1.0), 0)], DELTA)
    assert method_g == "gaussian" and eps_g == pytest.approx(alone[0])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0.0, 0.1), "noise_multiplier must be a positive finite number"),
        ((math.nan, 0.1), "noise_multiplier"),
        ((1.0, 0.0), "sampling_ratio must be a positive finite number"),
        ((1.0, 1.5), r"sampling_ratio must be in \(0, 1\]"),
    ],
)
def test_errors(args: tuple[float, float], match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        SubsampledGaussianCost(*args)
    with pytest.raises(InvalidParameterError, match=match):
        subsampled_gaussian_epsilon(*args, 10, DELTA)
