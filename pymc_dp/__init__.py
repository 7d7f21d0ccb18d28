"""pymc_dp: differentially private MCMC for PyMC models.

The public names below are imported on first use (PEP 562), so that ``import pymc_dp.kernels``
or ``import pymc_dp.accounting`` does not import PyMC: the kernels are NumPy-only by imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0.dev0"

# public name -> module that defines it
_EXPORTS = {
    "BarkerCost": "pymc_dp.accounting",
    "ComposedCost": "pymc_dp.accounting",
    "GaussianCost": "pymc_dp.accounting",
    "PrivacyBudget": "pymc_dp.accounting",
    "SelfComposedCost": "pymc_dp.accounting",
    "SubsampledGaussianCost": "pymc_dp.accounting",
    "BackendNotSupportedError": "pymc_dp.errors",
    "BarkerVarianceError": "pymc_dp.errors",
    "ConvergenceWarning": "pymc_dp.errors",
    "BudgetExceededError": "pymc_dp.errors",
    "CoupledRowsError": "pymc_dp.errors",
    "DataChangedError": "pymc_dp.errors",
    "InitialPointError": "pymc_dp.errors",
    "InsufficientDataError": "pymc_dp.errors",
    "InvalidParameterError": "pymc_dp.errors",
    "LedgerError": "pymc_dp.errors",
    "LedgerTamperedError": "pymc_dp.errors",
    "ModelNotSupportedError": "pymc_dp.errors",
    "PrivacyLeakError": "pymc_dp.errors",
    "PrivacyWarning": "pymc_dp.errors",
    "PrivateEvaluationError": "pymc_dp.errors",
    "PyMCDPError": "pymc_dp.errors",
    "ReadOnlyParameterError": "pymc_dp.errors",
    "ParameterSpace": "pymc_dp.parameter_space",
    "RowLikelihood": "pymc_dp.oracle",
    "attach_privacy_metadata": "pymc_dp.report",
    "check_convergence": "pymc_dp.convergence",
    "privacy_report": "pymc_dp.report",
    "plan_iterations": "pymc_dp.planning",
    "predict_centre_shift": "pymc_dp.prediction",
    "predict_ess": "pymc_dp.prediction",
    "sample": "pymc_dp.sampling",
    "DPHMC": "pymc_dp.step_methods",
    "DPBarker": "pymc_dp.step_methods",
    "DPPenalty": "pymc_dp.step_methods",
    "DPSGHMC": "pymc_dp.step_methods",
    "DPSGLD": "pymc_dp.step_methods",
    "DPSGNHT": "pymc_dp.step_methods",
}

__all__ = [
    "DPHMC",
    "DPSGHMC",
    "DPSGLD",
    "DPSGNHT",
    "BackendNotSupportedError",
    "BarkerCost",
    "BarkerVarianceError",
    "BudgetExceededError",
    "ComposedCost",
    "ConvergenceWarning",
    "CoupledRowsError",
    "DPBarker",
    "DPPenalty",
    "DataChangedError",
    "GaussianCost",
    "InitialPointError",
    "InsufficientDataError",
    "InvalidParameterError",
    "LedgerError",
    "LedgerTamperedError",
    "ModelNotSupportedError",
    "ParameterSpace",
    "PrivacyBudget",
    "PrivacyLeakError",
    "PrivacyWarning",
    "PrivateEvaluationError",
    "PyMCDPError",
    "ReadOnlyParameterError",
    "RowLikelihood",
    "SelfComposedCost",
    "SubsampledGaussianCost",
    "__version__",
    "attach_privacy_metadata",
    "check_convergence",
    "plan_iterations",
    "predict_centre_shift",
    "predict_ess",
    "privacy_report",
    "sample",
]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names load lazily
    from pymc_dp.accounting import (
        BarkerCost,
        ComposedCost,
        GaussianCost,
        PrivacyBudget,
        SelfComposedCost,
        SubsampledGaussianCost,
    )
    from pymc_dp.convergence import check_convergence
    from pymc_dp.errors import (
        BackendNotSupportedError,
        BarkerVarianceError,
        BudgetExceededError,
        ConvergenceWarning,
        CoupledRowsError,
        DataChangedError,
        InitialPointError,
        InsufficientDataError,
        InvalidParameterError,
        LedgerError,
        LedgerTamperedError,
        ModelNotSupportedError,
        PrivacyLeakError,
        PrivacyWarning,
        PrivateEvaluationError,
        PyMCDPError,
        ReadOnlyParameterError,
    )
    from pymc_dp.oracle import RowLikelihood
    from pymc_dp.parameter_space import ParameterSpace
    from pymc_dp.planning import plan_iterations
    from pymc_dp.prediction import predict_centre_shift, predict_ess
    from pymc_dp.report import attach_privacy_metadata, privacy_report
    from pymc_dp.sampling import sample
    from pymc_dp.step_methods import DPHMC, DPSGHMC, DPSGLD, DPSGNHT, DPBarker, DPPenalty


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pymc_dp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
