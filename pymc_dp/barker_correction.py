"""The correction distribution ``V_corr`` of the DP Barker test (theory §4.4).

Barker's test accepts iff ``λ + V > 0`` with ``V ~ Logistic(0, 1)``. The DP Barker sampler
has Gaussian noise ``N(0, C)`` in ``λ`` already (``C`` is the *normal variance*) and adds an
independent draw of ``V_corr``, chosen so that

.. math::

    N(0, C) + V_\\mathrm{corr} \\approx \\mathrm{Logistic}(0, 1).

No exact ``V_corr`` exists (``πt / sinh(πt) · exp(C t² / 2)``, the characteristic function
it would need, exceeds 1 for large ``t``), so the package ships symmetric Gaussian mixtures
fitted numerically by ``docs/scripts/fit_barker_correction.py`` (package data
``pymc_dp/data/barker_correction.json``) together with their sup-norm CDF error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from typing import Any, Self

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special

from pymc_dp.errors import InvalidParameterError

__all__ = ["BarkerCorrection"]

_DATA_FILE = "barker_correction.json"
_FIT_SCRIPT = "docs/scripts/fit_barker_correction.py"
_DEFAULT_GRID = (-40.0, 40.0, 20001)


@cache
def _shipped_fits() -> dict[str, Any]:
    """The parsed package data file (read once per process)."""
    resource = files("pymc_dp") / "data" / _DATA_FILE
    return json.loads(resource.read_text(encoding="utf-8"))


def _frozen_array(values: ArrayLike, name: str) -> NDArray[np.float64]:
    array = np.array(values, dtype=np.float64, ndmin=1)
    if array.ndim != 1 or not np.all(np.isfinite(array)):
        raise InvalidParameterError(f"{name} must be a 1-d array of finite numbers")
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class BarkerCorrection:
    """Symmetric Gaussian mixture ``V_corr`` with ``N(0, C) + V_corr ≈ Logistic(0, 1)``.

    .. math::

        V_\\mathrm{corr} \\sim \\sum_j w_j \\, N(m_j, s_j^2),

    where the components come in ``±m`` pairs with equal weights and sds (plus possibly a
    component at mean 0). Since ``N(0, C) * N(m, s²) = N(m, s² + C)``, the sum has the CDF

    .. math::

        F(x) = \\sum_j w_j \\, \\Phi\\!\\left(\\frac{x - m_j}{\\sqrt{s_j^2 + C}}\\right).

    Use :meth:`load` for the shipped fits.

    Parameters
    ----------
    normal_variance : float
        ``C``, the variance of the Gaussian noise already in the test statistic.
    weights, means, sds : numpy.ndarray
        Component weights ``w_j`` (non-negative, summing to 1), means ``m_j`` and standard
        deviations ``s_j ≥ 0``; stored as read-only float arrays.
    cdf_error : float
        ``max_x |F(x) − expit(x)|`` as recorded by the fitting script (see
        :meth:`max_cdf_error` to recompute it).
    """

    normal_variance: float
    weights: NDArray[np.float64] = field(repr=False)
    means: NDArray[np.float64] = field(repr=False)
    sds: NDArray[np.float64] = field(repr=False)
    cdf_error: float = math.nan

    def __post_init__(self) -> None:
        c = float(self.normal_variance)
        if not (math.isfinite(c) and c > 0):
            raise InvalidParameterError(f"normal_variance must be positive, got {c}")
        weights = _frozen_array(self.weights, "weights")
        means = _frozen_array(self.means, "means")
        sds = _frozen_array(self.sds, "sds")
        if not (weights.shape == means.shape == sds.shape):
            raise InvalidParameterError(
                "weights, means and sds must have the same length, got "
                f"{weights.size}, {means.size} and {sds.size}"
            )
        if np.any(weights < 0) or not math.isclose(weights.sum(), 1.0, abs_tol=1e-9):
            raise InvalidParameterError("weights must be non-negative and sum to 1")
        if np.any(sds < 0):
            raise InvalidParameterError("sds must be non-negative")
        object.__setattr__(self, "normal_variance", c)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "means", means)
        object.__setattr__(self, "sds", sds)
        object.__setattr__(self, "cdf_error", float(self.cdf_error))

    @classmethod
    def available_normal_variances(cls) -> tuple[float, ...]:
        """The values of ``C`` with a shipped fit, ascending."""
        return tuple(
            sorted(float(fit["normal_variance"]) for fit in _shipped_fits()["fits"].values())
        )

    @classmethod
    def load(cls, normal_variance: float = 2.0) -> Self:
        """The shipped fit for ``C = normal_variance``.

        Parameters
        ----------
        normal_variance : float, default 2.0
            ``C``; must be one of :meth:`available_normal_variances` (up to 1e-9).

        Returns
        -------
        BarkerCorrection

        Raises
        ------
        InvalidParameterError
            If no fit for this ``C`` is shipped.
        """
        for fit in _shipped_fits()["fits"].values():
            if math.isclose(float(fit["normal_variance"]), normal_variance, abs_tol=1e-9):
                return cls(
                    normal_variance=float(fit["normal_variance"]),
                    weights=fit["weights"],
                    means=fit["means"],
                    sds=fit["sds"],
                    cdf_error=float(fit["cdf_error"]),
                )
        available = ", ".join(repr(c) for c in cls.available_normal_variances())
        raise InvalidParameterError(
            f"no Barker correction is shipped for normal_variance={normal_variance!r}; "
            f"available values: {available}. Fit another with "
            f"`python {_FIT_SCRIPT} --normal-variance {normal_variance}`."
        )

    def sample(
        self,
        generator: Any,
        size: int | tuple[int, ...] | None = None,
    ) -> float | NDArray[np.float64]:
        """Draw ``V_corr``: component ``J ~ Categorical(w)``, then ``m_J + s_J · Z``.

        Parameters
        ----------
        generator : numpy.random.Generator or pymc_dp.noise.NoiseSource
            The only source of randomness used (pass the DP noise source): anything with
            ``choice(a, size, p=...)`` and ``standard_normal(size)``.
        size : int or tuple of int, optional
            Output shape; ``None`` returns a single float.

        Returns
        -------
        float or numpy.ndarray
            Draws of ``V_corr`` (not including the ``N(0, C)`` part).
        """
        index = generator.choice(self.weights.size, size=size, p=self.weights)
        z = generator.standard_normal(size)
        draws = self.means[index] + self.sds[index] * z
        return float(draws) if size is None else draws

    def cdf(self, x: ArrayLike) -> NDArray[np.float64]:
        """CDF of ``N(0, C) + V_corr``: ``F(x) = Σ_j w_j Φ((x − m_j) / sqrt(s_j² + C))``.

        Parameters
        ----------
        x : array_like
            Points at which to evaluate.

        Returns
        -------
        numpy.ndarray
            ``F(x)``, same shape as ``x``.
        """
        scale = np.sqrt(self.sds**2 + self.normal_variance)
        z = (np.asarray(x, dtype=np.float64)[..., None] - self.means) / scale
        return special.ndtr(z) @ self.weights

    def max_cdf_error(self, grid: ArrayLike | None = None) -> float:
        """Sup-norm distance ``max_i |F(x_i) − expit(x_i)|`` to the logistic CDF.

        Parameters
        ----------
        grid : array_like, optional
            Points ``x_i``; default 20 001 equally spaced points on [−40, 40], the grid the
            fitting script records ``cdf_error`` on.

        Returns
        -------
        float
        """
        x = np.linspace(*_DEFAULT_GRID) if grid is None else np.asarray(grid, dtype=np.float64)
        return float(np.max(np.abs(self.cdf(x) - special.expit(x))))
