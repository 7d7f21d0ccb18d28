"""The validation zoo: everyday PyMC models, written as PyMC's own docs write them (issue 17).

What the zoo is for: checking that a DP step built with **default settings** and started from
**PyMC's default initial point** gives a usable posterior on the models people actually write,
next to a non-private reference posterior computed on the same simulated data. Each
:class:`ZooModel` simulates a data set of ``n`` rows from fixed true parameters, builds an
ordinary PyMC model from it (``pm.Data`` covariates, ``coords``/``dims``, the priors of PyMC's
example gallery, ``observed=`` the outcome) and knows the true parameters it simulated from.

:func:`reference` computes the non-private reference posterior, as a mean and a standard
deviation per scalar element of every free variable in the constrained space (``beta[0]``,
``sigma``, ...):

``"laplace"`` (the default, used at ``n ≥ 10⁵``)
    A Laplace approximation in the unconstrained space: the mode of the log-density *with* the
    transforms' Jacobians (L-BFGS, then Newton steps), the covariance ``(−H)⁻¹`` from the
    Hessian of the model's log-density there, and draws from that Gaussian mapped back through
    the model's transforms. At ``n ≥ 10⁵`` these posteriors are close to Gaussian in the
    unconstrained space, so the approximation is accurate to a small fraction of a posterior
    sd. The non-centred hierarchical model is the exception (its joint mode is far from its
    posterior mass): its reference is the Laplace approximation of the equivalent *centred*
    model, whose draws are mapped to ``z_a = (a − μ_a) / σ_a`` (:meth:`ZooModel.reference`).
``"nuts"``
    PyMC's NUTS (short, two chains): for small ``n``, where the posterior may be skewed.

:func:`summarize` compares a DP run with the reference: the largest ``|mean difference|`` in
reference sds, the range of sd ratios, and R̂ / bulk ESS (:func:`pymc_dp.check_convergence`).
``benchmarks/zoo.py`` runs a default-settings DP step on every model and writes the table.

Every computation here reads the data without noise: this is evaluation code, not a release.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pymc as pm
import pytensor
import scipy.linalg
import scipy.optimize
from pymc.blocking import DictToArrayBijection, RaveledVars

from pymc_dp._compat import group_dataset
from pymc_dp.convergence import check_convergence

__all__ = [
    "ZOO",
    "Moments",
    "Reference",
    "ZooModel",
    "flat_names",
    "get_model",
    "reference",
    "summarize",
    "unconstrained_dim",
]


@dataclass(frozen=True)
class ZooModel:
    """One zoo model: a simulator, a PyMC model builder and the parameters it simulates from.

    Attributes
    ----------
    name, title : str
        Registry key and a human-readable title.
    simulate : callable
        ``simulate(n, rng) -> dict`` of arrays: the data set (covariates and outcome ``y``).
    build : callable
        ``build(data) -> pm.Model``: the model as PyMC's docs write it.
    true_params : dict
        The constrained values the data were simulated from, for the parameters that have a
        fixed true value (a hierarchical model's group effects are themselves simulated).
    note : str
        Anything known about the model under pymc_dp (e.g. a refusal by the DP oracle);
        empty when every check passes.
    reference_build : callable, optional
        ``reference_build(data) -> pm.Model``: an equivalent model (the same posterior) in which
        the Laplace approximation holds, with the free variables of :attr:`build`'s model as
        free variables or deterministics. ``None``: the reference uses :attr:`build`.
    """

    name: str
    title: str
    simulate: Callable[[int, np.random.Generator], dict[str, np.ndarray]] = field(repr=False)
    build: Callable[[dict[str, np.ndarray]], pm.Model] = field(repr=False)
    true_params: dict[str, Any] = field(default_factory=dict, repr=False)
    note: str = ""
    reference_build: Callable[[dict[str, np.ndarray]], pm.Model] | None = field(
        default=None, repr=False
    )

    def model(self, n: int, seed: int = 0) -> tuple[dict[str, np.ndarray], pm.Model]:
        """Simulate ``n`` rows with ``np.random.default_rng(seed)`` and build the model."""
        data = self.simulate(int(n), np.random.default_rng(seed))
        return data, self.build(data)

    def reference(self, data: dict[str, np.ndarray], **kwargs: Any) -> Reference:
        """The non-private reference posterior of this model on ``data`` (:func:`reference`).

        Computed on :attr:`reference_build`'s equivalent model when there is one (same
        posterior, a parametrisation in which the Laplace approximation holds), reporting the
        free variables of :attr:`build`'s model.
        """
        names = [rv.name for rv in self.build(data).free_RVs]
        builder = self.build if self.reference_build is None else self.reference_build
        return reference(builder(data), var_names=names, **kwargs)


def _design(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``n × k`` standard-normal covariates (the gallery's simulated designs)."""
    return rng.normal(size=(n, k))


def _obs_coords(n: int, **extra: Any) -> dict[str, Any]:
    return {"obs_id": np.arange(n), **extra}


# ---------------------------------------------------------------- linear regression

_PREDICTORS = ["x1", "x2", "x3"]
_LINEAR = {"alpha": 1.0, "beta": np.array([1.5, -0.8, 0.4]), "sigma": 1.2}


def _linear_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    X = _design(n, 3, rng)
    p = _LINEAR
    y = p["alpha"] + X @ p["beta"] + p["sigma"] * rng.normal(size=n)
    return {"X": X, "y": y}


def _linear_build(data: dict[str, np.ndarray]) -> pm.Model:
    coords = _obs_coords(len(data["y"]), predictor=_PREDICTORS)
    with pm.Model(coords=coords) as model:
        X = pm.Data("X", data["X"], dims=("obs_id", "predictor"))
        alpha = pm.Normal("alpha", mu=0, sigma=10)
        beta = pm.Normal("beta", mu=0, sigma=10, dims="predictor")
        sigma = pm.HalfNormal("sigma", sigma=1)
        mu = alpha + pm.math.dot(X, beta)
        pm.Normal("y", mu=mu, sigma=sigma, observed=data["y"], dims="obs_id")
    return model


# ---------------------------------------------------------------- intercept and group offsets

_OFFSET_GROUPS = 5
_OFFSETS = np.array([0.3, -0.2, 0.5, 0.0, -0.4])
_GROUP_OFFSETS = {"a": 1.0, "b": _OFFSETS, "beta": 0.7, "sigma": 1.5}


def _offsets_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    p = _GROUP_OFFSETS
    group = rng.integers(0, _OFFSET_GROUPS, size=n)
    x = rng.normal(size=n)
    y = p["a"] + p["b"][group] + p["beta"] * x + p["sigma"] * rng.normal(size=n)
    return {"group": group.astype("int64"), "x": x, "y": y}


def _offsets_build(data: dict[str, np.ndarray]) -> pm.Model:
    """An intercept beside unconstrained group offsets: the rows inform only ``a + b_j``, and
    along ``(a + c, b − c)`` the posterior is the prior's (a straight ridge)."""
    coords = _obs_coords(len(data["y"]), group=np.arange(_OFFSET_GROUPS))
    with pm.Model(coords=coords) as model:
        group_idx = pm.Data("group_idx", data["group"], dims="obs_id")
        x = pm.Data("x", data["x"], dims="obs_id")
        a = pm.Normal("a", mu=0.0, sigma=10.0)
        b = pm.Normal("b", mu=0.0, sigma=1.0, dims="group")
        beta = pm.Normal("beta", mu=0.0, sigma=5.0)
        sigma = pm.HalfNormal("sigma", sigma=5.0)
        mu = a + b[group_idx] + beta * x
        pm.Normal("y", mu=mu, sigma=sigma, observed=data["y"], dims="obs_id")
    return model


# ---------------------------------------------------------------- robust regression

_ROBUST = {"intercept": 0.5, "slope": 2.0, "sigma": 0.5, "nu": 4.0}


def _robust_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    x = rng.normal(size=n)
    p = _ROBUST
    y = p["intercept"] + p["slope"] * x + p["sigma"] * rng.standard_t(p["nu"], size=n)
    return {"x": x, "y": y}


def _robust_build(data: dict[str, np.ndarray]) -> pm.Model:
    with pm.Model(coords=_obs_coords(len(data["y"]))) as model:
        x = pm.Data("x", data["x"], dims="obs_id")
        intercept = pm.Normal("intercept", mu=0, sigma=10)
        slope = pm.Normal("slope", mu=0, sigma=10)
        sigma = pm.HalfNormal("sigma", sigma=1)
        nu = pm.Gamma("nu", alpha=2, beta=0.1)  # the Juárez–Steel prior of PyMC's examples
        mu = intercept + slope * x
        pm.StudentT("y", nu=nu, mu=mu, sigma=sigma, observed=data["y"], dims="obs_id")
    return model


# ---------------------------------------------------------------- logistic regression

_LOGISTIC = {"alpha": -0.5, "beta": np.array([1.0, -0.7, 0.3])}


def _logistic_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    X = _design(n, 3, rng)
    logits = _LOGISTIC["alpha"] + X @ _LOGISTIC["beta"]
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-logits))).astype("int64")
    return {"X": X, "y": y}


def _logistic_build(data: dict[str, np.ndarray]) -> pm.Model:
    coords = _obs_coords(len(data["y"]), predictor=_PREDICTORS)
    with pm.Model(coords=coords) as model:
        X = pm.Data("X", data["X"], dims=("obs_id", "predictor"))
        alpha = pm.Normal("alpha", mu=0, sigma=10)
        beta = pm.Normal("beta", mu=0, sigma=10, dims="predictor")
        logit_p = alpha + pm.math.dot(X, beta)
        pm.Bernoulli("y", logit_p=logit_p, observed=data["y"], dims="obs_id")
    return model


# ---------------------------------------------------------------- Poisson regression

_POISSON = {"alpha": 0.8, "beta": np.array([0.3, -0.2, 0.1])}


def _poisson_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    X = _design(n, 3, rng)
    y = rng.poisson(np.exp(_POISSON["alpha"] + X @ _POISSON["beta"]))
    return {"X": X, "y": y.astype("int64")}


def _poisson_build(data: dict[str, np.ndarray]) -> pm.Model:
    coords = _obs_coords(len(data["y"]), predictor=_PREDICTORS)
    with pm.Model(coords=coords) as model:
        X = pm.Data("X", data["X"], dims=("obs_id", "predictor"))
        alpha = pm.Normal("alpha", mu=0, sigma=10)
        beta = pm.Normal("beta", mu=0, sigma=1, dims="predictor")
        mu = pm.math.exp(alpha + pm.math.dot(X, beta))
        pm.Poisson("y", mu=mu, observed=data["y"], dims="obs_id")
    return model


# ---------------------------------------------------------------- overdispersed counts as Poisson

#: Counts with extra-Poisson variance (negative binomial, shape 0.7: variance ``μ + μ²/0.7``)
#: fitted with the zoo's Poisson regression, as a user does who does not check the dispersion.
#: The Poisson maximum likelihood estimate is still consistent for the mean's parameters, so
#: these are the values the posterior concentrates on; the likelihood is misspecified: the
#: rows' gradient variance (the Fisher information of the releases) is about 3.7–6.8 times the
#: log likelihood's curvature (the posterior's information) at n = 10⁵, which the centring
#: reads too (docs/theory.md §7). The rows' gradients have a heavy tail (the largest 51 times
#: their root mean square), and the centre's clip leaves some above it (docs/accuracy.md).
_POISSON_OVERDISPERSED = {"alpha": 0.8, "beta": np.array([0.3, -0.2, 0.1]), "shape": 0.7}


def _poisson_overdispersed_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    X = _design(n, 3, rng)
    mu = np.exp(_POISSON_OVERDISPERSED["alpha"] + X @ _POISSON_OVERDISPERSED["beta"])
    shape = _POISSON_OVERDISPERSED["shape"]  # a Gamma(shape, mu/shape)-Poisson mixture
    y = rng.poisson(rng.gamma(shape, mu / shape))
    return {"X": X, "y": y.astype("int64")}


# ---------------------------------------------------------------- negative binomial regression

_NEGBIN = {"alpha_0": 1.0, "beta": np.array([0.4, -0.3, 0.2]), "alpha": 2.0}


def _negbin_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    X = _design(n, 3, rng)
    mu = np.exp(_NEGBIN["alpha_0"] + X @ _NEGBIN["beta"])
    shape = _NEGBIN["alpha"]  # NB(mu, alpha): Gamma(alpha, mu/alpha)-Poisson mixture
    y = rng.poisson(rng.gamma(shape, mu / shape))
    return {"X": X, "y": y.astype("int64")}


def _negbin_build(data: dict[str, np.ndarray]) -> pm.Model:
    coords = _obs_coords(len(data["y"]), predictor=_PREDICTORS)
    with pm.Model(coords=coords) as model:
        X = pm.Data("X", data["X"], dims=("obs_id", "predictor"))
        intercept = pm.Normal("alpha_0", mu=0, sigma=10)
        beta = pm.Normal("beta", mu=0, sigma=1, dims="predictor")
        alpha = pm.Exponential("alpha", 0.5)  # PyMC's GLM-negative-binomial example
        mu = pm.math.exp(intercept + pm.math.dot(X, beta))
        pm.NegativeBinomial("y", mu=mu, alpha=alpha, observed=data["y"], dims="obs_id")
    return model


# ---------------------------------------------------------------- hierarchical (radon-style)

_GROUPS = 50
_HIER = {"mu_a": 1.5, "sigma_a": 0.7, "b": -0.6, "sigma": 0.8}


def _hier_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    p = _HIER
    a = p["mu_a"] + p["sigma_a"] * rng.normal(size=_GROUPS)  # the group intercepts
    group = rng.integers(0, _GROUPS, size=n)
    x = rng.normal(size=n)
    y = a[group] + p["b"] * x + p["sigma"] * rng.normal(size=n)
    return {"group": group.astype("int64"), "x": x, "y": y}


def _hier_build(data: dict[str, np.ndarray]) -> pm.Model:
    coords = _obs_coords(len(data["y"]), group=np.arange(_GROUPS))
    with pm.Model(coords=coords) as model:
        group_idx = pm.Data("group_idx", data["group"], dims="obs_id")
        x = pm.Data("x", data["x"], dims="obs_id")
        mu_a = pm.Normal("mu_a", mu=0.0, sigma=10)
        sigma_a = pm.HalfNormal("sigma_a", sigma=1)
        z_a = pm.Normal("z_a", mu=0, sigma=1, dims="group")
        a = pm.Deterministic("a", mu_a + z_a * sigma_a, dims="group")  # non-centred
        b = pm.Normal("b", mu=0.0, sigma=10.0)
        sigma = pm.HalfNormal("sigma", sigma=1)
        mu = a[group_idx] + b * x
        pm.Normal("y", mu=mu, sigma=sigma, observed=data["y"], dims="obs_id")
    return model


def _hier_centred_build(data: dict[str, np.ndarray]) -> pm.Model:
    """The centred varying-intercept model, as the radon notebook writes it first."""
    coords = _obs_coords(len(data["y"]), group=np.arange(_GROUPS))
    with pm.Model(coords=coords) as model:
        group_idx = pm.Data("group_idx", data["group"], dims="obs_id")
        x = pm.Data("x", data["x"], dims="obs_id")
        mu_a = pm.Normal("mu_a", mu=0.0, sigma=10)
        sigma_a = pm.HalfNormal("sigma_a", sigma=1)
        a = pm.Normal("a", mu=mu_a, sigma=sigma_a, dims="group")
        b = pm.Normal("b", mu=0.0, sigma=10.0)
        sigma = pm.HalfNormal("sigma", sigma=1)
        pm.Normal("y", mu=a[group_idx] + b * x, sigma=sigma, observed=data["y"], dims="obs_id")
    return model


def _hier_centred(data: dict[str, np.ndarray]) -> pm.Model:
    """The non-centred model's posterior, centred: ``a`` free, ``z_a`` a deterministic
    (reference only)."""
    model = _hier_centred_build(data)
    with model:
        pm.Deterministic("z_a", (model["a"] - model["mu_a"]) / model["sigma_a"], dims="group")
    return model


# ------------------------------------------------- radon notebook: 85 unequal counties

_COUNTIES = 85
_RADON = {"mu_a": 1.3, "sigma_a": 0.35, "beta": -0.66, "sigma_y": 0.75}


def _radon_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    p = _RADON
    weights = rng.dirichlet(np.full(_COUNTIES, 2.0))  # counties of unequal sizes
    alpha = p["mu_a"] + p["sigma_a"] * rng.normal(size=_COUNTIES)
    county = rng.choice(_COUNTIES, size=n, p=weights)
    floor = rng.integers(0, 2, size=n).astype(float)
    y = alpha[county] + p["beta"] * floor + p["sigma_y"] * rng.normal(size=n)
    return {"county": county.astype("int64"), "floor": floor, "y": y}


def _radon_build(data: dict[str, np.ndarray]) -> pm.Model:
    """Varying intercepts as PyMC's radon notebook writes them (centred, Exponential scales)."""
    coords = _obs_coords(len(data["y"]), county=np.arange(_COUNTIES))
    with pm.Model(coords=coords) as model:
        floor_idx = pm.Data("floor_idx", data["floor"], dims="obs_id")
        county_idx = pm.Data("county_idx", data["county"], dims="obs_id")
        mu_a = pm.Normal("mu_a", mu=0.0, sigma=10.0)
        sigma_a = pm.Exponential("sigma_a", 1.0)
        alpha = pm.Normal("alpha", mu=mu_a, sigma=sigma_a, dims="county")
        beta = pm.Normal("beta", mu=0.0, sigma=10.0)
        sigma_y = pm.Exponential("sigma_y", 1.0)
        theta = alpha[county_idx] + beta * floor_idx
        pm.Normal("y", theta, sigma=sigma_y, observed=data["y"], dims="obs_id")
    return model


# ---------------------------------------------------------------- ordinal regression

_ORDINAL = {"beta": np.array([0.8, -0.5]), "cutpoints": np.array([-1.5, 0.0, 1.2])}


def _ordinal_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    X = _design(n, 2, rng)
    latent = X @ _ORDINAL["beta"] + rng.logistic(size=n)
    y = (latent[:, None] > _ORDINAL["cutpoints"][None, :]).sum(axis=1)
    return {"X": X, "y": y.astype("int64")}


def _ordinal_model(data: dict[str, np.ndarray], **likelihood: Any) -> pm.Model:
    coords = _obs_coords(len(data["y"]), predictor=_PREDICTORS[:2], cut=np.arange(3))
    with pm.Model(coords=coords) as model:
        X = pm.Data("X", data["X"], dims=("obs_id", "predictor"))
        beta = pm.Normal("beta", mu=0, sigma=5, dims="predictor")
        cutpoints = pm.Normal(
            "cutpoints",
            mu=[-1, 0, 1],
            sigma=2,
            transform=pm.distributions.transforms.ordered,
            dims="cut",
        )
        eta = pm.math.dot(X, beta)
        pm.OrderedLogistic(
            "y", eta=eta, cutpoints=cutpoints, observed=data["y"], dims="obs_id", **likelihood
        )
    return model


def _ordinal_build(data: dict[str, np.ndarray]) -> pm.Model:
    """As PyMC's docs write it (``compute_p`` left at its default, ``True``)."""
    return _ordinal_model(data)


def _ordinal_no_p_build(data: dict[str, np.ndarray]) -> pm.Model:
    """The same model without the per-row ``y_probs`` deterministic (what pymc_dp asks for)."""
    return _ordinal_model(data, compute_p=False)


_ORDINAL_NOTE = (
    "Refused by pymc_dp as PyMC's docs write it: pm.OrderedLogistic adds the per-row "
    "deterministic 'y_probs' (compute_p=True by default), which pm.sample would store at every "
    "draw without noise (PrivacyLeakError when the step is built). 'ordinal_no_p' is the same "
    "model with compute_p=False, as the error message advises."
)


# ---------------------------------------------------------------- Gaussian mixture

_MIXTURE = {
    "w": np.array([0.35, 0.65]),
    "mu": np.array([-1.5, 2.0]),
    "sigma": np.array([1.0, 0.8]),
}


def _mixture_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    p = _MIXTURE
    k = (rng.random(n) > p["w"][0]).astype(int)
    y = p["mu"][k] + p["sigma"][k] * rng.normal(size=n)
    return {"y": y}


def _mixture_build(data: dict[str, np.ndarray]) -> pm.Model:
    coords = _obs_coords(len(data["y"]), component=np.arange(2))
    with pm.Model(coords=coords) as model:
        w = pm.Dirichlet("w", a=np.ones(2), dims="component")
        mu = pm.Normal(
            "mu",
            mu=0,
            sigma=10,
            transform=pm.distributions.transforms.ordered,  # no label switching
            initval=[-1.0, 1.0],
            dims="component",
        )
        sigma = pm.HalfNormal("sigma", sigma=2, dims="component")
        pm.NormalMixture("y", w=w, mu=mu, sigma=sigma, observed=data["y"], dims="obs_id")
    return model


# ---------------------------------------------------------------- more GLMs and likelihoods
# Written as PyMC's docs write them, with two standard-normal covariates (or one), beside the
# zoo's own: aggregated binomial counts, a Gamma GLM, a right-censored Weibull survival model,
# a Beta regression, a multinomial logit, a zero-inflated Poisson and a log-normal regression.

_BINOMIAL = {"alpha": -0.5, "beta": np.array([0.8, -0.4])}


def _binomial_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    X = _design(n, 2, rng)
    trials = rng.integers(1, 21, size=n)
    p = 1.0 / (1.0 + np.exp(-(_BINOMIAL["alpha"] + X @ _BINOMIAL["beta"])))
    return {"X": X, "trials": trials.astype("int64"), "y": rng.binomial(trials, p)}


def _binomial_build(data: dict[str, np.ndarray]) -> pm.Model:
    coords = _obs_coords(len(data["y"]), predictor=_PREDICTORS[:2])
    with pm.Model(coords=coords) as model:
        X = pm.Data("X", data["X"], dims=("obs_id", "predictor"))
        trials = pm.Data("trials", data["trials"], dims="obs_id")
        alpha = pm.Normal("alpha", mu=0, sigma=2.5)
        beta = pm.Normal("beta", mu=0, sigma=2.5, dims="predictor")
        logit_p = alpha + pm.math.dot(X, beta)
        pm.Binomial("y", n=trials, logit_p=logit_p, observed=data["y"], dims="obs_id")
    return model


_GAMMA = {"intercept": 0.5, "slope": 0.3, "shape": 3.0}


def _gamma_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    x = rng.normal(size=n)
    mu = np.exp(_GAMMA["intercept"] + _GAMMA["slope"] * x)
    return {"x": x, "y": rng.gamma(_GAMMA["shape"], mu / _GAMMA["shape"])}


def _gamma_build(data: dict[str, np.ndarray]) -> pm.Model:
    with pm.Model(coords=_obs_coords(len(data["y"]))) as model:
        x = pm.Data("x", data["x"], dims="obs_id")
        intercept = pm.Normal("intercept", mu=0, sigma=1)
        slope = pm.Normal("slope", mu=0, sigma=1)
        shape = pm.HalfNormal("shape", sigma=5)
        mu = pm.math.exp(intercept + slope * x)
        pm.Gamma("y", alpha=shape, beta=shape / mu, observed=data["y"], dims="obs_id")
    return model


_WEIBULL = {"intercept": 1.0, "slope": 0.4, "k": 1.5}
_CENSOR_AT = 5.0


def _weibull_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    x = rng.normal(size=n)
    scale = np.exp(_WEIBULL["intercept"] + _WEIBULL["slope"] * x)
    t = scale * rng.weibull(_WEIBULL["k"], size=n)
    return {"x": x, "y": np.minimum(t, _CENSOR_AT)}


def _weibull_build(data: dict[str, np.ndarray]) -> pm.Model:
    """Survival times right-censored at a public end of follow-up (PyMC's censored survival
    examples write it with ``pm.Censored``)."""
    with pm.Model(coords=_obs_coords(len(data["y"]))) as model:
        x = pm.Data("x", data["x"], dims="obs_id")
        intercept = pm.Normal("intercept", mu=0, sigma=2)
        slope = pm.Normal("slope", mu=0, sigma=2)
        k = pm.Gamma("k", alpha=2, beta=1)
        latent = pm.Weibull.dist(alpha=k, beta=pm.math.exp(intercept + slope * x))
        pm.Censored("y", latent, lower=None, upper=_CENSOR_AT, observed=data["y"], dims="obs_id")
    return model


_BETA = {"intercept": 0.2, "slope": 0.6, "kappa": 8.0}


def _beta_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    x = rng.normal(size=n)
    mu = 1.0 / (1.0 + np.exp(-(_BETA["intercept"] + _BETA["slope"] * x)))
    y = rng.beta(mu * _BETA["kappa"], (1 - mu) * _BETA["kappa"])
    return {"x": x, "y": np.clip(y, 1e-6, 1 - 1e-6)}


def _beta_build(data: dict[str, np.ndarray]) -> pm.Model:
    with pm.Model(coords=_obs_coords(len(data["y"]))) as model:
        x = pm.Data("x", data["x"], dims="obs_id")
        intercept = pm.Normal("intercept", mu=0, sigma=1.5)
        slope = pm.Normal("slope", mu=0, sigma=1.5)
        kappa = pm.Exponential("kappa", 0.1)
        mu = pm.math.invlogit(intercept + slope * x)
        pm.Beta("y", mu=mu, nu=kappa, observed=data["y"], dims="obs_id")
    return model


_CATEGORIES = ["a", "b", "c"]
_CATEGORICAL = {
    "alpha": np.array([0.3, -0.2]),
    "beta": np.array([[0.5, -0.3], [-0.4, 0.8]]),  # predictor × (category b, c)
}


def _categorical_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    X = _design(n, 2, rng)
    eta = np.column_stack([np.zeros(n), _CATEGORICAL["alpha"] + X @ _CATEGORICAL["beta"]])
    p = np.exp(eta - eta.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    y = (rng.random(n)[:, None] > p.cumsum(axis=1)).sum(axis=1)
    return {"X": X, "y": np.minimum(y, len(_CATEGORIES) - 1).astype("int64")}


def _categorical_build(data: dict[str, np.ndarray]) -> pm.Model:
    """A multinomial logit, the first category the reference (its coefficients fixed at 0)."""
    coords = _obs_coords(len(data["y"]), predictor=_PREDICTORS[:2], category=_CATEGORIES[1:])
    with pm.Model(coords=coords) as model:
        X = pm.Data("X", data["X"], dims=("obs_id", "predictor"))
        alpha = pm.Normal("alpha", mu=0, sigma=2, dims="category")
        beta = pm.Normal("beta", mu=0, sigma=2, dims=("predictor", "category"))
        eta = alpha + pm.math.dot(X, beta)
        logit_p = pm.math.concatenate([pm.math.zeros((X.shape[0], 1)), eta], axis=1)
        pm.Categorical("y", logit_p=logit_p, observed=data["y"], dims="obs_id")
    return model


_ZIP = {"intercept": 0.8, "slope": 0.5, "psi": 0.7}


def _zip_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    x = rng.normal(size=n)
    counts = rng.poisson(np.exp(_ZIP["intercept"] + _ZIP["slope"] * x))
    structural_zero = rng.random(n) >= _ZIP["psi"]  # psi: the probability of the Poisson part
    return {"x": x, "y": np.where(structural_zero, 0, counts).astype("int64")}


def _zip_build(data: dict[str, np.ndarray]) -> pm.Model:
    with pm.Model(coords=_obs_coords(len(data["y"]))) as model:
        x = pm.Data("x", data["x"], dims="obs_id")
        intercept = pm.Normal("intercept", mu=0, sigma=2)
        slope = pm.Normal("slope", mu=0, sigma=2)
        psi = pm.Beta("psi", alpha=1, beta=1)
        mu = pm.math.exp(intercept + slope * x)
        pm.ZeroInflatedPoisson("y", psi=psi, mu=mu, observed=data["y"], dims="obs_id")
    return model


_LOGNORMAL = {"alpha": 1.0, "beta": np.array([0.2, -0.1, 0.3]), "sigma": 0.7}


def _lognormal_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    X = _design(n, 3, rng)
    log_y = _LOGNORMAL["alpha"] + X @ _LOGNORMAL["beta"] + _LOGNORMAL["sigma"] * rng.normal(size=n)
    return {"X": X, "y": np.exp(log_y)}


def _lognormal_build(data: dict[str, np.ndarray]) -> pm.Model:
    coords = _obs_coords(len(data["y"]), predictor=_PREDICTORS)
    with pm.Model(coords=coords) as model:
        X = pm.Data("X", data["X"], dims=("obs_id", "predictor"))
        alpha = pm.Normal("alpha", mu=0, sigma=5)
        beta = pm.Normal("beta", mu=0, sigma=1, dims="predictor")
        sigma = pm.HalfCauchy("sigma", beta=2)
        mu = alpha + pm.math.dot(X, beta)
        pm.LogNormal("y", mu=mu, sigma=sigma, observed=data["y"], dims="obs_id")
    return model


# ---------------------------------------------------------------- median regression

_MEDIAN = {"alpha": 1.0, "beta": np.array([1.5, -0.8, 0.4])}


def _median_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    X = _design(n, 3, rng)
    noise = rng.standard_t(3, size=n)  # heavy tails, median 0
    return {"X": X, "y": _MEDIAN["alpha"] + X @ _MEDIAN["beta"] + noise}


def _median_build(data: dict[str, np.ndarray]) -> pm.Model:
    """Quantile regression at q = 0.5 (a likelihood with a kink at each row's median)."""
    coords = _obs_coords(len(data["y"]), predictor=_PREDICTORS)
    with pm.Model(coords=coords) as model:
        X = pm.Data("X", data["X"], dims=("obs_id", "predictor"))
        alpha = pm.Normal("alpha", mu=0, sigma=10)
        beta = pm.Normal("beta", mu=0, sigma=10, dims="predictor")
        b = pm.HalfNormal("b", sigma=5)
        mu = alpha + pm.math.dot(X, beta)
        pm.AsymmetricLaplace("y", mu=mu, b=b, kappa=1.0, observed=data["y"], dims="obs_id")
    return model


# ---------------------------------------------------------------- spline regression

_KNOTS = np.array([2.0, 4.0, 6.0, 8.0])
_SPLINE = {"w": np.array([0.5, 0.8, -1.6, 1.5, -1.2, 0.6]), "sigma": 0.3}


def _spline_basis(x: np.ndarray) -> np.ndarray:
    """A linear spline's truncated power basis ``[1, x, (x − k)₊ …]``: strongly collinear."""
    return np.column_stack([np.ones_like(x), x] + [np.clip(x - k, 0.0, None) for k in _KNOTS])


def _spline_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    x = rng.uniform(0.0, 10.0, size=n)
    y = _spline_basis(x) @ _SPLINE["w"] + _SPLINE["sigma"] * rng.normal(size=n)
    return {"B": _spline_basis(x), "y": y}


def _spline_build(data: dict[str, np.ndarray]) -> pm.Model:
    coords = _obs_coords(len(data["y"]), basis=np.arange(data["B"].shape[1]))
    with pm.Model(coords=coords) as model:
        B = pm.Data("B", data["B"], dims=("obs_id", "basis"))
        w = pm.Normal("w", mu=0, sigma=5, dims="basis")
        sigma = pm.HalfNormal("sigma", sigma=1)
        pm.Normal("y", mu=pm.math.dot(B, w), sigma=sigma, observed=data["y"], dims="obs_id")
    return model


# ---------------------------------------------------------------- correlated outcomes (LKJ)

_MV = {
    "mu": np.array([0.0, 1.0, -1.0]),
    "cov": np.array([[1.0, 0.5, 0.2], [0.5, 2.0, 0.3], [0.2, 0.3, 1.5]]),
}


def _mv_simulate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"y": rng.multivariate_normal(_MV["mu"], _MV["cov"], size=n)}


def _mv_build(data: dict[str, np.ndarray]) -> pm.Model:
    """Three correlated outcomes per row, LKJ prior on their correlation (PyMC's LKJ example)."""
    coords = _obs_coords(len(data["y"]), outcome=["a", "b", "c"])
    with pm.Model(coords=coords) as model:
        chol, _, _ = pm.LKJCholeskyCov(
            "chol", n=3, eta=2.0, sd_dist=pm.Exponential.dist(1.0, shape=3), compute_corr=True
        )
        mu = pm.Normal("mu", mu=0, sigma=5, dims="outcome")
        pm.MvNormal("y", mu=mu, chol=chol, observed=data["y"], dims=("obs_id", "outcome"))
    return model


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in [
        ZooModel(
            "linear",
            "Linear regression (Normal, 3 covariates)",
            _linear_simulate,
            _linear_build,
            _LINEAR,
        ),
        ZooModel(
            "robust",
            "Robust regression (StudentT, ν ~ Gamma(2, 0.1))",
            _robust_simulate,
            _robust_build,
            _ROBUST,
        ),
        ZooModel(
            "logistic",
            "Logistic regression (Bernoulli logit, 3 covariates)",
            _logistic_simulate,
            _logistic_build,
            _LOGISTIC,
        ),
        ZooModel(
            "poisson",
            "Poisson regression (log link, 3 covariates)",
            _poisson_simulate,
            _poisson_build,
            _POISSON,
        ),
        ZooModel(
            "poisson_overdispersed",
            "Poisson regression on overdispersed counts (a misspecified likelihood)",
            _poisson_overdispersed_simulate,
            _poisson_build,
            {k: v for k, v in _POISSON_OVERDISPERSED.items() if k != "shape"},
        ),
        ZooModel(
            "negbin",
            "Negative binomial regression (log link, α ~ Exponential)",
            _negbin_simulate,
            _negbin_build,
            _NEGBIN,
        ),
        ZooModel(
            "group_offsets",
            f"Intercept and free group offsets ({_OFFSET_GROUPS} groups; a prior-only ridge)",
            _offsets_simulate,
            _offsets_build,
            _GROUP_OFFSETS,
        ),
        ZooModel(
            "hierarchical",
            f"Varying intercepts, non-centred ({_GROUPS} groups, radon-style)",
            _hier_simulate,
            _hier_build,
            _HIER,
            reference_build=_hier_centred,
        ),
        ZooModel(
            "hierarchical_centred",
            f"Varying intercepts, centred ({_GROUPS} groups, radon-style)",
            _hier_simulate,
            _hier_centred_build,
            _HIER,
        ),
        ZooModel(
            "radon_counties",
            f"Varying intercepts, centred ({_COUNTIES} counties of unequal sizes, a floor effect;"
            " the radon notebook's model)",
            _radon_simulate,
            _radon_build,
            _RADON,
        ),
        ZooModel(
            "ordinal",
            "Ordinal regression (OrderedLogistic, ordered cutpoints)",
            _ordinal_simulate,
            _ordinal_build,
            _ORDINAL,
            note=_ORDINAL_NOTE,
        ),
        ZooModel(
            "ordinal_no_p",
            "Ordinal regression as above, OrderedLogistic(compute_p=False)",
            _ordinal_simulate,
            _ordinal_no_p_build,
            _ORDINAL,
        ),
        ZooModel(
            "mixture",
            "Two-component Gaussian mixture (NormalMixture, ordered means)",
            _mixture_simulate,
            _mixture_build,
            _MIXTURE,
        ),
        ZooModel(
            "binomial",
            "Binomial regression (aggregated counts of 1-20 trials, logit link)",
            _binomial_simulate,
            _binomial_build,
            _BINOMIAL,
        ),
        ZooModel(
            "gamma",
            "Gamma regression (log link, shape ~ HalfNormal)",
            _gamma_simulate,
            _gamma_build,
            _GAMMA,
        ),
        ZooModel(
            "weibull_censored",
            "Weibull survival, right-censored (pm.Censored, log link)",
            _weibull_simulate,
            _weibull_build,
            _WEIBULL,
        ),
        ZooModel(
            "beta",
            "Beta regression (mean-precision, logit link)",
            _beta_simulate,
            _beta_build,
            _BETA,
        ),
        ZooModel(
            "categorical",
            "Multinomial logit (Categorical, 3 categories)",
            _categorical_simulate,
            _categorical_build,
            _CATEGORICAL,
        ),
        ZooModel(
            "zero_inflated_poisson",
            "Zero-inflated Poisson regression (log link)",
            _zip_simulate,
            _zip_build,
            _ZIP,
        ),
        ZooModel(
            "lognormal",
            "Log-normal regression (HalfCauchy scale)",
            _lognormal_simulate,
            _lognormal_build,
            _LOGNORMAL,
        ),
        ZooModel(
            "median_regression",
            "Median regression (AsymmetricLaplace, Student-t errors; a kink per row)",
            _median_simulate,
            _median_build,
            _MEDIAN,
        ),
        ZooModel(
            "spline",
            "Linear spline regression (truncated power basis, 4 knots; collinear columns)",
            _spline_simulate,
            _spline_build,
            _SPLINE,
        ),
        ZooModel(
            "mv_normal_lkj",
            "Correlated outcomes (MvNormal, LKJCholeskyCov, 3 outcomes per row)",
            _mv_simulate,
            _mv_build,
            {"mu": _MV["mu"]},
        ),
    ]
}


def get_model(name: str) -> ZooModel:
    """The zoo model called ``name`` (a clear error listing the names otherwise)."""
    try:
        return ZOO[name]
    except KeyError:
        raise KeyError(f"No zoo model {name!r}; choose one of {sorted(ZOO)}.") from None


# ---------------------------------------------------------------- reference posterior


class Moments(NamedTuple):
    """Reference posterior mean and standard deviation of one scalar element."""

    mean: float
    sd: float


class Reference(dict):
    """:func:`reference`'s result: ``{"beta[0]": Moments(mean, sd), ...}`` plus how it was made.

    Attributes
    ----------
    method : str
        ``"laplace"``, ``"laplace+is"`` (importance-corrected) or ``"nuts"``.
    ess : float
        Effective sample size of the reference draws: Kish's ``(Σw)²/Σw²`` of the importance
        weights for ``"laplace+is"``, the number of draws otherwise (NUTS: not estimated).
    """

    method: str = ""
    ess: float = float("nan")


def flat_names(name: str, shape: tuple[int, ...]) -> list[str]:
    """ArviZ-style names of the scalar elements of a variable: ``beta[0]``, ``L[1, 0]``."""
    if not shape:
        return [name]
    return [f"{name}[{', '.join(map(str, idx))}]" for idx in np.ndindex(*shape)]


def unconstrained_dim(model: pm.Model) -> int:
    """Number of unconstrained parameters ``d`` (the size of all value variables together)."""
    point = model.initial_point()
    return int(sum(np.size(point[v.name]) for v in model.value_vars))


def _constrained_fn(model: pm.Model, names: Sequence[str]) -> Callable[..., list[np.ndarray]]:
    """Compiled map from the value variables to the named free variables or deterministics."""
    outputs = model.replace_rvs_by_values([model[name] for name in names])
    return pytensor.function(model.value_vars, outputs, on_unused_input="ignore")


def _moments(
    names: list[str], draws: list[np.ndarray], weights: np.ndarray | None = None
) -> dict[str, Moments]:
    """Per-element (weighted) mean and sd of ``draws[k]`` (``(samples, *shape)``)."""
    out: dict[str, Moments] = {}
    for name, values in zip(names, draws, strict=True):
        values = np.asarray(values, dtype=float)
        flat = values.reshape(values.shape[0], -1)
        if weights is None:
            mean, sd = flat.mean(0), flat.std(0, ddof=1)
        else:
            mean = weights @ flat
            sd = np.sqrt(weights @ (flat - mean) ** 2 / (1.0 - np.sum(weights**2)))
        for j, label in enumerate(flat_names(name, values.shape[1:])):
            out[label] = Moments(float(mean[j]), float(sd[j]))
    return out


def _fd_hessian(grad: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
    """``∇ grad`` at ``x`` by central differences of the exact gradient, symmetrised."""
    steps = 1e-4 * np.maximum(1.0, np.abs(x))
    columns = []
    for j, h in enumerate(steps):
        e = np.zeros_like(x)
        e[j] = h
        columns.append((grad(x + e) - grad(x - e)) / (2 * h))
    jac = np.column_stack(columns)
    return (jac + jac.T) / 2


@dataclass(frozen=True)
class _Laplace:
    mode: RaveledVars  # unconstrained mode (Jacobians included)
    precision: np.ndarray  # −H at the mode
    logp: Callable[[np.ndarray], float]  # unconstrained log-density of a flat vector


def _laplace(model: pm.Model, newton_steps: int, hessian: str) -> _Laplace:
    """Mode of the unconstrained log-density (Jacobians included) and ``−H`` there."""
    value_vars = model.value_vars
    start = model.initial_point()
    x = DictToArrayBijection.map({v.name: np.asarray(start[v.name]) for v in value_vars})
    info = x.point_map_info

    def point(vec: np.ndarray) -> dict[str, np.ndarray]:
        return DictToArrayBijection.rmap(RaveledVars(vec, info))

    logp_fn = model.compile_logp(jacobian=True)
    # PyMC takes the random variables and differentiates along their value variables, in order
    dlogp_fn = model.compile_dlogp(vars=model.free_RVs, jacobian=True)

    def logp(vec: np.ndarray) -> float:
        return float(logp_fn(point(vec)))

    def dlogp(vec: np.ndarray) -> np.ndarray:
        return np.asarray(dlogp_fn(point(vec)), dtype=float)

    if hessian == "exact":
        d2logp_fn = model.compile_d2logp(vars=model.free_RVs, jacobian=True, negate_output=False)

        def neg_hess(vec: np.ndarray) -> np.ndarray:
            return -np.asarray(d2logp_fn(point(vec)), dtype=float)

    elif hessian == "fd":

        def neg_hess(vec: np.ndarray) -> np.ndarray:
            return -_fd_hessian(dlogp, vec)

    else:
        raise ValueError(f"hessian must be 'fd' or 'exact', got {hessian!r}.")

    def objective(vec: np.ndarray) -> tuple[float, np.ndarray]:
        return -logp(vec), -dlogp(vec)

    result = scipy.optimize.minimize(
        objective,
        x.data,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": 10_000, "ftol": 1e-15, "gtol": 1e-8},
    )
    vec, current = result.x, -result.fun
    for _ in range(newton_steps):  # polish with damped Newton steps
        grad = dlogp(vec)
        try:
            move = scipy.linalg.solve(neg_hess(vec), grad, assume_a="pos")
        except (np.linalg.LinAlgError, ValueError):
            break
        for _ in range(30):
            value = logp(vec + move)
            if np.isfinite(value) and value >= current - 1e-9 * max(1.0, abs(current)):
                break
            move = move / 2
        else:
            break
        vec, current = vec + move, max(value, current)
        if float(grad @ move) < 1e-10:  # Newton decrement: at the mode
            break
    return _Laplace(RaveledVars(vec, info), neg_hess(vec), logp)


def _truncated_weights(log_weights: np.ndarray) -> np.ndarray:
    """Self-normalised importance weights, truncated at ``√N`` times their mean (Ionides 2008)."""
    w = np.exp(log_weights - np.max(log_weights))
    w = np.where(np.isfinite(w), w, 0.0)
    w = np.minimum(w, np.mean(w) * np.sqrt(w.size))
    return w / np.sum(w)


def reference(
    model: pm.Model,
    *,
    var_names: Sequence[str] | None = None,
    method: str = "laplace",
    draws: int = 4000,
    importance: bool = True,
    random_seed: int = 0,
    newton_steps: int = 20,
    hessian: str = "fd",
    nuts_kwargs: Mapping[str, Any] | None = None,
) -> Reference:
    """Non-private reference posterior: mean and sd of every scalar element of every free variable.

    Parameters
    ----------
    model : pymc.Model
        The model (reads its observed data without noise: evaluation only).
    var_names : sequence of str, optional
        The variables to report, free variables or deterministics of ``model`` (default: every
        free variable). With an equivalent reparametrised model (:attr:`ZooModel.reference_build`)
        these are the original model's free variables, written as deterministics.
    method : {"laplace", "nuts"}
        ``"laplace"`` (default, for ``n ≥ 10⁵``): Gaussian ``N(mode, (−H)⁻¹)`` in the
        unconstrained space at the mode of the log-density with the transforms' Jacobians,
        ``draws`` samples mapped back through the model's transforms. The mode is found by
        L-BFGS from the model's initial point and polished by Newton steps; ``pm.find_MAP`` is
        not used because it maximises the density without the Jacobians (the constrained
        mode). ``"nuts"`` (for small ``n``): ``pm.sample`` with NUTS, 2 chains of
        ``draws // 2`` draws after 1000 tuning steps (override with ``nuts_kwargs``).
    draws : int
        Reference samples.
    importance : bool
        Laplace only: correct the Gaussian draws toward the exact posterior by self-normalised
        importance sampling (weights ``p/q`` truncated at ``√N`` times their mean). This
        removes what is left of the Gaussian approximation's error (e.g. the ``O(J/n)`` shift
        of a variance that a joint mode has next to ``J`` group effects) at the cost of
        ``draws`` log-density evaluations. A :class:`UserWarning` says when the weights' Kish
        ESS is under 10 % of ``draws`` (the approximation is then poor).
    random_seed : int
        Seed of the reference samples.
    newton_steps : int
        Most Newton steps after the optimiser (Laplace only).
    hessian : {"fd", "exact"}
        How ``H`` is computed (Laplace only): ``"fd"`` (default) by central differences of the
        model's exact compiled gradient, ``2d`` gradient evaluations; ``"exact"`` with
        ``model.compile_d2logp`` (the same numbers to about 1e-6 relative, but its compilation
        takes seconds per model).
    nuts_kwargs : mapping, optional
        Extra arguments for ``pm.sample`` (NUTS only).

    Returns
    -------
    Reference
        A dict ``{"beta[0]": Moments(mean, sd), "sigma": ..., ...}`` of constrained values, in
        the order of ``var_names`` and C order within each variable, with the method used and
        the reference's effective sample size as attributes.

    Raises
    ------
    numpy.linalg.LinAlgError
        When ``−H`` at the mode is not positive definite (no Laplace approximation there).

    Notes
    -----
    The Laplace approximation is only as good as the posterior is Gaussian in the unconstrained
    space. It fails for the non-centred hierarchical model: there the *joint* mode lies far
    from the posterior mass (the volume factor ``σ_a^J`` of the non-centred coordinates pushes
    it to large ``σ_a``), so :class:`ZooModel` carries an equivalent centred model for its
    reference (:meth:`ZooModel.reference`).
    """
    names = [rv.name for rv in model.free_RVs] if var_names is None else list(var_names)
    out = Reference()
    if method == "nuts":
        kwargs = {
            "draws": max(draws // 2, 1),
            "tune": 1000,
            "chains": 2,
            "cores": 1,
            "progressbar": False,
            "random_seed": random_seed,
            "compute_convergence_checks": False,
            **(nuts_kwargs or {}),
        }
        with model:
            idata = pm.sample(**kwargs)
        post = idata.posterior
        samples = [
            np.asarray(post[name].values).reshape(-1, *post[name].shape[2:]) for name in names
        ]
        out.update(_moments(names, samples))
        out.method = "nuts"
        return out
    if method != "laplace":
        raise ValueError(f"method must be 'laplace' or 'nuts', got {method!r}.")
    fit = _laplace(model, newton_steps, hessian)
    chol = np.linalg.cholesky(fit.precision)  # LinAlgError if −H is not positive definite
    rng = np.random.default_rng(random_seed)
    noise = rng.standard_normal((draws, fit.mode.data.size))
    # x = mode + L⁻ᵀ e has covariance (L Lᵀ)⁻¹ = (−H)⁻¹, and log q(x) = −|e|²/2 + const
    unconstrained = fit.mode.data + scipy.linalg.solve_triangular(chol.T, noise.T).T
    to_constrained = _constrained_fn(model, names)
    value_names = [v.name for v in model.value_vars]
    samples_list: list[list[np.ndarray]] = [[] for _ in names]
    for row in unconstrained:
        values = DictToArrayBijection.rmap(RaveledVars(row, fit.mode.point_map_info))
        for k, value in enumerate(to_constrained(*(values[v] for v in value_names))):
            samples_list[k].append(np.asarray(value))
    samples = [np.stack(s) for s in samples_list]
    if not importance:
        out.update(_moments(names, samples))
        out.method, out.ess = "laplace", float(draws)
        return out
    log_p = np.array([fit.logp(row) for row in unconstrained])
    weights = _truncated_weights(log_p + 0.5 * np.sum(noise**2, axis=1))
    out.update(_moments(names, samples, weights))
    out.method, out.ess = "laplace+is", float(1.0 / np.sum(weights**2))
    if out.ess < 0.1 * draws:
        warnings.warn(
            f"The Laplace approximation is poor here: importance ESS {out.ess:.0f} of {draws} "
            "draws. Use method='nuts' or an equivalent reparametrised model.",
            UserWarning,
            stacklevel=2,
        )
    return out


# ---------------------------------------------------------------- comparing a run with it

_ELEMENT = re.compile(r"^(?P<var>[^\[]+)(?:\[(?P<idx>[0-9, ]+)\])?$")


def _element_draws(posterior: Any, label: str) -> np.ndarray:
    """Draws ``(chain, draw)`` of the scalar element ``label`` (``beta[0]``) of a posterior."""
    match = _ELEMENT.match(label)
    if match is None or match["var"] not in posterior.data_vars:
        raise KeyError(f"The posterior has no variable for {label!r}.")
    values = np.asarray(posterior[match["var"]].values, dtype=float)
    if match["idx"]:
        idx = tuple(int(i) for i in match["idx"].split(","))
        values = values[(slice(None), slice(None), *idx)]
    return values


def summarize(idata_posterior: Any, reference: Mapping[str, Moments]) -> dict[str, float]:
    """Compare a run's released draws with a reference posterior.

    Parameters
    ----------
    idata_posterior : InferenceData, DataTree or xarray.Dataset
        The run (``pymc_dp.sample``'s result) or its ``posterior`` group.
    reference : mapping
        :func:`reference`'s result.

    Returns
    -------
    dict
        ``max_abs_mean_diff_sd`` (largest ``|mean − reference mean| / reference sd`` over the
        reference's scalar elements), ``max_abs_mean_diff_own_sd`` (the same in the run's own
        sd: how far outside its own intervals the reference mean lies, so a run whose intervals
        are honest about its error keeps it near or below 2), ``sd_ratio_min`` and
        ``sd_ratio_max`` (run sd / reference sd), ``ess_bulk_median`` (the median bulk ESS of
        the reference's elements: a prediction of effective draws is per coordinate, and the
        smallest of many noisy estimates sits below their typical value), and, from
        :func:`pymc_dp.check_convergence` over every released variable, ``rhat_max``,
        ``ess_bulk_min`` and ``acceptance`` (NaN without sample stats).
    """
    import arviz as az

    posterior = group_dataset(idata_posterior, "posterior")
    stats = group_dataset(idata_posterior, "sample_stats")
    if posterior is None and hasattr(idata_posterior, "data_vars"):
        posterior = getattr(idata_posterior, "ds", idata_posterior)  # a posterior dataset
    if posterior is None:
        raise ValueError("summarize needs an InferenceData/DataTree or a posterior dataset.")
    diffs, ratios, own, ess = [], [], [], []
    for label, moments in reference.items():
        draws = _element_draws(posterior, label)
        value = float(az.ess(draws, method="bulk")) if np.ptp(draws) > 0 else 1.0
        ess.append(1.0 if math.isnan(value) else value)  # as check_convergence counts it
        error = abs(float(draws.mean()) - moments.mean)
        spread = float(draws.std(ddof=1))
        diffs.append(error / moments.sd)
        ratios.append(spread / moments.sd)
        own.append(error / spread if spread > 0 else (0.0 if error == 0 else math.inf))
    groups = {"posterior": posterior}
    if stats is not None:
        groups["sample_stats"] = stats
    check = check_convergence(groups)
    return {
        "max_abs_mean_diff_sd": float(np.max(diffs)),
        "max_abs_mean_diff_own_sd": float(np.max(own)),
        "sd_ratio_min": float(np.min(ratios)),
        "sd_ratio_max": float(np.max(ratios)),
        "rhat_max": float(check.rhat_max),
        "ess_bulk_min": float(check.ess_bulk_min),
        "ess_bulk_median": float(np.median(ess)),
        "acceptance": float(check.acceptance),
    }
