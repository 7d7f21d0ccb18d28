"""Exceptions raised by pymc_dp.

Every error the package raises on purpose derives from :class:`PyMCDPError`, so a caller
can catch them all at once. Messages name the offending argument or model variable and
say what to change.
"""

from __future__ import annotations

__all__ = [
    "BudgetExceededError",
    "CoupledRowsError",
    "InvalidParameterError",
    "LedgerError",
    "ModelNotSupportedError",
    "PrivacyLeakError",
    "PyMCDPError",
]


class PyMCDPError(Exception):
    """Base class of every error raised by pymc_dp."""


class InvalidParameterError(PyMCDPError, ValueError):
    """An argument has a value the method cannot use (non-positive clip bound, bad epsilon, ...)."""


class ModelNotSupportedError(PyMCDPError, ValueError):
    """The PyMC model cannot be sampled privately as written (see the message for the fix)."""


class CoupledRowsError(ModelNotSupportedError):
    """The log-likelihood is not a sum of terms that each depend on one row of data only."""


class PrivacyLeakError(ModelNotSupportedError):
    """Part of the model or of the requested output would reveal private data without noise."""


class BudgetExceededError(PyMCDPError):
    """A request would spend more privacy than the budget has left; nothing was read."""


class LedgerError(PyMCDPError):
    """The privacy ledger cannot be opened, read or written."""
