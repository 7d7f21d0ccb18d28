"""Every DP step variant against the conformance base (tests/step_methods/conformance.py)."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import pytest

import pymc_dp
from pymc_dp.step_methods.base import DPStep

from .conformance import DPStepConformance, PenaltyTermControl

SD = 0.05  # posterior sd of the untempered model (n = 400, unit noise)


class TestDPPenaltyConformance(DPStepConformance, PenaltyTermControl):
    step_class = pymc_dp.DPPenalty

    def make_step(self, budget, **overrides: Any):
        # b_l = 6: per-row ratios per unit jump stay below |y − μ| + jump/2 < 5 (nothing clipped)
        kwargs = {"llr_clip": 6.0, "noise_multiplier": 4.0, "proposal_scale": SD}
        return pymc_dp.DPPenalty(budget=budget, **{**kwargs, **overrides})

    def noisy_overrides(self):
        return {"noise_multiplier": 2.0, "proposal_scale": 2 * SD}  # release noise σ ≈ 2.4


class TestDPPenaltyOneComponentConformance(TestDPPenaltyConformance):
    def make_step(self, budget, **overrides: Any):
        return super().make_step(budget, **{"one_component": True, **overrides})


class TestDPPenaltyGuidedConformance(TestDPPenaltyConformance):
    def make_step(self, budget, **overrides: Any):
        return super().make_step(budget, **{"guided": True, **overrides})


class TestMinibatchDPPenaltyConformance(DPStepConformance):
    step_class = pymc_dp.DPPenalty
    temperature = 0.25

    def make_step(self, budget, **overrides: Any):
        kwargs = {
            "llr_clip": 6.0,
            "noise_multiplier": 0.5,
            "batch_size": 100,
            "temperature": self.temperature,
            "proposal_scale": 2 * SD,  # the tempered posterior's sd
        }
        return pymc_dp.DPPenalty(budget=budget, **{**kwargs, **overrides})


class TestDPHMCConformance(DPStepConformance, PenaltyTermControl):
    step_class = pymc_dp.DPHMC
    nonprivate_stats: ClassVar[set[str]] = {"llr_clipped_fraction", "grad_clipped_fraction"}

    def make_step(self, budget, **overrides: Any):
        kwargs = {
            "step_size": 0.5,
            "n_steps": 3,
            "grad_clip": 6.0,  # per-row gradients |y − μ| stay below 5
            "llr_clip": 6.0,
            "grad_noise_multiplier": 4.0,
            "llr_noise_multiplier": 4.0,
            "mass_diag": [1 / SD**2],
            "adapt_step_size": False,
            "adapt_mass": False,
        }
        return pymc_dp.DPHMC(budget=budget, **{**kwargs, **overrides})

    def noisy_overrides(self):
        # a coarse integrator with noisy gradients (energy errors of order one) and ratio noise
        # σ_l ≈ 1: without −σ_l²/2 the final states' variance grows by about 1.8
        return {"step_size": 1.0, "llr_noise_multiplier": 1.0, "grad_noise_multiplier": 1.0}


class TestDPBarkerConformance(DPStepConformance):
    step_class = pymc_dp.DPBarker
    temperature = 0.05  # n0 = 20: the clip √b/n0 = 0.7 is above nearly every per-row ratio
    nonprivate_stats: ClassVar[set[str]] = {"llr_clipped_fraction", "batch_variance"}

    def make_step(self, budget, **overrides: Any):
        kwargs = {"batch_size": 200, "temperature": self.temperature, "proposal_scale": 0.22}
        return pymc_dp.DPBarker(budget=budget, **{**kwargs, **overrides})


class _StochasticGradientConformance(DPStepConformance):
    """The stochastic-gradient samplers: no accept/reject (``jump`` shows the chain moving);
    step sizes small enough that their discretisation and batch-noise bias (a few % of the
    variance) stays below what the invariance test can see with 200 chains."""

    nonprivate_stats: ClassVar[set[str]] = {"grad_clipped_fraction"}
    expected_stats: ClassVar[set[str]] = {"jump", "step_size"}


class TestDPSGLDConformance(_StochasticGradientConformance):
    step_class = pymc_dp.DPSGLD

    def make_step(self, budget, **overrides: Any):
        # h = η/n = 0.02 s²: the draws' variance is s²/(1 − 0.01); batch noise adds about 3 %
        kwargs = {"step_size": 0.02, "grad_clip": 6.0, "batch_size": 100}
        return pymc_dp.DPSGLD(budget=budget, **{**kwargs, **overrides})


class TestDPSGNHTConformance(_StochasticGradientConformance):
    step_class = pymc_dp.DPSGNHT

    def make_step(self, budget, **overrides: Any):
        # h = 0.005 = s/10; the thermostat absorbs the batch noise
        kwargs = {"step_size": 2.0, "diffusion": 10.0, "grad_clip": 6.0, "batch_size": 100}
        return pymc_dp.DPSGNHT(budget=budget, **{**kwargs, **overrides})


class TestDPSGHMCConformance(_StochasticGradientConformance):
    step_class = pymc_dp.DPSGHMC

    def make_step(self, budget, **overrides: Any):
        # h = s/10, friction 30: the batch noise ignored by B̂ = 0 is about 3 % of 2Fh
        kwargs = {
            "step_size": 2.0,
            "friction": 30.0,
            "n_steps": 3,
            "grad_clip": 6.0,
            "batch_size": 200,
        }
        return pymc_dp.DPSGHMC(budget=budget, **{**kwargs, **overrides})


def test_every_dp_step_class_has_a_conformance_subclass():
    exported = {
        obj
        for name in pymc_dp.__all__
        if inspect.isclass(obj := getattr(pymc_dp, name)) and issubclass(obj, DPStep)
    }
    covered = {
        cls.step_class
        for cls in globals().values()
        if inspect.isclass(cls)
        and issubclass(cls, DPStepConformance)
        and cls.__name__.startswith("Test")
    }
    assert exported and exported <= covered, exported - covered


@pytest.mark.parametrize("name", ["DPPenalty", "DPHMC", "DPBarker", "DPSGLD", "DPSGNHT", "DPSGHMC"])
def test_the_coverage_check_sees_each_step(name):  # negative control for the test above
    assert getattr(pymc_dp, name) in {
        TestDPPenaltyConformance.step_class,
        TestDPHMCConformance.step_class,
        TestDPBarkerConformance.step_class,
        TestDPSGLDConformance.step_class,
        TestDPSGNHTConformance.step_class,
        TestDPSGHMCConformance.step_class,
    }
