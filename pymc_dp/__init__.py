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
    DataChangedError,
    InitialPointError,
    InvalidParameterError,
    LedgerError,
    ModelNotSupportedError,
    PrivacyLeakError,
    PrivacyWarning,
    PrivateEvaluationError,
    PyMCDPError,
    ReadOnlyParameterError,
)
from pymc_dp.oracle import RowLikelihood
from pymc_dp.report import attach_privacy_metadata, privacy_report
from pymc_dp.sampling import plan_iterations, sample
from pymc_dp.step_methods import DPHMC, DPBarker, DPPenalty

__version__ = "0.1.0.dev0"

__all__ = [
    "DPHMC",
    "BarkerCost",
    "BudgetExceededError",
    "CoupledRowsError",
    "DPBarker",
    "DPPenalty",
    "DataChangedError",
    "GaussianCost",
    "InitialPointError",
    "InvalidParameterError",
    "LedgerError",
    "ModelNotSupportedError",
    "PrivacyBudget",
    "PrivacyLeakError",
    "PrivacyWarning",
    "PrivateEvaluationError",
    "PyMCDPError",
    "ReadOnlyParameterError",
    "RowLikelihood",
    "SubsampledGaussianCost",
    "__version__",
    "attach_privacy_metadata",
    "plan_iterations",
    "privacy_report",
    "sample",
]
