"""The public parameter space of a PyMC model: raveling, transforms and the log-prior (no data).

A DP step moves the raveled vector ``θ`` of every free variable in PyMC's unconstrained space
(transforms applied, in the order of ``model.value_vars``). Everything about ``θ`` that reads no
observed data lives here (theory §1):

* :meth:`ParameterSpace.ravel` / :meth:`ParameterSpace.unravel` between PyMC point dicts and
  ``θ``;
* the log-prior ``log p(θ)`` and its gradient (every log-density term without data: priors,
  transform Jacobians and data-free potentials);
* :meth:`ParameterSpace.in_support`: the likelihood's parameter-only checks (``sigma > 0``),
  under which the log-density is −∞ whatever the data, so a proposal outside is rejected
  without reading anything;
* :meth:`ParameterSpace.check_start`: a chain's start point, checked before any reservation.

Step methods hold a :class:`ParameterSpace`; they never hold the oracle
(:mod:`pymc_dp.oracle`), which builds this space for the model it reads. A space can also be
built on its own from a model (``ParameterSpace(model)``), e.g. to evaluate the prior.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.replace import clone_replace
from pytensor.tensor.type import continuous_dtypes

from pymc_dp._compile import compile_function
from pymc_dp._leaks import describe_leaf
from pymc_dp.errors import InitialPointError, InvalidParameterError, ModelNotSupportedError

__all__ = ["ParameterSpace", "prior_and_observed_terms", "prior_terms", "resolve_vars"]


def resolve_vars(model: pm.Model, vars: Sequence[Any] | None) -> list[Variable]:
    """The value variables a sampler moves, in ``model.value_vars`` order.

    ``vars`` may hold random variables, value variables or names; ``None`` means every free
    variable. Discrete variables and PyMC's imputation variables (private data made free
    variables) are refused with an error naming them.
    """
    if vars is None:
        chosen = list(model.value_vars)
    else:
        if isinstance(vars, str | Variable):
            vars = [vars]
        chosen = []
        for v in vars:
            if isinstance(v, str):
                if v not in model.named_vars:
                    raise InvalidParameterError(
                        f"vars: the model has no variable named {v!r}. Free variables are "
                        f"{[rv.name for rv in model.free_RVs]}."
                    )
                v = model.named_vars[v]
            if v in model.rvs_to_values and v in model.free_RVs:
                v = model.rvs_to_values[v]
            if v not in model.value_vars:
                kind = "observed" if v in model.observed_RVs else "not a free variable"
                raise InvalidParameterError(
                    f"vars: {describe_leaf(v)} is {kind}. A DP step moves free "
                    "(unobserved) continuous variables only; remove it from vars."
                )
            chosen.append(v)
        order = {v: i for i, v in enumerate(model.value_vars)}
        chosen = sorted(dict.fromkeys(chosen), key=order.__getitem__)
    values_to_rvs = {val: rv for rv, val in model.rvs_to_values.items()}
    for v in chosen:
        if v.dtype not in continuous_dtypes:
            rv = values_to_rvs[v]
            raise ModelNotSupportedError(
                f"Variable {rv.name!r} is discrete ({v.dtype}); DP step methods move "
                "continuous parameters only. Marginalise it out (e.g. with "
                "pymc_extras.marginalize) or make it continuous."
            )
    imputed = [rv.name for rv in model.free_RVs if rv.name.endswith("_unobserved")]
    for name in imputed:
        base = name[: -len("_unobserved")]
        if f"{base}_observed" in model.named_vars:
            raise ModelNotSupportedError(
                f"Observed variable {base!r} has missing values (NaN or masked): PyMC created "
                f"{name!r} to impute them, a free variable made of private data. Drop or "
                "impute the missing rows before building the model."
            )
    return chosen


def prior_terms(model: pm.Model) -> list[tuple[str, Variable]]:
    """``(name, elementwise log-density)`` of every free variable (Jacobians included) and
    every ``pm.Potential``: the terms of the model's log-density besides the likelihood."""
    return prior_and_observed_terms(model, observed=False)[0]


def prior_and_observed_terms(
    model: pm.Model, observed: bool = True
) -> tuple[list[tuple[str, Variable]], list[Variable]]:
    """:func:`prior_terms`, and the observed variables' elementwise log-densities (in
    ``model.observed_RVs`` order; none with ``observed=False``) from the same construction of
    PyMC's log-probability graph (each construction costs a tenth of a second or more)."""
    prior_rvs = list(model.free_RVs)
    observed_rvs = list(model.observed_RVs) if observed else []
    rvs = prior_rvs + observed_rvs
    logps = model.logp(vars=rvs, jacobian=True, sum=False) if rvs else []
    prior_logps, observed_logps = logps[: len(prior_rvs)], list(logps[len(prior_rvs) :])
    terms = [(rv.name, lp) for rv, lp in zip(prior_rvs, prior_logps, strict=True)]
    if model.potentials:
        pot_logps = model.logp(vars=model.potentials, sum=False)
        terms += [(pot.name, lp) for pot, lp in zip(model.potentials, pot_logps, strict=True)]
    return terms, observed_logps


class ParameterSpace:
    """The raveled unconstrained parameters of a model and everything public about them.

    Parameters
    ----------
    model : pymc.Model, optional
        The model (default: the model on the context stack).
    vars : sequence, optional
        Free variables to move (default: all, in ``model.value_vars`` order). Free variables
        not listed are held fixed at :meth:`set_fixed_values` (default: the initial point).
    prior : list of (str, Variable), optional
        The prior terms (:func:`prior_terms`; the oracle passes them after checking them for
        leaks). Default: all of the model's non-likelihood terms.
    support_checks : list of (str, Variable), optional
        Parameter-only conditions of the likelihood (``"sigma > 0"``, graph over value
        variables) that read no row data; the oracle finds them (default: none).
    initial_point : dict, optional
        ``model.initial_point()``, if the caller has it.

    Attributes
    ----------
    value_vars : list
        The moved value variables, in raveling order.
    ndim : int
        Length of ``θ``.
    """

    def __init__(
        self,
        model: pm.Model | None = None,
        vars: Sequence[Any] | None = None,
        *,
        prior: list[tuple[str, Variable]] | None = None,
        support_checks: list[tuple[str, Variable]] | None = None,
        initial_point: dict[str, np.ndarray] | None = None,
    ) -> None:
        self.model = pm.modelcontext(model)
        self._check_bounds = bool(getattr(self.model, "check_bounds", True))
        self.value_vars = resolve_vars(self.model, vars)
        # PyMC compiles a function for it: the oracle passes the one it already has
        self.initial_point = self.model.initial_point() if initial_point is None else initial_point
        self._layout()
        self._prior_terms = prior_terms(self.model) if prior is None else list(prior)
        self._observed_names = [rv.name for rv in self.model.observed_RVs]
        self._compile_public(support_checks or [])

    # ------------------------------------------------------------------ layout

    def _layout(self) -> None:
        point = self.initial_point
        self.theta = pt.vector("theta", dtype=pytensor.config.floatX)
        self.slices: list[tuple[Variable, slice, tuple[int, ...]]] = []
        start = 0
        replacements: dict[Variable, Variable] = {}
        for v in self.value_vars:
            shape = tuple(np.shape(point[v.name]))
            size = int(np.prod(shape, dtype=int))
            sl = slice(start, start + size)
            self.slices.append((v, sl, shape))
            replacements[v] = self.theta[sl].reshape(shape).astype(v.dtype)
            start += size
        self.ndim = start
        self._fixed: dict[str, SharedVariable] = {}
        for v in self.model.value_vars:
            if v not in replacements:
                shared = pytensor.shared(np.asarray(point[v.name], dtype=v.dtype), name=v.name)
                self._fixed[v.name] = shared
                replacements[v] = shared
        self._replacements = replacements

    def to_theta(self, graphs: list[Variable]) -> list[Variable]:
        """Graphs over the model's value variables rewritten as graphs of ``θ`` (build time)."""
        return clone_replace(graphs, self._replacements, rebuild_strict=False)

    def compile(self, inputs: list[Variable], outputs: Any) -> Any:
        """Compile with the package's mode and the model's ``check_bounds`` (build time)."""
        return compile_function(inputs, outputs, check_bounds=self._check_bounds)

    @property
    def fixed_values(self) -> dict[str, np.ndarray]:
        """Current values of the free variables held fixed (not in ``vars``)."""
        return {name: shared.get_value() for name, shared in self._fixed.items()}

    def set_fixed_values(self, point: dict[str, Any]) -> None:
        """Set the values of free variables that are not in ``vars`` (held fixed)."""
        for name, shared in self._fixed.items():
            if name in point:
                shared.set_value(np.asarray(point[name], dtype=shared.dtype))
        self._public_cache = None  # the prior of θ may read the fixed variables

    def ravel(self, point: dict[str, Any]) -> np.ndarray:
        """Raveled parameter vector θ (unconstrained space) from a point dict."""
        parts = [np.ravel(np.asarray(point[v.name], dtype=float)) for v, _, _ in self.slices]
        return np.concatenate(parts) if parts else np.zeros(0)

    def unravel(self, theta: np.ndarray) -> dict[str, np.ndarray]:
        """Point dict (value-variable names) from a raveled parameter vector θ."""
        theta = np.asarray(theta)
        return {v.name: theta[sl].reshape(shape) for v, sl, shape in self.slices}

    def as_theta(self, theta: np.ndarray) -> np.ndarray:
        """θ as the compiled functions take it; a wrong length is an error naming the layout."""
        theta = np.asarray(theta, dtype=pytensor.config.floatX)
        if theta.shape != (self.ndim,):
            raise InvalidParameterError(
                f"theta has shape {theta.shape}; expected ({self.ndim},), the raveled "
                f"unconstrained parameters {[v.name for v in self.value_vars]}."
            )
        return theta

    # ------------------------------------------------------------------ log-prior

    def _compile_public(self, checks: list[tuple[str, Variable]]) -> None:
        """One function of θ for the log-prior, its gradient, each prior term and the
        likelihood's parameter-only checks (one message each): every compilation has a fixed
        cost, and all of these are cheap; the last θ's values are kept (a proposal is checked
        for support, then its prior is read)."""
        floatX = pytensor.config.floatX
        terms = self.to_theta([lp.sum() for _, lp in self._prior_terms])
        total = pt.add(*terms) if terms else pt.constant(0.0, dtype=floatX)
        grad = pytensor.grad(total, self.theta, disconnected_inputs="ignore")
        # each term alone too, to name a variable whose prior is not finite at a chain's start
        each = pt.stack(terms) if terms else pt.zeros((0,), dtype=floatX)
        self._prior_names = [name for name, _ in self._prior_terms]
        self._support_messages = list(dict.fromkeys(msg for msg, _ in checks))
        conditions = self.to_theta([cond for _, cond in checks])
        by_message = [
            pt.all(pt.stack([c for (m, _), c in zip(checks, conditions, strict=True) if m == msg]))
            for msg in self._support_messages
        ]
        flags = pt.stack(by_message) if by_message else pt.zeros((0,), dtype="bool")
        self._f_public = self.compile([self.theta], [total, grad, each, flags])
        self._public_cache: tuple[bytes, list[np.ndarray]] | None = None

    def _public_values(self, theta: np.ndarray) -> list[np.ndarray]:
        """``[log p(θ), ∇ log p(θ), each prior term, each check passed]`` (the last θ kept)."""
        theta = self.as_theta(theta)
        key = theta.tobytes()
        if self._public_cache is None or self._public_cache[0] != key:
            self._public_cache = (key, self._f_public(theta))
        return self._public_cache[1]

    def logprior(self, theta: np.ndarray) -> float:
        """Log-prior ``log p(θ)`` including transform Jacobians and data-free potentials."""
        return float(self._public_values(theta)[0])

    def logprior_grad(self, theta: np.ndarray) -> np.ndarray:
        """Gradient of :meth:`logprior` with respect to θ."""
        return np.array(self._public_values(theta)[1])

    def logprior_and_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """:meth:`logprior` and :meth:`logprior_grad` in one call."""
        value, grad, _, _ = self._public_values(theta)
        return float(value), np.array(grad)

    # ------------------------------------------------------------------ support and start

    def failed_checks(self, theta: np.ndarray) -> list[str]:
        """The likelihood's parameter checks (e.g. ``"sigma > 0"``) that fail at θ."""
        if not self._support_messages:
            return []
        ok = self._public_values(theta)[3]
        return [msg for msg, good in zip(self._support_messages, ok, strict=True) if not good]

    def in_support(self, theta: np.ndarray) -> bool:
        """Whether θ is finite and passes every parameter check that reads no row data.

        Outside, the model's log-density is −∞ for every dataset: a proposal there is a
        rejection (a divergence for HMC), decided without reading data.
        """
        theta = np.asarray(theta)
        if not np.isfinite(theta).all():
            return False
        return not self._support_messages or bool(self._public_values(theta)[3].all())

    def check_start(self, theta: np.ndarray) -> None:
        """Refuse a chain's starting point that is non-finite or outside the support.

        Reads no data (θ, the log-prior and the parameter-only checks of the likelihood), so it
        runs before any reservation. Raises :class:`InitialPointError` naming the variable.
        """
        theta = np.asarray(theta, dtype=float)
        for v, sl, _ in self.slices:
            if not np.all(np.isfinite(theta[sl])):
                raise InitialPointError(
                    f"The initial value of {v.name!r} is not finite in the sampler's "
                    "(unconstrained) space: it is NaN/infinite or outside the variable's support "
                    "(e.g. a negative value for a positive variable). Give a finite value inside "
                    "the support in initvals, or leave initvals unset."
                )
        terms = self._public_values(theta)[2]
        bad = [
            name
            for name, value in zip(self._prior_names, terms, strict=True)
            if not np.isfinite(value)
        ]
        if bad:
            raise InitialPointError(
                f"The prior log-density of {bad} is not finite at the initial point (the value "
                "is outside the support, or so extreme that it overflows). Give initvals well "
                "inside the support, or leave initvals unset."
            )
        failed = self.failed_checks(theta)
        if failed:
            observed = ", ".join(repr(name) for name in self._observed_names)
            raise InitialPointError(
                f"The likelihood of {observed} is undefined at the initial point of "
                f"{[v.name for v in self.value_vars]}: the parameter check(s) {failed} fail. "
                "Give initvals at which the model's parameters are valid, or leave initvals unset."
            )

    # ------------------------------------------------------------------ pickling

    def __getstate__(self) -> dict[str, Any]:
        # Compiled functions and the layout travel; the model and its graphs stay behind.
        state = self.__dict__.copy()
        for key in ("model", "_prior_terms", "_replacements"):
            state[key] = None
        return state

    def __repr__(self) -> str:
        return f"ParameterSpace(ndim={self.ndim}, vars={[v.name for v in self.value_vars]})"
