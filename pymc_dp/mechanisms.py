"""Mechanisms: the only code that turns private data into releases (theory §2).

A :class:`PrivateChannel` is the one path from a step method to the private data. It holds the
oracle (:class:`~pymc_dp.oracle.RowLikelihood`, which reads the data), the chain's secret
:class:`~pymc_dp.noise.NoiseSource` and its :class:`ReleaseCounter`; a step method holds a
channel, its public :class:`~pymc_dp.parameter_space.ParameterSpace` (``channel.space``) and
mechanisms bound to the channel, never the oracle itself.

A mechanism is an object bound to one channel that makes one kind of release and carries its
privacy :attr:`Mechanism.event` (a :class:`~pymc_dp.accounting.PrivacyCost`):

* :class:`LLRRelease` — ``T·Σ_i clip(ℓ_i(θ') − ℓ_i(θ), ±B) + N(0, σ²)``; one Gaussian
  mechanism, PLD parameter ``1/(2z²)``;
* :class:`CentredLLRRelease` — the same for the ratio less its linear part at a public centre,
  ``T·Σ_i clip(ℓ_i(θ') − ℓ_i(θ) − ĝ_i·(θ' − θ), ±B) + N(0, σ²)``, with the centre's released
  gradient sum added back (post-processing); one Gaussian mechanism;
* :class:`GradientRelease` — ``T·(Σ_i clip_b(∇ℓ_i(θ)) + N(0, σ² I))``; one Gaussian mechanism;
* :class:`MinibatchLLRRelease` — the minibatch penalty's ``λ* − ½σ_b² + N(0, σ²)`` on a secret
  batch; one subsampled Gaussian mechanism;
* :class:`MinibatchGradientRelease` — ``Σ_{i∈B} clip_C(∇ℓ_i(θ)) + N(0, σ² I)`` on a secret
  batch (the stochastic-gradient samplers); one subsampled Gaussian mechanism;
* :class:`BarkerTest` — the accept decision of Barker's test on a secret batch; DP Barker's
  RDP bound.

A step's per-iteration cost is the composition of its mechanisms' events
(:func:`pymc_dp.accounting.compose`); accounting knows no algorithm. Every call is checked
against the chain's reservation *before* the data are read (:meth:`ReleaseCounter.record`): a
release the reservation does not cover (a mechanism's parameters changed behind its back)
raises :class:`~pymc_dp.errors.BudgetExceededError` instead. A proposal outside the model's
support (a parameter-only check of the likelihood fails) is decided without reading data and
releases nothing.
"""

from __future__ import annotations

import collections
import functools
import math
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import scipy.linalg

from pymc_dp import releases
from pymc_dp.accounting.costs import BarkerCost, GaussianCost, PrivacyCost, SubsampledGaussianCost
from pymc_dp.barker_correction import BarkerCorrection
from pymc_dp.errors import (
    BarkerVarianceError,
    BudgetExceededError,
    InvalidParameterError,
    ReadOnlyParameterError,
)
from pymc_dp.noise import NoiseSource
from pymc_dp.oracle import NORM_BOUND_RANGE, RowLikelihood
from pymc_dp.parameter_space import ParameterSpace
from pymc_dp.releases import BarkerDecision, Centre, Release, RemainderScale, marginal_metric

__all__ = [
    "BarkerTest",
    "CentreGradientRelease",
    "CentredGradientRelease",
    "CentredLLRRelease",
    "CentredRatioHistogram",
    "CurvatureNormHistogram",
    "CurvatureRelease",
    "FisherRelease",
    "GradNormHistogram",
    "GradientRelease",
    "LLRRelease",
    "Mechanism",
    "MinibatchGradientRelease",
    "MinibatchLLRRelease",
    "PrivateChannel",
    "ReleaseCounter",
    "conditioned_on_zeros",
    "minibatch_llr_estimate",
    "minibatch_llr_sensitivity",
]

# Relative slack on the Gaussian allowance: the reservation's μ and the sum of the releases' μ
# are the same numbers added in another order.
_MU_SLACK = 1e-9


class ReleaseCounter:
    """Counts a chain's releases by privacy event and checks each against its reservation.

    Without an allowance (``limited`` false: direct use in tests and research) releases are
    only counted. A step method calls :meth:`allow` with every reservation it makes; from then
    on :meth:`record` raises :class:`BudgetExceededError` *before* the data are read when a
    release is not covered: Gaussian events by their total PLD parameter ``μ`` (theory §3),
    other events by count, each reserved event covering releases no more revealing than itself
    (:meth:`PrivacyCost.covers`).

    Attributes
    ----------
    released, allowed : collections.Counter
        Atomic events released / reserved in this chain, with counts.
    """

    def __init__(self) -> None:
        self.released: collections.Counter[PrivacyCost] = collections.Counter()
        self.allowed: collections.Counter[PrivacyCost] = collections.Counter()
        self.limited = False
        # the Gaussian totals, kept as the counters grow: every release checks against them
        self._released_mu = 0.0
        self._allowed_mu = 0.0

    @property
    def mu(self) -> float:
        """Total Gaussian PLD parameter released in this chain."""
        return self._released_mu

    @property
    def allowed_mu(self) -> float:
        """Total Gaussian PLD parameter the reservations cover."""
        return self._allowed_mu

    def total(self) -> int:
        """Number of releases in this chain."""
        return sum(self.released.values())

    def allow(self, cost: PrivacyCost, iterations: int) -> None:
        """Add a reservation of ``iterations`` iterations of ``cost`` to what may be released."""
        self.limited = True
        for atom, count in cost.atoms():
            self.allowed[atom] += count * int(iterations)
            atom_mu = atom.gaussian_mu()
            if atom_mu is not None:
                self._allowed_mu += count * int(iterations) * atom_mu

    def record(self, event: PrivacyCost) -> None:
        """Count one release of ``event``; raise first if the reservations do not cover it."""
        event_mu = event.gaussian_mu()
        gaussian = event_mu is not None
        mu = self._released_mu + event_mu if gaussian else self._released_mu
        if self.limited:
            covered = (
                mu <= self._allowed_mu * (1.0 + _MU_SLACK) if gaussian else self._covered(event)
            )
            if not covered:
                raise BudgetExceededError(
                    f"A release ({event.describe()}) that this chain's reservation in the "
                    "privacy ledger does not cover: the step's privacy parameters no longer match "
                    "what it reserved. Nothing was read. Privacy parameters cannot change after a "
                    "step is built: build a new step."
                )
        self.released[event] += 1
        self._released_mu = mu

    def _covered(self, event: PrivacyCost) -> bool:
        """Whether a release of the non-Gaussian ``event`` fits, counted against the reserved
        events that cover it."""
        slots = [a for a in self.allowed if not a.is_gaussian() and a.covers(event)]
        used = sum(k for e, k in self.released.items() if any(a.covers(e) for a in slots))
        return used + 1 <= sum(self.allowed[a] for a in slots)


@functools.lru_cache(maxsize=256)
def _gaussian_event(noise_multiplier: float) -> PrivacyCost:
    """The (immutable) event of one Gaussian release with multiplier ``z``, built once per ``z``.

    Every release records its event; building and validating it anew cost more than the rest
    of the accounting. Keyed by the value, the event still follows the parameter.
    """
    return GaussianCost.from_noise_multiplier(noise_multiplier)


class PrivateChannel:
    """The one path from a step method to the private data: oracle, secret noise, counter.

    Parameters
    ----------
    oracle : RowLikelihood
        The model's private-data oracle.
    noise : NoiseSource, optional
        The chain's secret noise (default: fresh OS entropy); replaced per chain by
        :meth:`start_chain`.
    """

    def __init__(self, oracle: RowLikelihood, noise: NoiseSource | None = None) -> None:
        self._oracle = oracle
        self.noise = NoiseSource() if noise is None else noise
        self.counter = ReleaseCounter()

    @classmethod
    def open(
        cls, model: Any = None, vars: Any = None, *, row_data: Any = None, backend: Any = None
    ) -> PrivateChannel:
        """A channel on the oracle of ``model`` (built, checked and validated once per model)."""
        return cls(RowLikelihood.for_model(model, vars, row_data=row_data, backend=backend))

    @property
    def space(self) -> ParameterSpace:
        """The public parameter space of the model."""
        return self._oracle.space

    @property
    def backend(self) -> str | None:
        """What the oracle's per-row functions compile to: None (default) or ``"JAX"``."""
        return self._oracle.backend

    @property
    def n_rows(self) -> int:
        """Number of rows ``n`` (public: the substitute relation keeps it fixed)."""
        return self._oracle.n_rows

    @property
    def likelihood_coordinates(self) -> np.ndarray:
        """Which coordinates of ``θ`` the log-likelihood reads (a boolean mask; public: the
        model's graph). Along the others (a hierarchy's hyperparameters, which only the prior
        reads) every row's log-likelihood is constant and its gradient zero, for every dataset."""
        return self._oracle.likelihood_coordinates.copy()

    @property
    def fisher_pattern(self) -> np.ndarray:
        """Which entries of ``Σ_i ∇ℓ_i ∇ℓ_iᵀ`` can be non-zero for any dataset (a boolean
        ``d × d`` matrix; public: the model's graph). Zero off the likelihood's coordinates, and
        between two groups' entries of a variable each row reads at one group (``a[g_i]``)."""
        return self._oracle.fisher_pattern.copy()

    @property
    def likelihood_flat_directions(self) -> np.ndarray:
        """``d × k`` orthonormal directions of ``θ`` along which no row's log-likelihood
        changes, for any data (an intercept beside free group offsets); public: the graph."""
        return self._oracle.likelihood_flat_directions.copy()

    @property
    def likelihood_has_kinks(self) -> bool:
        """Whether a row's log-likelihood has a kink or a jump in ``θ`` (Laplace errors, an
        absolute value of the parameters and the row); public: found on made-up rows."""
        return self._oracle.likelihood_has_kinks

    @property
    def row_blocks(self) -> np.ndarray | None:
        """The coordinates of ``θ`` each group's rows read (``(groups, m)``), where every
        gathered variable is read at one grouping; ``None`` otherwise (public: the graph)."""
        blocks = self._oracle.row_blocks
        return None if blocks is None else blocks.copy()

    @property
    def gathered_blocks(self) -> list[tuple[int, int, int]]:
        """The variables each row reads at one group (``a[g_i]``), as ``(first coordinate,
        groups, coordinates per group)`` in ``θ`` (public: the model's graph)."""
        return list(self._oracle.gathered_blocks)

    @property
    def model(self) -> Any:
        """The PyMC model (``None`` in a pickled copy)."""
        return self._oracle.model

    @property
    def reads(self) -> int:
        """Passes over (a subset of) the rows so far: instrumentation for tests, not data."""
        return self._oracle.calls

    @property
    def rows_read(self) -> int:
        """Rows evaluated so far (instrumentation for tests)."""
        return self._oracle.rows_read

    def start_chain(self, noise: NoiseSource) -> None:
        """A new chain: its own noise and counter; cached per-row values are forgotten."""
        self.noise = noise
        self.counter = ReleaseCounter()
        self._oracle.clear_cache()

    def check_data_unchanged(self) -> None:
        """Refuse data changed since the build (``pm.set_data``): ``DataChangedError``."""
        self._oracle.check_data_unchanged()

    def check_deterministics(self, model: Any = None) -> None:
        """Refuse deterministics that read row data (also ones added after the build), of the
        oracle's model or of ``model`` (one built on the same data)."""
        self._oracle.check_deterministics(model)

    def check_before_reading(self, theta: np.ndarray) -> None:
        """A chain's checks before its first read: data unchanged, deterministics, start."""
        self.check_data_unchanged()
        self.check_deterministics()
        self.space.check_start(theta)

    def __repr__(self) -> str:
        return f"PrivateChannel(n_rows={self.n_rows}, noise={self.noise!r})"


class Mechanism(ABC):
    """A release bound to one :class:`PrivateChannel`, with its privacy :attr:`event`.

    Parameters are read-only once built (:class:`~pymc_dp.errors.ReadOnlyParameterError`);
    should one change anyway, the event changes with it and the counter refuses the release.
    """

    def __init__(self, channel: PrivateChannel) -> None:
        self.channel = channel

    def _finish(self) -> None:
        self.event  # noqa: B018 - validates the parameters
        self._built = True

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_built", False):
            raise ReadOnlyParameterError(
                f"{type(self).__name__}.{name} cannot change after the mechanism is built: "
                "the budget reserves what its parameters release. Build a new step."
            )
        super().__setattr__(name, value)

    @property
    @abstractmethod
    def event(self) -> PrivacyCost:
        """The privacy event of one call."""

    def _record(self) -> None:
        self.channel.counter.record(self.event)  # the event of the parameters as they are now

    @property
    def _oracle(self) -> RowLikelihood:
        return self.channel._oracle


class _GaussianMechanism(Mechanism):
    """A mechanism released once per call with Gaussian noise of multiplier ``noise_multiplier``.

    Event: one Gaussian mechanism, PLD parameter ``1/(2z²)``.
    """

    noise_multiplier: float

    @property
    def event(self) -> PrivacyCost:
        return _gaussian_event(self.noise_multiplier)


class _NoisySum(Mechanism):
    """Shared parameters of the Gaussian releases of a clipped sum: ``z``, ``T``, diagnostics.

    Event: one Gaussian mechanism, PLD parameter ``1/(2z²)`` (subclasses on a batch override).
    """

    def __init__(
        self,
        channel: PrivateChannel,
        *,
        noise_multiplier: float,
        temperature: float = 1.0,
        count_clipped: bool = False,
    ) -> None:
        super().__init__(channel)
        self.noise_multiplier = float(noise_multiplier)
        self.temperature = float(temperature)
        self.count_clipped = bool(count_clipped)

    @property
    def event(self) -> PrivacyCost:
        return _gaussian_event(self.noise_multiplier)

    def _ratio_bound(self, theta: np.ndarray, theta_new: np.ndarray) -> tuple[float, Any]:
        """``B = b_l ‖θ' − θ‖₂`` for a ratio release, and the release decided without reading
        (``None`` otherwise): ``−∞`` outside the support (nothing released or counted), ``0``
        for ``θ' = θ`` (counted, nothing read). The release is recorded before any read."""
        none = 0 if self.count_clipped else None
        if not self.channel.space.in_support(theta_new):  # −∞ for every dataset: read nothing
            return 0.0, Release(-np.inf, 0.0, none)
        bound = self.llr_clip * float(np.linalg.norm(np.asarray(theta_new) - np.asarray(theta)))
        self._record()
        if bound == 0.0:  # θ' = θ: the ratio is 0 without reading data, and so is the noise
            return 0.0, Release(0.0, 0.0, none)
        return bound, None


class LLRRelease(_NoisySum):
    """Noisy tempered clipped log-likelihood-ratio sum (theory §2, §4.1 steps 2–3).

    ``release(θ, θ')`` returns ``T · R(θ, θ') + ξ`` with ``R = Σ_i clip(ℓ_i(θ') − ℓ_i(θ), ±B)``,
    ``B = b_l ‖θ' − θ‖₂`` and ``ξ ~ N(0, σ²)``, ``σ = z · 2 T B`` (sensitivity ``2 T B`` under
    substitution of one row). Event: one Gaussian mechanism, PLD parameter ``1/(2z²)``.
    """

    def __init__(
        self,
        channel: PrivateChannel,
        *,
        llr_clip: float,
        noise_multiplier: float,
        temperature: float = 1.0,
        count_clipped: bool = False,
    ) -> None:
        super().__init__(
            channel,
            noise_multiplier=noise_multiplier,
            temperature=temperature,
            count_clipped=count_clipped,
        )
        self.llr_clip = float(llr_clip)
        self._finish()

    def __call__(self, theta: np.ndarray, theta_new: np.ndarray) -> Release:
        bound, early = self._ratio_bound(theta, theta_new)
        if early is not None:
            return early
        clipped = self._oracle.clipped_llr_sum(
            theta, theta_new, bound, count_clipped=self.count_clipped
        )
        t = self.temperature
        sigma = self.noise_multiplier * 2.0 * t * bound
        return Release(
            self.channel.noise.release(t * clipped.value, sigma), sigma, clipped.n_clipped
        )


class _CentredRelease(_NoisySum):
    """Shared parameters of the releases centred at a public :class:`~pymc_dp.oracle.Centre`:
    the centre, its released gradient sum ``Ĝ``, the metric ``W`` (``Σ̂ = W Wᵀ``), the
    remainder clip ``h`` and the offsets' scale (:class:`~pymc_dp.releases.RemainderScale`).
    """

    def __init__(
        self,
        channel: PrivateChannel,
        *,
        centre: Centre,
        centre_gradient: np.ndarray,
        metric: np.ndarray,
        remainder_clip: float,
        noise_multiplier: float,
        temperature: float = 1.0,
        count_clipped: bool = False,
    ) -> None:
        super().__init__(
            channel,
            noise_multiplier=noise_multiplier,
            temperature=temperature,
            count_clipped=count_clipped,
        )
        d = channel.space.ndim
        metric = np.asarray(metric, dtype=float)
        gradient = np.asarray(centre_gradient, dtype=float)
        if metric.shape != (d, d) or not np.all(np.isfinite(metric)):
            raise InvalidParameterError(f"metric must be a finite ({d}, {d}) Cholesky factor.")
        if gradient.shape != (d,) or not np.all(np.isfinite(gradient)):
            raise InvalidParameterError(f"centre_gradient must be {d} finite numbers.")
        self.centre = Centre(
            np.array(centre.theta, dtype=float),
            float(centre.grad_clip),
            self._oracle._whitening(centre.whitening).copy(),
        )
        self.centre_gradient = gradient.copy()
        self.metric = np.tril(metric)
        self.likelihood_coordinates = channel.likelihood_coordinates
        self.scale = RemainderScale(
            self.metric, self.centre.theta, self.likelihood_coordinates, channel.row_blocks
        )
        self.remainder_clip = float(remainder_clip)


class CentredLLRRelease(_CentredRelease):
    """Noisy tempered ratio with a control variate at a public centre (theory §4.1).

    With ``ĝ_i`` row ``i``'s clipped gradient at the :class:`~pymc_dp.oracle.Centre` ``θ_c``
    and ``Ĝ`` their sum as released once (a :class:`GradientRelease` at ``θ_c``, public), the
    ratio splits as ``Σ_i (ℓ_i(θ') − ℓ_i(θ)) = Σ_i ĝ_i·Δ + Σ_i r_i`` with ``Δ = θ' − θ`` and
    the remainders ``r_i = ℓ_i(θ') − ℓ_i(θ) − ĝ_i·Δ``. Near the centre ``r_i`` is of second
    order, ``|r_i| ≤ h_i ‖δ‖ (‖u‖ + ‖u'‖)/2`` in the public metric ``W`` (``u = W⁻¹(θ − θ_c)``,
    ``u' = W⁻¹(θ' − θ_c)``, ``δ = u' − u``; ``h_i`` bounds row ``i``'s Hessian in that metric),
    far smaller than the first-order ratio the plain :class:`LLRRelease` clips. ``release(θ, θ')``
    returns ``T·(Ĝ·Δ) + T·Σ_i clip(r_i, ±B) + ξ`` with ``B = h ‖δ‖ (‖u‖ + ‖u'‖)/2``,
    ``ξ ~ N(0, σ²)``, ``σ = z · 2 T B`` (sensitivity ``2 T B``: each row enters one clipped
    term). Event: one Gaussian mechanism, PLD parameter ``1/(2z²)``; ``Ĝ·Δ`` is
    post-processing of an earlier release. Outside the support: ``−∞``, nothing read.

    ``r_i`` depends only on the coordinates ``L`` the likelihood reads
    (:attr:`PrivateChannel.likelihood_coordinates`), so ``u``, ``u'`` and ``δ`` are taken on
    those, in the metric ``W_L`` of ``Σ̂``'s block there (:func:`~pymc_dp.releases.marginal_metric`;
    ``W`` when ``L`` is every coordinate). Row ``i``'s Hessian has the same norm in ``W_L`` as
    in ``W`` (both factor ``Σ̂_LL``), and ``‖W_L⁻¹ x_L‖ ≤ ‖W⁻¹ x‖``, so the bound is never
    larger; a move of the prior-only coordinates alone (a hierarchy's ``μ_a``, ``σ_a``) has
    ``B = 0`` and reads nothing. Where the chain is far from ``θ_c`` along those coordinates
    (``θ_c``'s own error there is the prior's business), the full metric's ``‖u‖`` made every
    release noisy.
    """

    def __init__(self, channel: PrivateChannel, **options: Any) -> None:
        super().__init__(channel, **options)
        self._oracle.compile_centred()  # every call makes that pass: compiled before the chain
        self._finish()

    def bound(self, theta: np.ndarray, theta_new: np.ndarray) -> float:
        """``B = h ‖δ‖ (‖u‖ + ‖u'‖)/2`` (:class:`~pymc_dp.releases.RemainderScale`: on the
        likelihood's coordinates, and with the oracle's ``row_blocks`` the largest over each
        group's own coordinates): public, from the two points only."""
        return self.remainder_clip * self.scale(theta, theta_new)

    def __call__(self, theta: np.ndarray, theta_new: np.ndarray) -> Release:
        none = 0 if self.count_clipped else None
        if not self.channel.space.in_support(theta_new):  # −∞ for every dataset: read nothing
            return Release(-np.inf, 0.0, none)
        bound = self.bound(theta, theta_new)
        self._record()
        t = self.temperature
        linear = t * float(self.centre_gradient @ (np.asarray(theta_new) - np.asarray(theta)))
        if bound == 0.0:  # the likelihood's coordinates did not move: every r_i is 0, unread
            return Release(linear, 0.0, none)
        clipped = self._oracle.clipped_centred_llr_sum(
            theta, theta_new, self.centre, bound, count_clipped=self.count_clipped
        )
        sigma = self.noise_multiplier * 2.0 * t * bound
        value = linear + self.channel.noise.release(t * clipped.value, sigma)
        return Release(value, sigma, clipped.n_clipped)


class CentredGradientRelease(_CentredRelease):
    """Noisy tempered gradient with a control variate at a public centre (theory §4.3).

    The gradient analogue of :class:`CentredLLRRelease`. With ``Ĝ`` the centre's released
    gradient sum (public) and ``ĝ_i`` row ``i``'s clipped gradient there, the sum splits as
    ``Σ_i ∇ℓ_i(θ) = Ĝ + Σ_i (∇ℓ_i(θ) − ĝ_i)`` up to ``Ĝ``'s noise. Near the centre each
    difference is of first order in the offset: in the metric ``W_L`` of ``Σ̂``'s block on the
    likelihood's coordinates ``L``, ``‖W_Lᵀ(∇ℓ_i(θ) − ∇ℓ_i(θ_c))‖ ≤ h_i ‖u‖`` (``h_i`` the
    bound of row ``i``'s Hessian there, ``u`` the offset from the centre; with the oracle's
    ``row_blocks`` the largest over groups of each group's own offset,
    :meth:`~pymc_dp.releases.RemainderScale.offset`). ``release(θ)`` returns
    ``T · (Ĝ + W_L⁻ᵀ (Σ_i clip_B(W_Lᵀ(∇ℓ_i(θ) − ĝ_i)) + N(0, σ² I)))`` on ``L`` and ``T Ĝ``
    elsewhere (0 for the centring's ``Ĝ``, conditioned on those zeros), with
    ``B = h · max_j ‖u_j‖`` and ``σ = z · 2B``: ``W_L⁻ᵀ`` times a Gaussian
    mechanism of sensitivity ``2B``, then post-processing. Event: one Gaussian mechanism, PLD
    parameter ``1/(2z²)``. A clipped difference only changes an HMC proposal, never its target
    (the ratio test decides). At the centre itself (``B = 0``) nothing is read: ``T Ĝ``.
    ``noise_std`` is ``T σ`` in the metric's coordinates. Outside the support: NaN, nothing
    read or released. Along the likelihood's flat directions
    (:attr:`PrivateChannel.likelihood_flat_directions`) every difference is 0: the noisy part
    is returned conditioned on that (:func:`conditioned_on_flat`; ``noise_std`` then bounds
    its noise).
    """

    def __init__(self, channel: PrivateChannel, **options: Any) -> None:
        super().__init__(channel, **options)
        self.marginal = marginal_metric(self.metric, self.likelihood_coordinates)
        # the difference sum is 0 along the likelihood's flat directions N for every dataset:
        # the noise there is known, and the release is conditioned on it
        # (conditioned_on_flat, with C = W_L⁻ᵀ W_L⁻¹ σ²: less S (NᵀS)⁻¹ Nᵀ x, S = C N / σ²,
        # rank k, so kept as the two factors)
        flat = channel.likelihood_flat_directions[self.likelihood_coordinates]
        self._flat_correction = None
        if flat.size:
            spread = scipy.linalg.solve_triangular(
                self.marginal.T,
                scipy.linalg.solve_triangular(self.marginal, flat, lower=True),
                lower=False,
            )
            self._flat_correction = (spread, np.linalg.solve(flat.T @ spread, flat.T))
        self._oracle.compile_centred_grad()  # every call makes that pass: before the chain
        self._finish()

    def bound(self, theta: np.ndarray) -> float:
        """``B = h · max_j ‖u_j‖``: public, from the point only."""
        return self.remainder_clip * float(self.scale.offset(theta))

    def __call__(self, theta: np.ndarray) -> Release:
        space = self.channel.space
        if not space.in_support(theta):
            return Release(np.full(space.ndim, np.nan), 0.0, 0 if self.count_clipped else None)
        bound = self.bound(theta)
        smallest, largest = NORM_BOUND_RANGE  # what the oracle clips norms to (10⁻⁵⁰, 10⁵⁰)
        if not bound <= largest:  # a trajectory diverged (∞ included): as off support
            return Release(np.full(space.ndim, np.nan), 0.0, 0 if self.count_clipped else None)
        self._record()  # checked against the reservation before the data are read
        t = self.temperature
        value = self.centre_gradient.copy()
        if bound < smallest:  # at the centre every difference is 0, within 10⁻⁵⁰ of it at most
            # n·B: unread (a release would add that and noise of sd 2zB, both negligible)
            return Release(t * value, 0.0, 0 if self.count_clipped else None)
        kept = self.likelihood_coordinates
        clipped = self._oracle.clipped_centred_grad_sum(
            theta, self.centre, self.marginal, kept, bound, count_clipped=self.count_clipped
        )
        sigma = self.noise_multiplier * 2.0 * bound
        noisy = self.channel.noise.release(clipped.value, sigma)
        # W_L⁻ᵀ: back from the metric's coordinates (post-processing)
        difference = scipy.linalg.solve_triangular(self.marginal.T, noisy, lower=False)
        if self._flat_correction is not None:
            spread, gain = self._flat_correction
            difference = difference - spread @ (gain @ difference)
        value[kept] += difference
        return Release(t * value, t * sigma, clipped.n_clipped)


class GradientRelease(_NoisySum):
    """Noisy tempered clipped gradient sum ``T · (G(θ) + N(0, σ² I))``, ``σ = z · 2 b_g``.

    Theory §2 and §4.3. Sensitivity ``2 b_g`` under substitution of one row; event: one
    Gaussian mechanism, PLD parameter ``1/(2z²)``. Outside the model's support the gradient is
    undefined: NaN, without reading data or releasing anything.

    With a public ``precond`` ``D`` (positive, one per coordinate) the clip is preconditioned:
    ``G_D(θ) = Σ_i ∇ℓ_i · min(1, b_g / ‖D ∇ℓ_i‖)`` and the release is
    ``T · (G_D(θ) + D⁻¹ N(0, σ² I))``. That is ``D⁻¹`` times the Gaussian mechanism
    ``D G_D + N(0, σ² I)``, whose sensitivity is ``2 b_g``: the same event, and coordinates with
    small per-row gradients are no longer drowned by the noise that the largest ones set.
    ``noise_std`` is ``T σ`` in the scaled space.

    Coordinates the likelihood does not read (:attr:`PrivateChannel.likelihood_coordinates`,
    public) come back as exactly 0: the sum is 0 there for every dataset, and the noise drawn
    there is independent of the other coordinates' (post-processing). Along the likelihood's
    flat directions (:attr:`PrivateChannel.likelihood_flat_directions`) the sum is 0 too, and
    the release is conditioned on it (:func:`conditioned_on_flat`, noise variances
    ``σ² D⁻²``; ``noise_std`` then bounds the noise).
    """

    def __init__(
        self,
        channel: PrivateChannel,
        *,
        grad_clip: float,
        noise_multiplier: float,
        temperature: float = 1.0,
        count_clipped: bool = False,
        precond: np.ndarray | None = None,
    ) -> None:
        super().__init__(
            channel,
            noise_multiplier=noise_multiplier,
            temperature=temperature,
            count_clipped=count_clipped,
        )
        self.grad_clip = float(self._oracle._check_norm_bound(grad_clip, "grad_clip"))
        self.precond = None if precond is None else self._oracle._precond(precond).copy()
        self.likelihood_coordinates = channel.likelihood_coordinates
        self.flat = channel.likelihood_flat_directions
        self._finish()

    def __call__(self, theta: np.ndarray) -> Release:
        space = self.channel.space
        if not space.in_support(theta):
            return Release(np.full(space.ndim, np.nan), 0.0, 0 if self.count_clipped else None)
        self._record()  # checked against the reservation before the data are read
        clipped = self._oracle.clipped_grad_sum(
            theta, self.grad_clip, count_clipped=self.count_clipped, precond=self.precond
        )
        sigma = self.noise_multiplier * 2.0 * self.grad_clip
        t = self.temperature
        if self.precond is None:
            value = self.channel.noise.release(clipped.value, sigma)
        else:  # the Gaussian mechanism D G_D + N(0, σ² I), then D⁻¹ (post-processing)
            value = self.channel.noise.release(self.precond * clipped.value, sigma) / self.precond
        # along coordinates the likelihood does not read the sum is 0 for every dataset: what
        # was released there is noise alone, independent of the rest (post-processing)
        value = np.where(self.likelihood_coordinates, value, 0.0)
        # along the likelihood's flat directions too (an intercept beside free group offsets)
        scale = None if self.precond is None else self.precond**-2.0  # the noise's variances
        value = conditioned_on_flat(value, scale, self.flat)[0]
        return Release(t * value, t * sigma, clipped.n_clipped)


class CentreGradientRelease(_GaussianMechanism):
    """The centre's noisy clipped gradient sum ``Ĝ`` of :class:`CentredLLRRelease` (released once).

    With the :class:`~pymc_dp.oracle.Centre`'s whitening ``P`` and clip ``b``, the rows'
    clipped gradients ``ĝ_i = ∇ℓ_i(θ_c) · min(1, b / ‖P ∇ℓ_i(θ_c)‖)`` (computed once in the
    oracle, never released) are summed and released as ``Ĝ = P⁻¹ (P Σ_i ĝ_i + N(0, σ² I))``,
    ``σ = z · 2b``: ``P⁻¹`` times the Gaussian mechanism on ``P Σ_i ĝ_i``, whose sensitivity
    under substitution of one row is ``2b`` (``‖P ĝ_i‖ ≤ b``). Event: one Gaussian mechanism,
    PLD parameter ``1/(2z²)``. The noise of ``P⁻¹ (…)`` has covariance ``C = σ² P⁻¹ P⁻ᵀ``.

    Along the coordinates ``N`` the likelihood does not read
    (:attr:`PrivateChannel.likelihood_coordinates`, public) the sum is 0 for every dataset,
    so the released ``Ĝ_N`` is the noise ``ξ_N`` itself; with a ``P`` that mixes coordinates
    it is correlated with the noise of the others (``L``). ``Ĝ`` is therefore returned
    conditioned on it (post-processing): ``Ĝ_L − C_LN C_NN⁻¹ Ĝ_N`` and ``0`` along ``N``,
    whose noise has the conditional covariance ``C_LL − C_LN C_NN⁻¹ C_NL`` and none along
    ``N`` (:attr:`noise_covariance`). Without that, a centred hierarchy's ``μ_a`` and ``σ_a``
    took ``Ĝ``'s noise for the likelihood's gradient, and the centring's Newton steps moved
    them tens of posterior sds away. Likewise along the likelihood's flat directions
    (:attr:`PrivateChannel.likelihood_flat_directions`: ``nᵀ Σ_i ĝ_i = 0``;
    :func:`conditioned_on_flat`).
    """

    def __init__(self, channel: PrivateChannel, *, centre: Centre, noise_multiplier: float) -> None:
        super().__init__(channel)
        self.centre = Centre(
            np.array(centre.theta, dtype=float),
            float(self._oracle._check_bound(centre.grad_clip, "grad_clip")),
            self._oracle._whitening(centre.whitening).copy(),
        )
        self.noise_multiplier = float(noise_multiplier)
        self.likelihood_coordinates = channel.likelihood_coordinates
        self.flat = channel.likelihood_flat_directions
        self._finish()

    @property
    def noise_std(self) -> float:
        """``σ``: the noise's standard deviation in whitened coordinates."""
        return self.noise_multiplier * 2.0 * self.centre.grad_clip

    @property
    def noise_covariance(self) -> np.ndarray:
        """Covariance of the noise of ``Ĝ`` as returned (public): ``σ² P⁻¹ P⁻ᵀ`` conditioned on
        its coordinates outside the likelihood (zero rows and columns there)."""
        return self._conditioned(np.zeros(self.channel.space.ndim))[1]

    def _conditioned(self, released: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``P⁻¹ released`` and its noise covariance, conditioned on the known zeros."""
        inverse = np.linalg.inv(self.centre.whitening)
        covariance = self.noise_std**2 * inverse @ inverse.T
        value, covariance = conditioned_on_zeros(
            inverse @ released, covariance, self.likelihood_coordinates
        )
        return conditioned_on_flat(value, covariance, self.flat)

    def __call__(self) -> Release:
        if not self.channel.space.in_support(self.centre.theta):
            raise InvalidParameterError("the centre must be a point inside the model's support.")
        self._record()  # checked against the reservation before the data are read
        total = self._oracle.centre_grad_sum(self.centre)
        noisy = self.channel.noise.release(self.centre.whitening @ total, self.noise_std)
        return Release(self._conditioned(noisy)[0], self.noise_std, None)


def conditioned_on_zeros(
    value: np.ndarray, covariance: np.ndarray, kept: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A Gaussian release ``x + ξ``, ``ξ ~ N(0, C)``, of an ``x`` known to be 0 outside ``kept``.

    Along ``N`` (not ``kept``) the release is ``ξ_N``, so the noise along ``L`` (``kept``) is
    known in part: ``ξ_L | ξ_N ~ N(C_LN C_NN⁻¹ ξ_N, C_LL − C_LN C_NN⁻¹ C_NL)``. Returns the
    release less that mean along ``L`` and 0 along ``N``, and the conditional covariance (0
    along ``N``). Both are functions of the release and public values: post-processing.
    """
    kept = np.asarray(kept, dtype=bool)
    value = np.array(value, dtype=float)
    covariance = np.array(covariance, dtype=float)
    if kept.all():
        return value, covariance
    known = ~kept
    cross = covariance[np.ix_(kept, known)]
    weights = np.linalg.solve(covariance[np.ix_(known, known)], cross.T).T  # C_LN C_NN⁻¹
    value[kept] -= weights @ value[known]
    value[known] = 0.0
    conditional = np.zeros_like(covariance)
    block = covariance[np.ix_(kept, kept)] - weights @ cross.T
    conditional[np.ix_(kept, kept)] = 0.5 * (block + block.T)
    return value, conditional


def conditioned_on_flat(
    value: np.ndarray, covariance: np.ndarray | None, flat: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """A Gaussian release ``x + ξ``, ``ξ ~ N(0, C)``, of an ``x`` known to have ``Nᵀx = 0``.

    ``N`` (``flat``, ``d × k``): the likelihood's flat directions
    (:attr:`PrivateChannel.likelihood_flat_directions`), along which every row's gradient, so
    any sum of them, is zero for every dataset. ``Nᵀ(x + ξ) = Nᵀξ`` is then known noise, and
    ``ξ | Nᵀξ`` has mean ``C N (NᵀCN)⁻¹ Nᵀξ`` and covariance ``C − C N (NᵀCN)⁻¹ NᵀC``: the
    release less that mean, and that covariance, are returned (post-processing).
    ``covariance`` ``None`` stands for ``I`` (white noise; the covariance returned is then
    ``None`` too), a vector for a diagonal one.
    """
    value = np.array(value, dtype=float)
    if flat is None or np.size(flat) == 0:
        return value, covariance
    flat = np.asarray(flat, dtype=float)
    if covariance is None:
        spread = flat
    elif np.ndim(covariance) == 1:
        spread = np.asarray(covariance, dtype=float)[:, None] * flat
    else:
        spread = np.asarray(covariance, dtype=float) @ flat  # C N
    gain = np.linalg.solve(flat.T @ spread, flat.T)  # (NᵀCN)⁻¹ Nᵀ
    value = value - spread @ (gain @ value)
    if covariance is None or np.ndim(covariance) == 1:
        return value, None
    conditional = np.asarray(covariance, dtype=float) - spread @ gain @ covariance
    return value, 0.5 * (conditional + conditional.T)


class _SymmetricMatrixRelease(_GaussianMechanism):
    """A clipped sum of per-row symmetric ``d × d`` matrices in the coordinates of a public
    invertible ``whitening`` (the identity by default), released with independent
    ``N(0, σ²)`` noise on its upper triangle (diagonal included), ``σ = z ·`` the sensitivity
    of the subclass: the upper triangle's L2 norm is at most the Frobenius norm. Event: one
    Gaussian mechanism, PLD parameter ``1/(2z²)``."""

    #: what the matrix is, for the support error
    _what = "matrix"

    def __init__(
        self, channel: PrivateChannel, *, noise_multiplier: float, whitening: np.ndarray | None
    ) -> None:
        super().__init__(channel)
        identity = np.eye(channel.space.ndim)
        self.whitening = self._oracle._whitening(
            identity if whitening is None else whitening
        ).copy()
        self.noise_multiplier = float(noise_multiplier)

    def _exact(self, theta: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, theta: np.ndarray) -> Release:
        space = self.channel.space
        if not space.in_support(theta):
            raise InvalidParameterError(
                f"the {self._what} release needs a point inside the support."
            )
        self._record()  # checked against the reservation before the data are read
        exact = self._exact(theta)
        upper = np.triu_indices(space.ndim)
        sigma = self.noise_multiplier * self.sensitivity
        noisy = np.zeros_like(exact)
        noisy[upper] = self.channel.noise.release(exact[upper], sigma)
        noisy = np.triu(noisy) + np.triu(noisy, 1).T
        return Release(noisy, sigma, None)


class FisherRelease(_SymmetricMatrixRelease):
    """Noisy clipped empirical Fisher information ``Σ_i v_i v_iᵀ`` (a private curvature).

    ``v_i = P ∇ℓ_i(θ) · min(1, b / ‖P ∇ℓ_i(θ)‖)`` with a public invertible ``whitening`` ``P``
    (the identity by default) and clip ``b``
    (:meth:`~pymc_dp.oracle.RowLikelihood.clipped_fisher`). The release is the
    symmetric matrix whose upper triangle (diagonal included) carries independent
    ``N(0, σ²)`` noise, ``σ = z · √2 b²``: substituting row ``v`` by ``w`` changes the matrix by
    ``w wᵀ − v vᵀ``, whose Frobenius norm is at most ``√(‖v‖⁴ + ‖w‖⁴) ≤ √2 b²`` (the cross term
    ``(v·w)²`` is never negative), and the upper triangle's L2 norm is at most the Frobenius
    norm. Event: one Gaussian mechanism, PLD parameter ``1/(2z²)``. Near the mode of a
    well-specified model ``P⁻¹ F P⁻ᵀ`` estimates the likelihood's information (the negative
    Hessian of the log-likelihood): a posterior covariance from one release, post-processing.
    """

    def __init__(
        self,
        channel: PrivateChannel,
        *,
        grad_clip: float,
        noise_multiplier: float,
        whitening: np.ndarray | None = None,
    ) -> None:
        super().__init__(channel, noise_multiplier=noise_multiplier, whitening=whitening)
        self.grad_clip = float(self._oracle._check_bound(grad_clip, "grad_clip"))
        self._finish()

    _what = "Fisher"

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the upper triangle: ``√2 b²``."""
        return math.sqrt(2.0) * self.grad_clip**2

    def _exact(self, theta: np.ndarray) -> np.ndarray:
        return self._oracle.clipped_fisher(theta, self.grad_clip, self.whitening)


class CurvatureRelease(_SymmetricMatrixRelease):
    """Noisy clipped observed information ``Σ_i M_i`` (a private curvature).

    ``M_i = −P ∇²ℓ_i(θ) Pᵀ · min(1, c / ‖P ∇²ℓ_i(θ) Pᵀ‖_F)``: each row's negative Hessian in
    the coordinates of a public invertible ``whitening`` ``P``, clipped to Frobenius norm ``c``
    (:meth:`~pymc_dp.oracle.RowLikelihood.clipped_curvature`). The release is the symmetric
    matrix whose upper triangle (diagonal included) carries independent ``N(0, σ²)`` noise,
    ``σ = z · 2c``: substituting a row changes the sum by ``M_w − M_v``, of Frobenius norm at
    most ``2c``, and the upper triangle's L2 norm is at most the Frobenius norm. Event: one
    Gaussian mechanism, PLD parameter ``1/(2z²)``. ``P⁻¹ F P⁻ᵀ`` estimates the likelihood's
    information at ``θ``, the posterior's curvature, also where the likelihood does not
    describe the rows' variance (:class:`FisherRelease` then estimates the rows' gradient
    variance instead: 5–10 times the curvature for doctor visits under a Poisson likelihood).
    """

    def __init__(
        self,
        channel: PrivateChannel,
        *,
        curvature_clip: float,
        noise_multiplier: float,
        whitening: np.ndarray | None = None,
    ) -> None:
        super().__init__(channel, noise_multiplier=noise_multiplier, whitening=whitening)
        self.curvature_clip = float(self._oracle._check_bound(curvature_clip, "curvature_clip"))
        self._finish()

    _what = "curvature"

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the upper triangle: ``2c``."""
        return 2.0 * self.curvature_clip

    def _exact(self, theta: np.ndarray) -> np.ndarray:
        return self._oracle.clipped_curvature(theta, self.curvature_clip, self.whitening)


class CurvatureNormHistogram(_GaussianMechanism):
    """Noisy histogram of the rows' observed-information norms ``‖P ∇²ℓ_i(θ) Pᵀ‖_F``.

    Counts over the bins of ``edges``
    (:meth:`~pymc_dp.oracle.RowLikelihood.curvature_norm_counts`) plus ``N(0, σ² I)``,
    ``σ = z·√2``: substituting one row moves at most one count from one bin to another. Event:
    one Gaussian mechanism, PLD parameter ``1/(2z²)``. Its far tail is the clip of a
    :class:`CurvatureRelease` in the same ``whitening`` (post-processing).
    """

    def __init__(
        self,
        channel: PrivateChannel,
        *,
        edges: np.ndarray,
        noise_multiplier: float,
        whitening: np.ndarray,
    ) -> None:
        super().__init__(channel)
        edges = np.asarray(edges, dtype=float)
        if edges.ndim != 1 or edges.size < 1 or not np.all(np.diff(edges) > 0):
            raise InvalidParameterError(
                f"edges must be a strictly increasing 1-d array of norms; got {edges!r}."
            )
        self.edges = edges
        self.whitening = self._oracle._whitening(whitening).copy()
        self.noise_multiplier = float(noise_multiplier)
        self._finish()

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the counts: ``√2``."""
        return math.sqrt(2.0)

    def __call__(self, theta: np.ndarray) -> Release:
        if not self.channel.space.in_support(theta):
            raise InvalidParameterError("the curvature histogram needs a point inside the support.")
        self._record()  # checked against the reservation before the data are read
        counts = self._oracle.curvature_norm_counts(theta, self.edges, self.whitening)
        sigma = self.noise_multiplier * self.sensitivity
        return Release(self.channel.noise.release(counts, sigma), sigma, None)


class GradNormHistogram(_GaussianMechanism):
    """Noisy histogram of the per-row gradient norms ``‖∇_θ ℓ_i(θ)‖₂`` (private clip choice).

    Counts over the bins of ``edges`` (see :meth:`RowLikelihood.grad_norm_counts`) plus
    ``N(0, σ² I)``, ``σ = z·√2``: substituting one row moves at most one count from one bin to
    another, an L2 change of at most ``√2``. With ``m`` ``directions`` (public unit vectors
    ``u_k``) the values counted are the directional derivatives ``|∇_θ ℓ_i(θ)·u_k|``, ``m``
    per row: one row's ``m`` values may all sit in one bin before and all in another after, an
    L2 change of ``√2·m`` (the most: the removed and added count vectors each have L2 norm at
    most ``m``), so ``σ = z·√2·m``. Event: one Gaussian mechanism, PLD parameter
    ``1/(2z²)``. A quantile of the released counts
    (:func:`pymc_dp.releases.quantile_from_counts`, :func:`~pymc_dp.releases.clip_from_counts`)
    is post-processing. With ``precond`` ``D`` the norms (or slopes) are those of ``D ∇ℓ_i``
    (the bound of a preconditioned :class:`GradientRelease`), with ``whitening`` ``P`` those of
    ``P ∇ℓ_i`` (the bound of a :class:`CentreGradientRelease`); the sensitivity is unchanged.
    """

    def __init__(
        self,
        channel: PrivateChannel,
        *,
        edges: np.ndarray,
        noise_multiplier: float,
        directions: np.ndarray | None = None,
        precond: np.ndarray | None = None,
        whitening: np.ndarray | None = None,
    ) -> None:
        super().__init__(channel)
        edges = np.asarray(edges, dtype=float)
        if edges.ndim != 1 or edges.size < 1 or not np.all(np.diff(edges) > 0):
            raise InvalidParameterError(
                f"edges must be a strictly increasing 1-d array of norms; got {edges!r}."
            )
        if directions is not None:
            directions = np.atleast_2d(np.asarray(directions, dtype=float))
            norms = np.linalg.norm(directions, axis=1)
            if directions.shape[1] != channel.space.ndim or not np.allclose(norms, 1.0):
                raise InvalidParameterError(
                    f"directions must be unit vectors of length {channel.space.ndim}, one per "
                    f"row of an (m, {channel.space.ndim}) array."
                )
        self.edges = edges
        self.directions = directions
        if precond is not None and whitening is not None:
            raise InvalidParameterError("give precond or whitening, not both.")
        self.precond = None if precond is None else self._oracle._precond(precond).copy()
        self.whitening = None if whitening is None else self._oracle._whitening(whitening).copy()
        self.noise_multiplier = float(noise_multiplier)
        self._finish()

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the counts: ``√2``, or ``√2·m`` with ``m`` directions."""
        m = 1 if self.directions is None else self.directions.shape[0]
        return math.sqrt(2.0) * m

    def __call__(self, theta: np.ndarray) -> Release:
        space = self.channel.space
        if not space.in_support(theta):
            raise InvalidParameterError(
                "the gradient-norm histogram needs a point inside the model's support."
            )
        self._record()  # checked against the reservation before the data are read
        counts = self._oracle.grad_norm_counts(
            theta, self.edges, self.directions, self.precond, self.whitening
        )
        sigma = self.noise_multiplier * self.sensitivity
        return Release(self.channel.noise.release(counts, sigma), sigma, None)


class CentredRatioHistogram(_GaussianMechanism):
    """Noisy histogram of normalised centred ratios (the private choice of the remainder clip).

    At ``m`` public pairs ``(θ_k, θ'_k)`` the values counted are ``|r_i(θ_k, θ'_k)| / s_k`` with
    ``r_i`` the centred ratio of :class:`CentredLLRRelease` and ``s_k = ‖δ_k‖ (‖u_k‖ + ‖u'_k‖)/2``
    its bound per unit ``h``: ``m n`` values. One row's ``m`` values move at most ``m`` counts
    out and ``m`` in, an L2 change of at most ``√2·m``; noise ``σ = z·√2·m``. Event: one Gaussian
    mechanism, PLD parameter ``1/(2z²)``.
    """

    def __init__(
        self,
        channel: PrivateChannel,
        *,
        ratio: CentredLLRRelease,
        pairs: np.ndarray,
        edges: np.ndarray,
        noise_multiplier: float,
    ) -> None:
        super().__init__(channel)
        pairs = np.asarray(pairs, dtype=float)
        d = channel.space.ndim
        if pairs.ndim != 3 or pairs.shape[1:] != (2, d) or not np.all(np.isfinite(pairs)):
            raise InvalidParameterError(f"pairs must be a finite (m, 2, {d}) array of points.")
        scales = np.array([ratio.bound(a, b) for a, b in pairs]) / ratio.remainder_clip
        if not np.all(scales > 0):
            raise InvalidParameterError("every pair must be two distinct points.")
        self.ratio = ratio
        self.pairs = pairs
        self.scales = scales
        self.edges = np.asarray(edges, dtype=float)
        self.noise_multiplier = float(noise_multiplier)
        self._finish()

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the counts: ``√2·m``."""
        return math.sqrt(2.0) * self.pairs.shape[0]

    def __call__(self) -> Release:
        space = self.channel.space
        if not all(space.in_support(a) and space.in_support(b) for a, b in self.pairs):
            raise InvalidParameterError("the ratio histogram needs pairs inside the support.")
        self._record()  # checked against the reservation before the data are read
        counts = self._oracle.centred_ratio_counts(
            self.pairs, self.ratio.centre, self.scales, self.edges
        )
        sigma = self.noise_multiplier * self.sensitivity
        return Release(self.channel.noise.release(counts, sigma), sigma, None)


def check_batch_rows(batch_size: int, n_rows: int) -> None:
    """A batch of ``batch_size`` rows must fit in ``n_rows``: ``2 ≤ b ≤ n``."""
    if not 2 <= batch_size <= n_rows:
        raise InvalidParameterError(
            f"batch_size={batch_size} must be between 2 and the number of rows n = {n_rows}."
        )


def minibatch_llr_estimate(
    ratio: np.ndarray, *, n_rows: int, temperature: float
) -> tuple[float, float]:
    """``λ* = s Σ_j r_j`` and its variance estimate ``σ_b²`` from a batch's clipped ratios.

    ``s = nT/b``; ``σ_b² = (1 − q) s² b/(b − 1) (Σ r_j² − (Σ r_j)²/b)`` is the unbiased
    estimate of ``Var(λ*)`` under sampling without replacement (``q = b/n``; the thesis' form
    without the finite-population factor and with ``b`` for ``b − 1`` differs by ``O(1/b + q)``).
    """
    b, n = ratio.shape[0], int(n_rows)
    check_batch_rows(b, n)
    s = n * temperature / b
    total = float(ratio.sum())
    spread = max(float(np.dot(ratio, ratio)) - total * total / b, 0.0)
    return s * total, (1.0 - b / n) * s * s * spread * b / (b - 1)


def minibatch_llr_sensitivity(bound: float, *, batch_size: int, n_rows: int, temperature: float):
    """Substitute-relation sensitivity ``c`` of the minibatch penalty release (theory §4.2).

    The release is ``λ* − ½σ_b²`` with ``λ* = s Σ_{j∈B} r_j``, ``s = nT/b`` and ``σ_b²`` the
    (finite-population-corrected, unbiased) variance estimate of ``λ*``,
    ``σ_b² = (1 − q) · s² · b/(b − 1) · (Σ r_j² − (Σ r_j)²/b)``, ``q = b/n``. With
    ``|r_j| ≤ B`` and the batch differing in one row:

    * ``Δλ = 2 s B`` (thesis Thm 3.5);
    * with ``V = Σ r_j² − (Σ r_j)²/b``, ``R*`` the sum over the rows the two batches share
      (``|R*| ≤ (b − 1)B``) and ``u → v = u + d`` the substituted ratio (``0 < d ≤ 2B``),
      ``ΔV = d[(u + v)(1 − 1/b) − 2R*/b]`` and ``|u + v| ≤ 2B − d``, so
      ``|ΔV| ≤ (b − 1)/b · d(4B − d) ≤ 4(b − 1)B²/b`` and ``½ Δσ_b² ≤ 2 (1 − q) s² B²``.

    Both maxima are reached together (shared rows all at ``+B``, ``u = −B → v = +B``), so
    ``c = 2 s B + 2 (1 − q) s² B²`` is the exact sensitivity. The thesis (Lemma 3.4, Thm 3.5)
    bounds the variance part with the constant 3, which is valid but adds up to half again as
    much noise. For ``b = n`` the variance term vanishes and ``c = 2TB``, the full-data DP
    penalty's sensitivity.
    """
    b, n = int(batch_size), int(n_rows)
    s = n * temperature / b
    return 2.0 * s * bound + 2.0 * (1.0 - b / n) * s * s * bound * bound


class MinibatchLLRRelease(_NoisySum):
    """Noisy minibatch estimate of the tempered log-likelihood ratio (theory §4.2).

    ``release(θ, θ')`` draws ``b`` rows without replacement from the secret generator, reads
    only those rows at ``θ`` and ``θ'``, clips ``r_j = ℓ_j(θ') − ℓ_j(θ)`` to ``±B``
    (``B = b_l ‖θ' − θ‖₂``) and releases ``λ* − ½σ_b² + ξ`` with ``λ* = (nT/b) Σ r_j``,
    ``σ_b²`` its variance estimate (:func:`minibatch_llr_sensitivity`) and ``ξ ~ N(0, σ²)``,
    ``σ = z c``. The penalty test then subtracts ``½σ²``, so ``½(σ² + σ_b²)`` in total. Event:
    one subsampled Gaussian, multiplier ``z``, ratio ``q = b/n``. ``variance_correction=False``
    leaves out ``−½σ_b²`` (only for the tests' negative control).
    """

    def __init__(
        self,
        channel: PrivateChannel,
        *,
        batch_size: int,
        llr_clip: float,
        noise_multiplier: float,
        temperature: float = 1.0,
        count_clipped: bool = False,
        variance_correction: bool = True,
    ) -> None:
        super().__init__(
            channel,
            noise_multiplier=noise_multiplier,
            temperature=temperature,
            count_clipped=count_clipped,
        )
        check_batch_rows(int(batch_size), channel.n_rows)
        self.batch_size = int(batch_size)
        self.llr_clip = float(llr_clip)
        self.variance_correction = bool(variance_correction)
        self._finish()

    @property
    def event(self) -> SubsampledGaussianCost:
        return SubsampledGaussianCost(self.noise_multiplier, self.batch_size / self.channel.n_rows)

    def __call__(self, theta: np.ndarray, theta_new: np.ndarray) -> Release:
        bound, early = self._ratio_bound(theta, theta_new)
        if early is not None:
            return early
        n, b, t = self.channel.n_rows, self.batch_size, self.temperature
        rows = self.channel.noise.rows(n, b)  # secret: never from random_seed
        oracle = self._oracle
        ratio = oracle.loglik_rows(theta_new, rows) - oracle.loglik_rows(theta, rows)
        n_clipped = releases.count_clipped(ratio, bound) if self.count_clipped else None
        ratio = releases.clip_ratio(ratio, bound)
        estimate, batch_variance = minibatch_llr_estimate(ratio, n_rows=n, temperature=t)
        sigma = self.noise_multiplier * minibatch_llr_sensitivity(
            bound, batch_size=b, n_rows=n, temperature=t
        )
        if self.variance_correction:
            estimate -= 0.5 * batch_variance
        return Release(self.channel.noise.release(estimate, sigma), sigma, n_clipped)


class MinibatchGradientRelease(Mechanism):
    """Noisy clipped gradient sum over a secret batch (theory §4.5).

    ``release(θ)`` draws ``b`` of the ``n`` rows uniformly without replacement from the secret
    generator, reads only those rows and returns ``G̃ = Σ_{i∈B} clip_C(∇_θ ℓ_i(θ)) + N(0, σ² I)``
    with ``σ = z · 2C`` (substitute-one-row sensitivity ``2C``: a row in the batch is replaced by
    another). Event: one subsampled Gaussian with multiplier ``z`` and ratio ``q = b/n``, which
    the accountant's theorem covers for exactly this sampling (fixed size, without replacement,
    substitute relation: :mod:`pymc_dp.accounting.subsampled`). Outside the model's support the
    gradient is undefined: NaN, without reading data or releasing anything.
    """

    #: how the batch is drawn: the scheme the accountant (SubsampledGaussianCost) assumes
    sampling = "fixed size, uniformly without replacement, secret generator"

    def __init__(
        self,
        channel: PrivateChannel,
        *,
        batch_size: int,
        grad_clip: float,
        noise_multiplier: float,
        count_clipped: bool = False,
    ) -> None:
        super().__init__(channel)
        check_batch_rows(int(batch_size), channel.n_rows)
        self.batch_size = int(batch_size)
        self.grad_clip = float(self._oracle._check_norm_bound(grad_clip, "grad_clip"))
        self.noise_multiplier = float(noise_multiplier)
        self.count_clipped = bool(count_clipped)
        self._finish()

    @property
    def event(self) -> SubsampledGaussianCost:
        return SubsampledGaussianCost(self.noise_multiplier, self.batch_size / self.channel.n_rows)

    @property
    def noise_std(self) -> float:
        """``σ = z · 2C``, the standard deviation of the noise on each coordinate of the sum."""
        return self.noise_multiplier * 2.0 * self.grad_clip

    def __call__(self, theta: np.ndarray) -> Release:
        space = self.channel.space
        if not space.in_support(theta):
            return Release(np.full(space.ndim, np.nan), 0.0, 0 if self.count_clipped else None)
        self._record()  # checked against the reservation before the data are read
        rows = self.channel.noise.rows(self.channel.n_rows, self.batch_size)  # secret
        clipped = self._oracle.clipped_grad_sum(
            theta, self.grad_clip, rows, count_clipped=self.count_clipped
        )
        sigma = self.noise_std
        return Release(self.channel.noise.release(clipped.value, sigma), sigma, clipped.n_clipped)


class BarkerTest(Mechanism):
    """The DP Barker acceptance test on a secret minibatch (theory §4.4, thesis Algorithm 3).

    ``test(θ, θ', log p(θ') − log p(θ))`` draws ``b`` rows without replacement from the secret
    generator, reads only those rows, and with ``r_j = ℓ_j(θ') − ℓ_j(θ)`` clipped to
    ``|r_j| ≤ √b / n0`` (``n0 = T n``) forms ``λ = (n0 / b) Σ_j r_j + log p(θ') − log p(θ)`` and
    ``σ_b² = n0² Var_B(r) / b``; then draws ``s ~ N(0, C − σ_b²)`` and ``V_corr`` (so that
    ``N(0, C) + V_corr ≈ Logistic(0, 1)``) and accepts iff ``λ + s + V_corr > 0``. The clip
    bounds ``σ_b² ≤ 1 < C = 2``, so the test can always be corrected; should it not be,
    :class:`~pymc_dp.errors.BarkerVarianceError` is raised rather than a silent decision.
    Event: :class:`~pymc_dp.accounting.BarkerCost` (thesis Thm 3.3, RDP).
    """

    def __init__(
        self,
        channel: PrivateChannel,
        *,
        batch_size: int,
        temperature: float,
        correction: BarkerCorrection,
    ) -> None:
        super().__init__(channel)
        self.batch_size = int(batch_size)
        self.temperature = float(temperature)
        self.correction = correction
        self._finish()

    @property
    def event(self) -> BarkerCost:
        return BarkerCost(self.batch_size, self.channel.n_rows)

    def __call__(
        self, theta: np.ndarray, theta_new: np.ndarray, log_prior_ratio: float
    ) -> BarkerDecision:
        if not self.channel.space.in_support(theta_new):  # −∞ for every dataset: read nothing
            return BarkerDecision(False, 0.0, 0)
        n, b = self.channel.n_rows, self.batch_size
        self._record()
        noise = self.channel.noise
        rows = noise.rows(n, b)  # secret: never from random_seed
        n0 = self.temperature * n
        bound = np.sqrt(b) / n0
        oracle = self._oracle
        ratio = oracle.loglik_rows(theta_new, rows) - oracle.loglik_rows(theta, rows)
        n_clipped = releases.count_clipped(ratio, bound)
        ratio = releases.clip_ratio(ratio, bound)
        lam = (n0 / b) * float(ratio.sum()) + float(log_prior_ratio)
        variance = n0**2 * float(ratio.var()) / b
        total = self.correction.normal_variance
        if variance > total:
            raise BarkerVarianceError(
                f"The batch variance exceeds the normal variance C = {total} that the Barker "
                "test corrects; the test cannot be made exact. Use a larger batch_size."
            )
        extra = noise.normal(np.sqrt(total - variance)) + self.correction.sample(noise)
        return BarkerDecision(bool(lam + extra > 0), variance, n_clipped)
