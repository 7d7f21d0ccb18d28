"""Noise-aware draws of the centred ratio: the centre release's noise widens the posterior.

The centred DP penalty (theory §4.1, "the centred ratio") pays for the linear part of the
log-likelihood once, with the noisy gradient ``Ĝ = G + ξ`` at the centre ``θ_c``,
``ξ ~ N(0, V)``. Read as exact, ``Ĝ`` tilts the target by ``exp(ξ·θ)``: near the mode, where the
likelihood is about ``N(m; θ, F⁻¹)`` (``m = θ_c + F⁻¹ G``, ``F`` its information), the tilted
target's likelihood is centred at ``m̃ = θ_c + F⁻¹ Ĝ``, off by ``F⁻¹ ξ`` (covariance
``F⁻¹ V F⁻¹``), with the full precision ``F``: its intervals are as narrow as the exact
posterior's, around a moved centre.

A noise-aware analysis of the release treats that noise as part of the observation
(``m̃ | m ~ N(m, F⁻¹ V F⁻¹)``, ``m | θ ~ N(θ, F⁻¹)``): the likelihood of ``θ`` given the release is
``N(m̃; θ, F⁻¹ + F⁻¹ V F⁻¹)``, the same centre with precision ``F (F + V)⁻¹ F = F − A``,

    A = F (F + V)⁻¹ V  (= F − F (F + V)⁻¹ F).

With the prior, the posterior precision ``Σ̂⁻¹ = F + Π`` becomes ``Σ̂⁻¹ − A``. The chain keeps
sampling the tilted target (whose released ratios are cheap near its own scale); its draws are
reported through the affine map ``θ ↦ m_a + K (θ − m̂)`` about the target's mode ``m̂``, with
``K Σ̂ Kᵀ = (Σ̂⁻¹ − A)⁻¹`` (``K = L M^{1/2} L⁻¹``, ``Σ̂ = L Lᵀ``, ``M = (I − Lᵀ A L)⁻¹``) and ``m_a``
the noise-aware mean (:func:`noise_aware_stretch`). For a Gaussian target and prior that is
exactly the noise-aware posterior; with a weak prior each direction's variance grows by
``1 + s²``, ``s`` the tilt in posterior sd (``Centring.shift_sd``), and the mean stays.
A direction the likelihood does not inform (``F = 0``) is not stretched. Everything here is
post-processing of released values (the Fisher release, the noise scale, ``Ĝ``'s mode).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["NoiseAwareStretch", "noise_aware_stretch"]

#: The stretch's variance factor is capped here (sd at most 10 times): beyond that the
#: release says almost nothing along a direction, and the covariance guess, not the noise,
#: would set the width.
MAX_VARIANCE_FACTOR = 100.0


class NoiseAwareStretch(NamedTuple):
    """The affine map ``θ ↦ centre + shift + matrix (θ − centre)`` of the module docstring."""

    centre: np.ndarray  # m̂
    shift: np.ndarray  # m_a − m̂ (zero with a flat prior)
    matrix: np.ndarray  # K
    inverse: np.ndarray  # K⁻¹
    variance_factor: float  # the largest 1 + s² over the directions (capped)

    def reported(self, theta: np.ndarray) -> np.ndarray:
        """The draw released for the chain's state ``θ``."""
        offset = np.asarray(theta, dtype=float) - self.centre
        return self.centre + self.shift + self.matrix @ offset

    def internal(self, reported: np.ndarray) -> np.ndarray:
        """The chain's state for a released draw (the inverse map)."""
        offset = np.asarray(reported, dtype=float) - self.centre - self.shift
        return self.centre + self.inverse @ offset


def _symmetric_power(vectors: np.ndarray, values: np.ndarray, power: float) -> np.ndarray:
    """``U diag(values^power) Uᵀ`` for the eigen-decomposition ``(values, U = vectors)``."""
    return (vectors * values**power) @ vectors.T


def _unit_clipped(matrix: np.ndarray) -> np.ndarray:
    """A symmetric matrix with its eigenvalues clipped to ``[0, 1]``."""
    values, vectors = np.linalg.eigh(0.5 * (matrix + matrix.T))
    return _symmetric_power(vectors, np.clip(values, 0.0, 1.0), 1.0)


def _taken(noise: np.ndarray, information: np.ndarray) -> np.ndarray:
    """``f − f (f + v)⁻¹ f`` for a clipped ``f`` (``information``) and ``v`` (``noise``)."""
    noise = 0.5 * (noise + noise.T)
    # a pseudo-inverse: along a direction where both are 0 (a coordinate the likelihood does
    # not read: no information, and the release's noise conditioned away) nothing is taken
    taken = information - information @ _pseudo_inverse(information + noise) @ information
    return 0.5 * (taken + taken.T)


def _pseudo_inverse(matrix: np.ndarray) -> np.ndarray:
    """Moore–Penrose inverse of a symmetric positive semi-definite matrix."""
    return np.linalg.pinv(0.5 * (matrix + matrix.T), hermitian=True)


def widening_information(
    whitened_noise: np.ndarray, whitened_information: np.ndarray
) -> np.ndarray:
    """``A`` in the coordinates that whiten ``Σ̂``: ``f − f (f + v)⁻¹ f``, with ``f = Lᵀ F L`` and
    ``v = Lᵀ V L`` (``Σ̂ = L Lᵀ``).

    ``f = I − Lᵀ Π L`` is at most ``I``; a released Fisher's noise can make it indefinite, so
    its eigenvalues are clipped to ``[0, 1]`` here, in these coordinates, which keeps the
    result in ``[0, I)`` (a clip in the raw coordinates would not). ``v = Lᵀ V L`` is singular
    where the model has coordinates the likelihood does not read (``V`` is zero along them:
    the release is conditioned there, :func:`~pymc_dp.mechanisms.conditioned_on_zeros`), and
    so can ``f + v`` be; its pseudo-inverse then takes nothing in that null space.
    """
    return _taken(whitened_noise, _unit_clipped(whitened_information))


def noise_aware_stretch(
    mode: np.ndarray,
    centre: np.ndarray,
    gradient: np.ndarray,
    gradient_covariance: np.ndarray,
    likelihood_information: np.ndarray,
    covariance: np.ndarray,
) -> NoiseAwareStretch:
    """The map that takes the tilted target ``N(m̂, Σ̂)`` to the noise-aware posterior.

    ``θ ↦ m_a + K (θ − m̂)`` with ``K Σ̂ Kᵀ = (Σ̂⁻¹ − A)⁻¹`` and the noise-aware mean
    ``m_a = m̂ − (Σ̂⁻¹ − A)⁻¹ A (m̃ − m̂)`` (``m̃ = θ_c + F⁻¹ Ĝ``, the likelihood's centre; with a
    weak prior ``m̃ ≈ m̂`` and the mean stays; where the prior informs a direction the release
    blurred, the mean moves towards the prior's). ``A m̃ = A θ_c + V (F + V)⁻¹ Ĝ`` needs no
    inverse of ``F``.

    Parameters
    ----------
    mode : array
        ``m̂``, the tilted target's mode.
    centre, gradient, gradient_covariance : array
        ``θ_c``, ``Ĝ`` and its noise covariance ``V``
        (:class:`~pymc_dp.step_methods.initialization.Centring`).
    likelihood_information : array
        ``F``, the likelihood's part of the released curvature (``Σ̂⁻¹`` less the prior's).
    covariance : array
        ``Σ̂``, the released posterior covariance.

    Returns
    -------
    NoiseAwareStretch
    """
    mode = np.array(mode, dtype=float)
    root = np.linalg.cholesky(covariance)
    information = _unit_clipped(root.T @ likelihood_information @ root)  # f, clipped
    noise = root.T @ gradient_covariance @ root  # v
    taken = _taken(noise, information)  # Lᵀ A L, in [0, I)
    values, vectors = np.linalg.eigh(np.eye(root.shape[0]) - taken)  # Lᵀ (Σ̂⁻¹ − A) L = M⁻¹
    values = np.clip(values, 1.0 / MAX_VARIANCE_FACTOR, 1.0)
    inverse_root = np.linalg.inv(root)
    # the mean: −L M Lᵀ A (m̃ − m̂), with Lᵀ A (m̃ − m̂) = (Lᵀ A L) L⁻¹ (θ_c − m̂) + v (f + v)⁻¹ Lᵀ Ĝ
    towards_centre = taken @ (inverse_root @ (np.asarray(centre, dtype=float) - mode))
    gradient = root.T @ np.asarray(gradient, dtype=float)
    pull = towards_centre + noise @ _pseudo_inverse(information + noise) @ gradient
    return NoiseAwareStretch(
        centre=mode,
        shift=-root @ _symmetric_power(vectors, values, -1.0) @ pull,
        matrix=root @ _symmetric_power(vectors, values, -0.5) @ inverse_root,  # L M^{1/2} L⁻¹
        inverse=root @ _symmetric_power(vectors, values, 0.5) @ inverse_root,
        variance_factor=float(1.0 / np.min(values)),
    )
