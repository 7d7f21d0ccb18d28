"""pymc_dp: differentially private MCMC for PyMC models."""

from pymc_dp.accounting import (
    BarkerCost,
    GaussianCost,
    PrivacyBudget,
    SubsampledGaussianCost,
)
from pymc_dp.errors import (
    BudgetExceededError,
    CoupledRowsError,
    InvalidParameterError,
    LedgerError,
    ModelNotSupportedError,
    PrivacyLeakError,
    PyMCDPError,
)
from pymc_dp.oracle import RowLikelihood
from pymc_dp.step_methods import DPHMC, DPPenalty

__version__ = "0.1.0.dev0"

__all__ = [
    "DPHMC",
    "BarkerCost",
    "BudgetExceededError",
    "CoupledRowsError",
    "DPPenalty",
    "GaussianCost",
    "InvalidParameterError",
    "LedgerError",
    "ModelNotSupportedError",
    "PrivacyBudget",
    "PrivacyLeakError",
    "PyMCDPError",
    "RowLikelihood",
    "SubsampledGaussianCost",
    "__version__",
]
