"""Mechanisms as objects bound to a private channel, carrying their privacy events (theory §2).

The release-level properties (noise scale, temperature, what is read) are tested with the
kernels that use them (tests/kernels/); here: events, composition of a step's cost from its
mechanisms, the release counter's coverage rule, read-only parameters, the channel.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from pymc_dp import RowLikelihood
from pymc_dp.accounting import (
    BarkerCost,
    GaussianCost,
    SubsampledGaussianCost,
    compose,
)
from pymc_dp.barker_correction import BarkerCorrection
from pymc_dp.errors import BudgetExceededError, InvalidParameterError, ReadOnlyParameterError
from pymc_dp.mechanisms import (
    BarkerTest,
    GradientRelease,
    LLRRelease,
    MinibatchLLRRelease,
    PrivateChannel,
    ReleaseCounter,
)
from pymc_dp.noise import NoiseSource
from pymc_dp.testing import Banana

SPEC = Banana(d=2, a=0.0)


@cache
def oracle_and_mean():
    data = SPEC.simulate(400, np.random.default_rng(3))
    mean, _ = SPEC.posterior_params(data)
    return RowLikelihood(SPEC.model(data)), mean


def channel() -> PrivateChannel:
    oracle, _ = oracle_and_mean()
    return PrivateChannel(oracle, NoiseSource(0))


def test_each_mechanism_carries_the_event_of_its_release():
    ch = channel()
    n = ch.n_rows
    assert LLRRelease(ch, llr_clip=1.0, noise_multiplier=4.0).event == GaussianCost(1 / 32)
    assert GradientRelease(ch, grad_clip=1.0, noise_multiplier=2.0).event == GaussianCost(1 / 8)
    batch = MinibatchLLRRelease(ch, batch_size=40, llr_clip=1.0, noise_multiplier=3.0)
    assert batch.event == SubsampledGaussianCost(3.0, 40 / n)
    test = BarkerTest(ch, batch_size=40, temperature=0.1, correction=BarkerCorrection.load(2.0))
    assert test.event == BarkerCost(40, n)


def test_a_dphmc_iteration_is_composed_from_its_mechanisms_events():
    ch = channel()
    llr = LLRRelease(ch, llr_clip=1.0, noise_multiplier=4.0)
    grad = GradientRelease(ch, grad_clip=1.0, noise_multiplier=2.0)
    cost = compose(llr.event, (grad.event, 6))  # L = 5: six gradient releases
    assert cost == GaussianCost(1 / 32 + 6 / 8)  # the all-Gaussian fast path: one μ


def test_the_counter_refuses_a_release_its_reservation_does_not_cover():
    counter = ReleaseCounter()
    gauss, weaker = GaussianCost.from_noise_multiplier(2.0), GaussianCost.from_noise_multiplier(1.0)
    counter.allow(compose(gauss), 3)
    for _ in range(3):
        counter.record(gauss)
    with pytest.raises(BudgetExceededError, match="does not cover"):
        counter.record(gauss)  # a fourth release
    counter = ReleaseCounter()
    counter.allow(gauss, 3)
    with pytest.raises(BudgetExceededError):
        counter.record(weaker)  # less noise: μ 0.5 > the 0.375 reserved


def test_subsampled_releases_are_covered_by_count_and_noise():
    counter = ReleaseCounter()
    reserved = SubsampledGaussianCost(2.0, 0.1)
    counter.allow(reserved, 2)
    counter.record(SubsampledGaussianCost(3.0, 0.1))  # more noise: covered
    counter.record(reserved)
    with pytest.raises(BudgetExceededError):
        counter.record(reserved)  # a third
    counter = ReleaseCounter()
    counter.allow(reserved, 5)
    with pytest.raises(BudgetExceededError):
        counter.record(SubsampledGaussianCost(1.0, 0.1))  # less noise
    with pytest.raises(BudgetExceededError):
        counter.record(SubsampledGaussianCost(2.0, 0.2))  # another sampling ratio


def test_an_unlimited_counter_only_counts():
    counter = ReleaseCounter()
    event = GaussianCost.from_noise_multiplier(1.0)
    for _ in range(4):
        counter.record(event)
    assert counter.released[event] == 4 and counter.mu == pytest.approx(2.0)


def test_mechanism_parameters_are_read_only_and_a_bypass_is_caught_before_reading():
    ch = channel()
    _, mean = oracle_and_mean()
    release = LLRRelease(ch, llr_clip=1.0, noise_multiplier=4.0)
    with pytest.raises(ReadOnlyParameterError, match="noise_multiplier"):
        release.noise_multiplier = 1e-3
    ch.counter.allow(release.event, 1)
    release.__dict__["noise_multiplier"] = 1e-3  # behind its back: the event follows
    reads = ch.reads
    with pytest.raises(BudgetExceededError):
        release(mean, mean + 0.1)
    assert ch.reads == reads  # nothing was read


def test_bad_mechanism_parameters_are_refused():
    ch = channel()
    with pytest.raises(InvalidParameterError, match="noise_multiplier"):
        LLRRelease(ch, llr_clip=1.0, noise_multiplier=0.0)
    with pytest.raises(InvalidParameterError, match="batch_size"):
        MinibatchLLRRelease(ch, batch_size=1, llr_clip=1.0, noise_multiplier=1.0)


def test_a_new_chain_gets_its_own_noise_and_counter():
    ch = channel()
    _, mean = oracle_and_mean()
    release = LLRRelease(ch, llr_clip=1.0, noise_multiplier=4.0)
    release(mean, mean + 0.1)
    first = ch.counter
    ch.start_chain(NoiseSource(1))
    assert ch.counter is not first and ch.counter.total() == 0 and first.total() == 1
    a = release(mean, mean + 0.1).value
    ch.start_chain(NoiseSource(1))
    assert release(mean, mean + 0.1).value == a  # the chain's noise source decides the noise
