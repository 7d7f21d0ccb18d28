"""The seeds' evaluation models (theory §5, thesis Table 5.1) with exact posterior samplers.

The DP-HMC paper's comparison with the stochastic-gradient samplers (its §4) used two more: a
wider 2-d banana (``paper_banana``) and a 10-d Gaussian with a random covariance
(``gaussian_10d``).

Each :class:`Problem` simulates its data set, builds an ordinary PyMC model from it (one free
vector ``theta``) and draws exact samples from the (tempered) posterior where a closed form
exists. The circle has none: its posterior mean is the origin (by symmetry), which is what the
seeds compare against. Bayesian logistic regression (the SGHMC thesis' model) has none either;
its reference sample comes from PyMC's NUTS on the same data (non-private, evaluation only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pymc as pm
import pytensor.tensor as pt

from pymc_dp.testing import Banana

__all__ = ["PROBLEMS", "Problem", "get_problem", "paper_gaussian_covariance"]


@dataclass(frozen=True)
class Problem:
    """One evaluation model: data, PyMC model, exact posterior (theory §5).

    Attributes
    ----------
    name, title : str
        Registry key and a human-readable title.
    n : int
        Rows of data.
    n0 : float, optional
        Tempering ``T = n0 / n`` (``None``: ``T = 1``).
    d : int
        Dimension of ``theta``.
    """

    name: str
    title: str
    n: int
    d: int
    n0: float | None = None
    _simulate: Callable[[int, np.random.Generator], np.ndarray] = field(repr=False, default=None)
    _model: Callable[[np.ndarray], pm.Model] = field(repr=False, default=None)
    _exact: Callable[..., np.ndarray] | None = field(repr=False, default=None)
    exact_mean: np.ndarray | None = field(repr=False, default=None)

    @property
    def temperature(self) -> float:
        return 1.0 if self.n0 is None else self.n0 / self.n

    @property
    def tempered(self) -> bool:
        return self.n0 is not None

    def simulate(self, rng: np.random.Generator) -> np.ndarray:
        return self._simulate(self.n, rng)

    def model(self, data: np.ndarray) -> pm.Model:
        return self._model(data)

    @property
    def has_exact_sample(self) -> bool:
        return self._exact is not None

    def exact_sample(self, data: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
        """Exact draws ``(size, d)`` from the tempered posterior."""
        if self._exact is None:
            raise ValueError(f"{self.name} has no closed-form posterior sample.")
        return self._exact(data, size, rng, self.temperature)

    def resized(self, n: int) -> Problem:
        """The same model with ``n`` rows (``n0`` scaled in proportion): for quick runs."""
        n0 = None if self.n0 is None else self.n0 * n / self.n
        return replace(self, n=int(n), n0=n0)


def _banana(
    name: str,
    title: str,
    *,
    d: int,
    n: int,
    a: float,
    n0: float | None = None,
    lik_var: tuple[float, ...] | None = None,
):
    spec = Banana(d=d, a=a, lik_var=lik_var)
    return Problem(
        name,
        title,
        n=n,
        d=d,
        n0=n0,
        _simulate=lambda size, rng: spec.simulate(size, rng),
        _model=spec.model,
        _exact=spec.posterior_sample,
    )


# ---------------------------------------------------------------- correlated Gaussian

_CORR = np.array([[1.0, 0.999], [0.999, 1.0]])
_CORR_PRIOR_VAR = 100.0
_TRUE_THETA = np.array([0.0, 3.0])


def _corr_simulate(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.multivariate_normal(_TRUE_THETA, _CORR, size=n)


def _corr_model(data: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, np.sqrt(_CORR_PRIOR_VAR), shape=2)
        pm.MvNormal("x", mu=theta, cov=_CORR, observed=data)
    return model


def _corr_exact(data, size, rng, temperature):
    n = data.shape[0]
    lik_precision = np.linalg.inv(_CORR)
    precision = temperature * n * lik_precision + np.eye(2) / _CORR_PRIOR_VAR
    cov = np.linalg.inv(precision)
    mean = cov @ (temperature * n * lik_precision @ data.mean(0))
    return rng.multivariate_normal(mean, cov, size=size)


# ---------------------------------------------------------------- 10-d Gaussian (DP-HMC paper §4)

_G10_D = 10
_G10_PRIOR_SD = 100.0
_G10_SEED = 43235667  # the paper's key number; NumPy draws a different matrix than its JAX


def paper_gaussian_covariance() -> np.ndarray:
    """``Q diag(λ) Qᵀ``: λ_j ~ Gamma(1/2, 1), Q orthonormalised from a U(0, 1) matrix (paper §4).

    With this seed the eigenvalues run from 0.0047 to 2.69 (condition number 576).
    """
    rng = np.random.default_rng(_G10_SEED)
    eigenvalues = rng.gamma(0.5, 1.0, size=_G10_D)
    q, _ = np.linalg.qr(rng.uniform(size=(_G10_D, _G10_D)))
    return (q * eigenvalues) @ q.T


_G10_COV = paper_gaussian_covariance()
_G10_THETA = np.r_[0.0, 3.0, np.zeros(_G10_D - 2)]


def _g10_simulate(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.multivariate_normal(_G10_THETA, _G10_COV, size=n)


def _g10_model(data: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, _G10_PRIOR_SD, shape=_G10_D)
        pm.MvNormal("x", mu=theta, cov=_G10_COV, observed=data)
    return model


def _g10_exact(data, size, rng, temperature):
    n = data.shape[0]
    lik_precision = np.linalg.inv(_G10_COV)
    precision = temperature * n * lik_precision + np.eye(_G10_D) / _G10_PRIOR_SD**2
    cov = np.linalg.inv(precision)
    mean = cov @ (temperature * n * lik_precision @ data.mean(0))
    return rng.multivariate_normal(mean, cov, size=size)


# ---------------------------------------------------------------- circle

_CIRCLE_A = 1e-5


def _circle_simulate(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.normal(3.0, 1.0, size=n)


def _circle_logp(value, theta):
    radius2 = pt.sum(theta**2)
    return -_CIRCLE_A * (radius2 - value**2) ** 2


def _circle_model(data: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        theta = pm.Flat("theta", shape=2)
        pm.CustomDist("r", theta, logp=_circle_logp, observed=data)
    return model


# ---------------------------------------------------------------- logistic regression

_LOGISTIC_BETA = np.array([-0.3, 1.0, -0.5, 0.8])  # intercept first


def _logistic_simulate(n: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.normal(size=(n, _LOGISTIC_BETA.size - 1))
    logits = _LOGISTIC_BETA[0] + x @ _LOGISTIC_BETA[1:]
    y = rng.random(n) < 1.0 / (1.0 + np.exp(-logits))
    return np.column_stack([x, y.astype(float)])


def _logistic_model(data: np.ndarray) -> pm.Model:
    x, y = data[:, :-1], data[:, -1].astype("int64")
    with pm.Model() as model:
        covariates = pm.Data("covariates", x)
        theta = pm.Normal("theta", 0.0, 5.0, shape=x.shape[1] + 1)
        logits = theta[0] + pm.math.dot(covariates, theta[1:])
        pm.Bernoulli("y", logit_p=logits, observed=y)
    return model


PROBLEMS: dict[str, Problem] = {
    p.name: p
    for p in [
        _banana("gaussian", "Gaussian with known covariance (2-d)", d=2, n=100_000, a=0.0),
        _banana("flat_banana_2d", "Flat banana, d = 2", d=2, n=100_000, a=20.0),
        _banana("flat_banana_10d", "Flat banana, d = 10", d=10, n=200_000, a=20.0),
        _banana("tempered_banana_2d", "Tempered banana, d = 2", d=2, n=100_000, a=20.0, n0=1000),
        _banana("tempered_banana_10d", "Tempered banana, d = 10", d=10, n=200_000, a=20.0, n0=1000),
        _banana("gaussian_30d", "High-dimensional Gaussian, d = 30", d=30, n=200_000, a=0.0),
        _banana("narrow_banana", "Narrow banana", d=2, n=150_000, a=350.0),
        # DP-HMC paper §4: likelihood precisions 0.0005 and 0.0004, prior variance 1000
        _banana(
            "paper_banana",
            "Banana of the DP-HMC paper (σ₁² = 2000, σ₂² = 2500)",
            d=2,
            n=100_000,
            a=20.0,
            lik_var=(2000.0, 2500.0),
        ),
        Problem(
            "gaussian_10d",
            "10-d Gaussian, random covariance (DP-HMC paper)",
            n=100_000,
            d=_G10_D,
            _simulate=_g10_simulate,
            _model=_g10_model,
            _exact=_g10_exact,
        ),
        Problem(
            "correlated_gaussian",
            "Correlated Gaussian (ρ = 0.999)",
            n=200_000,
            d=2,
            _simulate=_corr_simulate,
            _model=_corr_model,
            _exact=_corr_exact,
        ),
        Problem(
            "circle",
            "Circle",
            n=100_000,
            d=2,
            _simulate=_circle_simulate,
            _model=_circle_model,
            exact_mean=np.zeros(2),
        ),
        Problem(
            "logistic_regression",
            "Bayesian logistic regression",
            n=100_000,
            d=4,
            _simulate=_logistic_simulate,
            _model=_logistic_model,
        ),
    ]
}


def get_problem(name: str) -> Problem:
    try:
        return PROBLEMS[name]
    except KeyError:
        raise ValueError(f"Unknown problem {name!r}; choose one of {sorted(PROBLEMS)}.") from None
