"""Privacy accounting (theory §3): tight Gaussian composition, zCDP, RDP, subsampling, budgets.

Public entry points
-------------------
:class:`PrivacyBudget`
    The (ε, δ) budget a user creates; counts iterations, enforces reservations through an
    SQLite :class:`Ledger` and reports spending.
:class:`GaussianCost`, :class:`SubsampledGaussianCost`, :class:`BarkerCost`
    What one release of a mechanism costs (atomic costs).
:func:`compose`, :class:`SelfComposedCost`, :class:`ComposedCost`
    What one iteration of a sampler releases, composed from the costs of its mechanisms.
:func:`gaussian_delta`, :func:`gaussian_epsilon`, :func:`gaussian_capacity`
    The tight (ε, δ) curve of a composition of Gaussian mechanisms.
:func:`zcdp_capacity`, :func:`zcdp_epsilon`, :func:`zcdp_iterations`
    The looser zCDP comparator.
:func:`rdp_to_epsilon`, :func:`barker_rdp`, :func:`subsampled_gaussian_epsilon`
    RDP and PLD accounting of subsampled mechanisms.

See ``docs/accounting.md`` for the maths and the conventions.
"""

from pymc_dp.accounting.budget import BudgetReport, PrivacyBudget
from pymc_dp.accounting.calibration import calibrate_noise
from pymc_dp.accounting.costs import (
    BarkerCost,
    ComposedCost,
    GaussianCost,
    PrivacyCost,
    SelfComposedCost,
    SubsampledGaussianCost,
    as_cost,
    compose,
    compose_epsilon,
    composition_fits,
    max_iterations,
)
from pymc_dp.accounting.gaussian import (
    gaussian_capacity,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_epsilon_curve,
    gaussian_iterations,
    gaussian_log_delta,
)
from pymc_dp.accounting.ledger import Ledger, LedgerEntry, Reservation
from pymc_dp.accounting.rdp import (
    barker_base_rdp,
    barker_epsilon,
    barker_rdp,
    rdp_to_epsilon,
    wbk_subsampled_rdp,
)
from pymc_dp.accounting.subsampled import (
    subsampled_gaussian_delta,
    subsampled_gaussian_epsilon,
    subsampled_gaussian_pld,
    subsampled_gaussian_rdp,
)
from pymc_dp.accounting.zcdp import zcdp_capacity, zcdp_epsilon, zcdp_iterations

__all__ = [
    "BarkerCost",
    "BudgetReport",
    "ComposedCost",
    "GaussianCost",
    "Ledger",
    "LedgerEntry",
    "PrivacyBudget",
    "PrivacyCost",
    "Reservation",
    "SelfComposedCost",
    "SubsampledGaussianCost",
    "as_cost",
    "barker_base_rdp",
    "barker_epsilon",
    "barker_rdp",
    "calibrate_noise",
    "compose",
    "compose_epsilon",
    "composition_fits",
    "gaussian_capacity",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_epsilon_curve",
    "gaussian_iterations",
    "gaussian_log_delta",
    "max_iterations",
    "rdp_to_epsilon",
    "subsampled_gaussian_delta",
    "subsampled_gaussian_epsilon",
    "subsampled_gaussian_pld",
    "subsampled_gaussian_rdp",
    "wbk_subsampled_rdp",
    "zcdp_capacity",
    "zcdp_epsilon",
    "zcdp_iterations",
]
