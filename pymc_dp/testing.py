"""Models with closed-form posteriors, reused by the tests, benchmarks and examples (theory §5).

The banana model of the thesis (T§5.1, Theorem 5.2): with
``g(x) = (x_1, x_2 − a(x_1 − m)² − b, x_3, …, x_d)`` and ``Ban(µ, Σ, a, b, m)`` the law of
``g(x)`` for ``x ~ N(µ, Σ)``,

    θ ~ Ban(0, σ0² I, a, b, m)
    x_i1 ~ N(θ_1, σ_1²),  x_i2 ~ N(θ_2 + a(θ_1 − m)² + b, σ_2²),  x_ij ~ N(θ_j, σ_j²) (j > 2).

The posterior tempered with ``T`` is ``Ban(µ, Σ, a, b, m)`` with
``µ_j = T n τ_j x̄_j / (T n τ_j + τ_0)`` and ``Σ = diag(1 / (T n τ_j + τ_0))``, ``τ_j = 1/σ_j²``.
``a = 0`` gives the Gaussian model with known (diagonal) covariance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pymc as pm

__all__ = ["Banana", "banana_model"]


def _default_lik_var(d: int) -> np.ndarray:
    """Likelihood variances of the seeds (T§5.2): σ1² = 20, σ2² = 2.5, σi² = 1 for i > 2."""
    var = np.ones(d)
    var[0] = 20.0
    if d > 1:
        var[1] = 2.5
    return var


def _default_theta(d: int) -> np.ndarray:
    """True parameters of the seeds (T§5.2): θ2 = 3, other θi = 0."""
    theta = np.zeros(d)
    if d > 1:
        theta[1] = 3.0
    return theta


@dataclass(frozen=True)
class Banana:
    """The seeds' banana model (T Definition 5.1, Theorem 5.2); ``a = 0`` is the Gaussian model.

    Parameters
    ----------
    d : int
        Dimension (≥ 2 for a banana; any ≥ 1 when ``a = 0``).
    a, b, m : float
        Banana parameters; the seeds use ``b = m = 0`` and ``a = 20`` (flat), ``350`` (narrow).
    prior_var : float
        ``σ0²`` of the prior ``Ban(0, σ0² I, a, b, m)`` (1000 in Table 5.1).
    lik_var : array, optional
        Likelihood variances ``σ_j²``; default ``(20, 2.5, 1, …, 1)``.
    """

    d: int = 2
    a: float = 20.0
    b: float = 0.0
    m: float = 0.0
    prior_var: float = 1000.0
    lik_var: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.d < 1 or (self.d < 2 and self.a != 0):
            raise ValueError("a banana needs d >= 2 (use a = 0 for a 1-d Gaussian)")
        lik_var = _default_lik_var(self.d) if self.lik_var is None else self.lik_var
        object.__setattr__(self, "lik_var", np.asarray(lik_var, dtype=float))

    def g(self, x: np.ndarray) -> np.ndarray:
        """``g(x) = (x_1, x_2 − a(x_1 − m)² − b, x_3, …)``: maps a Gaussian draw to a banana one."""
        y = np.array(x, dtype=float, copy=True)
        if self.d > 1:
            y[..., 1] = x[..., 1] - self.a * (x[..., 0] - self.m) ** 2 - self.b
        return y

    def simulate(
        self, n: int, rng: np.random.Generator, theta: np.ndarray | None = None
    ) -> np.ndarray:
        """Data ``X`` of shape ``(n, d)`` from the likelihood at ``theta`` (default: the seeds')."""
        theta = _default_theta(self.d) if theta is None else np.asarray(theta, dtype=float)
        mean = theta.copy()
        if self.d > 1:
            mean[1] = theta[1] + self.a * (theta[0] - self.m) ** 2 + self.b
        return mean + rng.normal(size=(n, self.d)) * np.sqrt(self.lik_var)

    def model(self, data: np.ndarray) -> pm.Model:
        """The PyMC model: a flat ``theta`` with the banana prior as a data-free potential."""
        data = np.asarray(data, dtype=float)
        with pm.Model() as model:
            theta = pm.Flat("theta", shape=self.d)
            bent = theta
            if self.d > 1:
                shift = self.a * (theta[0] - self.m) ** 2 + self.b
                bent = pm.math.concatenate([theta[:1], (theta[1] + shift)[None], theta[2:]])
            pm.Potential("banana_prior", -0.5 * pm.math.sum(bent**2) / self.prior_var)
            pm.Normal("x", mu=bent, sigma=np.sqrt(self.lik_var), observed=data)
        return model

    def posterior_params(
        self, data: np.ndarray, temperature: float = 1.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(µ, diag Σ)`` of the tempered posterior ``Ban(µ, Σ, a, b, m)`` (T Theorem 5.2)."""
        data = np.asarray(data, dtype=float)
        n = data.shape[0]
        tau = 1.0 / self.lik_var
        tau0 = 1.0 / self.prior_var
        precision = temperature * n * tau + tau0
        mean = temperature * n * tau * data.mean(axis=0) / precision
        return mean, 1.0 / precision

    def posterior_sample(
        self, data: np.ndarray, size: int, rng: np.random.Generator, temperature: float = 1.0
    ) -> np.ndarray:
        """Exact draws ``(size, d)`` from the tempered posterior."""
        mean, var = self.posterior_params(data, temperature)
        return self.g(mean + rng.normal(size=(size, self.d)) * np.sqrt(var))


def banana_model(data: np.ndarray, **kwargs) -> pm.Model:
    """Shorthand for ``Banana(d=data.shape[1], **kwargs).model(data)``."""
    return Banana(d=np.shape(data)[1], **kwargs).model(data)
