"""``PrivacyBudget``: the (ε, δ) budget a user creates, backed by a privacy ledger (theory §3).

A budget answers "how many iterations may I run?" (:meth:`PrivacyBudget.iterations`,
:meth:`PrivacyBudget.iterations_per_chain`), enforces it (:meth:`PrivacyBudget.reserve`, atomic
across processes through the SQLite :class:`~pymc_dp.accounting.ledger.Ledger`), and reports
what has been spent (:meth:`PrivacyBudget.report`).

Every chain reads the same data, so the chains of one run — and every run on the same dataset
that shares a ledger — compose: the budget is for all of them together (theory §1). Tuning
iterations release states like any other and count in full.

By default a budget creates a private temporary ledger, which lives as long as the budget
object in the process that created it. Pickled copies (PyMC sends the step method, and with it
the budget, to one worker process per chain, by ``fork`` or ``spawn``) refer to the same file,
so all chains of ``pm.sample(cores=4)`` draw from one budget. Pass ``ledger=path`` and
``dataset=name`` to share a budget between separate analyses of the same data.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from pymc_dp.accounting._checks import check_delta, check_epsilon, check_int
from pymc_dp.accounting.calibration import calibrate_noise
from pymc_dp.accounting.costs import (
    PrivacyCost,
    as_cost,
    compose_epsilon,
    composition_fits,
    max_iterations,
)
from pymc_dp.accounting.gaussian import gaussian_capacity
from pymc_dp.accounting.ledger import Ledger, LedgerEntry, Reservation
from pymc_dp.errors import InvalidParameterError, LedgerError

__all__ = ["BudgetReport", "PrivacyBudget"]

_DEFAULT_DATASET = "default"


def _remove_private_ledger(directory: str, owner_pid: int) -> None:
    # Runs when the owning budget is garbage-collected or at interpreter exit. A forked child
    # inherits the finalizer; only the creating process may delete the file.
    if os.getpid() == owner_pid:
        shutil.rmtree(directory, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class BudgetReport:
    """What a budget has spent and what is left (returned by :meth:`PrivacyBudget.report`).

    Attributes
    ----------
    epsilon, delta : float
        The budget.
    dataset : str
        Dataset name in the ledger.
    ledger_path : str
        Ledger file.
    reservations : int
        Number of reservations recorded.
    reserved_iterations : int
        Iterations reserved in total (all mechanisms and chains).
    spent_epsilon : float
        ε at the budget's δ of everything reserved (``0`` if nothing).
    method : str
        How the reservations were composed: ``"gaussian"``, ``"pld"`` or ``"rdp"``.
    capacity_mu : float
        Total Gaussian PLD parameter ``M*`` the budget allows (theory §3).
    spent_mu : float or None
        Total PLD parameter reserved, if every reservation is Gaussian; else ``None``.
    remaining_mu : float or None
        ``capacity_mu - spent_mu`` (Gaussian-only spending), else ``None``.
    """

    epsilon: float
    delta: float
    dataset: str
    ledger_path: str
    reservations: int
    reserved_iterations: int
    spent_epsilon: float
    method: str
    capacity_mu: float
    spent_mu: float | None
    remaining_mu: float | None

    def __str__(self) -> str:
        lines = [
            f"Privacy budget epsilon={self.epsilon:g}, delta={self.delta:g} "
            f"(dataset {self.dataset!r}, ledger {self.ledger_path})",
            f"  reservations:        {self.reservations} ({self.reserved_iterations} iterations)",
            f"  spent epsilon:       {self.spent_epsilon:.6g} at delta={self.delta:g} "
            f"[{self.method}]",
            f"  Gaussian capacity:   mu* = {self.capacity_mu:.6g}",
        ]
        if self.spent_mu is not None:
            lines.append(f"  spent mu:            {self.spent_mu:.6g}")
            lines.append(f"  remaining mu:        {self.remaining_mu:.6g}")
        else:
            lines.append("  spent mu:            n/a (non-Gaussian reservations)")
        return "\n".join(lines)


class PrivacyBudget:
    """An (ε, δ)-DP budget for all analyses of one dataset, enforced through a ledger.

    Parameters
    ----------
    epsilon : float
        ε > 0 (finite).
    delta : float
        δ in ``(0, 1)``; theory §5 uses ``0.1 / n``.
    ledger : str or os.PathLike, optional
        Ledger file shared by every analysis of the dataset (created if missing). Default: a
        private temporary ledger created with the budget (enough for the chains of one
        ``pm.sample`` call, not for analyses in separate sessions).
    dataset : str, optional
        Name of the dataset in the ledger; required with ``ledger``. Its (ε, δ) is stored on
        first use and a different (ε, δ) for the same name is refused.
    timeout : float
        Seconds to wait for a ledger locked by another process.

    Raises
    ------
    InvalidParameterError
        For bad ε, δ, missing ``dataset`` with ``ledger``, or a dataset recorded with a
        different budget.
    LedgerError
        If the ledger file cannot be created, opened or read.

    Examples
    --------
    >>> from pymc_dp.accounting import PrivacyBudget, GaussianCost
    >>> budget = PrivacyBudget(epsilon=1.0, delta=1e-6)
    >>> cost = GaussianCost.from_noise_multiplier(50.0)       # DP penalty, z = 50
    >>> budget.iterations(cost)
    140
    >>> budget.iterations_per_chain(cost, chains=4)
    35
    >>> r = budget.reserve(cost, 4 * 35, mechanism="DPPenalty", chains=4)
    >>> budget.iterations(cost)
    0
    """

    def __init__(
        self,
        epsilon: float,
        delta: float,
        *,
        ledger: str | os.PathLike[str] | None = None,
        dataset: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        self._epsilon = check_epsilon(epsilon)
        self._delta = check_delta(delta)
        if dataset is not None and (not isinstance(dataset, str) or not dataset):
            raise InvalidParameterError(f"dataset must be a non-empty string; got {dataset!r}.")
        self._finalizer: weakref.finalize | None = None
        if ledger is None:
            directory = tempfile.mkdtemp(prefix="pymc_dp_ledger_")
            path = os.path.join(directory, "ledger.sqlite")
            self._temporary = True
            self._finalizer = weakref.finalize(self, _remove_private_ledger, directory, os.getpid())
            self._dataset = dataset or _DEFAULT_DATASET
        else:
            if dataset is None:
                raise InvalidParameterError(
                    "dataset is required with ledger=...: a ledger file can hold the budgets of "
                    "several datasets; pass dataset='<name of the data>' (the same name in every "
                    "analysis of the same data)."
                )
            path = os.fspath(ledger)
            self._temporary = False
            self._dataset = dataset
        self._ledger = Ledger(path, timeout=timeout)
        self._ledger.register_dataset(self._dataset, self._epsilon, self._delta)

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_ledger(
        cls, path: str | os.PathLike[str], dataset: str, *, timeout: float = 60.0
    ) -> PrivacyBudget:
        """Open the budget recorded for ``dataset`` in the ledger file ``path``.

        Raises
        ------
        LedgerError
            If the file does not exist, is not a ledger, or does not know ``dataset``.
        """
        ledger = Ledger(path, timeout=timeout, create=False)
        recorded = ledger.dataset_budget(dataset)
        if recorded is None:
            known = ledger.datasets()
            raise LedgerError(
                f"the privacy ledger {ledger.path!r} has no dataset {dataset!r}; it records "
                f"{known if known else 'no datasets'}."
            )
        return cls(recorded[0], recorded[1], ledger=path, dataset=dataset, timeout=timeout)

    # -- pickling --------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {
            "epsilon": self._epsilon,
            "delta": self._delta,
            "path": self._ledger.path,
            "timeout": self._ledger.timeout,
            "dataset": self._dataset,
            "temporary": self._temporary,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._epsilon = state["epsilon"]
        self._delta = state["delta"]
        self._dataset = state["dataset"]
        self._temporary = state["temporary"]
        self._finalizer = None  # copies never delete the ledger
        if not os.path.exists(state["path"]):
            raise LedgerError(
                f"the privacy ledger {state['path']!r} of this budget no longer exists (a "
                "temporary ledger is deleted when the budget that created it is garbage-"
                "collected); keep the original budget alive while its copies are in use."
            )
        self._ledger = Ledger(state["path"], timeout=state["timeout"], create=False)

    # -- properties ------------------------------------------------------------------------
    @property
    def epsilon(self) -> float:
        """Budget ε."""
        return self._epsilon

    @property
    def delta(self) -> float:
        """Budget δ."""
        return self._delta

    @property
    def dataset(self) -> str:
        """Dataset name in the ledger."""
        return self._dataset

    @property
    def ledger_path(self) -> str:
        """Path of the ledger file."""
        return self._ledger.path

    @property
    def is_temporary(self) -> bool:
        """Whether the ledger is the private temporary one created with the budget."""
        return self._temporary

    @property
    def capacity_mu(self) -> float:
        """Total Gaussian PLD parameter ``M*`` the whole budget allows (theory §3)."""
        return float(gaussian_capacity(self._epsilon, self._delta))

    def __repr__(self) -> str:
        where = "temporary ledger" if self._temporary else f"ledger={self.ledger_path!r}"
        return (
            f"PrivacyBudget(epsilon={self._epsilon!r}, delta={self._delta!r}, "
            f"dataset={self._dataset!r}, {where})"
        )

    # -- questions -------------------------------------------------------------------------
    def _spending(self) -> list[tuple[PrivacyCost, int]]:
        return [(e.cost, e.iterations) for e in self._ledger.entries(self._dataset)]

    def _too_small(self, cost: PrivacyCost, iterations: int, what: str) -> InvalidParameterError:
        eps_needed = cost.epsilon(self._delta, iterations)
        msg = (
            f"the budget epsilon={self._epsilon:g}, delta={self._delta:g} is too small for "
            f"{what} of {cost.describe()}: that needs epsilon={eps_needed:.4g} at this delta."
        )
        mu = cost.gaussian_mu()
        if mu is not None:
            msg += (
                f" The largest per-iteration mu that fits is {self.capacity_mu / iterations:.4g} "
                f"(this cost has mu={mu:.4g}); increase the noise multiplier(s) or epsilon."
            )
        else:
            msg += " Increase the noise or epsilon."
        return InvalidParameterError(msg)

    def iterations(self, cost: PrivacyCost | float) -> int:
        """Iterations of ``cost`` that still fit in the budget (over all chains together).

        Gaussian costs: the closed form ``⌊(M* - M_spent)/μ⌋`` (theory §3), checked against the δ
        formula so that it never overshoots. Other costs: bisection on the count (thesis
        Algorithm 2) over the composition with everything already reserved.

        Parameters
        ----------
        cost : PrivacyCost or float
            Per-iteration cost; a float is shorthand for ``GaussianCost(mu)``.

        Returns
        -------
        int
            ``k ≥ 0``; on a fresh budget, the total number of iterations allowed.

        Raises
        ------
        InvalidParameterError
            If the cost is invalid, or the budget — even unspent — cannot pay for one iteration
            (the message gives the ε one iteration needs and the largest per-iteration μ).
        """
        c = as_cost(cost)
        k = max_iterations(self._spending(), c, self._epsilon, self._delta)
        if k == 0 and not composition_fits([(c, 1)], self._epsilon, self._delta):
            raise self._too_small(c, 1, "a single iteration")
        return k

    def fits(self, cost: PrivacyCost | float, iterations: int) -> bool:
        """Whether ``iterations`` more iterations of ``cost`` fit beside everything reserved.

        One composition check (cheaper than :meth:`iterations`, which searches for the largest
        count); it reserves nothing, so another process may take the room before
        :meth:`reserve` does.
        """
        c = as_cost(cost)
        k = check_int(iterations, "iterations", minimum=0)
        return composition_fits([*self._spending(), (c, k)], self._epsilon, self._delta)

    def fits_spending(self, spending: Sequence[tuple[PrivacyCost | float, int]]) -> bool:
        """Whether ``(cost, iterations)`` pairs fit together beside everything reserved.

        :meth:`fits` for a run whose cost changes along the way (one pair per stage).
        """
        items = [(as_cost(c), check_int(k, "iterations", minimum=0)) for c, k in spending]
        return composition_fits([*self._spending(), *items], self._epsilon, self._delta)

    def calibrate_noise(
        self,
        cost_of: Callable[[float], PrivacyCost | float],
        iterations: int,
        *,
        rtol: float = 1e-4,
    ) -> float:
        """Smallest noise scale ``s`` for which ``iterations`` of ``cost_of(s)`` still fit.

        Budget-first calibration (:func:`~pymc_dp.accounting.calibrate_noise`) against
        everything already reserved on this budget's dataset: for Gaussian costs the planned
        run then spends exactly what is left; it never overshoots.

        Examples
        --------
        >>> budget = PrivacyBudget(epsilon=1.0, delta=1e-6)
        >>> z = budget.calibrate_noise(GaussianCost.from_noise_multiplier, 4 * 1000)
        >>> budget.iterations(GaussianCost.from_noise_multiplier(z))
        4000
        """
        return calibrate_noise(
            cost_of, self._epsilon, self._delta, iterations, spent=self._spending(), rtol=rtol
        )

    def iterations_per_chain(self, cost: PrivacyCost | float, chains: int) -> int:
        """Iterations each of ``chains`` chains may run: ``iterations(cost) // chains``.

        Every chain reads the same data, so chains compose; tuning iterations count like any
        other iteration.

        Raises
        ------
        InvalidParameterError
            If ``chains < 1``, or the budget — even unspent — cannot pay one iteration per chain.
        """
        n_chains = check_int(
            chains, "chains", minimum=1, hint=" Pass the number of chains that will run."
        )
        c = as_cost(cost)
        per_chain = self.iterations(c) // n_chains
        if per_chain == 0 and not composition_fits([(c, n_chains)], self._epsilon, self._delta):
            raise self._too_small(c, n_chains, f"one iteration in each of {n_chains} chains")
        return per_chain

    def epsilon_spent(self) -> float:
        """ε at the budget's δ of everything reserved so far on this dataset."""
        return compose_epsilon(self._spending(), self._delta)[0]

    def spent_summary(self) -> str:
        """One sentence for messages: the budget and the ε already reserved on its ledger."""
        return (
            f"The budget (ε = {self._epsilon:g}, δ = {self._delta:g}) has ε = "
            f"{self.epsilon_spent():.4g} reserved on its ledger"
        )

    def ledger_head(self) -> str:
        """The ledger's hash-chain head, ``"<length>:<sha256>"`` (:meth:`Ledger.head`)."""
        return self._ledger.head()

    def history(self) -> list[LedgerEntry]:
        """All reservations on this dataset, oldest first."""
        return self._ledger.entries(self._dataset)

    def report(self) -> BudgetReport:
        """What has been spent (ε at δ; total μ if all Gaussian) and what is left."""
        entries = self._ledger.entries(self._dataset)
        spending = [(e.cost, e.iterations) for e in entries]
        eps_spent, method = compose_epsilon(spending, self._delta)
        cap = self.capacity_mu
        if all(e.cost.is_gaussian() for e in entries):
            spent_mu: float | None = math.fsum(e.iterations * e.cost.gaussian_mu() for e in entries)
            remaining_mu: float | None = max(cap - spent_mu, 0.0)
        else:
            spent_mu = remaining_mu = None
        return BudgetReport(
            epsilon=self._epsilon,
            delta=self._delta,
            dataset=self._dataset,
            ledger_path=self.ledger_path,
            reservations=len(entries),
            reserved_iterations=sum(e.iterations for e in entries),
            spent_epsilon=eps_spent,
            method=method,
            capacity_mu=cap,
            spent_mu=spent_mu,
            remaining_mu=remaining_mu,
        )

    # -- enforcement -----------------------------------------------------------------------
    def reserve(
        self,
        cost: PrivacyCost | float,
        iterations: int,
        *,
        mechanism: str = "DPPenalty",
        chain: int | None = None,
        chains: int = 1,
    ) -> Reservation:
        """Reserve ``iterations`` iterations of ``cost`` before reading any data.

        Atomic across threads and processes (one ``BEGIN IMMEDIATE`` SQLite transaction on
        the ledger): the check against everything already reserved on the dataset and the
        insertion of the new reservation cannot interleave with another reserver. The whole
        reservation counts as spent from now on, whether or not the iterations run.

        Parameters
        ----------
        cost : PrivacyCost or float
            Per-iteration cost (a float is ``GaussianCost(mu)``).
        iterations : int
            Iterations to reserve (≥ 1), summed over the chains this reservation covers.
        mechanism : str
            Name of the step method, recorded in the ledger.
        chain : int, optional
            Chain id, when one chain reserves for itself.
        chains : int
            Number of chains the reservation covers (recorded).

        Returns
        -------
        Reservation

        Raises
        ------
        BudgetExceededError
            If the reservation would exceed the budget (the message says how many iterations
            of this cost still fit); nothing is recorded.
        InvalidParameterError
            For invalid arguments, or a budget too small even for one iteration.
        """
        parts = [(cost, iterations)]
        return self.reserve_parts(parts, mechanism=mechanism, chain=chain, chains=chains)[0]

    def reserve_parts(
        self,
        parts: Sequence[tuple[PrivacyCost, int]],
        *,
        mechanism: str = "DPPenalty",
        chain: int | None = None,
        chains: int = 1,
    ) -> list[Reservation]:
        """Reserve consecutive stages of different costs at once: all of them, or none.

        A chain whose cost changes along the way (a decreasing step-size schedule, theory
        §4.5) reserves ``[(cost_1, k_1), (cost_2, k_2), …]``: ``k_1`` iterations of ``cost_1``,
        then ``k_2`` of ``cost_2``, … in one atomic transaction (see :meth:`reserve`). Returns
        one :class:`Reservation` per part, in order.
        """
        if not parts:
            raise InvalidParameterError("parts must hold at least one (cost, iterations) pair.")
        items = [
            (
                as_cost(c),
                check_int(k, "iterations", minimum=1, hint=" Reserve at least one iteration."),
            )
            for c, k in parts
        ]
        n_chains = check_int(chains, "chains", minimum=1)
        if chain is not None:
            chain = check_int(chain, "chain", minimum=0)
        if not isinstance(mechanism, str) or not mechanism:
            raise InvalidParameterError(f"mechanism must be a non-empty string; got {mechanism!r}.")
        if not composition_fits([(items[0][0], 1)], self._epsilon, self._delta):
            raise self._too_small(items[0][0], 1, "a single iteration")
        entries = self._ledger.reserve_parts(
            self._dataset, items, mechanism=mechanism, chain=chain, chains=n_chains
        )
        return [Reservation._from_entry(entry, self._ledger) for entry in entries]
