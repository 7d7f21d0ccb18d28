"""Gaussian mechanisms: turn the oracle's clipped sums into noisy, counted releases (SPEC §2).

This is the only module that draws differential-privacy noise. Noise comes from a
:class:`NoiseSource`, a generator of its own seeded from OS entropy by default and never from the
user's ``random_seed`` (an adversary who knows the noise seed can subtract the noise). A fixed
``noise_seed`` makes the noise reproducible for tests and research runs; that choice is recorded
(:attr:`NoiseSource.reproducible`) so it can be reported with the release.

Every release is counted in a :class:`ReleaseCounter`. A step's counter holds the chain's
reservation (:meth:`ReleaseCounter.allow`), and each release is checked against it *before* the
data are read: a release that the reservation does not cover (say, a noise multiplier lowered
after the reservation) raises :class:`~pymc_dp.errors.BudgetExceededError` instead.

A proposal outside the model's support (a parameter-only check of the likelihood fails, e.g.
``sigma > 0`` after ``exp`` underflowed) is decided without reading data: the released ratio is
``−∞`` (a rejection) and nothing is released or counted (``RowLikelihood.in_support``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from pymc_dp.accounting.costs import BarkerCost, GaussianCost, PrivacyCost, SubsampledGaussianCost
from pymc_dp.barker_correction import BarkerCorrection
from pymc_dp.errors import BudgetExceededError, InvalidParameterError, PyMCDPError
from pymc_dp.oracle import RowLikelihood

__all__ = [
    "BarkerDecision",
    "BarkerVarianceError",
    "NoiseSource",
    "Release",
    "ReleaseCounter",
    "barker_test",
    "minibatch_llr_estimate",
    "minibatch_llr_sensitivity",
    "release_grad",
    "release_llr",
    "release_llr_minibatch",
]


class NoiseSource:
    """A secret generator for DP noise and other secret choices (e.g. minibatch rows).

    Parameters
    ----------
    seed : int or numpy.random.SeedSequence, optional
        ``None`` (default): fresh OS entropy — the only private choice. An integer or seed
        sequence makes the noise reproducible (tests, research), which :attr:`reproducible`
        records.
    """

    def __init__(self, seed: int | np.random.SeedSequence | None = None) -> None:
        self.reproducible = seed is not None
        if isinstance(seed, np.random.SeedSequence):
            self._seq = seed
        else:
            self._seq = np.random.SeedSequence(seed)
        self.generator = np.random.Generator(np.random.PCG64(self._seq))

    def spawn(self, n: int) -> list[NoiseSource]:
        """Independent child sources (one per chain), reproducible iff this one is."""
        children = []
        for seq in self._seq.spawn(n):
            child = NoiseSource(seq)
            child.reproducible = self.reproducible
            children.append(child)
        return children

    def normal(self, scale: float | np.ndarray, size: int | None = None) -> float | np.ndarray:
        """Draw ``N(0, scale²)`` noise."""
        return self.generator.normal(0.0, scale, size)

    def __repr__(self) -> str:
        kind = "reproducible (seeded)" if self.reproducible else "OS entropy"
        return f"NoiseSource({kind})"


# Relative slack on the Gaussian allowance: the reservation's μ and the sum of the releases' μ
# are the same numbers added in another order.
_MU_SLACK = 1e-9


@dataclass
class ReleaseCounter:
    """Counts releases and checks each one against the chain's reservation (SPEC §2–§3).

    Without an allowance (``limited=False``, the default for direct use in tests and research)
    releases are only counted. A step method calls :meth:`allow` with every reservation it makes,
    and from then on each ``add_*`` call raises :class:`BudgetExceededError` *before* the data
    are read when the release is not covered: Gaussian releases by their total PLD parameter
    ``μ``; subsampled releases (minibatch penalty, Barker) by their count for the same sampling
    ratio and a noise multiplier at least as large as reserved.
    """

    llr_releases: int = 0
    grad_releases: int = 0
    barker_tests: int = 0  # subsampled tests: accounted in RDP, not in mu
    minibatch_llr_releases: int = 0  # subsampled Gaussian releases: PLD accounted, not in mu
    mu: float = 0.0
    limited: bool = False
    allowed_mu: float = 0.0
    allowed_subsampled: dict = dataclasses.field(default_factory=dict)  # (z, q) -> count
    allowed_barker: dict = dataclasses.field(default_factory=dict)  # (b, n) -> count

    def allow(self, cost: PrivacyCost, iterations: int) -> None:
        """Add a reservation of ``iterations`` iterations of ``cost`` to what may be released."""
        self.limited = True
        if isinstance(cost, GaussianCost):
            self.allowed_mu += iterations * cost.mu
        elif isinstance(cost, SubsampledGaussianCost):
            key = (cost.noise_multiplier, cost.sampling_ratio)
            self.allowed_subsampled[key] = self.allowed_subsampled.get(key, 0) + iterations
        elif isinstance(cost, BarkerCost):
            key = (cost.batch_size, cost.n)
            self.allowed_barker[key] = self.allowed_barker.get(key, 0) + iterations
        else:  # pragma: no cover - every step's cost is one of the above
            raise InvalidParameterError(f"no release allowance for the cost {cost!r}.")

    def _refuse(self, what: str) -> BudgetExceededError:
        return BudgetExceededError(
            f"{what}, which this chain's reservation in the privacy ledger does not cover: the "
            "step's privacy parameters no longer match what it reserved. Nothing was read. "
            "Privacy parameters cannot change after a step is built: build a new step."
        )

    def add(self, kind: str, noise_multiplier: float) -> None:
        """Count one Gaussian release (``kind`` "llr" or "grad") with multiplier ``z``."""
        mu = self.mu + 1.0 / (2.0 * noise_multiplier**2)
        if self.limited and mu > self.allowed_mu * (1.0 + _MU_SLACK):
            raise self._refuse(
                f"This release (noise multiplier {noise_multiplier:.6g}) would bring the chain's "
                f"Gaussian privacy loss to mu = {mu:.6g} of the {self.allowed_mu:.6g} reserved"
            )
        if kind == "llr":
            self.llr_releases += 1
        else:
            self.grad_releases += 1
        self.mu = mu

    def add_minibatch_llr(self, noise_multiplier: float, sampling_ratio: float) -> None:
        """Count one subsampled Gaussian release (multiplier ``z``, sampling ratio ``q``)."""
        if self.limited:
            covered = sum(
                count
                for (z, q), count in self.allowed_subsampled.items()
                if q == sampling_ratio and noise_multiplier >= z
            )
            if self.minibatch_llr_releases + 1 > covered:
                raise self._refuse(
                    f"Minibatch release number {self.minibatch_llr_releases + 1} (noise "
                    f"multiplier {noise_multiplier:.6g}, sampling ratio {sampling_ratio:.6g})"
                )
        self.minibatch_llr_releases += 1

    def add_barker_test(self, batch_size: int, n_rows: int) -> None:
        """Count one DP Barker test on a batch of ``b`` of ``n`` rows."""
        if self.limited and self.barker_tests + 1 > self.allowed_barker.get(
            (batch_size, n_rows), 0
        ):
            raise self._refuse(
                f"Barker test number {self.barker_tests + 1} (batch of {batch_size} of "
                f"{n_rows} rows)"
            )
        self.barker_tests += 1


class Release(NamedTuple):
    """A noisy release and the standard deviation of the noise that was added.

    ``n_clipped`` is NOT private (computed from the data without noise); a step method asks for
    it (``count_clipped=True``) only for its opt-in, non-private diagnostics channel, and it is
    ``None`` otherwise.
    """

    value: float | np.ndarray
    noise_std: float
    n_clipped: int | None


def _check_multiplier(z: float, name: str) -> float:
    z = float(z)
    if not (np.isfinite(z) and z > 0):
        raise InvalidParameterError(f"{name} must be positive and finite, got {z}.")
    return z


def release_llr(
    oracle: RowLikelihood,
    noise: NoiseSource,
    theta: np.ndarray,
    theta_new: np.ndarray,
    *,
    llr_clip: float,
    noise_multiplier: float,
    temperature: float = 1.0,
    counter: ReleaseCounter | None = None,
    count_clipped: bool = False,
) -> Release:
    """Noisy tempered clipped log-likelihood-ratio sum (SPEC §2, §4.1 steps 2–3).

    Releases ``T · R(θ, θ') + ξ`` with ``R = Σ_i clip(ℓ_i(θ') − ℓ_i(θ), ±B)``,
    ``B = b_l ‖θ' − θ‖₂`` and ``ξ ~ N(0, σ²)``, ``σ = z · 2 T B`` (sensitivity ``2 T B`` under
    substitution of one row). One Gaussian mechanism with PLD parameter ``1/(2z²)``.
    """
    z = _check_multiplier(noise_multiplier, "noise_multiplier")
    if not oracle.in_support(theta_new):  # log-density −∞ for every dataset: reject, read nothing
        return Release(-np.inf, 0.0, 0 if count_clipped else None)
    bound = float(llr_clip) * float(np.linalg.norm(np.asarray(theta_new) - np.asarray(theta)))
    if counter is not None:
        counter.add("llr", z)
    if bound == 0.0:  # θ' = θ: the ratio is 0 without reading data, and so is the noise
        return Release(0.0, 0.0, 0 if count_clipped else None)
    clipped = oracle.clipped_llr_sum(theta, theta_new, bound, count_clipped=count_clipped)
    sigma = z * 2.0 * temperature * bound
    return Release(temperature * clipped.value + noise.normal(sigma), sigma, clipped.n_clipped)


def release_grad(
    oracle: RowLikelihood,
    noise: NoiseSource,
    theta: np.ndarray,
    *,
    grad_clip: float,
    noise_multiplier: float,
    temperature: float = 1.0,
    counter: ReleaseCounter | None = None,
    count_clipped: bool = False,
) -> Release:
    """Noisy tempered clipped gradient sum ``T · (G(θ) + N(0, σ² I))``, ``σ = z · 2 b_g``.

    SPEC §2 and §4.3. Sensitivity ``2 b_g`` under substitution of one row; one Gaussian
    mechanism with PLD parameter ``1/(2z²)``.
    """
    z = _check_multiplier(noise_multiplier, "grad_noise_multiplier")
    if counter is not None:  # checked against the reservation before the data are read
        counter.add("grad", z)
    clipped = oracle.clipped_grad_sum(theta, grad_clip, count_clipped=count_clipped)
    sigma = z * 2.0 * float(grad_clip)
    value = temperature * (clipped.value + noise.normal(sigma, clipped.value.shape[0]))
    return Release(value, temperature * sigma, clipped.n_clipped)


def _check_batch(batch_size: int, n_rows: int) -> None:
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
    _check_batch(b, n)
    s = n * temperature / b
    total = float(ratio.sum())
    spread = max(float(np.dot(ratio, ratio)) - total * total / b, 0.0)
    return s * total, (1.0 - b / n) * s * s * spread * b / (b - 1)


def minibatch_llr_sensitivity(bound: float, *, batch_size: int, n_rows: int, temperature: float):
    """Substitute-relation sensitivity ``c`` of the minibatch penalty release (SPEC §4.2).

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


def release_llr_minibatch(
    oracle: RowLikelihood,
    noise: NoiseSource,
    theta: np.ndarray,
    theta_new: np.ndarray,
    *,
    batch_size: int,
    llr_clip: float,
    noise_multiplier: float,
    temperature: float = 1.0,
    counter: ReleaseCounter | None = None,
    variance_correction: bool = True,
    count_clipped: bool = False,
) -> Release:
    """Noisy minibatch estimate of the tempered log-likelihood ratio (SPEC §4.2, thesis §3.4).

    Draws ``b`` rows without replacement from the secret generator, reads only those rows at
    ``θ`` and ``θ'``, clips ``r_j = ℓ_j(θ') − ℓ_j(θ)`` to ``±B`` (``B = b_l ‖θ' − θ‖₂``) and
    releases ``λ* − ½σ_b² + ξ`` with ``λ* = (nT/b) Σ r_j``, ``σ_b²`` its variance estimate
    (see :func:`minibatch_llr_sensitivity`) and ``ξ ~ N(0, σ²)``, ``σ = z c``. The penalty test
    then subtracts ``½σ²``, so in total ``½(σ² + σ_b²)`` as SPEC §4.2. Privacy: one subsampled
    Gaussian mechanism with multiplier ``z`` and ratio ``q = b/n`` (``SubsampledGaussianCost``).
    ``variance_correction=False`` leaves out ``−½σ_b²`` (only for the tests' negative control).
    """
    z = _check_multiplier(noise_multiplier, "noise_multiplier")
    n, b = oracle.n_rows, int(batch_size)
    _check_batch(b, n)
    if not oracle.in_support(theta_new):  # log-density −∞ for every dataset: reject, read nothing
        return Release(-np.inf, 0.0, 0 if count_clipped else None)
    bound = float(llr_clip) * float(np.linalg.norm(np.asarray(theta_new) - np.asarray(theta)))
    if counter is not None:
        counter.add_minibatch_llr(z, b / n)
    if bound == 0.0:  # θ' = θ: the ratio is 0 without reading data, and so is the noise
        return Release(0.0, 0.0, 0 if count_clipped else None)
    rows = noise.generator.choice(n, size=b, replace=False)  # secret: never from random_seed
    ratio = oracle.loglik_rows(theta_new, rows) - oracle.loglik_rows(theta, rows)
    n_clipped = int(np.sum(~(np.abs(ratio) <= bound))) if count_clipped else None  # NaN: clipped
    ratio = np.clip(np.where(np.isnan(ratio), -bound, ratio), -bound, bound)
    estimate, batch_variance = minibatch_llr_estimate(ratio, n_rows=n, temperature=temperature)
    sigma = z * minibatch_llr_sensitivity(bound, batch_size=b, n_rows=n, temperature=temperature)
    value = estimate + noise.normal(sigma)
    if variance_correction:
        value -= 0.5 * batch_variance
    return Release(value, sigma, n_clipped)


class BarkerDecision(NamedTuple):
    """Outcome of one DP Barker test: only ``accepted`` is released.

    ``batch_variance`` (``σ_b²``) and ``n_clipped`` are computed from the batch without noise:
    NOT private, kept only in the opt-in diagnostics.
    """

    accepted: bool
    batch_variance: float
    n_clipped: int


class BarkerVarianceError(PyMCDPError):
    """The batch variance exceeded the normal variance the Barker test can correct."""


def barker_test(
    oracle: RowLikelihood,
    noise: NoiseSource,
    theta: np.ndarray,
    theta_new: np.ndarray,
    *,
    log_prior_ratio: float,
    batch_size: int,
    temperature: float,
    correction: BarkerCorrection,
    counter: ReleaseCounter | None = None,
) -> BarkerDecision:
    """The DP Barker acceptance test on a secret minibatch (SPEC §4.4, thesis Algorithm 3).

    Draws ``b`` rows without replacement from the secret generator, reads only those rows, and
    with ``r_j = ℓ_j(θ') − ℓ_j(θ)`` clipped to ``|r_j| ≤ √b / n0`` (``n0 = T n``) forms
    ``λ = (n0 / b) Σ_j r_j + log p(θ') − log p(θ)`` and ``σ_b² = n0² Var_B(r) / b``; then draws
    ``s ~ N(0, C − σ_b²)`` and ``V_corr`` (so that ``N(0, C) + V_corr ≈ Logistic(0, 1)``) and
    accepts iff ``λ + s + V_corr > 0``. The clip bounds ``σ_b² ≤ 1 < C = 2`` (population
    variance of values in ``[−a, a]`` is at most ``a²``), so the test can always be corrected;
    should it not be (``σ_b² > C``), :class:`BarkerVarianceError` is raised rather than a silent
    accept or reject. Privacy: thesis Thm 3.3, accounted by ``BarkerCost``.
    """
    n = oracle.n_rows
    b = int(batch_size)
    if not oracle.in_support(theta_new):  # log-density −∞ for every dataset: reject, read nothing
        return BarkerDecision(False, 0.0, 0)
    if counter is not None:
        counter.add_barker_test(b, n)
    rows = noise.generator.choice(n, size=b, replace=False)  # secret: never from random_seed
    n0 = temperature * n
    bound = np.sqrt(b) / n0
    ratio = oracle.loglik_rows(theta_new, rows) - oracle.loglik_rows(theta, rows)
    n_clipped = int(np.sum(~(np.abs(ratio) <= bound)))  # NaN counts as clipped
    ratio = np.clip(np.where(np.isnan(ratio), -bound, ratio), -bound, bound)
    lam = (n0 / b) * float(ratio.sum()) + float(log_prior_ratio)
    variance = n0**2 * float(ratio.var()) / b
    total = correction.normal_variance
    if variance > total:
        raise BarkerVarianceError(
            f"The batch variance exceeds the normal variance C = {total} that the Barker test "
            "corrects; the test cannot be made exact. Use a larger batch_size."
        )
    extra = noise.normal(np.sqrt(total - variance)) + correction.sample(noise.generator)
    return BarkerDecision(bool(lam + extra > 0), variance, n_clipped)
