"""PyMC step methods for the DP samplers."""

from pymc_dp.step_methods.barker import DPBarker
from pymc_dp.step_methods.hmc import DPHMC
from pymc_dp.step_methods.penalty import DPPenalty

__all__ = ["DPHMC", "DPBarker", "DPPenalty"]
