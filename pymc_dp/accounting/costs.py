"""Per-iteration privacy costs and their composition (SPEC §3, §4.1–§4.5).

A *cost* is a small frozen object describing what one iteration of a sampler releases, in the
spirit of dp_accounting's ``DpEvent``\\ s:

* :class:`GaussianCost` — Gaussian releases with total PLD parameter ``mu`` per iteration
  (DP penalty: ``μ = 1/(2z²)``; DP HMC: ``μ = 1/(2z_l²) + (L+1)/(2z_g²)``; SPEC §4.1, §4.3).
* :class:`SubsampledGaussianCost` — a Gaussian release on a batch drawn without replacement
  (minibatch DP penalty, stochastic-gradient baselines; SPEC §4.2, §4.5), accounted with the
  PLD of :mod:`.subsampled`.
* :class:`BarkerCost` — one DP Barker iteration (SPEC §4.4), accounted in RDP (:mod:`.rdp`).

:func:`compose_epsilon` composes a list of ``(cost, iterations)`` pairs on the same data:

1. only Gaussian costs — sum the PLD parameters and use the tight closed form (SPEC §3);
2. Gaussian and subsampled-Gaussian costs — compose PLDs numerically with dp_accounting (the
   Gaussian part as one ``N(M, 2M)`` PLD, each subsampled part as its self-composition);
3. anything with DP Barker — add RDP curves over the integer orders where the Barker bound
   holds (a Gaussian with PLD parameter ``μ`` has RDP ``αμ``; subsampled Gaussians use WBK
   Thm 9) and convert with the improved RDP → (ε, δ) conversion.

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
    "BarkerCost",
    "GaussianCost",
    "PrivacyCost",
    "SubsampledGaussianCost",
    "as_cost",
    "compose_epsilon",
    "composition_fits",
    "cost_from_record",
    "max_iterations",
]


class PrivacyCost(abc.ABC):
    """What one iteration of a sampler releases about the data (base class).

    Subclasses are frozen dataclasses; they pickle, hash and compare by value.
    """

    #: Short name stored in the ledger.
    kind: ClassVar[str]
    #: How ε is computed, for reports.
    accountant: ClassVar[str]

    @abc.abstractmethod
    def epsilon(self, delta: float, iterations: int) -> float:
        """ε at ``delta`` after ``iterations`` iterations of this cost alone."""

    @abc.abstractmethod
    def to_record(self) -> dict[str, Any]:
        """JSON-serialisable description (with ``"kind"``), inverse of :func:`cost_from_record`."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One-line human-readable description."""

    def is_gaussian(self) -> bool:
        """Whether the cost is a plain Gaussian PLD ``N(μ, 2μ)`` per iteration."""
        return self.gaussian_mu() is not None

    def gaussian_mu(self) -> float | None:
        """PLD parameter per iteration if the cost is exactly Gaussian, else ``None``."""
        return None


def _finite_positive(value: object, name: str, what: str) -> float:
    return check_positive(value, name, hint=f" {what}")


@dataclasses.dataclass(frozen=True)
class GaussianCost(PrivacyCost):
    """Gaussian releases with total PLD parameter ``mu`` per iteration (SPEC §2, §3).

    Parameters
    ----------
    mu : float
        ``Σ Δ_j²/(2σ_j²)`` over the Gaussian releases of one iteration (> 0, finite).

    Examples
    --------
    >>> GaussianCost.from_noise_multiplier(10.0)           # DP penalty, z = 10
    GaussianCost(mu=0.005)
    >>> round(GaussianCost.hmc(10.0, 50.0, leapfrog_steps=25).mu, 6)  # DP HMC
    0.0102
    """

    mu: float
    kind: ClassVar[str] = "gaussian"
    accountant: ClassVar[str] = "tight Gaussian PLD composition"

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
        """One Gaussian release per iteration: ``μ = 1/(2z²)`` (DP penalty, SPEC §4.1)."""
        z = check_positive(noise_multiplier, "noise_multiplier")
        return cls(1.0 / (2.0 * z * z))

    @classmethod
    def hmc(
        cls, noise_multiplier_l: float, noise_multiplier_g: float, *, leapfrog_steps: int
    ) -> GaussianCost:
        """DP HMC iteration: ``μ = 1/(2z_l²) + (L+1)/(2z_g²)`` (SPEC §4.3; thesis Thm 4.3)."""
        zl = check_positive(noise_multiplier_l, "noise_multiplier_l")
        zg = check_positive(noise_multiplier_g, "noise_multiplier_g")
        steps = check_int(leapfrog_steps, "leapfrog_steps", minimum=1)
        return cls(1.0 / (2.0 * zl * zl) + (steps + 1) / (2.0 * zg * zg))

    def gaussian_mu(self) -> float | None:
        return self.mu

    def epsilon(self, delta: float, iterations: int) -> float:
        """Tight ε at ``delta`` of ``iterations`` iterations (SPEC §3)."""
        k = check_int(iterations, "iterations", minimum=0)
        return float(_g.gaussian_epsilon(check_delta(delta), k * self.mu)) if k else 0.0

    def to_record(self) -> dict[str, Any]:
        return {"kind": self.kind, "mu": self.mu}

    def describe(self) -> str:
        return f"Gaussian, mu={self.mu:.6g} per iteration"


@dataclasses.dataclass(frozen=True)
class SubsampledGaussianCost(PrivacyCost):
    """A Gaussian release on a batch drawn without replacement (SPEC §4.2, §4.5).

    Parameters
    ----------
    noise_multiplier : float
        ``z = σ/Δ`` with ``Δ`` the substitute-relation sensitivity of the batch query (SPEC §2).
    sampling_ratio : float
        ``q = b/n`` in ``(0, 1]``.

    Notes
    -----
    Accounted with the PLD of the Dong–Roth–Su dominating pair computed through dp_accounting
    (:mod:`pymc_dp.accounting.subsampled`). ``sampling_ratio = 1`` is a plain Gaussian with
    ``μ = 1/(2z²)``.
    """

    noise_multiplier: float
    sampling_ratio: float
    kind: ClassVar[str] = "subsampled_gaussian"
    accountant: ClassVar[str] = "numerical PLD composition (dp_accounting)"

    def __post_init__(self) -> None:
        z, q = _sub._check_zq(self.noise_multiplier, self.sampling_ratio)
        object.__setattr__(self, "noise_multiplier", z)
        object.__setattr__(self, "sampling_ratio", q)

    def gaussian_mu(self) -> float | None:
        if self.sampling_ratio == 1.0:
            return 1.0 / (2.0 * self.noise_multiplier**2)
        return None

    def epsilon(self, delta: float, iterations: int) -> float:
        """ε at ``delta`` of ``iterations`` iterations (PLD accounting)."""
        return _sub.subsampled_gaussian_epsilon(
            self.noise_multiplier, self.sampling_ratio, iterations, delta
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
class BarkerCost(PrivacyCost):
    """One DP Barker iteration on a batch of ``batch_size`` out of ``n`` rows (SPEC §4.4).

    Valid for the clip ``T|r_j| ≤ √b/n`` and total normal variance ``C = 2`` of SPEC §4.4
    (thesis Thm 3.3); accounted in RDP over integer orders ``3 ≤ α < b/5``.

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
    accountant: ClassVar[str] = "RDP with subsampling amplification"

    def __post_init__(self) -> None:
        b, n_rows = _rdp._check_barker(self.batch_size, self.n)
        object.__setattr__(self, "batch_size", b)
        object.__setattr__(self, "n", n_rows)

    def epsilon(self, delta: float, iterations: int) -> float:
        """ε at ``delta`` of ``iterations`` iterations (RDP, improved conversion)."""
        return _rdp.barker_epsilon(iterations, self.batch_size, self.n, delta)

    def to_record(self) -> dict[str, Any]:
        return {"kind": self.kind, "batch_size": self.batch_size, "n": self.n}

    def describe(self) -> str:
        return f"DP Barker, batch {self.batch_size} of n={self.n} (RDP)"


_KINDS: dict[str, type[PrivacyCost]] = {
    GaussianCost.kind: GaussianCost,
    SubsampledGaussianCost.kind: SubsampledGaussianCost,
    BarkerCost.kind: BarkerCost,
}


def cost_from_record(record: dict[str, Any]) -> PrivacyCost:
    """Rebuild a cost from :meth:`PrivacyCost.to_record` output."""
    try:
        kind = record["kind"]
        cls = _KINDS[kind]
    except (KeyError, TypeError) as exc:
        raise InvalidParameterError(f"unknown privacy cost record {record!r}.") from exc
    fields = {k: v for k, v in record.items() if k != "kind"}
    return cls(**fields)


def as_cost(cost: PrivacyCost | float) -> PrivacyCost:
    """Accept a cost object or a plain float (shorthand for ``GaussianCost(mu)``)."""
    if isinstance(cost, PrivacyCost):
        return cost
    if isinstance(cost, numbers.Real) and not isinstance(cost, bool):
        return GaussianCost(float(cost))
    raise InvalidParameterError(
        f"cost must be a PrivacyCost (GaussianCost, SubsampledGaussianCost, BarkerCost) or a "
        f"float per-iteration mu; got {cost!r}."
    )


Spending = Sequence[tuple[PrivacyCost, int]]


def _normalise(
    spending: Iterable[tuple[PrivacyCost | float, int]],
) -> list[tuple[PrivacyCost, int]]:
    out = []
    for cost, k in spending:
        kk = check_int(k, "iterations", minimum=0)
        if kk:
            out.append((as_cost(cost), kk))
    return out


def _method(spending: Spending) -> str:
    if all(c.is_gaussian() for c, _ in spending):
        return "gaussian"
    if any(isinstance(c, BarkerCost) for c, _ in spending):
        return "rdp"
    return "pld"


def _total_mu(spending: Spending) -> float:
    total = 0.0
    for c, k in spending:
        mu = c.gaussian_mu()
        if mu is not None:
            total += k * mu
    return total


def _pld(spending: Spending) -> Any:
    pld = None
    m = _total_mu(spending)
    if m > 0:
        pld = _sub.gaussian_pld(m)
    for c, k in spending:
        if c.gaussian_mu() is None:
            assert isinstance(c, SubsampledGaussianCost)
            part = _sub.subsampled_gaussian_pld(c.noise_multiplier, c.sampling_ratio, k)
            pld = part if pld is None else pld.compose(part)
    return pld


def _rdp_total(spending: Spending) -> tuple[np.ndarray, np.ndarray]:
    barkers = [c for c, _ in spending if isinstance(c, BarkerCost)]
    top = min(int(_rdp.barker_orders(c.batch_size)[-1]) for c in barkers)
    orders = np.arange(3, top + 1, dtype=np.int64)
    total = np.zeros(orders.shape)
    m = _total_mu(spending)
    total += orders * m
    for c, k in spending:
        if isinstance(c, BarkerCost):
            b_orders, b_rdp = _rdp.barker_rdp(c.batch_size, c.n)
            total += k * b_rdp[: orders.size]
            assert np.array_equal(b_orders[: orders.size], orders)
        elif c.gaussian_mu() is None:
            assert isinstance(c, SubsampledGaussianCost)
            total += k * _sub.subsampled_gaussian_rdp(orders, c.noise_multiplier, c.sampling_ratio)
    return orders, total


def compose_epsilon(
    spending: Iterable[tuple[PrivacyCost | float, int]], delta: float
) -> tuple[float, str]:
    """ε at ``delta`` of the composition of ``(cost, iterations)`` pairs on the same data.

    Parameters
    ----------
    spending : iterable of (cost, int)
        Costs (or plain floats = Gaussian ``mu``) and iteration counts.
    delta : float
        Target δ.

    Returns
    -------
    (float, str)
        ε and the method used: ``"gaussian"`` (tight closed form on ``Σ k μ``), ``"pld"``
        (dp_accounting PLD composition) or ``"rdp"`` (RDP curves added, improved conversion).
    """
    d = check_delta(delta)
    items = _normalise(spending)
    if not items:
        return 0.0, "gaussian"
    method = _method(items)
    if method == "gaussian":
        return float(_g.gaussian_epsilon(d, _total_mu(items))), method
    if method == "pld":
        return max(0.0, float(_pld(items).get_epsilon_for_delta(d))), method
    orders, total = _rdp_total(items)
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
    items = _normalise(spending)
    if not items:
        return True
    method = _method(items)
    if method == "gaussian":
        return _g._fits(eps, _total_mu(items), d)
    if method == "pld":
        return float(_pld(items).get_delta_for_epsilon(eps)) <= d
    orders, total = _rdp_total(items)
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
    on ``k`` (thesis Algorithm 2) over :func:`composition_fits`, started from a looser bound.

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
    if new.is_gaussian() and all(c.is_gaussian() for c, _ in items):
        return _g.gaussian_iterations(eps, d, new.gaussian_mu(), spent_mu=_total_mu(items))

    def fits(k: int) -> bool:
        return composition_fits([*items, (new, k)], eps, d)

    guess = _guess(new, eps, d)
    return largest_fitting(fits, guess, step=max(1, guess // 32))


def _guess(new: PrivacyCost, eps: float, d: float) -> int:
    """Starting point for the search: roughly what ``new`` alone allows.

    Subsampled Gaussian: a central-limit approximation of its PLD. Other costs: the count of
    the cost alone (an upper bound on the count next to other spending). The search then
    corrects the guess in either direction, so the guess affects speed only.
    """
    if isinstance(new, SubsampledGaussianCost):
        # Central-limit guess: a PLD with mean m per iteration behaves like N(k m, 2 k m).
        kl = _sub.symmetric_pld_mean(new.noise_multiplier, new.sampling_ratio)
        return max(math.floor(float(_g.gaussian_capacity(eps, d)) / kl), 1) if kl > 0 else 1
    if isinstance(new, BarkerCost):
        return max(
            largest_fitting(lambda k: new.epsilon(d, k) <= eps, 1),
            1,
        )
    mu = new.gaussian_mu()
    assert mu is not None
    return max(_g.gaussian_iterations(eps, d, mu), 1)
