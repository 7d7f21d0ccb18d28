"""``DPHMC``: differentially private Hamiltonian Monte Carlo (theory §4.3) as a PyMC step method."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pymc_dp.accounting import compose
from pymc_dp.accounting.costs import GaussianCost
from pymc_dp.errors import InvalidParameterError
from pymc_dp.kernels.hmc import HMCMechanisms, HMCParams, HMCState, hmc_kernel
from pymc_dp.mechanisms import (
    CentredGradientRelease,
    CentredLLRRelease,
    GradientRelease,
    LLRRelease,
)
from pymc_dp.releases import Release, RemainderScale
from pymc_dp.step_methods.adaptation import DualAverage, MassWindows
from pymc_dp.step_methods.base import DEFAULT_CHAINS, DPStep, _given_length
from pymc_dp.step_methods.centred import CentredSampling
from pymc_dp.step_methods.initialization import PrivateStart
from pymc_dp.step_methods.options import (
    check_flag,
    check_fraction,
    check_positive_int,
    check_temperature,
    noise_multiplier_from,
    positive_float,
)

__all__ = ["DPHMC"]

_DEFAULT_N_STEPS = 3
_DEFAULT_STEP_SIZE = 0.5  # divided by d^(1/4), with the mass from the private scale
# Automatic noise (budget-first): the released ratio's noise at a typical trajectory's jump, in
# nats, and each gradient release's noise per coordinate in units of the posterior's gradient
# one sd from the mode. Scaled together by the calibration.
_TARGET_RATIO_NOISE = 2.0
_TARGET_GRAD_NOISE = 1.0
_DEFAULT_JITTER = 0.15  # η · Uniform(0.85, 1.15), as PyMC's HamiltonianMC
# Dual averaging sees 0/1 acceptance flags, not acceptance probabilities: with Stan's γ = 0.05
# the log step fluctuates by about 1 and the averaged step ends up accepting ~0.1 above target
# (measured on the Gaussian model); γ = 0.3 damps the fluctuation.
_DUAL_AVERAGING_GAMMA = 0.3
_FINAL_STEP_SIZE_ONLY = (
    100  # tuning iterations after the last mass window (Stan's term_buffer is 50)
)
#: With the control variate (centred releases), in the metric of the private posterior
#: covariance Σ̂: the default step size (divided by d^(1/4)), the released ratio's noise aimed
#: at (nats, at a typical trajectory), the energy error the gradients' noise may add over a
#: trajectory (nats, at a typical point), and the default chain length.
_CENTRED_STEP_SIZE = 1.0
_TARGET_CENTRED_RATIO_NOISE = 1.0
_TARGET_CENTRED_GRAD_ENERGY = 0.5
_CENTRED_CHAIN_LENGTH = 500
#: Effective draws per draw of a centred chain at its target noise, per squared trajectory
#: duration ``(L η)²`` (in posterior sd): the smallest bulk ESS per draw over 4 chains of 500
#: iterations, ε = 5, divided by ``(L η)²``, was 0.04–0.16 (median 0.12) on eleven zoo and
#: survey runs, d = 4–54, n = 10⁵–10⁶ (d = 4: ``(L η)² = 4.5``, d = 54: 1.2; a short
#: trajectory moves about as far as a random walk with that step). 0.08 keeps every one of
#: those runs at or above half its prediction (the 50-group hierarchy at 1.08; before, a
#: constant 0.35 per draw put it at 0.30).
_CENTRED_ESS_PER_SQUARED_DURATION = 0.08
#: Public Monte Carlo draws for the typical bounds of a trajectory.
_TYPICAL_SAMPLES = 2000


class DPHMC(CentredSampling, DPStep):
    """Differentially private Hamiltonian Monte Carlo (theory §4.3).

    ``DPHMC(budget=budget)`` with no other argument chooses everything privately (theory §7)
    and centres its releases at the private mode (``control_variate``).

    Each iteration runs ``L`` leapfrog steps with ``L + 1`` fresh noisy clipped gradient
    releases ``T · (Σ_i clip_{b_g}(∇ℓ_i(θ)) + N(0, (2 z_g b_g)² I))`` and accepts with the noisy
    penalty test on the clipped log-likelihood ratio (noise ``σ_l = z_l · 2 T b_l ‖θ' − θ‖₂``,
    accept iff ``log U < ΔH + ξ − σ_l²/2``). Privacy per iteration: ``L + 2`` Gaussian
    mechanisms, PLD parameter ``μ = 1/(2 z_l²) + (L+1)/(2 z_g²)``. The chain targets the exact
    posterior when no ratio is clipped; clipped or noisy gradients only lower acceptance.

    Parameters
    ----------
    vars : list, optional
        Must be every free variable (the default).
    budget : PrivacyBudget
        The (ε, δ) budget every chain reserves its iterations from (tuning included).
    step_size : float, optional
        Leapfrog step size ``η`` (initial value when ``adapt_step_size``). Default with a
        private initialisation: ``0.5 / d^{1/4}`` in the metric of its posterior scale
        (``1 / d^{1/4}`` in the metric of the private posterior covariance with the centred
        releases); needed when every privacy setting is explicit.
    n_steps : int, optional
        Leapfrog steps ``L`` per iteration (default 3); each makes ``L + 1`` gradient releases.
    grad_clip : float or "auto"
        ``b_g``: per-row gradient norm bound. ``"auto"`` (the default): a preconditioned bound on
        ``‖D ∇ℓ_i‖`` chosen by the private initialisation, ``D`` putting every coordinate's
        per-row gradients on one scale (theory §2, §7).
    llr_clip : float or "auto"
        ``b_l``: per-row log-likelihood-ratio bound per unit jump length ``‖θ' − θ‖₂``;
        ``"auto"`` as for :class:`DPPenalty`.
    grad_noise_multiplier, tau_g : float, optional
        ``z_g``, or the seeds' ``τ_g`` with ``z_g = τ_g √n``. At most one.
    llr_noise_multiplier, tau_l : float, optional
        ``z_l``, or ``τ_l`` with ``z_l = τ_l √n``. At most one. Give both noise multipliers or
        neither: then both are calibrated together so that the planned chains spend what is
        left of the budget exactly.
    mass_diag : array, optional
        Diagonal of the mass matrix ``M``: the momentum is ``N(0, M)``. Default: the inverse of
        the private posterior covariance (dense) with the centred releases, else the inverse of
        the private initialisation's posterior variances, or ones without one. Giving it (or
        ``adapt_mass=True``) turns the centred releases off.
    step_jitter : bool or float
        Multiply ``η`` by ``Uniform(1 − j, 1 + j)`` each iteration (``j = 0.15`` for ``True``,
        as PyMC's ``HamiltonianMC``). Data-independent, so exactness is kept.
    adapt_step_size : bool
        During tuning, dual averaging of ``η`` toward ``target_accept`` from the acceptance flags.
    adapt_mass : bool, optional
        Default: True with explicit settings, False with a private initialisation (its scale
        is better than one from a few noisy tuning draws). During tuning, set ``M⁻¹`` to the
        variance of the chain's own tuning draws in doubling
        windows after 75 iterations, the last one closing 100 iterations before the end of
        tuning when the tuning length is known (Stan's scheme; plan with ``sampling_kwargs``).
        Both adaptations are post-processing of released values and cost no privacy; tuning
        iterations still spend budget.
    target_accept : float
        Acceptance rate the step size is tuned toward (default 0.65, the optimum of HMC in high
        dimension, Beskos et al. 2013).
    temperature : float
        ``T ∈ (0, 1]``.
    control_variate : bool
        Default True: on the fully automatic step (no clip, noise multiplier, ``mass_diag``,
        ``adapt_mass=True`` or ``init_share=0`` given), every release is centred at the private mode
        (theory §4.3, "centred releases"): one gradient release there, ``Ĝ``, pays for the
        first-order term once; each leapfrog gradient releases only the rows' gradients less their
        gradients at the centre (clip ``h ‖u‖``, ``u`` the offset from the centre in posterior sd),
        and the test the centred ratio of :class:`DPPenalty`. The leapfrog then runs in the dense
        metric of the private posterior covariance. At n = 10⁵ this is hundreds of times less noise
        per release for the same budget. The target is the posterior tilted by ``Ĝ``'s noise, as for
        :class:`DPPenalty` (``dp_centre_shift_sd``). False: the plain releases of the DP HMC paper.
    noise_aware : bool
        Default True, with the centred releases: the draws are reported widened for the
        centre release's noise, as :class:`DPPenalty`'s (theory §4.1, "noise-aware draws").
    init_share : float, optional
        Share of the budget's Gaussian capacity spent on the private initialisation (theory
        §7). Default 0.1 when a setting is automatic; 0 turns it off.
    noise_rng : int, optional
        Seed for reproducible DP noise (tests, research). Default: OS entropy.
    secure_noise : bool
        Default True: DP noise and secret batches from the operating system's cryptographic
        generator, each release snapped to a public grid (docs: security). ``False`` is a fast
        research mode (NumPy's PCG64, no snapping), recorded in the metadata and flagged by
        :func:`~pymc_dp.privacy_report`.
    nonprivate_diagnostics : bool
        Also store, per iteration, the share of per-row gradients clipped (over the
        iteration's gradient releases) and of ratios clipped. Computed from the data without
        noise: the release is then **not** DP, and the privacy metadata say so.
    compile_kwargs : dict, optional
        ``{"mode": "JAX"}`` compiles the per-row likelihood functions (the passes over the data)
        with JAX instead of PyTensor's default backend: faster passes for heavy likelihoods, and
        a GPU when JAX has one (needs ``pip install jax``). Only ``mode`` is read.
    centre_hierarchies : bool
        Default True: a non-centred hierarchy (``z ~ N(0, 1)`` entering the model as
        ``mu + sigma * z``) is sampled in its centred coordinates ``a = mu + sigma * z``, a
        change of variables of the parameters that reads no data; the draws are reported as
        ``z``, like any other step's (docs: theory, "Non-centred hierarchies"). Settings given
        per coordinate (a proposal scale or mass) are then in those coordinates. False samples
        the model's own coordinates.
    """

    name = "dp_hmc"
    # step-size adaptation needs a hundred or so iterations of a chain
    _min_chain_length: ClassVar[int] = 200
    stats_dtypes_shapes: ClassVar[dict] = {
        **DPStep.stats_dtypes_shapes,
        "diverging": (bool, []),
        "step_size": (np.float64, []),
    }
    _centred_chain_length: ClassVar[int] = _CENTRED_CHAIN_LENGTH
    _nonprivate_stats: ClassVar[dict] = {
        "grad_clipped_fraction": (np.float64, []),
        "llr_clipped_fraction": (np.float64, []),
    }
    _chain_state: ClassVar[tuple[str, ...]] = (
        *DPStep._chain_state,
        *("_inv_mass", "_dual", "_windows", "_tuned_step"),
    )
    _privacy_parameters: ClassVar[frozenset[str]] = DPStep._privacy_parameters | {
        "grad_noise_multiplier",
        "llr_noise_multiplier",
        "grad_clip",
        "grad_precond",
        "llr_clip",
        "n_steps",
        "temperature",
        "_release_llr",
        "_release_grad",
        "_centring",
    }

    def __init__(
        self,
        vars: Any = None,
        *,
        budget: Any,
        step_size: float | None = None,
        n_steps: int | None = None,
        grad_clip: float | str = "auto",
        llr_clip: float | str = "auto",
        grad_noise_multiplier: float | None = None,
        tau_g: float | None = None,
        llr_noise_multiplier: float | None = None,
        tau_l: float | None = None,
        mass_diag: Any = None,
        step_jitter: bool | float = True,
        adapt_step_size: bool = True,
        adapt_mass: bool | None = None,
        target_accept: float = 0.65,
        temperature: float = 1.0,
        control_variate: bool = True,
        noise_aware: bool = True,
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
        self._auto_grad_clip = isinstance(grad_clip, str) and grad_clip == "auto"
        self._auto_llr_clip = isinstance(llr_clip, str) and llr_clip == "auto"
        given = [
            (grad_noise_multiplier, tau_g, "grad_noise_multiplier", "tau_g"),
            (llr_noise_multiplier, tau_l, "llr_noise_multiplier", "tau_l"),
        ]
        unset = [m is None and t is None for m, t, _, _ in given]
        if unset[0] != unset[1]:
            raise InvalidParameterError(
                "Give both noise multipliers (grad_noise_multiplier or tau_g, and "
                "llr_noise_multiplier or tau_l), or neither: then both are calibrated so that "
                "the planned run spends the budget exactly."
            )
        self._auto_noise = unset[0]
        if not self._auto_noise:
            for multiplier, tau, name, tau_name in given:  # checked before the (slow) build
                noise_multiplier_from(multiplier, tau, 1, name=name, tau_name=tau_name)
        self._noise_arguments = (grad_noise_multiplier, tau_g, llr_noise_multiplier, tau_l)
        self.grad_precond = None  # the private initialisation's preconditioner, when automatic
        self.step_size = None if step_size is None else positive_float(step_size, "step_size")
        self.n_steps = (
            _DEFAULT_N_STEPS if n_steps is None else check_positive_int(n_steps, "n_steps")
        )
        self.grad_clip = None if self._auto_grad_clip else positive_float(grad_clip, "grad_clip")
        self.llr_clip = None if self._auto_llr_clip else positive_float(llr_clip, "llr_clip")
        self.temperature = check_temperature(temperature)
        self.target_accept = check_fraction(target_accept, "target_accept")
        if isinstance(step_jitter, bool | np.bool_):
            jitter = _DEFAULT_JITTER if step_jitter else 0.0
        else:
            try:
                jitter = float(step_jitter)
            except (TypeError, ValueError):
                jitter = -1.0
        if not 0 <= jitter < 1:
            raise InvalidParameterError(
                f"step_jitter must be True, False or a fraction in [0, 1), got {step_jitter!r}."
            )
        self.step_jitter = jitter
        self.adapt_step_size = check_flag(adapt_step_size, "adapt_step_size")
        self._adapt_mass_argument = adapt_mass
        self.adapt_mass = True if adapt_mass is None else check_flag(adapt_mass, "adapt_mass")
        self._control_variate_argument = check_flag(control_variate, "control_variate")
        self._mass_argument = mass_diag
        self.noise_aware = check_flag(noise_aware, "noise_aware")
        self._centring = None
        self._stretch = None
        self._root = None  # the dense metric W (M⁻¹ = W Wᵀ) with the control variate
        self._typical = None  # (offset, trajectory scale): public, for the plan
        self._typical_at_mode = None  # the same where the chains sample, for the prediction
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
        n = self._channel.n_rows
        if not self._auto_noise:
            g, tg, l_, tl = self._noise_arguments
            self.grad_noise_multiplier = noise_multiplier_from(
                g, tg, n, name="grad_noise_multiplier", tau_name="tau_g"
            )
            self.llr_noise_multiplier = noise_multiplier_from(
                l_, tl, n, name="llr_noise_multiplier", tau_name="tau_l"
            )
        ndim = self.space.ndim
        self.mass_diag = None
        if mass_diag is not None:
            mass = np.asarray(mass_diag, dtype=float)
            if mass.shape not in ((), (ndim,)):
                raise InvalidParameterError(
                    f"mass_diag has shape {mass.shape}; expected ({ndim},), one entry per "
                    f"unconstrained coordinate of {[v.name for v in self.space.value_vars]}."
                )
            mass = np.broadcast_to(mass, (ndim,)).copy()
            if not np.all(np.isfinite(mass) & (mass > 0)):
                raise InvalidParameterError("mass_diag must be positive and finite.")
            self.mass_diag = mass
        if self.step_size is None and not (self.automatic or self.init_share):
            raise InvalidParameterError(
                "step_size is needed when every privacy setting is given explicitly (there is "
                "no private initialisation to derive it from): e.g. step_size=0.1."
            )
        self._complete_build()

    # ---------------------------------------------------------------- automatic settings

    def _automatic_settings(self) -> list[str]:
        names = []
        if self._auto_grad_clip:
            names.append("grad_clip")
        if self._auto_llr_clip:
            names.append("llr_clip")
        if self._auto_noise:
            names += ["grad_noise_multiplier", "llr_noise_multiplier"]
        return names

    def _noise_is_automatic(self) -> bool:
        return self._auto_noise

    def _uses_control_variate(self) -> bool:
        """Centred releases: on the fully automatic step with a private initialisation."""
        return (
            self._control_variate_argument
            and self._auto_grad_clip
            and self._auto_llr_clip
            and self._auto_noise
            and self.init_share != 0
            and self._mass_argument is None  # a given mass or mass adaptation: the plain
            and self._adapt_mass_argument is not True  # releases, with that mass
        )

    def _default_tune_fraction(self) -> float:
        """0.2 with the centred releases (a private start in the bulk and the private
        covariance as the mass: only the step size is tuned), else 0.5."""
        return 0.2 if self._uses_control_variate() else 0.5

    def _refine_initialization(self) -> bool:
        return not self._uses_control_variate()  # the centre's gradient locates the posterior

    def _chain_length(self, chains: int, tune: float | int, draws: int | None) -> int:
        """With the control variate, at most the length the centring planned the split for
        (and at least ``_min_chain_length``, with more noise than the target if need be)."""
        if self._centring is None:
            return super()._chain_length(chains, tune, draws)
        # as many iterations as the rest of the budget buys at the target noise, at most the
        # planned length (with fewer, more noise per release only shortens the steps); longer
        # where draws ask for more
        planned = min(self._budget_length(chains), _CENTRED_CHAIN_LENGTH)
        given = _given_length(tune, draws, planned)
        return planned if given is None else given

    def _centred_step_size(self) -> float:
        """``η`` in the metric of ``Σ̂`` with the control variate (given, or the default)."""
        if self.step_size is not None:
            return self.step_size
        return _CENTRED_STEP_SIZE / self.space.ndim**0.25

    def _typical_bounds(
        self, metric: np.ndarray, centre: np.ndarray, mode: np.ndarray | None = None
    ) -> tuple[float, float]:
        """Root mean squares of the centred bounds per unit clip over typical trajectories.

        Public Monte Carlo over a chain at stationarity in ``N(m, W Wᵀ)`` (``m``: ``mode``,
        where the chains sample, the tilted target's mode; the centre ``θ_c`` by default),
        with the bounds measured from the centre ``θ_c``: the gradient's offset
        ``max_j ‖u_j‖`` (:meth:`~pymc_dp.releases.RemainderScale.offset`) and the ratio's
        scale ``s(θ, θ')`` (:class:`~pymc_dp.releases.RemainderScale`) for ``θ'`` where the
        exact dynamics of that Gaussian take ``θ`` in time ``L η``:
        ``u' = u cos(Lη) + p sin(Lη)``, ``p ~ N(0, I)`` (``u`` whitened about ``m``).
        """
        rng = np.random.default_rng(0)
        d = centre.size
        white = rng.standard_normal((_TYPICAL_SAMPLES, d))
        momentum = rng.standard_normal((_TYPICAL_SAMPLES, d))
        duration = self._centred_step_size() * self.n_steps
        moved = white * np.cos(duration) + momentum * np.sin(duration)
        middle = centre if mode is None else np.asarray(mode, dtype=float)
        theta = middle + white @ metric.T
        theta_new = middle + moved @ metric.T
        scale = RemainderScale(
            metric, centre, self._channel.likelihood_coordinates, self._channel.row_blocks
        )
        offset = float(np.sqrt(np.mean(np.square(scale.offset(theta)))))
        trajectory = float(np.sqrt(np.mean(np.square(scale(theta, theta_new)))))
        return offset, trajectory

    def _centred_noise_multipliers(
        self, remainder_clip: float, typical: tuple[float, float]
    ) -> tuple[float, float]:
        """``(z_g, z_l)`` at the centred targets (theory §4.3, "centred releases").

        The ratio's noise ``z_l · 2T h s`` is ``_TARGET_CENTRED_RATIO_NOISE`` nats at the
        typical trajectory's ``s``. Each gradient release adds noise of sd ``σ_w = z_g · 2T h b``
        per whitened coordinate at offset ``b``; a kick ``η σ_w`` against a momentum of norm
        ``√d_L`` changes the energy by about ``η σ_w √d_L``, and ``L`` kicks add up to
        ``η σ_w √(L d_L)``, aimed at ``_TARGET_CENTRED_GRAD_ENERGY`` nats at the typical ``b``.
        """
        offset, trajectory = typical
        t = self.temperature
        z_l = _TARGET_CENTRED_RATIO_NOISE / (2.0 * t * remainder_clip * trajectory)
        d_lik = int(np.count_nonzero(self._channel.likelihood_coordinates))
        spread = self._centred_step_size() * np.sqrt(self.n_steps * d_lik)
        z_g = _TARGET_CENTRED_GRAD_ENERGY / (spread * 2.0 * t * remainder_clip * offset)
        return z_g, z_l

    def noise_excess(self) -> float:
        """How many times the target noise the budget leaves each centred release where the
        chains sample (above 1: short of budget, or the tilted target's mode, where the chains
        sample, far from the centre the bounds grow from). Public: the calibrated noise
        multiplier against the target's at the mode (:meth:`_typical_bounds`). ``nan``
        without the centred releases or before the plan."""
        multiplier = getattr(self, "grad_noise_multiplier", None)
        if self._centring is None or multiplier is None:
            return float("nan")
        z_g, _ = self._centred_noise_multipliers(
            self._centring.remainder_clip, self._typical_at_mode
        )
        return float(multiplier / z_g)

    def predicted_ess(self) -> float:
        """A rough count of the effective draws this prepared plan can give (public).

        With the centred releases at (or below) their target noise a draw is worth about
        ``c (L η)²`` effective draws (at most one), ``L η`` the trajectory's duration in
        posterior sd and ``c = _CENTRED_ESS_PER_SQUARED_DURATION`` (measured on the zoo).
        A budget that leaves each release ``k > 1`` times its target noise makes dual
        averaging shorten the step about ``k`` times: the moves become diffusive and each draw
        is worth about ``k²`` times less. ``nan`` without the centred releases or before a plan.
        """
        excess = self.noise_excess()
        if not np.isfinite(excess) or self._planned_iterations is None:
            return float("nan")
        chains = self._planned_chains or DEFAULT_CHAINS
        draws = self._planned_iterations - (self._planned_tune or 0)
        duration = self._centred_step_size() * self.n_steps
        per_draw = min(1.0, _CENTRED_ESS_PER_SQUARED_DURATION * duration**2)
        return chains * draws * per_draw / max(1.0, excess) ** 2

    def _centring_independence_probability(self) -> float:
        """Half: the pairs DP HMC's remainder clip has been measured with. Its leapfrog
        trajectories are neither a random-walk jump nor an independence draw."""
        return 0.5

    def _after_initialization(
        self, start: PrivateStart, chains: int, length: int | None
    ) -> PrivateStart:
        """The centring phase (:class:`~pymc_dp.step_methods.centred.CentredSampling`)."""
        if not self._uses_control_variate():
            return start
        length = _CENTRED_CHAIN_LENGTH if length is None else length
        typical = self._typical_bounds(np.linalg.cholesky(start.covariance), start.theta)

        def sampler_mu(remainder_clip: float) -> float:
            """PLD ``μ`` of ``chains × length`` iterations at the target noise (the plan)."""
            z_g, z_l = self._centred_noise_multipliers(remainder_clip, typical)
            per_iteration = 1.0 / (2.0 * z_l**2) + (self.n_steps + 1) / (2.0 * z_g**2)
            return chains * length * per_iteration

        return self._centre(start, sampler_mu)

    def _configure(self, start: Any) -> None:
        """Clips, mass and step size from the private start (post-processing)."""
        if self._auto_grad_clip:  # the preconditioned clip: every coordinate on one scale
            self.grad_clip = start.precond_clip
            self.grad_precond = start.precond
        if self._auto_llr_clip:
            self.llr_clip = start.llr_clip
        if self._centring is not None:  # the dense metric Σ̂ = W Wᵀ of the centring
            self._root = np.tril(self._centring.metric)
            self.mass_diag = 1.0 / np.diag(self._root @ self._root.T)
            self.step_size = self._centred_step_size()
            self._typical = self._typical_bounds(self._root, self._centring.centre.theta)
            # the chains sample around the tilted target's mode (the start) and the bounds grow
            # from the centre: a mode several sd away makes every release noisier than the
            # plan's target, which the prediction counts
            self._typical_at_mode = self._typical_bounds(
                self._root, self._centring.centre.theta, mode=start.theta
            )
            if self._adapt_mass_argument is None:
                self.adapt_mass = False
        if self.mass_diag is None:
            # M⁻¹ = diag Σ̂: the private posterior scale (ones without an initialisation)
            ndim = self.space.ndim
            self.mass_diag = np.ones(ndim) if start is None else 1.0 / start.scale**2
        if self.step_size is None:
            self.step_size = _DEFAULT_STEP_SIZE / self.space.ndim**0.25
        if start is not None and self._adapt_mass_argument is None:
            self.adapt_mass = False  # the private scale beats a mass from a few noisy draws
        self._reset_adaptation()

    def _target_noise_multipliers(self) -> tuple[float, float]:
        """``(z_g, z_l)`` at the target noise: ratio noise ``_TARGET_RATIO_NOISE`` nats at a
        typical trajectory's jump, gradient noise ``_TARGET_GRAD_NOISE`` in the mass's units
        (with the control variate: :meth:`_centred_noise_multipliers`)."""
        if self._centring is not None:
            return self._centred_noise_multipliers(self._centring.remainder_clip, self._typical)
        scale = 1.0 / np.sqrt(self.mass_diag)  # posterior sd as the mass sees it
        jump = self.step_size * self.n_steps * float(np.linalg.norm(scale))
        z_l = _TARGET_RATIO_NOISE / (2.0 * self.temperature * self.llr_clip * jump)
        # gradient noise sd in coordinate k is 2 z_g b_g / D_k; in whitened units × sd_k
        precond = np.ones_like(scale) if self.grad_precond is None else self.grad_precond
        whitened = float(np.sqrt(np.mean((scale / precond) ** 2)))
        z_g = _TARGET_GRAD_NOISE / (2.0 * self.grad_clip * whitened)
        return z_g, z_l

    def _unit_cost(self, scale: float) -> Any:
        z_g, z_l = self._target_noise_multipliers()
        return compose(
            GaussianCost.from_noise_multiplier(scale * z_l),
            (GaussianCost.from_noise_multiplier(scale * z_g), self.n_steps + 1),
        )

    def _build_mechanisms(self, noise_scale: float | None) -> None:
        if noise_scale is not None:
            z_g, z_l = self._target_noise_multipliers()
            self.grad_noise_multiplier = noise_scale * z_g
            self.llr_noise_multiplier = noise_scale * z_l
        centring = self._centring
        if centring is not None:  # the centred ratio and gradients (theory §4.1, §4.3)
            common = dict(
                centre=centring.centre,
                centre_gradient=centring.gradient,
                metric=centring.metric,
                remainder_clip=centring.remainder_clip,
                temperature=self.temperature,
                count_clipped=self.nonprivate_diagnostics,
            )
            self._release_llr = CentredLLRRelease(
                self._channel, noise_multiplier=self.llr_noise_multiplier, **common
            )
            self._release_grad = CentredGradientRelease(
                self._channel, noise_multiplier=self.grad_noise_multiplier, **common
            )
            return
        self._release_llr = LLRRelease(
            self._channel,
            llr_clip=self.llr_clip,
            noise_multiplier=self.llr_noise_multiplier,
            temperature=self.temperature,
            count_clipped=self.nonprivate_diagnostics,
        )
        self._release_grad = GradientRelease(
            self._channel,
            grad_clip=self.grad_clip,
            noise_multiplier=self.grad_noise_multiplier,
            temperature=self.temperature,
            count_clipped=self.nonprivate_diagnostics,
            precond=self.grad_precond,
        )

    def _events(self) -> list:
        # one ratio release and L + 1 gradient releases per iteration (theory §4.3)
        return [self._release_llr.event, (self._release_grad.event, self.n_steps + 1)]

    # ---------------------------------------------------------------- adaptation

    def _reset_adaptation(self) -> None:
        if getattr(self, "mass_diag", None) is None or self.step_size is None:
            return  # called by the base before the settings are known
        self._inv_mass = 1.0 / self.mass_diag
        self._dual = DualAverage(self.step_size, self.target_accept, gamma=_DUAL_AVERAGING_GAMMA)
        tune = self._planned_tune
        stop_at = None if tune is None else tune - _FINAL_STEP_SIZE_ONLY
        self._windows = MassWindows(self.space.ndim, stop_at=stop_at)
        self._tuned_step = self.step_size

    def stop_tuning(self) -> None:
        """End of tuning: keep the averaged step size (and the mass of the last full window)."""
        if self.tune and self.adapt_step_size:
            self._tuned_step = self._dual.final
        super().stop_tuning()

    def _base_step_size(self) -> float:
        if self.tune and self.adapt_step_size:
            return self._dual.current
        return self._tuned_step

    def _adapt(self, accepted: bool, theta: np.ndarray) -> None:
        """Dual averaging on acceptance flags; mass from the chain's draws (released: free)."""
        if self.adapt_step_size:
            self._dual.update(accepted)
        if self.adapt_mass:
            inv_mass = self._windows.update(theta)
            if inv_mass is not None:
                self._inv_mass = inv_mass
                if self.adapt_step_size:
                    self._dual.restart(self._dual.final)

    # ---------------------------------------------------------------- one iteration

    def _iterate(self, theta: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        logprior = self._logprior_at(theta)
        step_size = self._base_step_size()
        if self.step_jitter:
            step_size *= self.rng.uniform(1.0 - self.step_jitter, 1.0 + self.step_jitter)
        params = HMCParams(step_size, self.n_steps, self._inv_mass, root=self._root)
        self._grad_clipped = [0, 0]  # clipped rows, rows read (diagnostics only: NOT private)
        mechanisms = HMCMechanisms(
            self.space.logprior, self.space.logprior_grad, self._counted_grad, self._release_llr
        )
        new_state, info = hmc_kernel(HMCState(theta, logprior), params, self.rng, mechanisms)
        self._remember_logprior(new_state.theta, new_state.logprior)
        if self.tune:
            self._adapt(info.accepted, new_state.theta)
        stats = {
            "accepted": info.accepted,
            "jump": info.jump,
            "diverging": info.diverging,
            "step_size": step_size,
        }
        if self.nonprivate_diagnostics:  # NOT private
            stats["grad_clipped_fraction"] = self._grad_clipped[0] / max(self._grad_clipped[1], 1)
            stats["llr_clipped_fraction"] = (info.llr_clipped or 0) / self._channel.n_rows
        return new_state.theta, stats

    def _counted_grad(self, theta: np.ndarray) -> Release:
        """One gradient release; with non-private diagnostics, its clip count is tallied."""
        released = self._release_grad(theta)
        if released.n_clipped is not None and released.noise_std > 0:
            self._grad_clipped[0] += released.n_clipped
            self._grad_clipped[1] += self._channel.n_rows
        return released

    def privacy_metadata(self) -> dict[str, Any]:
        meta = super().privacy_metadata()
        if self._centring is None:  # the centred releases clip at the remainder clip instead
            meta.update(
                dp_grad_clip=self.grad_clip,
                dp_grad_precond="none"
                if self.grad_precond is None
                else " ".join(f"{x:.6g}" for x in self.grad_precond),
                dp_llr_clip=self.llr_clip,
            )
        meta.update(
            dp_grad_noise_multiplier=self._release_grad.noise_multiplier,
            dp_llr_noise_multiplier=self._release_llr.noise_multiplier,
            dp_leapfrog_steps=self.n_steps,
            dp_temperature=self._release_llr.temperature,
            dp_mu_per_iteration=self.cost.gaussian_mu(),
        )
        meta.update(self._centring_metadata())
        if self._centring is not None:
            meta.update(dp_noise_excess=self.noise_excess())
        return meta
