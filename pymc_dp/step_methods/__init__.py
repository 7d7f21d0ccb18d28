"""PyMC step methods for the DP samplers."""

from pymc_dp.step_methods.barker import DPBarker
from pymc_dp.step_methods.hmc import DPHMC
from pymc_dp.step_methods.penalty import DPPenalty
from pymc_dp.step_methods.stochastic_gradient import DPSGHMC, DPSGLD, DPSGNHT

__all__ = ["DPHMC", "DPSGHMC", "DPSGLD", "DPSGNHT", "DPBarker", "DPPenalty"]
