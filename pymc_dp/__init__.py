"""pymc_dp: differentially private MCMC for PyMC models."""

from pymc_dp.errors import (
    BudgetExceededError,
    CoupledRowsError,
    InvalidParameterError,
    LedgerError,
    ModelNotSupportedError,
    PrivacyLeakError,
    PyMCDPError,
)

__version__ = "0.1.0.dev0"

__all__ = [
    "BudgetExceededError",
    "CoupledRowsError",
    "InvalidParameterError",
    "LedgerError",
    "ModelNotSupportedError",
    "PrivacyLeakError",
    "PyMCDPError",
    "__version__",
]
