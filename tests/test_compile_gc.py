"""Python's garbage collector is paused while the oracle builds and compiles, and only then."""

from __future__ import annotations

import gc
from collections import OrderedDict

import numpy as np
import pymc as pm
import pytensor
import pytest

from pymc_dp import _compile
from pymc_dp.oracle import RowLikelihood


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_every_compilation_of_a_build_and_of_first_use_runs_with_the_collector_paused(
    collector_on, monkeypatch
):
    # every function the oracle compiles goes through pytensor.function, in _compile
    states = []
    function = pytensor.function

    def spy(*args, **kwargs):
        states.append(gc.isenabled())
        return function(*args, **kwargs)

    monkeypatch.setattr(_compile.pytensor, "function", spy)
    # an earlier test in this process may have compiled the same graphs: start with none remembered
    monkeypatch.setattr(_compile, "_cache", OrderedDict())
    y = np.random.default_rng(3).normal(1.0, 1.0, 40)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, pm.HalfNormal("sigma", 2.0), observed=y)
    oracle = RowLikelihood(model)
    assert gc.isenabled()  # restored after the build
    built = len(states)
    oracle.grad_rows(np.zeros(2))  # compiled on first use
    assert gc.isenabled()
    assert built >= 3 and len(states) == built + 1  # prior, log-likelihood, gradient; rows
    assert not any(states)


def test_the_pause_restores_the_collector_after_an_error(collector_on):
    with pytest.raises(RuntimeError), _compile.gc_paused():
        assert not gc.isenabled()
        raise RuntimeError
    assert gc.isenabled()


def test_nested_pauses_are_one_pause(collector_on):
    with _compile.gc_paused():
        with _compile.gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner one does not restart it
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled(collector_on):
    gc.disable()
    with _compile.gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
