"""Privacy metadata carried inside the ``InferenceData``, and the report that reads it back.

The metadata are flat ``dp_*`` attributes of ``str``, ``int`` and ``float`` (netCDF stores no
bool, None or dict attributes) on the ``posterior`` and ``sample_stats`` groups, so that they
survive ``to_netcdf``/``from_netcdf`` with the samples they describe.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

import arviz as az
import numpy as np

from pymc_dp._compat import group_names
from pymc_dp.accounting import GaussianCost, compose, gaussian_epsilon
from pymc_dp.accounting.costs import compose_epsilon
from pymc_dp.convergence import check_convergence
from pymc_dp.errors import InvalidParameterError, PrivacyLeakError

__all__ = ["attach_privacy_metadata", "privacy_report"]

PRIVATE_GROUPS = ("observed_data", "constant_data", "log_likelihood")
_PER_CHAIN_KEYS = ("dp_iterations_this_chain", "dp_epsilon_this_chain")


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:  # pragma: no cover - an editable checkout without metadata
        return "unknown"


def privacy_metadata(step: Any, *, chains: int, tune: int, draws: int) -> dict[str, Any]:
    """The flat ``dp_*`` record of one release: budget, mechanism, parameters, what was spent.

    The spend is the accountant's: ``chains · (tune + draws)`` iterations of ``μ`` each, composed
    exactly (tight Gaussian PLD, theory §3); ε is reported at the budget's δ.
    """
    budget = step.budget
    iterations = int(tune) + int(draws)
    total = chains * iterations
    meta = {k: v for k, v in step.privacy_metadata().items() if k not in _PER_CHAIN_KEYS}
    uniform = getattr(step, "uniform_cost", True)
    mu_per_iteration = step.cost.gaussian_mu() if uniform else None
    start = getattr(step, "private_start", None)
    phases: dict[str, float] = {} if start is None else dict(start.phases)
    if mu_per_iteration is not None:
        phases["tuning"] = chains * int(tune) * float(mu_per_iteration)
        phases["sampling"] = chains * int(draws) * float(mu_per_iteration)
    for phase, mu in phases.items():  # each phase alone, at the budget's δ
        key = phase.replace(" ", "_")
        meta[f"dp_phase_{key}_mu"] = float(mu)
        meta[f"dp_phase_{key}_epsilon"] = (
            float(gaussian_epsilon(budget.delta, mu)) if mu > 0 else 0.0
        )
    init_mu = 0.0 if start is None else float(start.mu)
    if mu_per_iteration is not None:
        mu_spent = init_mu + total * float(mu_per_iteration)  # Gaussian: μ adds up
        meta.update(
            dp_accountant="tight Gaussian PLD composition (pymc_dp.accounting, docs/theory.md §3)",
            dp_mu_per_iteration=float(mu_per_iteration),
            dp_mu_spent=mu_spent,
            dp_epsilon_spent=float(gaussian_epsilon(budget.delta, mu_spent)) if mu_spent else 0.0,
        )
    elif not uniform:
        # a step-size schedule: each chain's stages (chain_spending), composed like the ledger
        phase_spending = {
            "tuning": [(c, chains * k) for c, k in step.chain_spending(0, int(tune))],
            "sampling": [(c, chains * k) for c, k in step.chain_spending(int(tune), iterations)],
        }
        for phase, spending in phase_spending.items():
            meta[f"dp_phase_{phase}_epsilon"] = compose_epsilon(spending, budget.delta)[0]
        events = [*phase_spending["tuning"], *phase_spending["sampling"]]
        if init_mu > 0:
            events.append((GaussianCost(init_mu), 1))
        meta.update(
            dp_accountant=(
                f"{step.cost.accountant}: {len(step.chain_spending(0, iterations))} stages of "
                "decreasing cost per chain (a step-size schedule), the first "
                f"{step.cost.describe()} (pymc_dp.accounting, docs/theory.md §3)"
            ),
            dp_epsilon_spent=compose_epsilon(events, budget.delta)[0] if events else 0.0,
        )
    else:
        # a subsampled cost: each phase's ε on its own, and the whole run composed (a Gaussian
        # private initialisation with it, as the ledger composes them)
        for phase, count in (("tuning", chains * int(tune)), ("sampling", chains * int(draws))):
            meta[f"dp_phase_{phase}_epsilon"] = (
                float(step.cost.epsilon(budget.delta, count)) if count else 0.0
            )
        events: list = [(step.cost, total)] if total else []
        if init_mu > 0:
            events.append(GaussianCost.from_noise_multiplier(1.0 / np.sqrt(2.0 * init_mu)))
        meta.update(
            dp_accountant=(
                f"{step.cost.accountant}: {step.cost.describe()} "
                "(pymc_dp.accounting, docs/theory.md §3)"
            ),
            dp_epsilon_spent=float(compose(*events).epsilon(budget.delta, 1)) if events else 0.0,
        )
    meta.update(
        dp_chains=int(chains),
        dp_tune_per_chain=int(tune),
        dp_draws_per_chain=int(draws),
        dp_iterations_per_chain=iterations,
        dp_budget_epsilon_spent_total=float(budget.report().spent_epsilon),
        # the ledger's hash-chain head after these reservations: keep it to check later that
        # the ledger was not rewritten or replaced (Ledger.verify(head=...))
        dp_ledger_head=budget.ledger_head(),
        dp_version_pymc_dp=_version("pymc-dp"),
        dp_version_pymc=_version("pymc"),
        dp_version_pytensor=_version("pytensor"),
        dp_version_arviz=_version("arviz"),
    )
    for key, value in meta.items():
        if isinstance(value, bool):
            meta[key] = int(value)
        elif not isinstance(value, str | int | float):
            meta[key] = str(value)
    return meta


def attach_privacy_metadata(
    idata: az.InferenceData,
    step: Any,
    *,
    chains: int | None = None,
    tune: int | None = None,
    draws: int | None = None,
) -> az.InferenceData:
    """Make the result of ``pm.sample(step=dp_step, ...)`` safe to share, and label it.

    It labels only what it has verified. Refused with :class:`~pymc_dp.errors.PrivacyLeakError`:

    * sample stats that the DP step does not produce (``lp``, ``tree_depth``, ``sampler_0__…``:
      the draws came from, or together with, a non-DP sampler such as NUTS);
    * posterior variables that are not the model's free variables or data-free deterministics
      (a ``pm.Deterministic`` that reads row data is stored without noise);
    * a ``log_likelihood`` group (every row's exact log-likelihood at every draw).

    The groups that PyMC always writes with the raw data (``observed_data``, ``constant_data``)
    are dropped, then the privacy metadata (:func:`privacy_metadata`) are written on
    ``posterior`` and ``sample_stats`` (and their warm-up groups). ``chains``, ``tune`` and
    ``draws`` default to what the InferenceData records (``tuning_steps`` attribute, chain and
    draw dimensions). What cannot be verified from the InferenceData (e.g. another pm.sample run
    on the same data under a different budget) is listed in ``docs/limitations.md``.
    """
    if "posterior" not in group_names(idata):
        raise InvalidParameterError("idata has no posterior group: pass pm.sample's result.")
    _verify_groups(idata, step)
    posterior = idata.posterior
    chains = int(posterior.sizes["chain"]) if chains is None else int(chains)
    draws = int(posterior.sizes["draw"]) if draws is None else int(draws)
    if tune is None:
        tune = posterior.attrs.get("tuning_steps")
        if tune is None:
            raise InvalidParameterError(
                "The InferenceData does not record its tuning steps: pass tune=... (per chain)."
            )
    _verify_spend(idata, step, chains=chains, iterations=int(tune) + draws)
    for group in PRIVATE_GROUPS:
        if group in group_names(idata):
            del idata[group]
    meta = privacy_metadata(step, chains=chains, tune=int(tune), draws=draws)
    for group in _LABELLED_GROUPS:
        if group in group_names(idata):
            idata[group].attrs.update(meta)
    return idata


_LABELLED_GROUPS = ("posterior", "sample_stats", "warmup_posterior", "warmup_sample_stats")


def _verify_groups(idata: az.InferenceData, step: Any) -> None:
    """Refuse an InferenceData that holds anything a DP step's release does not (see above)."""
    from pymc_dp.step_methods.base import DPStep

    if not isinstance(step, DPStep):
        raise InvalidParameterError(
            f"step must be the pymc_dp step that produced idata, got {type(step).__name__}."
        )
    groups = set(group_names(idata))
    if "log_likelihood" in groups:
        raise PrivacyLeakError(
            "idata has a log_likelihood group: every row's exact log-likelihood at every draw, "
            "computed without noise. It cannot be labelled as a DP release; sample again "
            "without idata_kwargs={'log_likelihood': True} (pymc_dp.sample refuses it)."
        )
    if "sample_stats" not in groups:
        raise PrivacyLeakError(
            "idata has no sample_stats group, so it cannot be verified as the output of a "
            f"{type(step).__name__}. Pass the InferenceData returned by pm.sample(step=step)."
        )
    missing = sorted(set(step.stats_dtypes_shapes) - set(idata["sample_stats"].data_vars))
    if missing:
        raise PrivacyLeakError(
            f"idata.sample_stats lacks {missing}, which {type(step).__name__} records at every "
            "iteration: these draws were not produced by this step."
        )
    _refuse_unknown(
        idata,
        ("sample_stats", "warmup_sample_stats"),
        set(step.stats_dtypes_shapes),
        f"which {type(step).__name__} does not produce: the draws come from (or together with) "
        "another sampler, such as NUTS, that reads the raw data without noise and stores exact "
        "log-densities. Sample with step=<the DP step> alone (pymc_dp.sample).",
    )
    model = step.model
    if model is None:
        raise InvalidParameterError(
            "This step is a copy without its model (it was pickled). Call "
            "attach_privacy_metadata with the step object built in this session."
        )
    step.check_deterministics()
    known = {rv.name for rv in model.free_RVs}
    known |= {v.name for v in model.value_vars}
    known |= {d.name for d in model.deterministics}
    _refuse_unknown(
        idata,
        ("posterior", "warmup_posterior"),
        known,
        "which are not free variables or deterministics of the step's model, so they cannot "
        "be verified as private.",
    )


def _verify_spend(idata: az.InferenceData, step: Any, *, chains: int, iterations: int) -> None:
    """The draws' own record of ε must be this step's, and its ledger must have paid for them.

    Each iteration stores the chain's ``epsilon_spent`` as the step's accountant computes it
    from the step's privacy parameters; at the last draw it must equal what this step's
    parameters give for ``iterations``. The step's budget must hold reservations of this cost
    for at least ``chains × iterations`` iterations (of each stage's cost, under a step-size
    schedule).
    """
    recorded = idata["sample_stats"]["epsilon_spent"].values[..., -1]
    expected = step._spent(iterations)["epsilon_spent"]
    if not np.allclose(recorded, expected, rtol=1e-6, atol=1e-12):
        raise PrivacyLeakError(
            f"The draws record ε = {np.max(recorded):.6g} spent per chain, but "
            f"{type(step).__name__} with its privacy parameters spends ε = {expected:.6g} in "
            f"{iterations} iterations: these draws were produced by another step (or with "
            "other tune/draws). Label them with the step that produced them."
        )
    history = step.budget.history()
    for cost, count in step.chain_spending(0, iterations):  # one pair, or one per stage
        paid = sum(e.iterations for e in history if e.cost == cost)
        if paid < chains * count:
            raise PrivacyLeakError(
                f"The budget of this step has reservations for {paid} iterations of its cost "
                f"({cost.describe()}), fewer than the {chains} × {count} these draws need: they "
                "were not produced under this budget. Label them with the step (and budget) "
                "that produced them."
            )


def _refuse_unknown(idata: Any, groups: tuple[str, ...], allowed: set[str], why: str) -> None:
    for group in groups:
        if group in group_names(idata):
            unknown = sorted(set(idata[group].data_vars) - allowed)
            if unknown:
                raise PrivacyLeakError(f"idata.{group} holds {unknown}, {why}")


def privacy_report(idata: az.InferenceData, *, show: bool = True) -> dict[str, Any]:
    """Print a human summary of the privacy metadata in ``idata`` and return it as a dict.

    Warnings come first: fast research noise (``secure_noise=False``), then non-private
    diagnostics (the release is not differentially private), then reproducible (seeded) DP
    noise, which is for tests and research only.
    """
    source = None
    for group in ("posterior", "sample_stats"):
        if group in group_names(idata) and "dp_step" in idata[group].attrs:
            source = idata[group].attrs
            break
    if source is None:
        raise InvalidParameterError(
            "This InferenceData carries no pymc_dp privacy metadata: sample with "
            "pymc_dp.sample, or call pymc_dp.attach_privacy_metadata(idata, step)."
        )
    meta = {k: _plain(v) for k, v in source.items() if k.startswith("dp_")}
    lines = []
    if meta.get("dp_secure_noise") == 0:
        lines.append(
            "NOT SECURE: fast research noise (secure_noise=False: NumPy's PCG64, releases not "
            "snapped); do not publish this release."
        )
    if meta.get("dp_nonprivate_diagnostics"):
        lines.append("NOT DIFFERENTIALLY PRIVATE: this release contains non-private diagnostics.")
    if meta.get("dp_noise_reproducible"):
        lines.append("WARNING: the DP noise was seeded (noise_rng); do not publish this release.")
    lines += [
        f"{meta['dp_step']}: (ε = {meta['dp_epsilon_spent']:.4g}, δ = {meta['dp_delta']:g})-DP "
        f"release of {meta['dp_chains']} chain(s) × {meta['dp_iterations_per_chain']} "
        f"iterations ({meta['dp_tune_per_chain']} tune + {meta['dp_draws_per_chain']} draws)",
        f"budget: ε = {meta['dp_epsilon']:g} at δ = {meta['dp_delta']:g}; spent under it so far "
        f"(all releases on its ledger): ε = {meta['dp_budget_epsilon_spent_total']:.4g}",
        f"accountant: {meta['dp_accountant']}"
        + (
            f"; μ = {meta['dp_mu_spent']:.6g} ({meta['dp_mu_per_iteration']:.6g} per iteration)"
            if "dp_mu_spent" in meta
            else ""
        ),
        f"data: n = {meta['dp_n_rows']} rows; neighbouring datasets: "
        f"{meta['dp_neighbouring_relation']}",
    ]
    phases = [k[len("dp_phase_") : -len("_epsilon")] for k in meta if k.endswith("_epsilon")]
    phases = [p for p in phases if f"dp_phase_{p}_mu" in meta]
    if phases:
        lines.append(
            "by phase (each alone; together they compose to the ε above): "
            + "; ".join(
                f"{p.replace('_', ' ')} ε = {meta[f'dp_phase_{p}_epsilon']:.3g} "
                f"(μ = {meta[f'dp_phase_{p}_mu']:.3g})"
                for p in phases
            )
        )
    skip = {
        "dp_step",
        "dp_epsilon",
        "dp_delta",
        "dp_epsilon_spent",
        "dp_budget_epsilon_spent_total",
        "dp_chains",
        "dp_iterations_per_chain",
        "dp_tune_per_chain",
        "dp_draws_per_chain",
        "dp_accountant",
        "dp_mu_spent",
        "dp_mu_per_iteration",
        "dp_n_rows",
        "dp_neighbouring_relation",
        "dp_ledger_head",
        *(k for k in meta if k.startswith("dp_phase_")),
    }
    params = ", ".join(f"{k[3:]}={v}" for k, v in meta.items() if k not in skip)
    lines.append(f"parameters: {params}")
    lines.append(check_convergence(idata).summary())  # from the released draws: free
    if show:
        print("\n".join(lines))
    return meta


def _plain(value: Any) -> Any:
    """netCDF hands attributes back as NumPy scalars: return Python ones."""
    if hasattr(value, "item"):
        return value.item()
    return value
