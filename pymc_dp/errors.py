"""Exceptions raised by pymc_dp.

Every error the package raises on purpose derives from :class:`PyMCDPError`, so a caller
can catch them all at once. Messages name the offending argument or model variable and
say what to change.
"""

from __future__ import annotations

__all__ = [
    "BackendNotSupportedError",
    "BarkerVarianceError",
    "BudgetExceededError",
    "CoupledRowsError",
    "DataChangedError",
    "InitialPointError",
    "InsufficientDataError",
    "InvalidParameterError",
    "LedgerError",
    "LedgerTamperedError",
    "ModelNotSupportedError",
    "PrivacyLeakError",
    "PrivacyWarning",
    "PrivateEvaluationError",
    "PyMCDPError",
    "ReadOnlyParameterError",
]


class PyMCDPError(Exception):
    """Base class of every error raised by pymc_dp."""


class InvalidParameterError(PyMCDPError, ValueError):
    """An argument has a value the method cannot use (non-positive clip bound, bad epsilon, ...)."""


class ModelNotSupportedError(PyMCDPError, ValueError):
    """The PyMC model cannot be sampled privately as written (see the message for the fix)."""


class BackendNotSupportedError(ModelNotSupportedError):
    """The backend asked for (``compile_kwargs={"mode": "JAX"}``) cannot compile the model."""


class CoupledRowsError(ModelNotSupportedError):
    """The log-likelihood is not a sum of terms that each depend on one row of data only."""


class PrivacyLeakError(ModelNotSupportedError):
    """Part of the model or of the requested output would reveal private data without noise."""


class BudgetExceededError(PyMCDPError):
    """A request would spend more privacy than the budget has left; nothing was read."""


class LedgerError(PyMCDPError):
    """The privacy ledger cannot be opened, read or written."""


class LedgerTamperedError(LedgerError):
    """The privacy ledger's hash chain does not match its rows: history was edited or deleted."""


class InitialPointError(InvalidParameterError):
    """A chain's starting point is non-finite or outside the model's support (nothing was read)."""


class ReadOnlyParameterError(PyMCDPError, AttributeError):
    """A privacy parameter of a step was changed after construction (build a new step instead)."""


class DataChangedError(PyMCDPError, RuntimeError):
    """The model's row data changed (``pm.set_data``) after the step was built; nothing was read."""


class PrivateEvaluationError(PyMCDPError, RuntimeError):
    """Evaluating the model on the private data failed.

    The original exception is withheld (no message, no chained cause): its text may carry
    data-derived numbers, such as PyTensor's listing of a failing node's input values.
    """


class BarkerVarianceError(PyMCDPError, RuntimeError):
    """A DP Barker batch's variance exceeded the normal variance the test corrects (theory §4.4).

    The test cannot then be made exact, so it raises instead of deciding; a larger batch fixes it.
    """


class InsufficientDataError(PyMCDPError, RuntimeError):
    """A private choice (a clip bound from a noisy histogram) saw nothing above its noise.

    Too few rows for the budget: the settings must be given explicitly (or ε made larger).
    """


class PrivacyWarning(UserWarning):
    """A setting is allowed but weakens the privacy guarantee (e.g. δ ≥ 1/n)."""


class ConvergenceWarning(UserWarning):
    """The released draws show a run that has not converged (:mod:`pymc_dp.convergence`).

    The check reads only the released draws and their private statistics, so it costs no
    privacy; it says what to change (a larger ε, more rows, fewer parameters).
    """
