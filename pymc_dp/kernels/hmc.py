"""DP HMC: one iteration of theory §4.3 (Räisä, Koskela & Honkela; thesis Algorithm 4).

From ``θ``, with step size ``η``, ``L`` leapfrog steps and mass ``M`` (diagonal, or dense as
``M⁻¹ = W Wᵀ``):

1. ``p₀ ~ N(0, M)``;
2. leapfrog with a fresh noisy gradient at every position, ``L + 1`` releases in all:
   ``p ← p + (η/2) g̃(θ₀)``; for ``j = 1..L``: ``θ ← θ + η M⁻¹ p``, ``p ← p + η g̃(θ)``
   (``η/2`` on the last step), where ``g̃(θ) = T · (G(θ) + N(0, σ_g² I)) + ∇ log p(θ)``;
3. ``ΔH = T · R(θ, θ') + log p(θ') − log p(θ) + ½ p₀ᵀM⁻¹p₀ − ½ p'ᵀM⁻¹p'``;
4. the mechanism releases ``T · R + ξ``, ``ξ ~ N(0, σ_l²)``, ``σ_l = z_l · 2 T b_l ‖θ' − θ‖₂``;
   accept iff ``log U < ΔH + ξ − σ_l²/2``.

The noisy leapfrog is still reversible and volume-preserving (the noise is fresh and independent
of the direction of travel), so with the ``−σ_l²/2`` penalty the chain targets the exact
posterior when no log-likelihood ratio is clipped; gradient clipping and gradient noise only
lower the acceptance rate (paper Thm 3.3–3.4).

A trajectory whose position or momentum becomes non-finite stops there and is rejected as a
*divergence*; so is one whose released ``ΔH + ξ`` is below ``−DIVERGENCE_THRESHOLD`` (PyMC's
``Emax``). Both decisions use released values only; the releases made before stopping are
still spent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import scipy.linalg

from pymc_dp.releases import Release

__all__ = [
    "DIVERGENCE_THRESHOLD",
    "HMCInfo",
    "HMCMechanisms",
    "HMCParams",
    "HMCState",
    "hmc_kernel",
    "leapfrog",
]

#: A released energy change below ``−DIVERGENCE_THRESHOLD`` counts as a divergence (as PyMC).
DIVERGENCE_THRESHOLD = 1000.0


class HMCState(NamedTuple):
    """Chain state: position and its (public) log-prior."""

    theta: np.ndarray
    logprior: float


class HMCParams(NamedTuple):
    step_size: float  # η for this iteration (after any jitter)
    n_steps: int  # L
    inv_mass: np.ndarray  # diagonal of M⁻¹ (ignored with ``root``)
    penalty: bool = True  # False only for the negative control in tests
    root: np.ndarray | None = None  # a dense M⁻¹ = W Wᵀ, W lower triangular

    def velocity(self, momentum: np.ndarray) -> np.ndarray:
        """``M⁻¹ p``."""
        if self.root is None:
            return self.inv_mass * momentum
        return self.root @ (self.root.T @ momentum)

    def kinetic(self, momentum: np.ndarray) -> float:
        """``½ pᵀ M⁻¹ p``."""
        if self.root is None:
            return 0.5 * float(np.sum(self.inv_mass * momentum**2))
        scaled = self.root.T @ momentum
        return 0.5 * float(scaled @ scaled)

    def draw_momentum(self, rng: np.random.Generator, d: int) -> np.ndarray:
        """``p ~ N(0, M)``: ``ξ / √(M⁻¹)``, or ``W⁻ᵀ ξ`` with a dense ``M⁻¹ = W Wᵀ``."""
        noise = rng.standard_normal(d)
        if self.root is None:
            return noise / np.sqrt(self.inv_mass)
        return scipy.linalg.solve_triangular(self.root.T, noise, lower=False)


class HMCMechanisms(NamedTuple):
    """What the kernel may evaluate: the public log-prior and its gradient, and the bound
    gradient and ratio releases."""

    logprior: Callable[[np.ndarray], float]
    logprior_grad: Callable[[np.ndarray], np.ndarray]
    release_grad: Callable[[np.ndarray], Release]  # θ → T·(G(θ) + N(0, σ_g² I))
    release_llr: Callable[[np.ndarray, np.ndarray], Release]  # (θ, θ') → T·R + ξ

    def noisy_grad(self, theta: np.ndarray) -> np.ndarray:
        """``g̃(θ) = T · (G(θ) + N(0, σ_g² I)) + ∇ log p(θ)``: one gradient release."""
        return self.release_grad(theta).value + self.logprior_grad(theta)


class HMCInfo(NamedTuple):
    accepted: bool
    jump: float  # ‖θ' − θ‖₂ of the proposal (0 after a divergence)
    diverging: bool
    grad_releases: int  # gradient releases made (L + 1 unless the trajectory diverged)
    noise_std: float  # σ_l of the released ratio (0 if none was made)
    llr_clipped: int | None = 0  # NOT private; None unless the release counted it


def leapfrog(
    theta: np.ndarray,
    momentum: np.ndarray,
    params: HMCParams,
    noisy_grad: Callable[[np.ndarray], np.ndarray],
) -> tuple[np.ndarray, np.ndarray, int, bool]:
    """Step 2: ``L`` leapfrog steps with ``L + 1`` noisy gradients.

    Returns ``(θ', p', gradient evaluations, finite)``; stops at the first non-finite position
    or momentum (no further gradient is evaluated). A position or momentum that overflows is
    that divergence, not a NumPy warning (PyMC's integrators treat it the same way).
    """
    eta, steps = params.step_size, params.n_steps
    grad = noisy_grad(theta)
    with _overflow_is_divergence():
        momentum = momentum + 0.5 * eta * grad
    evaluations = 1
    for j in range(1, steps + 1):
        with _overflow_is_divergence():
            theta = theta + eta * params.velocity(momentum)
        if not np.all(np.isfinite(theta)):
            return theta, momentum, evaluations, False
        grad = noisy_grad(theta)
        evaluations += 1
        with _overflow_is_divergence():
            momentum = momentum + (eta if j < steps else 0.5 * eta) * grad
        if not np.all(np.isfinite(momentum)):
            return theta, momentum, evaluations, False
    return theta, momentum, evaluations, True


def _overflow_is_divergence() -> np.errstate:
    """Arithmetic on a trajectory whose non-finite result the caller checks (a divergence)."""
    return np.errstate(over="ignore", invalid="ignore")


def hmc_kernel(
    state: HMCState,
    params: HMCParams,
    rng: np.random.Generator,
    mechanisms: HMCMechanisms,
) -> tuple[HMCState, HMCInfo]:
    """One DP-HMC iteration (theory §4.3). ``rng`` draws the momentum and ``U`` (public).

    ``mechanisms.release_grad(θ)`` makes one fresh gradient release (``g̃`` adds the prior's
    gradient); ``mechanisms.release_llr(θ, θ')`` the noisy tempered clipped ratio. Nothing else
    reads data.
    """
    p0 = params.draw_momentum(rng, state.theta.shape[0])
    theta_new, p_new, evaluations, finite = leapfrog(state.theta, p0, params, mechanisms.noisy_grad)
    logprior_new = mechanisms.logprior(theta_new) if finite else -np.inf
    if not np.isfinite(logprior_new):  # diverged: reject without releasing the ratio
        return state, HMCInfo(False, 0.0, True, evaluations, 0.0)
    # T·R + ξ, the only data-dependent number
    released = mechanisms.release_llr(state.theta, theta_new)
    with _overflow_is_divergence():  # a momentum that large is a divergence (−∞ or NaN below)
        kinetic_change = params.kinetic(p0) - params.kinetic(p_new)
        energy_change = released.value + logprior_new - state.logprior + kinetic_change  # ΔH + ξ
    diverging = not energy_change > -DIVERGENCE_THRESHOLD  # also NaN
    log_ratio = energy_change - (0.5 * released.noise_std**2 if params.penalty else 0.0)
    accepted = bool(not diverging and np.log(rng.uniform()) < log_ratio)
    with _overflow_is_divergence():  # a diverged trajectory's jump may be infinite
        jump = float(np.linalg.norm(theta_new - state.theta))
    info = HMCInfo(accepted, jump, diverging, evaluations, released.noise_std, released.n_clipped)
    if accepted:
        return HMCState(theta_new, logprior_new), info
    return state, info
