"""Per-iteration privacy costs as composable events, and their composition (theory §3, §4).

A *cost* is a small frozen object describing what one iteration of a sampler releases about
the data, in the spirit of dp_accounting's ``DpEvent``\\ s. Accounting knows mechanisms, not
algorithms: a step method builds its per-iteration cost from the events of the mechanisms it
uses with :func:`compose`.

Atomic costs (one release of one mechanism):

* :class:`GaussianCost` — Gaussian releases with PLD parameter ``mu`` (``μ = 1/(2z²)`` for
  one release with noise multiplier ``z``; theory §2, §3).
* :class:`SubsampledGaussianCost` — a Gaussian release on a batch drawn without replacement
  (theory §4.2, §4.5), accounted with the PLD of :mod:`.subsampled`.
* :class:`BarkerCost` — one DP Barker test (theory §4.4), accounted in RDP (:mod:`.rdp`).

Composite costs (dp_accounting's ``SelfComposedDpEvent`` / ``ComposedDpEvent``):

* :class:`SelfComposedCost` — ``count`` releases of one cost per iteration.
* :class:`ComposedCost` — the releases of several costs per iteration.

Every cost flattens into atoms with counts (:meth:`PrivacyCost.atoms`). :func:`compose`
returns the normal form of a composition; all Gaussian atoms merge into one
``GaussianCost(Σ count·μ)`` (the tight fast path), e.g. a DP-HMC iteration, one
log-likelihood-ratio release and ``L + 1`` gradient releases, is::

    compose(GaussianCost.from_noise_multiplier(z_l),
            (GaussianCost.from_noise_multiplier(z_g), L + 1))
    == GaussianCost(1/(2 z_l²) + (L + 1)/(2 z_g²))

:func:`compose_epsilon` composes a list of ``(cost, iterations)`` pairs on the same data.
Each pair is flattened into ``(atom, iterations · count)`` and the accountant is the loosest
*level* of the atoms (``"gaussian"`` < ``"pld"`` < ``"rdp"``):

1. ``"gaussian"`` (only Gaussian atoms) — sum the PLD parameters, ``M = Σ k μ``, and use the
   tight closed form (theory §3);
2. ``"pld"`` (Gaussian and subsampled-Gaussian atoms) — compose PLDs numerically with
   dp_accounting (the Gaussian part as one ``N(M, 2M)`` PLD, each other atom as its
   self-composition, :meth:`AtomicCost.pld`);
3. ``"rdp"`` (any atom without a PLD here, i.e. DP Barker) — add RDP curves
   (:meth:`AtomicCost.rdp`; a Gaussian with PLD parameter ``μ`` has RDP ``αμ``) over the
   integer orders every atom supports, and convert with the improved RDP → (ε, δ) conversion.

Every method gives a valid upper bound on ε; 1 is exact, 2 is tight up to the PLD grid, 3 is
the loosest.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from pymc_dp.accounting import gaussian as _g
from pymc_dp.accounting import rdp as _rdp
from pymc_dp.accounting import subsampled as _sub
from pymc_dp.accounting._checks import check_delta, check_epsilon, check_int, check_positive
from pymc_dp.accounting._search import largest_fitting
from pymc_dp.errors import InvalidParameterError

__all__ = [
    "AtomicCost",
    "BarkerCost",
    "ComposedCost",
    "GaussianCost",
    "PrivacyCost",
    "SelfComposedCost",
    "SubsampledGaussianCost",
    "as_cost",
    "compose",
    "compose_epsilon",
    "composition_fits",
    "cost_from_record",
    "max_iterations",
]

#: Accountant levels, from the tightest to the loosest; a composition uses the loosest level
#: of its atoms.
LEVELS: tuple[str, ...] = ("gaussian", "pld", "rdp")

_ACCOUNTANTS: dict[str, str] = {
    "gaussian": "tight Gaussian PLD composition",
    "pld": "numerical PLD composition (dp_accounting)",
    "rdp": "RDP with subsampling amplification",
}

#: Largest RDP order used when no atom of an RDP composition bounds the orders itself.
_RDP_MAX_ORDER = _rdp.BARKER_MAX_ORDER


def _loosest(levels: Iterable[str]) -> str:
    return max(levels, key=LEVELS.index, default="gaussian")


class PrivacyCost(abc.ABC):
    """What one iteration of a sampler releases about the data (base class).

    Subclasses are frozen dataclasses; they pickle, hash and compare by value. Atomic costs
    derive from :class:`AtomicCost`; :class:`SelfComposedCost` and :class:`ComposedCost`
    combine other costs.
    """

    #: Short name stored in the ledger.
    kind: ClassVar[str]

    @abc.abstractmethod
    def atoms(self) -> tuple[tuple[AtomicCost, int], ...]:
        """The cost flattened into atomic costs with their counts per iteration.

        Equal atoms are merged (their counts added); an atomic cost returns ``((self, 1),)``.
        One iteration of the cost is the composition ``⊗_a a^{⊗ count_a}``.
        """

    @abc.abstractmethod
    def to_record(self) -> dict[str, Any]:
        """JSON-serialisable description (with ``"kind"``), inverse of :func:`cost_from_record`."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One-line human-readable description."""

    @classmethod
    def _from_record(cls, fields: dict[str, Any]) -> PrivacyCost:
        """Build the cost from the fields of its record (``"kind"`` removed)."""
        return cls(**fields)

    def epsilon(self, delta: float, iterations: int) -> float:
        """ε at ``delta`` after ``iterations`` iterations of this cost alone.

        Composite costs use :func:`compose_epsilon` on ``[(self, iterations)]``.
        """
        k = check_int(iterations, "iterations", minimum=0)
        return compose_epsilon([(self, k)], delta)[0]

    def accountant_level(self) -> str:
        """How a composition of this cost alone is accounted: ``"gaussian"``, ``"pld"`` or
        ``"rdp"`` (the loosest level of its atoms)."""
        return _loosest(atom.accountant_level() for atom, _ in self.atoms())

    @property
    def accountant(self) -> str:
        """How ε of this cost is computed, for reports."""
        return _ACCOUNTANTS[self.accountant_level()]

    def is_gaussian(self) -> bool:
        """Whether the cost is a plain Gaussian PLD ``N(μ, 2μ)`` per iteration."""
        return self.gaussian_mu() is not None

    def gaussian_mu(self) -> float | None:
        """PLD parameter per iteration if every atom is Gaussian, else ``None``.

        ``μ = Σ_a count_a · μ_a`` over the atoms (Gaussian PLDs compose by adding ``μ``).
        """
        total = []
        for atom, count in self.atoms():
            mu = atom.gaussian_mu()
            if mu is None:
                return None
            total.append(count * mu)
        return math.fsum(total)

    def covers(self, other: PrivacyCost) -> bool:
        """Whether a reservation of ``self`` covers a release of ``other`` (atomic costs only).

        Raises
        ------
        InvalidParameterError
            For a composite cost: compare the atoms of :meth:`atoms` instead.
        """
        raise InvalidParameterError(
            f"covers compares atomic costs; {self.describe()} is a composition. Compare the "
            "atoms of cost.atoms() (summing the mu of Gaussian atoms) instead."
        )

    def iterations_guess(self, epsilon: float, delta: float) -> int:
        """A starting point (≥ 1) for the search of how many iterations fit alone.

        Gaussian costs: the closed form of :func:`~pymc_dp.accounting.gaussian_iterations`.
        Otherwise ``min_a ⌊k_a / count_a⌋`` over the atoms, ``k_a`` the guess of atom ``a``
        alone. Affects only the speed of :func:`max_iterations`.
        """
        mu = self.gaussian_mu()
        if mu is not None:
            return max(_g.gaussian_iterations(epsilon, delta, mu), 1)
        return min(
            max(atom.iterations_guess(epsilon, delta) // count, 1) for atom, count in self.atoms()
        )


def _finite_positive(value: object, name: str, what: str) -> float:
    return check_positive(value, name, hint=f" {what}")


class AtomicCost(PrivacyCost):
    """One release of one mechanism: the atoms every cost flattens into.

    Subclasses declare how compositions containing them are accounted
    (:meth:`accountant_level`) and provide the pieces the accountants need: :meth:`pld`,
    :meth:`rdp` (with :meth:`rdp_min_order` / :meth:`rdp_max_order`) and
    :meth:`iterations_guess`.
    """

    def atoms(self) -> tuple[tuple[AtomicCost, int], ...]:
        return ((self, 1),)

    def gaussian_mu(self) -> float | None:
        return None

    @abc.abstractmethod
    def accountant_level(self) -> str:
        """``"gaussian"`` (closed form), ``"pld"`` (dp_accounting PLD) or ``"rdp"``."""

    @abc.abstractmethod
    def pld(self, count: int) -> Any:
        """dp_accounting ``PrivacyLossDistribution`` of ``count ≥ 1`` releases."""

    @abc.abstractmethod
    def rdp(self, orders: np.ndarray, count: int) -> np.ndarray:
        """RDP ``count · ε(α)`` of ``count`` releases at the integer ``orders``."""

    def rdp_min_order(self) -> int:
        """Smallest integer RDP order :meth:`rdp` supports."""
        return 2

    def rdp_max_order(self) -> int | None:
        """Largest integer RDP order :meth:`rdp` supports (``None``: unbounded)."""
        return None

    @abc.abstractmethod
    def iterations_guess(self, epsilon: float, delta: float) -> int:
        """Roughly how many releases fit in (epsilon, delta) alone (≥ 1; search start)."""

    def covers(self, other: PrivacyCost) -> bool:
        """Whether a reservation of ``self`` covers a release of ``other``.

        True when ``other`` is no more revealing than ``self``: both Gaussian (including a
        subsampled Gaussian with ``q = 1``) and ``μ_other ≤ μ_self``; both subsampled
        Gaussians with the same sampling ratio and ``z_other ≥ z_self``; equal DP Barker
        costs. Different kinds otherwise never cover each other.

        Raises
        ------
        InvalidParameterError
            If ``other`` is not an atomic cost.
        """
        if not isinstance(other, AtomicCost):
            raise InvalidParameterError(
                f"other must be an atomic cost (GaussianCost, SubsampledGaussianCost, "
                f"BarkerCost); got {other!r}. Compare the atoms of other.atoms() one by one."
            )
        mine, theirs = self.gaussian_mu(), other.gaussian_mu()
        if mine is not None and theirs is not None:
            return theirs <= mine
        return self._covers_atom(other)

    def _covers_atom(self, other: AtomicCost) -> bool:
        """:meth:`covers` for a pair that is not both Gaussian."""
        return False

    def _sort_key(self) -> tuple[Any, ...]:
        """Canonical order of atoms in a :class:`ComposedCost`: level, kind, then fields."""
        return (LEVELS.index(self.accountant_level()), self.kind, dataclasses.astuple(self))


@dataclasses.dataclass(frozen=True)
class GaussianCost(AtomicCost):
    """Gaussian releases with total PLD parameter ``mu`` per iteration (theory §2, §3).

    Parameters
    ----------
    mu : float
        ``Σ Δ_j²/(2σ_j²)`` over the Gaussian releases of one iteration (> 0, finite).

    Examples
    --------
    >>> GaussianCost.from_noise_multiplier(10.0)           # one release, z = 10
    GaussianCost(mu=0.005)
    >>> hmc = compose(                                      # DP HMC, L = 25
    ...     GaussianCost.from_noise_multiplier(10.0),
    ...     (GaussianCost.from_noise_multiplier(50.0), 25 + 1),
    ... )
    >>> round(hmc.mu, 6)
    0.0102
    """

    mu: float
    kind: ClassVar[str] = "gaussian"

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "mu",
            _finite_positive(
                self.mu,
                "mu",
                "It is the PLD parameter of one iteration, 1/(2 z^2) for one Gaussian release "
                "with noise multiplier z.",
            ),
        )

    @classmethod
    def from_noise_multiplier(cls, noise_multiplier: float) -> GaussianCost:
        """One Gaussian release: ``μ = 1/(2z²)`` with ``z = σ/Δ`` (theory §2)."""
        z = check_positive(noise_multiplier, "noise_multiplier")
        return cls(1.0 / (2.0 * z * z))

    def accountant_level(self) -> str:
        return "gaussian"

    def gaussian_mu(self) -> float | None:
        return self.mu

    def epsilon(self, delta: float, iterations: int) -> float:
        """Tight ε at ``delta`` of ``iterations`` iterations (theory §3)."""
        k = check_int(iterations, "iterations", minimum=0)
        return float(_g.gaussian_epsilon(check_delta(delta), k * self.mu)) if k else 0.0

    def pld(self, count: int) -> Any:
        """PLD ``N(kμ, 2kμ)`` of ``k = count`` releases."""
        return _sub.gaussian_pld(check_int(count, "count", minimum=1) * self.mu)

    def rdp(self, orders: np.ndarray, count: int) -> np.ndarray:
        """RDP ``count · α μ`` (a Gaussian PLD ``N(μ, 2μ)`` is ``(α, αμ)``-RDP)."""
        return count * self.mu * np.asarray(orders, dtype=float)

    def iterations_guess(self, epsilon: float, delta: float) -> int:
        return max(_g.gaussian_iterations(epsilon, delta, self.mu), 1)

    def to_record(self) -> dict[str, Any]:
        return {"kind": self.kind, "mu": self.mu}

    def describe(self) -> str:
        return f"Gaussian, mu={self.mu:.6g} per iteration"


@dataclasses.dataclass(frozen=True)
class SubsampledGaussianCost(AtomicCost):
    """A Gaussian release on a batch drawn without replacement (theory §4.2, §4.5).

    Parameters
    ----------
    noise_multiplier : float
        ``z = σ/Δ`` with ``Δ`` the substitute-relation sensitivity of the batch query (theory §2).
    sampling_ratio : float
        ``q = b/n`` in ``(0, 1]``.

    Notes
    -----
    Accounted with the PLD of the Dong–Roth–Su dominating pair computed through dp_accounting
    (:mod:`pymc_dp.accounting.subsampled`); in RDP with WBK Thm 9 on the base ``α/(2z²)``.
    ``sampling_ratio = 1`` is a plain Gaussian with ``μ = 1/(2z²)`` (accountant level
    ``"gaussian"``).
    """

    noise_multiplier: float
    sampling_ratio: float
    kind: ClassVar[str] = "subsampled_gaussian"

    def __post_init__(self) -> None:
        z, q = _sub._check_zq(self.noise_multiplier, self.sampling_ratio)
        object.__setattr__(self, "noise_multiplier", z)
        object.__setattr__(self, "sampling_ratio", q)

    def accountant_level(self) -> str:
        return "gaussian" if self.sampling_ratio == 1.0 else "pld"

    def gaussian_mu(self) -> float | None:
        if self.sampling_ratio == 1.0:
            return 1.0 / (2.0 * self.noise_multiplier**2)
        return None

    def epsilon(self, delta: float, iterations: int) -> float:
        """ε at ``delta`` of ``iterations`` iterations (PLD accounting)."""
        return _sub.subsampled_gaussian_epsilon(
            self.noise_multiplier, self.sampling_ratio, iterations, delta
        )

    def pld(self, count: int) -> Any:
        """Pessimistic PLD of ``C_q(G_{1/z})^{⊗count}`` (:func:`.subsampled_gaussian_pld`)."""
        return _sub.subsampled_gaussian_pld(self.noise_multiplier, self.sampling_ratio, count)

    def rdp(self, orders: np.ndarray, count: int) -> np.ndarray:
        """``count`` times WBK Thm 9 on the Gaussian base ``α/(2z²)`` (sampling w/o replacement)."""
        return count * _sub.subsampled_gaussian_rdp(
            orders, self.noise_multiplier, self.sampling_ratio
        )

    def iterations_guess(self, epsilon: float, delta: float) -> int:
        """Central-limit guess: a PLD with mean ``m`` per release behaves like ``N(km, 2km)``,
        so ``k ≈ M*(ε, δ)/m``."""
        mu = self.gaussian_mu()
        if mu is not None:
            return max(_g.gaussian_iterations(epsilon, delta, mu), 1)
        kl = _sub.symmetric_pld_mean(self.noise_multiplier, self.sampling_ratio)
        return max(math.floor(float(_g.gaussian_capacity(epsilon, delta)) / kl), 1) if kl > 0 else 1

    def _covers_atom(self, other: AtomicCost) -> bool:
        return (
            isinstance(other, SubsampledGaussianCost)
            and other.sampling_ratio == self.sampling_ratio
            and other.noise_multiplier >= self.noise_multiplier
        )

    def to_record(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "noise_multiplier": self.noise_multiplier,
            "sampling_ratio": self.sampling_ratio,
        }

    def describe(self) -> str:
        return (
            f"subsampled Gaussian, z={self.noise_multiplier:.6g}, "
            f"q={self.sampling_ratio:.6g} (without replacement)"
        )


@dataclasses.dataclass(frozen=True)
class BarkerCost(AtomicCost):
    """One DP Barker iteration on a batch of ``batch_size`` out of ``n`` rows (theory §4.4).

    Valid for the clip ``T|r_j| ≤ √b/n`` and total normal variance ``C = 2`` of theory §4.4
    (thesis Thm 3.3); accounted in RDP over integer orders ``3 ≤ α < b/5`` (it has no PLD
    here, so any composition containing it is accounted in RDP).

    Parameters
    ----------
    batch_size : int
        Batch size ``b ≥ 16`` (rows drawn without replacement).
    n : int
        Number of rows ``n ≥ b``.
    """

    batch_size: int
    n: int
    kind: ClassVar[str] = "barker"

    def __post_init__(self) -> None:
        b, n_rows = _rdp._check_barker(self.batch_size, self.n)
        object.__setattr__(self, "batch_size", b)
        object.__setattr__(self, "n", n_rows)

    def accountant_level(self) -> str:
        return "rdp"

    def epsilon(self, delta: float, iterations: int) -> float:
        """ε at ``delta`` of ``iterations`` iterations (RDP, improved conversion)."""
        return _rdp.barker_epsilon(iterations, self.batch_size, self.n, delta)

    def pld(self, count: int) -> Any:
        """Not available: DP Barker is accounted in RDP only.

        Raises
        ------
        InvalidParameterError
            Always.
        """
        raise InvalidParameterError(
            f"{self.describe()} has no privacy loss distribution here; it is accounted in RDP "
            "(compose_epsilon uses RDP for every composition containing it)."
        )

    def rdp(self, orders: np.ndarray, count: int) -> np.ndarray:
        """``count · ε(α)`` with ``ε(α)`` of :func:`~pymc_dp.accounting.barker_rdp`."""
        b_orders, b_rdp = _rdp.barker_rdp(self.batch_size, self.n)
        a = np.asarray(orders, dtype=np.int64)
        if a.size == 0 or a.min() < b_orders[0] or a.max() > b_orders[-1]:
            raise InvalidParameterError(
                f"orders must lie in [{int(b_orders[0])}, {int(b_orders[-1])}] for "
                f"{self.describe()} (integer 2 < alpha < b/5); got {orders!r}."
            )
        return count * b_rdp[a - b_orders[0]]

    def rdp_min_order(self) -> int:
        return 3

    def rdp_max_order(self) -> int | None:
        return int(_rdp.barker_orders(self.batch_size)[-1])

    def iterations_guess(self, epsilon: float, delta: float) -> int:
        """The exact count of this cost alone (a cheap RDP search)."""
        return max(largest_fitting(lambda k: self.epsilon(delta, k) <= epsilon, 1), 1)

    def _covers_atom(self, other: AtomicCost) -> bool:
        return other == self

    def to_record(self) -> dict[str, Any]:
        return {"kind": self.kind, "batch_size": self.batch_size, "n": self.n}

    def describe(self) -> str:
        return f"DP Barker, batch {self.batch_size} of n={self.n} (RDP)"


def _merge(pairs: Iterable[tuple[AtomicCost, int]]) -> tuple[tuple[AtomicCost, int], ...]:
    """Add the counts of equal atoms (first appearance order), dropping zero counts."""
    counts: dict[AtomicCost, int] = {}
    for atom, count in pairs:
        counts[atom] = counts.get(atom, 0) + count
    return tuple((atom, count) for atom, count in counts.items() if count)


def _check_part(cost: object, name: str) -> PrivacyCost:
    if not isinstance(cost, PrivacyCost):
        raise InvalidParameterError(
            f"{name} must be a PrivacyCost (GaussianCost, SubsampledGaussianCost, BarkerCost, "
            f"SelfComposedCost, ComposedCost); got {cost!r}. Build compositions with compose()."
        )
    return cost


@dataclasses.dataclass(frozen=True)
class SelfComposedCost(PrivacyCost):
    """``count`` releases of ``cost`` per iteration (dp_accounting's ``SelfComposedDpEvent``).

    One iteration is ``cost^{⊗count}``: ``m`` iterations spend what ``count · m`` iterations of
    ``cost`` spend. Prefer :func:`compose`, which returns the normal form (a Gaussian
    ``cost`` becomes ``GaussianCost(count · μ)``).

    Parameters
    ----------
    cost : PrivacyCost
        The cost released ``count`` times.
    count : int
        Number of releases per iteration (≥ 1).
    """

    cost: PrivacyCost
    count: int
    kind: ClassVar[str] = "self_composed"

    def __post_init__(self) -> None:
        _check_part(self.cost, "cost")
        object.__setattr__(
            self,
            "count",
            check_int(
                self.count,
                "count",
                minimum=1,
                hint=" It is the number of releases of `cost` per iteration.",
            ),
        )

    def atoms(self) -> tuple[tuple[AtomicCost, int], ...]:
        return tuple((atom, n * self.count) for atom, n in self.cost.atoms())

    @classmethod
    def _from_record(cls, fields: dict[str, Any]) -> PrivacyCost:
        return cls(cost_from_record(fields["cost"]), fields["count"])

    def to_record(self) -> dict[str, Any]:
        return {"kind": self.kind, "cost": self.cost.to_record(), "count": self.count}

    def describe(self) -> str:
        return f"{self.count} x [{self.cost.describe()}]"


@dataclasses.dataclass(frozen=True)
class ComposedCost(PrivacyCost):
    """The releases of several costs per iteration (dp_accounting's ``ComposedDpEvent``).

    One iteration is ``parts[0] ⊗ parts[1] ⊗ …``. Prefer :func:`compose`, which returns the
    normal form (Gaussian atoms merged, parts in a canonical order, so that equal
    compositions compare equal).

    Parameters
    ----------
    parts : tuple of PrivacyCost
        The costs composed (at least one; a list is converted to a tuple).
    """

    parts: tuple[PrivacyCost, ...]
    kind: ClassVar[str] = "composed"

    def __post_init__(self) -> None:
        if isinstance(self.parts, PrivacyCost) or not isinstance(self.parts, Iterable):
            raise InvalidParameterError(
                f"parts must be a tuple of PrivacyCost; got {self.parts!r}. Wrap a single cost "
                "as (cost,) or use compose(cost, ...)."
            )
        parts = tuple(_check_part(p, "each of parts") for p in self.parts)
        if not parts:
            raise InvalidParameterError(
                "parts must hold at least one PrivacyCost; got an empty tuple."
            )
        object.__setattr__(self, "parts", parts)

    def atoms(self) -> tuple[tuple[AtomicCost, int], ...]:
        return _merge(pair for part in self.parts for pair in part.atoms())

    @classmethod
    def _from_record(cls, fields: dict[str, Any]) -> PrivacyCost:
        return cls(tuple(cost_from_record(r) for r in fields["parts"]))

    def to_record(self) -> dict[str, Any]:
        return {"kind": self.kind, "parts": [p.to_record() for p in self.parts]}

    def describe(self) -> str:
        return "composition of " + " + ".join(f"[{p.describe()}]" for p in self.parts)


def compose(*items: PrivacyCost | tuple[PrivacyCost, int]) -> PrivacyCost:
    """The normal form of the composition of ``items`` for one iteration.

    Parameters
    ----------
    *items : PrivacyCost or (PrivacyCost, int)
        Costs released once, or ``(cost, count)`` pairs released ``count ≥ 0`` times per
        iteration (a float is shorthand for ``GaussianCost(mu)``).

    Returns
    -------
    PrivacyCost
        Nested composites are flattened into atoms, equal atoms merged and zero counts
        dropped; all Gaussian atoms merge into one ``GaussianCost(Σ count·μ)`` (Gaussian PLDs
        compose by adding ``μ``, theory §3). A single atom with count 1 is returned as itself,
        with count ``k > 1`` as ``SelfComposedCost(atom, k)``; several atoms give a
        :class:`ComposedCost` whose parts are in a canonical order, so
        ``compose(a, b) == compose(b, a)``.

    Raises
    ------
    InvalidParameterError
        For a bad cost or count, or when no cost with a count ≥ 1 is left.

    Examples
    --------
    >>> zl, zg, steps = 10.0, 50.0, 25                      # DP HMC
    >>> compose(GaussianCost.from_noise_multiplier(zl),
    ...         (GaussianCost.from_noise_multiplier(zg), steps + 1))
    GaussianCost(mu=0.0102)
    """
    pairs: list[tuple[AtomicCost, int]] = []
    for item in items:
        if isinstance(item, tuple):
            if len(item) != 2:
                raise InvalidParameterError(
                    f"each item of compose must be a cost or a (cost, count) pair; got {item!r}."
                )
            cost, count = item
        else:
            cost, count = item, 1
        c = as_cost(cost)
        k = check_int(
            count, "count", minimum=0, hint=" It is the number of releases per iteration."
        )
        pairs.extend((atom, k * n) for atom, n in c.atoms())
    merged = _merge(pairs)
    if not merged:
        raise InvalidParameterError(
            f"compose needs at least one cost with a count >= 1; got {items!r}."
        )
    gaussian = [(a, n) for a, n in merged if isinstance(a, GaussianCost)]
    rest = [(a, n) for a, n in merged if not isinstance(a, GaussianCost)]
    if len(gaussian) > 1 or (gaussian and gaussian[0][1] > 1):
        total = math.fsum(n * a.mu for a, n in gaussian)  # type: ignore[attr-defined]
        gaussian = [(GaussianCost(total), 1)]
    parts = sorted(gaussian + rest, key=lambda pair: pair[0]._sort_key())
    if len(parts) == 1:
        atom, n = parts[0]
        return atom if n == 1 else SelfComposedCost(atom, n)
    return ComposedCost(tuple(a if n == 1 else SelfComposedCost(a, n) for a, n in parts))


_KINDS: dict[str, type[PrivacyCost]] = {
    cls.kind: cls
    for cls in (GaussianCost, SubsampledGaussianCost, BarkerCost, SelfComposedCost, ComposedCost)
}


def cost_from_record(record: dict[str, Any]) -> PrivacyCost:
    """Rebuild a cost from :meth:`PrivacyCost.to_record` output (nested records included)."""
    try:
        kind = record["kind"]
        cls = _KINDS[kind]
    except (KeyError, TypeError) as exc:
        raise InvalidParameterError(f"unknown privacy cost record {record!r}.") from exc
    fields = {k: v for k, v in record.items() if k != "kind"}
    try:
        return cls._from_record(fields)
    except KeyError as exc:
        raise InvalidParameterError(
            f"privacy cost record {record!r} lacks the field {exc.args[0]!r}."
        ) from exc


def as_cost(cost: PrivacyCost | float) -> PrivacyCost:
    """Accept a cost object or a plain float (shorthand for ``GaussianCost(mu)``)."""
    if isinstance(cost, PrivacyCost):
        return cost
    if isinstance(cost, numbers.Real) and not isinstance(cost, bool):
        return GaussianCost(float(cost))
    raise InvalidParameterError(
        f"cost must be a PrivacyCost (GaussianCost, SubsampledGaussianCost, BarkerCost, or a "
        f"composition of them from compose()) or a float per-iteration mu; got {cost!r}."
    )


Spending = Sequence[tuple[PrivacyCost, int]]
Atoms = Sequence[tuple[AtomicCost, int]]


def _normalise(
    spending: Iterable[tuple[PrivacyCost | float, int]],
) -> list[tuple[PrivacyCost, int]]:
    out = []
    for cost, k in spending:
        kk = check_int(k, "iterations", minimum=0)
        if kk:
            out.append((as_cost(cost), kk))
    return out


def _flatten(spending: Spending) -> list[tuple[AtomicCost, int]]:
    """``(cost, k)`` pairs → ``(atom, k · count)`` pairs with equal atoms merged.

    Merging is exact (``A^{⊗k₁} ⊗ A^{⊗k₂} = A^{⊗(k₁+k₂)}``) and keeps the PLD accountant's
    work independent of how many ledger entries (e.g. one per chain) share an atom.
    """
    return list(_merge((atom, k * n) for cost, k in spending for atom, n in cost.atoms()))


def _method(atoms: Atoms) -> str:
    return _loosest(atom.accountant_level() for atom, _ in atoms)


def _total_mu(atoms: Atoms) -> float:
    total = 0.0
    for atom, k in atoms:
        mu = atom.gaussian_mu()
        if mu is not None:
            total += k * mu
    return total


def _pld(atoms: Atoms) -> Any:
    pld = None
    m = _total_mu(atoms)
    if m > 0:
        pld = _sub.gaussian_pld(m)
    for atom, k in atoms:
        if atom.gaussian_mu() is None:
            part = atom.pld(k)
            pld = part if pld is None else pld.compose(part)
    return pld


def _rdp_total(atoms: Atoms) -> tuple[np.ndarray, np.ndarray]:
    lowest = max(atom.rdp_min_order() for atom, _ in atoms)
    bounds = [top for atom, _ in atoms if (top := atom.rdp_max_order()) is not None]
    highest = min(bounds, default=_RDP_MAX_ORDER)
    orders = np.arange(lowest, highest + 1, dtype=np.int64)
    total = np.zeros(orders.shape)
    total += orders * _total_mu(atoms)
    for atom, k in atoms:
        if atom.gaussian_mu() is None:
            total += atom.rdp(orders, k)
    return orders, total


def compose_epsilon(
    spending: Iterable[tuple[PrivacyCost | float, int]], delta: float
) -> tuple[float, str]:
    """ε at ``delta`` of the composition of ``(cost, iterations)`` pairs on the same data.

    Each pair ``(cost, k)`` is flattened into ``(atom, k · count)`` over ``cost.atoms()``; the
    accountant is the loosest level of the atoms (module docstring).

    Parameters
    ----------
    spending : iterable of (cost, int)
        Costs (or plain floats = Gaussian ``mu``) and iteration counts.
    delta : float
        Target δ.

    Returns
    -------
    (float, str)
        ε and the method used: ``"gaussian"`` (tight closed form on ``M = Σ k μ``), ``"pld"``
        (dp_accounting PLD composition) or ``"rdp"`` (RDP curves added, improved conversion
        ``ε = min_α [Σ k ε(α) + ln((α-1)/α) - (ln δ + ln α)/(α - 1)]``).
    """
    d = check_delta(delta)
    atoms = _flatten(_normalise(spending))
    if not atoms:
        return 0.0, "gaussian"
    method = _method(atoms)
    if method == "gaussian":
        return float(_g.gaussian_epsilon(d, _total_mu(atoms))), method
    if method == "pld":
        return max(0.0, float(_pld(atoms).get_epsilon_for_delta(d))), method
    orders, total = _rdp_total(atoms)
    return _rdp.rdp_to_epsilon(orders, total, d)[0], method


def composition_fits(
    spending: Iterable[tuple[PrivacyCost | float, int]], epsilon: float, delta: float
) -> bool:
    """Whether the composition is (epsilon, delta)-DP by the method of :func:`compose_epsilon`.

    Gaussian-only compositions are checked as ``δ(ε; Σ k μ) ≤ δ`` on the closed form, PLD ones
    as ``δ_PLD(ε) ≤ δ``, RDP ones as ``ε_RDP(δ) ≤ ε``.
    """
    eps = check_epsilon(epsilon)
    d = check_delta(delta)
    atoms = _flatten(_normalise(spending))
    if not atoms:
        return True
    method = _method(atoms)
    if method == "gaussian":
        return _g._fits(eps, _total_mu(atoms), d)
    if method == "pld":
        return float(_pld(atoms).get_delta_for_epsilon(eps)) <= d
    orders, total = _rdp_total(atoms)
    return _rdp.rdp_to_epsilon(orders, total, d)[0] <= eps


def max_iterations(
    spending: Iterable[tuple[PrivacyCost | float, int]],
    cost: PrivacyCost | float,
    epsilon: float,
    delta: float,
) -> int:
    """Largest ``k`` such that ``spending + [(cost, k)]`` still fits in (epsilon, delta).

    Gaussian spending and cost: closed form ``⌊(M* - M_spent)/μ⌋`` checked against the δ
    formula (:func:`~pymc_dp.accounting.gaussian_iterations`). Otherwise a galloping bisection
    on ``k`` (thesis Algorithm 2) over :func:`composition_fits`, started from
    :meth:`PrivacyCost.iterations_guess`.

    Returns
    -------
    int
        Iterations that still fit (``0`` when none does, including when ``spending`` alone
        already exceeds the budget).
    """
    eps = check_epsilon(epsilon)
    d = check_delta(delta)
    items = _normalise(spending)
    new = as_cost(cost)
    if not composition_fits(items, eps, d):
        return 0
    new_mu = new.gaussian_mu()
    if new_mu is not None and all(c.is_gaussian() for c, _ in items):
        return _g.gaussian_iterations(eps, d, new_mu, spent_mu=_total_mu(_flatten(items)))

    def fits(k: int) -> bool:
        return composition_fits([*items, (new, k)], eps, d)

    guess = new.iterations_guess(eps, d)
    return largest_fitting(fits, guess, step=max(1, guess // 32))
