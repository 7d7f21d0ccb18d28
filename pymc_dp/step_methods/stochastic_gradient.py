"""``DPSGLD``, ``DPSGNHT`` and ``DPSGHMC``: the stochastic-gradient samplers (theory §4.5).

Each gradient is a noisy clipped sum over a secret batch
(:class:`~pymc_dp.mechanisms.MinibatchGradientRelease`), accounted as a subsampled Gaussian
(fixed-size batches without replacement, substitute relation, tight PLD). The dynamics' own noise
is the DP noise, so the step size sets the noise multiplier of each release
(:func:`~pymc_dp.kernels.stochastic_gradient.diffusion_noise_multiplier`) and the budget sets
how many releases a run may make. The updates are in
:mod:`pymc_dp.kernels.stochastic_gradient`.

These samplers have **no accept/reject step**: their draws follow the posterior only as the
step size goes to zero, and the batch noise adds bias on top. Use them to compare DP samplers;
for inference prefer :class:`~pymc_dp.DPPenalty` or :class:`~pymc_dp.DPHMC`, whose chains
target the posterior exactly when nothing is clipped.

A decreasing step size (``step_size_decay``) follows ``η_t = η (1 + t/t₀)^{-γ}`` in stages of
constant step (:class:`~pymc_dp.kernels.stochastic_gradient.StepSizeSchedule`): each stage's
releases have a larger noise multiplier than the last, a chain reserves all its stages in one
atomic ledger transaction, and the budget buys more iterations than at the constant step ``η``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pymc_dp.accounting.costs import PrivacyCost, compose
from pymc_dp.errors import InvalidParameterError
from pymc_dp.kernels.stochastic_gradient import (
    SGMechanisms,
    SGState,
    StepSizeSchedule,
    diffusion_noise_multiplier,
    sghmc_kernel,
    sgld_kernel,
    sgnht_kernel,
)
from pymc_dp.mechanisms import MinibatchGradientRelease, check_batch_rows
from pymc_dp.step_methods.base import DPStep
from pymc_dp.step_methods.options import check_batch_size, check_positive_int, positive_float

__all__ = ["DPSGHMC", "DPSGLD", "DPSGNHT"]

_COMMON_PARAMETERS = """
    vars : list, optional
        Must be every free variable (the default); anything else is refused.
    budget : PrivacyBudget
        The (ε, δ) budget; every gradient release is one subsampled Gaussian event in its
        ledger (tight PLD), tuning iterations included.
    step_size : float
        ``η``; the time step is ``h = η / n`` (the convention of the DP-HMC paper's
        experiments: the posterior's variance shrinks like ``1/n``, so ``η`` carries over
        between data sizes). It fixes the noise of each gradient release, hence its privacy
        cost. No accept/reject step corrects a step that is too large: check the draws.
    grad_clip : float
        ``C``: per-row bound on ``‖∇_θ ℓ_i(θ)‖₂`` in the sampler's (unconstrained) space.
    batch_size : int
        ``b``: rows per gradient, drawn secretly without replacement (``2 ≤ b ≤ n``).
    step_size_decay : float
        ``γ`` in ``[0, 1]``: the step size at a chain's iteration ``t`` (tuning included) is
        ``η (1 + t/t₀)^{-γ}``, followed in stages of constant step ``η · 2^{-k/2}`` (less than
        41 % above the formula). Default 0: the constant step ``η`` (the DP-HMC paper's choice).
        A smaller step releases with more noise, so the same budget buys more iterations; the
        stats' ``step_size`` shows the step each draw used.
    decay_offset : float, optional
        ``t₀ > 0`` in iterations (default 100 when ``step_size_decay > 0``): the step has
        fallen to ``2^{-γ} η`` at ``t = t₀``.
    init_share : float, optional
        Share of the budget's Gaussian capacity spent on a private initialisation (theory
        §7) that moves the start from PyMC's initial point into the bulk of the posterior;
        default none: chains start where PyMC starts them.
    noise_rng : int, optional
        Seed for reproducible DP noise and batches (tests, research). Default: OS entropy.
    secure_noise : bool
        Default True: DP noise and secret batches from the operating system's cryptographic
        generator, each release snapped to a public grid (docs: security). ``False`` is a fast
        research mode (NumPy's PCG64, no snapping), recorded in the metadata and flagged by
        :func:`~pymc_dp.privacy_report`.
    nonprivate_diagnostics : bool
        Also store ``grad_clipped_fraction`` (share of batch rows whose gradient was clipped)
        per iteration. Computed without noise: the release is then **not** DP.
    compile_kwargs : dict, optional
        ``{"mode": "JAX"}`` compiles the per-row likelihood functions (the passes over the
        data) with JAX instead of PyTensor's default backend: faster passes for heavy
        likelihoods, and a GPU when JAX has one (needs ``pip install jax``). Only ``mode`` is
        read.
    centre_hierarchies : bool
        Default True: a non-centred hierarchy (``z ~ N(0, 1)`` entering the model as
        ``mu + sigma * z``) is sampled in its centred coordinates ``a = mu + sigma * z``, a
        change of variables of the parameters that reads no data; the draws are reported as
        ``z``, like any other step's (docs: theory, "Non-centred hierarchies"). False samples
        the model's own coordinates."""


class _StochasticGradientStep(DPStep):
    """What the three samplers share: the release, the time step, stats and metadata."""

    _nonprivate_stats: ClassVar[dict] = {"grad_clipped_fraction": (np.float64, [])}
    stats_dtypes_shapes: ClassVar[dict] = {
        "jump": (np.float64, []),
        "step_size": (np.float64, []),
        "diverging": (bool, []),
        "mu_spent": (np.float64, []),
        "epsilon_spent": (np.float64, []),
    }
    _privacy_parameters: ClassVar[frozenset[str]] = DPStep._privacy_parameters | {
        "step_size",
        "grad_clip",
        "batch_size",
        "_release",
        "schedule",
    }
    #: ``D`` of the noise ``N(0, 2 D h)`` the dynamics need (subclasses)
    _diffusion_name: ClassVar[str | None] = None
    #: gradient releases per iteration
    n_steps: int = 1

    def __init__(
        self,
        vars: Any = None,
        *,
        budget: Any,
        step_size: float,
        grad_clip: float,
        batch_size: int,
        step_size_decay: float = 0.0,
        decay_offset: float | None = None,
        init_share: float | None = None,
        model: Any = None,
        noise_rng: int | None = None,
        secure_noise: bool = True,
        row_data: Any = None,
        nonprivate_diagnostics: bool = False,
        blocked: bool = True,
        rng: Any = None,
        compile_kwargs: dict[str, Any] | None = None,
        centre_hierarchies: bool = True,
    ) -> None:
        self.step_size = positive_float(step_size, "step_size")
        self.grad_clip = positive_float(grad_clip, "grad_clip")
        self.batch_size = check_batch_size(batch_size)
        self.schedule = _schedule(step_size_decay, decay_offset)
        self._stage_releases: dict[int, MinibatchGradientRelease] = {}
        super().__init__(
            vars,
            budget=budget,
            model=model,
            noise_rng=noise_rng,
            secure_noise=secure_noise,
            row_data=row_data,
            nonprivate_diagnostics=nonprivate_diagnostics,
            blocked=blocked,
            rng=rng,
            compile_kwargs=compile_kwargs,
            centre_hierarchies=centre_hierarchies,
            init_share=init_share,
        )
        check_batch_rows(self.batch_size, self._channel.n_rows)
        self._complete_build()

    # ---------------------------------------------------------------- the release

    @property
    def time_step(self) -> float:
        """``h = η / n`` (the first stage's under a schedule)."""
        return self.step_size / self._channel.n_rows

    def _stage(self, iteration: int) -> int:
        return 0 if self.schedule is None else self.schedule.stage(iteration)

    def _stage_factor(self, stage: int) -> float:
        return 1.0 if self.schedule is None else self.schedule.factor(stage)

    def _stage_release(self, stage: int) -> MinibatchGradientRelease:
        """The gradient release of a schedule's stage ``k``: time step ``h 2^{-k/2}``."""
        if stage == 0:
            return self._release
        if stage not in self._stage_releases:
            self._stage_releases[stage] = MinibatchGradientRelease(
                self._channel,
                batch_size=self.batch_size,
                grad_clip=self.grad_clip,
                noise_multiplier=self._noise_multiplier(self.time_step * self._stage_factor(stage)),
                count_clipped=self.nonprivate_diagnostics,
            )
        return self._stage_releases[stage]

    @property
    def uniform_cost(self) -> bool:
        return self.schedule is None

    def chain_spending(self, first: int, last: int) -> list[tuple[PrivacyCost, int]]:
        """One ``(cost, iterations)`` pair per stage of the step-size schedule."""
        if self.schedule is None:
            return super().chain_spending(first, last)
        return [
            (compose((self._stage_release(k).event, self.n_steps)), count)
            for k, count in self.schedule.stages(first, last)
        ]

    def _diffusion(self) -> float:
        return 1.0

    @property
    def noise_multiplier(self) -> float:
        """``z`` of each gradient release (the first stage's under a schedule): the one whose
        noise is the dynamics' own."""
        return self._noise_multiplier(self.time_step)

    def _noise_multiplier(self, time_step: float) -> float:
        return diffusion_noise_multiplier(
            time_step=time_step,
            diffusion=self._diffusion(),
            batch_size=self.batch_size,
            n_rows=self._channel.n_rows,
            grad_clip=self.grad_clip,
        )

    def _build_mechanisms(self, noise_scale: float | None) -> None:
        self._release = MinibatchGradientRelease(
            self._channel,
            batch_size=self.batch_size,
            grad_clip=self.grad_clip,
            noise_multiplier=self.noise_multiplier,
            count_clipped=self.nonprivate_diagnostics,
        )

    def _events(self) -> list:
        return [(self._release.event, self.n_steps)]

    def _now(self) -> tuple[float, SGMechanisms, float]:
        """This iteration's time step, mechanisms and step size ``η_t`` (its stage's)."""
        stage = self._stage(self._iteration)
        factor = self._stage_factor(stage)
        mechanisms = SGMechanisms(
            self.space.logprior_grad,
            self._stage_release(stage),
            self._channel.n_rows / self.batch_size,
        )
        return self.time_step * factor, mechanisms, self.step_size * factor

    def _stats(self, info: Any, step_size: float) -> dict[str, Any]:
        stats = {"jump": info.jump, "step_size": step_size, "diverging": info.diverging}
        if self.nonprivate_diagnostics:  # NOT private
            stats["grad_clipped_fraction"] = info.n_clipped / (self.batch_size * self.n_steps)
        return stats

    def privacy_metadata(self) -> dict[str, Any]:
        meta = super().privacy_metadata()
        meta.update(
            dp_step_size=self.step_size,
            dp_time_step=self.time_step,
            dp_grad_clip=self.grad_clip,
            dp_noise_multiplier=self._release.noise_multiplier,
            dp_batch_size=self.batch_size,
            dp_sampling=MinibatchGradientRelease.sampling,
            dp_gradient_releases_per_iteration=self.n_steps,
            dp_accept_reject="none (biased: exact only as the step size goes to 0)",
            dp_step_size_schedule="constant"
            if self.schedule is None
            else self.schedule.describe("step_size"),
        )
        if self.schedule is not None:
            meta.update(
                dp_step_size_decay=self.schedule.decay, dp_decay_offset=self.schedule.offset
            )
        if self._diffusion_name is not None:
            meta[f"dp_{self._diffusion_name}"] = self._diffusion()
        return meta


class DPSGLD(_StochasticGradientStep):
    __doc__ = f"""Differentially private stochastic gradient Langevin dynamics (theory §4.5).

    Each iteration draws a secret batch of ``b`` rows and moves
    ``θ ← θ + h (∇log p(θ) + (n/b) G̃)``, ``G̃ = Σ_{{i∈B}} clip_C(∇ℓ_i(θ)) + N(0, σ² I)``, with
    ``σ = (b/n) √(2/h)``: the DP noise is exactly the Langevin noise ``N(0, 2h)``, so one
    release has noise multiplier ``z = (b/n) √(2/h) / (2C)`` and the budget decides how many
    iterations run. No accept/reject step: biased for ``h > 0`` (for a Gaussian posterior of
    variance ``s²`` and full batches, the draws' variance is ``s² / (1 − h/(2s²))``).

    Parameters
    ----------{_COMMON_PARAMETERS}
    """

    name = "dp_sgld"

    def _iterate(self, theta: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        time_step, mechanisms, step_size = self._now()
        state, info = sgld_kernel(SGState(theta), time_step, mechanisms)
        return state.theta, self._stats(info, step_size)


class DPSGNHT(_StochasticGradientStep):
    __doc__ = f"""Differentially private stochastic gradient Nosé–Hoover thermostat (theory §4.5).

    Momentum ``p`` and thermostat ``ξ`` (``p₀ ~ N(0, I)``, ``ξ₀ = A``) are carried from one
    iteration to the next: ``p ← p − h ξ p + h (∇log p(θ) + (n/b) G̃)``, ``θ ← θ + h p``,
    ``ξ ← ξ + h (pᵀp/d − 1)`` (Ding et al. 2014). The release's noise is the thermostat's
    diffusion ``N(0, 2Ah)``: ``z = (b/n) √(2A/h) / (2C)``. The thermostat absorbs the batch
    noise that the diffusion does not account for. No accept/reject step.

    Parameters
    ----------{_COMMON_PARAMETERS}
    diffusion : float
        ``A``: the injected diffusion (and the thermostat's start). Larger ``A`` means more
        noise per release, so more releases per budget, and more friction.
    """

    name = "dp_sgnht"
    _diffusion_name = "diffusion"
    stats_dtypes_shapes: ClassVar[dict] = {
        **_StochasticGradientStep.stats_dtypes_shapes,
        "thermostat": (np.float64, []),
    }
    _chain_state: ClassVar[tuple[str, ...]] = (*DPStep._chain_state, "_momentum", "_thermostat")
    _privacy_parameters: ClassVar[frozenset[str]] = _StochasticGradientStep._privacy_parameters | {
        "diffusion"
    }

    def __init__(self, vars: Any = None, *, diffusion: float = 1.0, **kwargs: Any) -> None:
        self.diffusion = positive_float(diffusion, "diffusion")
        super().__init__(vars, **kwargs)

    def _diffusion(self) -> float:
        return self.diffusion

    def _reset_adaptation(self) -> None:
        self._momentum: np.ndarray | None = None  # drawn at the chain's first iteration
        self._thermostat = self.diffusion

    def _iterate(self, theta: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        if self._momentum is None:  # public: independent of the data
            self._momentum = self.rng.standard_normal(self.space.ndim)
            self._thermostat = self.diffusion
        state = SGState(theta, self._momentum, self._thermostat)
        time_step, mechanisms, step_size = self._now()
        state, info = sgnht_kernel(state, time_step, self.diffusion, mechanisms)
        self._momentum, self._thermostat = state.momentum, state.thermostat
        return state.theta, {**self._stats(info, step_size), "thermostat": state.thermostat}


class DPSGHMC(_StochasticGradientStep):
    __doc__ = f"""Differentially private stochastic gradient HMC with friction (theory §4.5).

    Each iteration draws ``p ~ N(0, I)`` and takes ``n_steps`` (``J``) steps
    ``p ← p + h (∇log p(θ) + (n/b) G̃) − h F p``, ``θ ← θ + h p`` (momentum first: every
    release moves ``θ``), each with its own secret batch
    and release (``J`` subsampled Gaussian events per iteration). The release's noise is the
    friction's ``N(0, 2Fh)`` (Chen, Fox & Guestrin 2014 with ``B̂ = 0``):
    ``z = (b/n) √(2F/h) / (2C)``. Friction removes momentum, and position and momentum use the
    same ``h``: the SGHMC thesis' printed algorithm has the opposite friction sign, an ``h``
    noise scaling where its accounting uses ``√h``, and two step sizes; theory §4.5 explains
    the choices. No accept/reject step.

    Parameters
    ----------{_COMMON_PARAMETERS}
    friction : float
        ``F``: friction, and the injected diffusion ``N(0, 2Fh)``.
    n_steps : int
        ``J``: steps (and gradient releases) per iteration.
    """

    name = "dp_sghmc"
    _diffusion_name = "friction"
    _privacy_parameters: ClassVar[frozenset[str]] = _StochasticGradientStep._privacy_parameters | {
        "friction",
        "n_steps",
    }

    def __init__(
        self, vars: Any = None, *, friction: float = 1.0, n_steps: int = 10, **kwargs: Any
    ) -> None:
        self.friction = positive_float(friction, "friction")
        self.n_steps = check_positive_int(n_steps, "n_steps")
        super().__init__(vars, **kwargs)

    def _diffusion(self) -> float:
        return self.friction

    def _iterate(self, theta: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        time_step, mechanisms, step_size = self._now()
        state, info = sghmc_kernel(
            SGState(theta), time_step, self.friction, self.n_steps, self.rng, mechanisms
        )
        return state.theta, self._stats(info, step_size)


def _schedule(decay: Any, offset: Any) -> StepSizeSchedule | None:
    """The step-size schedule of ``step_size_decay``/``decay_offset`` (``None``: constant)."""
    if isinstance(decay, bool) or not isinstance(decay, int | float | np.integer | np.floating):
        raise InvalidParameterError(
            f"step_size_decay must be a number in [0, 1], got {decay!r}. Use 0 for a constant "
            "step size, or e.g. step_size_decay=0.55 (Welling & Teh's range is 0.5 to 1)."
        )
    if not 0.0 <= float(decay) <= 1.0:
        raise InvalidParameterError(
            f"step_size_decay must be in [0, 1], got {decay!r}: the step size "
            "step_size * (1 + t/decay_offset)**-step_size_decay must not grow, and decaying "
            "faster than 1/t stops the chain from exploring. Use e.g. step_size_decay=0.55."
        )
    if float(decay) == 0.0:
        if offset is not None:
            raise InvalidParameterError(
                "decay_offset applies only with step_size_decay > 0 (a decreasing step size); "
                "give step_size_decay too, or leave decay_offset out."
            )
        return None
    offset = 100.0 if offset is None else positive_float(offset, "decay_offset")
    return StepSizeSchedule(decay=float(decay), offset=offset)
