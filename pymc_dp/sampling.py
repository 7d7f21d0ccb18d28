"""``pymc_dp.sample``: budget-driven ``pm.sample`` that returns a private ``InferenceData``.

What plain ``pm.sample(step=dp_step)`` does with the private data, and what this wrapper closes:

* With a user-given step, ``pm.sample`` evaluates no log-density itself (no start-value check,
  no jitter: those belong to its NUTS initialisation); the step's mechanisms are the only readers.
* It stores the raw data in the ``observed_data`` and ``constant_data`` groups: dropped here.
* It recomputes every ``pm.Deterministic`` at every draw and stores it: one that reads row data
  would publish a data-dependent value without noise, so the step refuses such models when it is
  built (``pymc_dp._leaks``).
* ``idata_kwargs={"log_likelihood": True}`` stores per-row log-likelihoods: refused.
* ``return_inferencedata=False`` returns a ``MultiTrace`` with the same deterministics and no
  metadata, and other trace backends persist state: both refused.
* Free variables outside the DP step would go to NUTS on the raw data: refused by the step, and
  so is a compound of the DP step with any non-DP step (at the chain's first iteration).
* Row data changed with ``pm.set_data`` after the step was built: refused before sampling.

After sampling, the released draws are checked for convergence (R̂, bulk ESS, acceptance,
divergences: post-processing, no privacy cost) and a :class:`~pymc_dp.ConvergenceWarning` says
plainly when they are not a usable posterior (:mod:`pymc_dp.convergence`).
"""

from __future__ import annotations

import multiprocessing
import warnings
from typing import Any

import arviz as az
import numpy as np
import pymc as pm

from pymc_dp.convergence import check_convergence
from pymc_dp.errors import ConvergenceWarning, InvalidParameterError, PrivacyLeakError
from pymc_dp.planning import plan_iterations
from pymc_dp.report import attach_privacy_metadata
from pymc_dp.step_methods.base import DPStep

__all__ = ["plan_iterations", "sample"]

# Below this predicted effective sample size, pymc_dp.sample warns before sampling.
_TOO_FEW_EFFECTIVE_DRAWS = 50
#: A tilt of the target by the centre's noise above this many posterior sd is warned about.
_LARGEST_CENTRE_SHIFT = 1.0
#: Tags the preparation's public stream, apart from the chains' streams of the same seed.
_PREPARATION_STREAM = 0x70726570


def sample(
    step: DPStep,
    *,
    chains: int = 4,
    tune: float | int | None = None,
    draws: int | None = None,
    cores: int | None = None,
    random_seed: Any = None,
    progressbar: bool = True,
    model: pm.Model | None = None,
    **kwargs: Any,
) -> az.InferenceData:
    """Sample with a DP step, spending (at most) its budget, and return a private InferenceData.

    Parameters
    ----------
    step : DPStep
        A ``pymc_dp`` step method (``DPPenalty``, ``DPHMC``) covering every free variable.
    chains : int
        Number of chains; they share the budget (every chain reads the same data).
    tune : int or float, optional
        Tuning iterations per chain: a count, or a fraction in ``[0, 1)`` of each chain's share.
        Tuning iterations spend budget like any other. Default: 0.2 for a ``DPPenalty`` that starts
        from its private initialisation (automatic settings) and for a ``DPHMC`` on centred
        releases, 0.5 otherwise.
    draws : int, optional
        Draws per chain kept after tuning; default: the rest of each chain's share. On
        automatic settings, more draws than the step's plan holds (with ``tune`` a fraction)
        lengthen each chain to ``draws / (1 − tune)`` iterations, with the noise chosen for
        that length.
    cores, random_seed, progressbar, **kwargs
        Passed to ``pm.sample``. ``random_seed`` seeds the public randomness only (the private
        initialisation's designs, proposals, momenta, accept draws), so a run is reproducible
        up to its DP noise; DP noise never comes from it. For a step compiled with JAX
        (``compile_kwargs={"mode": "JAX"}``) ``mp_ctx`` defaults to ``"forkserver"`` (``"spawn"``
        where there is none): JAX hangs in a forked worker.

    Returns
    -------
    arviz.InferenceData
        ``posterior`` and ``sample_stats`` only (no ``observed_data``/``constant_data``), with the
        privacy metadata as flat ``dp_*`` attributes on both groups
        (:func:`pymc_dp.privacy_report` reads them).
    """
    if not isinstance(step, DPStep):
        raise InvalidParameterError(
            f"step must be a pymc_dp step method (DPPenalty, DPHMC), got {type(step).__name__}."
        )
    _refuse_leaky_options(kwargs)
    model = pm.modelcontext(model if model is not None else step.model)
    step.check_model_unchanged()
    if tune is None:
        tune = step._default_tune_fraction()
    _seed_preparation(step, random_seed)
    # a step on automatic settings chooses them privately here (once), then plans
    n_tune, n_draws = step.prepare(chains=chains, tune=tune, draws=draws)
    step.plan(tune=n_tune, draws=n_draws, chains=chains)
    predicted = getattr(step, "predicted_ess", lambda: float("nan"))()
    if predicted < _TOO_FEW_EFFECTIVE_DRAWS:  # public numbers only: before the sampler reads
        warnings.warn(
            f"This budget buys about {predicted:.0f} effective draws for this model "
            f"({chains} chains × {n_draws} draws; predicted from public quantities and the "
            "private initialisation, before sampling): too few for a converged posterior. "
            "What helps: a larger epsilon, more rows, or fewer parameters.",
            ConvergenceWarning,
            stacklevel=2,
        )
    shift = getattr(step, "centre_shift_sd", lambda: float("nan"))()
    if shift > _LARGEST_CENTRE_SHIFT:  # public: from the private Σ̂ and the noise scale
        widened = getattr(step, "_stretching", lambda: False)()
        warnings.warn(
            f"The noise of this budget's centre release tilts the target by about {shift:.1f} "
            "posterior sd per direction (a random shift, centre_shift_sd in the privacy "
            "report): the means can be off by that much however long the chains run"
            + (" (the noise-aware draws are widened for it)" if widened else "")
            + ". What helps: a larger epsilon or more rows.",
            ConvergenceWarning,
            stacklevel=2,
        )
    unresolved = getattr(step, "unresolved_directions", lambda: None)()
    d = step.space.ndim
    if unresolved is not None and unresolved > d / 2:  # public: from the Fisher release
        warnings.warn(
            f"This budget resolves the posterior's curvature in only {d - unresolved} of {d} "
            "directions (in the others the noise of the released Fisher information is "
            "larger than the information, unresolved_directions in the privacy report): the "
            "proposals' scale there is a rougher guess, and with strongly "
            "correlated parameters (a non-centred hierarchy) it can be far off, so the chains "
            "may not converge. What helps: a larger epsilon, more rows, or fewer parameters "
            "(a hierarchy with many rows per group that the step did not centre by itself: "
            "write it centred).",
            ConvergenceWarning,
            stacklevel=2,
        )
    if getattr(step, "curvature_unchecked", lambda: False)():  # public: budget decisions
        warnings.warn(
            "This budget left no room to check the sampler's metric against the likelihood's "
            "own curvature (the centring's observed-curvature step): the metric comes from "
            "the rows' gradient variance, which is the posterior's curvature only where the "
            "likelihood describes the data's variance. Where it does not (overdispersed "
            "counts under a Poisson likelihood, heavy-tailed residuals under a Normal one) "
            "the metric is too narrow, the chains may not mix and the predicted effective "
            "draws are too high. What helps: a likelihood that describes the variance "
            "(negative binomial, Student-t), a larger epsilon, or more rows.",
            ConvergenceWarning,
            stacklevel=2,
        )
    if step.compile_backend == "JAX":  # JAX's runtime does not survive a fork: Linux's default
        methods = multiprocessing.get_all_start_methods()
        kwargs.setdefault("mp_ctx", "forkserver" if "forkserver" in methods else "spawn")
    # log_likelihood=True is refused above; PyMC's default is not to store it, and PyMC 6
    # deprecates passing the key at all (a FutureWarning on every run)
    idata_kwargs = {
        k: v for k, v in kwargs.pop("idata_kwargs", {}).items() if k != "log_likelihood"
    }
    with model:
        idata = pm.sample(
            draws=n_draws,
            tune=n_tune,
            chains=chains,
            cores=cores,
            step=step,
            random_seed=random_seed,
            progressbar=progressbar,
            idata_kwargs=idata_kwargs,
            **kwargs,
        )
    # drops observed_data / constant_data / log_likelihood and labels the release
    release = attach_privacy_metadata(idata, step, chains=chains, tune=n_tune, draws=n_draws)
    check = check_convergence(release)  # post-processing of the release: free
    if not check.converged:
        warnings.warn(check.summary(), ConvergenceWarning, stacklevel=2)
    return release


def _seed_preparation(step: DPStep, random_seed: Any) -> None:
    """Seed the public randomness of the step's private initialisation from ``random_seed``.

    ``step.prepare`` runs before ``pm.sample`` (which seeds only the chains) and draws public
    designs (directions, pairs) from the step's generator. A given ``random_seed`` seeds it, on
    a stream of its own (tagged), so the same seed gives the same designs. The DP noise is not
    drawn from this generator (:class:`~pymc_dp.noise.NoiseSource`).
    """
    if random_seed is None or step.prepared:
        return
    if isinstance(random_seed, np.random.Generator):
        step.rng = np.random.default_rng(random_seed.integers(2**63))
        return
    try:
        entropy = [int(s) for s in np.atleast_1d(random_seed)]
    except (TypeError, ValueError):
        raise InvalidParameterError(
            f"random_seed must be an int, a sequence of ints or a numpy Generator, got "
            f"{type(random_seed).__name__}."
        ) from None
    step.rng = np.random.default_rng([*entropy, _PREPARATION_STREAM])


def _refuse_leaky_options(kwargs: dict[str, Any]) -> None:
    if kwargs.get("return_inferencedata", True) is not True:
        raise PrivacyLeakError(
            "return_inferencedata=False is not supported: a MultiTrace carries no privacy "
            "metadata and keeps every deterministic. Use the returned InferenceData."
        )
    if kwargs.get("trace") is not None:
        raise PrivacyLeakError(
            "trace=... is not supported: trace backends such as Zarr persist sampler state. "
            "Leave trace unset and save the returned InferenceData (to_netcdf)."
        )
    if (kwargs.get("idata_kwargs") or {}).get("log_likelihood"):
        raise PrivacyLeakError(
            "idata_kwargs={'log_likelihood': True} would store every row's exact log-likelihood "
            "at every draw, which is not private. Leave it out."
        )
    if kwargs.get("nuts_sampler", "pymc") != "pymc":
        raise InvalidParameterError("nuts_sampler: DP steps run in PyMC's own sampler only.")
