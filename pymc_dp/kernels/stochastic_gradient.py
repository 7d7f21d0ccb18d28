"""Stochastic-gradient samplers: one iteration of DP-SGLD, DP-SGNHT and DP-SGHMC (theory §4.5).

Every gradient comes from a secret batch ``B`` of ``b`` of the ``n`` rows as the release
``G̃ = Σ_{i∈B} clip_C(∇ℓ_i(θ)) + N(0, σ² I)``, and the samplers use the noisy gradient of the
log posterior ``g̃(θ) = ∇log p(θ) + (n/b) G̃``. There is no accept/reject step: these samplers
are exact only in the limit of a vanishing step, and their batch noise adds bias on top (the
docs say so). With time step ``h``:

* **DP-SGLD** (Welling & Teh 2011): ``θ ← θ + h g̃(θ)``. The DP noise *is* the Langevin noise:
  ``σ`` is chosen so that ``h (n/b) N(0, σ²)`` is ``N(0, 2h)``, the noise of the Langevin
  diffusion ``dθ = ∇log π dt + √2 dW`` whose law is the posterior. (The DP-HMC paper's code
  adds ``N(0, h)`` to a drift ``h g̃``: that chain's law is ``∝ π²``, half the posterior's
  variance; the tests keep it as a negative control.)
* **DP-SGNHT** (Ding et al. 2014), thermostat ``ξ``, diffusion ``A``, momentum carried over:
  ``p ← p − h ξ p + h g̃(θ)`` with the noise of ``h (n/b) N(0, σ²)`` equal to ``N(0, 2Ah)``;
  ``θ ← θ + h p``; ``ξ ← ξ + h (pᵀp/d − 1)`` (Ding et al.'s order: the new ``p`` moves ``θ``).
* **DP-SGHMC** (Chen, Fox & Guestrin 2014, with the corrections of theory §4.5), friction
  ``F``, ``J`` steps per iteration from a fresh momentum ``p ~ N(0, I)``: ``θ ← θ + h p``, then
  ``p ← p + h g̃(θ) − h F p`` with the noise of ``h (n/b) N(0, σ²)`` equal to ``N(0, 2Fh)``.
  The friction *removes* momentum (a sign flip, as printed in the SGHMC thesis' Algorithm 2,
  would pump energy in), the noise has variance ``2Fh`` (√h scaling, as the thesis' own
  accounting assumes, not ``h``), and position and momentum use the same ``h`` (Chen et al.'s
  discretisation of ``dθ = p dt``, ``dp = ∇log π dt − F p dt + √(2F) dW``).

In each case the noise of variance ``2Dh`` (``D`` = 1, ``A`` or ``F``) carried by
``h (n/b) N(0, σ²)`` fixes ``σ = (b/n) √(2D/h)``, so the noise multiplier of the release
(sensitivity ``2C``) is ``z = σ / (2C)`` (:func:`diffusion_noise_multiplier`): the step size
decides the privacy cost of one gradient release, and the budget the number of releases.

**Decreasing step size** (:class:`StepSizeSchedule`): ``h_t = h (1 + t/t₀)^{-γ}`` (Welling &
Teh's ``a (b + t)^{-γ}``), followed on the geometric grid ``h · r^{-k}``, ``r = √2``: at
iteration ``t`` the step is ``h r^{-k(t)}`` with ``k(t) = ⌊γ log(1 + t/t₀) / log r⌋``, the grid
point at or just above ``h_t`` (less than 41 % above it). Every iteration of stage ``k``
releases with the same noise multiplier ``z_k = z_0 r^{k/2}``, so a chain's releases are a
few stages of identical subsampled Gaussians (``6.6 γ`` stages per tenfold growth of
``1 + t/t₀``) that the ledger composes exactly: the same PLD as composing
the releases one by one, at the cost of one PLD per stage. A finer grid would follow the
formula more closely and make every composition (planning, reserving, the ``epsilon_spent``
stat) slower in proportion.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from pymc_dp.releases import Release

__all__ = [
    "SGInfo",
    "SGMechanisms",
    "SGState",
    "StepSizeSchedule",
    "diffusion_noise_multiplier",
    "sghmc_kernel",
    "sgld_kernel",
    "sgnht_kernel",
]


def diffusion_noise_multiplier(
    *, time_step: float, diffusion: float, batch_size: int, n_rows: int, grad_clip: float
) -> float:
    """``z`` such that the released gradient's noise is the dynamics' own noise.

    The update adds ``h (n/b) N(0, σ² I)``; for it to be ``N(0, 2 D h I)`` (diffusion ``D``)
    ``σ = (b/n) √(2D/h)``, and relative to the sum's sensitivity ``2C``,
    ``z = (b/n) √(2D/h) / (2C)``.
    """
    sigma = batch_size / n_rows * np.sqrt(2.0 * diffusion / time_step)
    return float(sigma / (2.0 * grad_clip))


@dataclasses.dataclass(frozen=True)
class StepSizeSchedule:
    """``h_t = h (1 + t/t₀)^{-γ}`` on the grid ``h · grid^{-k}``: stages of constant step.

    Iterations ``t = 0, 1, …`` of a chain (tuning included). Stage ``k`` starts at
    ``t_k = ⌈t₀ (grid^{k/γ} − 1)⌉``, the first iteration with ``h_t ≤ h grid^{-k}``, and runs
    with the step ``h grid^{-k}``.

    Parameters
    ----------
    decay : float
        ``γ`` in ``(0, 1]``.
    offset : float
        ``t₀ > 0``, in iterations: the step has fallen by ``2^{-γ}`` at ``t = t₀``.
    grid : float
        Ratio between consecutive stages' steps (``> 1``).
    """

    decay: float
    offset: float
    grid: float = 2.0**0.5

    def start(self, stage: int) -> int:
        """``t_k``: the first iteration of stage ``k``."""
        if stage <= 0:
            return 0
        # (a start that is an integer up to round-off is that integer)
        start = self.offset * math.expm1(stage * math.log(self.grid) / self.decay)
        return math.ceil(start - 1e-9 * max(1.0, start))

    def stage(self, iteration: int) -> int:
        """``k(t)``: the stage iteration ``t`` belongs to."""
        k = math.floor(self.decay * math.log1p(iteration / self.offset) / math.log(self.grid))
        while self.start(k + 1) <= iteration:  # round-off in either direction
            k += 1
        while k > 0 and self.start(k) > iteration:
            k -= 1
        return k

    def factor(self, stage: int) -> float:
        """``grid^{-k}``: stage ``k``'s step relative to the first."""
        return float(self.grid ** (-stage))

    def stages(self, first: int, last: int) -> list[tuple[int, int]]:
        """``(stage, iterations)`` covering iterations ``first, …, last − 1``, in order."""
        out = []
        t = int(first)
        while t < last:
            k = self.stage(t)
            end = min(self.start(k + 1), int(last))
            out.append((k, end - t))
            t = end
        return out

    def describe(self, step: str = "h") -> str:
        """The schedule in words, with ``step`` the name of the first step."""
        return (
            f"{step} (1 + t/{self.offset:g})^-{self.decay:g} on the grid {step}·{self.grid:.4g}^-k "
            "(stages of constant step)"
        )


class SGState(NamedTuple):
    """Chain state: position, momentum (SGNHT carries it over) and thermostat (SGNHT)."""

    theta: np.ndarray
    momentum: np.ndarray | None = None
    thermostat: float | None = None


class SGInfo(NamedTuple):
    jump: float  # ‖θ' − θ‖₂
    diverging: bool  # a non-finite position or momentum: the chain stays where it was
    n_clipped: int | None  # rows clipped over the releases (NOT private; diagnostics only)


class SGMechanisms(NamedTuple):
    """What the kernels may evaluate: the public log-prior gradient and the bound release."""

    logprior_grad: Callable[[np.ndarray], np.ndarray]
    release_grad: Callable[[np.ndarray], Release]  # θ → Σ_B clip_C(∇ℓ_i) + N(0, σ² I)
    batch_scale: float  # n / b

    def noisy_grad(self, theta: np.ndarray) -> tuple[np.ndarray, int | None]:
        """``g̃(θ) = ∇log p(θ) + (n/b) G̃(θ)`` and the release's (non-private) clip count."""
        release = self.release_grad(theta)
        return self.logprior_grad(theta) + self.batch_scale * release.value, release.n_clipped


def _add(total: int | None, count: int | None) -> int | None:
    return None if count is None else (total or 0) + count


def _finite(*arrays: np.ndarray) -> bool:
    return all(np.all(np.isfinite(a)) for a in arrays)


def sgld_kernel(
    state: SGState, time_step: float, mechanisms: SGMechanisms
) -> tuple[SGState, SGInfo]:
    """One DP-SGLD step: ``θ ← θ + h g̃(θ)`` (one gradient release)."""
    theta = state.theta
    grad, clipped = mechanisms.noisy_grad(theta)
    new = theta + time_step * grad
    if not _finite(new):
        return state, SGInfo(0.0, True, clipped)
    return SGState(new), SGInfo(float(np.linalg.norm(new - theta)), False, clipped)


def sgnht_kernel(
    state: SGState, time_step: float, diffusion: float, mechanisms: SGMechanisms
) -> tuple[SGState, SGInfo]:
    """One DP-SGNHT step (one gradient release); ``diffusion`` is ``A``."""
    theta, p, xi = state.theta, state.momentum, state.thermostat
    grad, clipped = mechanisms.noisy_grad(theta)
    p_new = p - time_step * xi * p + time_step * grad
    theta_new = theta + time_step * p_new
    xi_new = xi + time_step * (float(p_new @ p_new) / p_new.size - 1.0)
    if not (_finite(theta_new, p_new) and np.isfinite(xi_new)):
        # the momentum is redrawn: the chain can go on from where it was
        return SGState(theta, None, diffusion), SGInfo(0.0, True, clipped)
    info = SGInfo(float(np.linalg.norm(theta_new - theta)), False, clipped)
    return SGState(theta_new, p_new, float(xi_new)), info


def sghmc_kernel(
    state: SGState,
    time_step: float,
    friction: float,
    n_steps: int,
    rng: np.random.Generator,
    mechanisms: SGMechanisms,
) -> tuple[SGState, SGInfo]:
    """One DP-SGHMC iteration: a fresh momentum and ``J`` steps (``J`` gradient releases).

    Each step updates the momentum from a release at the current position, then the position:
    ``p ← p + h G̃(θ) − h F p``, ``θ ← θ + h p``. Every release moves ``θ`` (with the position
    first, the last release of an iteration would only move a momentum that is then redrawn,
    and ``J = 1`` would be a random walk that ignores the data).

    A step whose position or momentum becomes non-finite ends the iteration at the start (a
    divergence); the releases it made are spent all the same (the step reserved ``J``).
    """
    theta0 = state.theta
    theta, p = theta0.copy(), rng.standard_normal(theta0.size)  # public: independent of data
    clipped = None
    for _ in range(n_steps):
        grad, count = mechanisms.noisy_grad(theta)
        clipped = _add(clipped, count)
        p = p + time_step * grad - time_step * friction * p
        theta = theta + time_step * p
        if not _finite(theta, p):
            return state, SGInfo(0.0, True, clipped)
    return SGState(theta), SGInfo(float(np.linalg.norm(theta - theta0)), False, clipped)
