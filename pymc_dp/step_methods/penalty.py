"""``DPPenalty``: the DP penalty algorithm (theory §4.1) as a PyMC step method."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pymc_dp.accounting.costs import GaussianCost
from pymc_dp.errors import InvalidParameterError
from pymc_dp.kernels.penalty import (
    INDEPENDENCE_PROBABILITY,
    IndependenceProposal,
    PenaltyMechanisms,
    PenaltyParams,
    PenaltyState,
    penalty_kernel,
)
from pymc_dp.mechanisms import (
    CentredLLRRelease,
    LLRRelease,
    MinibatchLLRRelease,
    check_batch_rows,
)
from pymc_dp.prediction import centred_bound_rms, predict_penalty_ess
from pymc_dp.step_methods.adaptation import CorrelationChoice, ScaleAdaptation
from pymc_dp.step_methods.base import DEFAULT_CHAINS, DPStep
from pymc_dp.step_methods.centred import CentredSampling
from pymc_dp.step_methods.initialization import PrivateStart, independence_df
from pymc_dp.step_methods.options import (
    check_batch_size,
    check_correlation,
    check_flag,
    check_fraction,
    check_proposal_scale,
    check_temperature,
    noise_multiplier_from,
    positive_float,
)

__all__ = ["DPPenalty"]

# Acceptance-rate targets: the optimal rates of random-walk Metropolis in many dimensions (0.234)
# and of one-dimensional updates (0.44).
_TARGET_RW = 0.234
_TARGET_OCU = 0.44
# Without a private initialisation, the random-walk scale defaults to this.
_DEFAULT_PROPOSAL_SCALE = 0.1
# random-walk tuning iterations expected below which the private scale is kept
_MIN_SCALE_UPDATES = 20
# independence proposals per correlation on the grid expected in tuning, below which the
# correlation is not chosen (the t is kept)
_MIN_CORRELATION_TRIALS = 20
# The automatic noise aims at this standard deviation (nats) of the released ratio at a typical
# jump: acceptance · σ² (the ESS bought per unit of privacy) is flat near its optimum σ ≈ 2.4.
_TARGET_RATIO_NOISE = 2.0
#: With the centred ratio: the released ratio's noise aimed at (nats, at the typical jump), and
#: the default chain length (budget is rarely what limits it: time is).
_TARGET_CENTRED_NOISE = 1.0
_CENTRED_CHAIN_LENGTH = 2000


class DPPenalty(CentredSampling, DPStep):
    """Differentially private penalty-method Metropolis–Hastings (theory §4.1, §4.2).

    ``DPPenalty(budget=budget)`` with no other argument is the recommended start: its clip,
    scale, start and noise are chosen from accounted releases (theory §7).

    Each iteration proposes ``θ'`` and releases the clipped, tempered log-likelihood ratio
    ``T · Σ_i clip(ℓ_i(θ') − ℓ_i(θ), ±b_l ‖θ' − θ‖)`` with Gaussian noise of standard deviation
    ``σ = z · 2 T b_l ‖θ' − θ‖``; it accepts iff ``log U < λ + ξ − σ²/2``. One Gaussian mechanism
    per iteration: PLD parameter ``μ = 1/(2z²)``. Exact posterior when no ratio is clipped.

    With ``batch_size=b`` it is the *minibatch* DP penalty (theory §4.2, thesis §3.4): each
    iteration reads only ``b`` rows drawn secretly without replacement, releases
    ``λ* − ½σ_b² + ξ`` with ``λ* = (nT/b) Σ_{j∈B} r_j`` and ``σ_b²`` its estimated variance,
    ``ξ ~ N(0, σ²)``, ``σ = z · c`` with ``c = 2sB + 2(1 − b/n)s²B²``, ``s = nT/b``,
    ``B = b_l ‖θ' − θ‖`` (the exact sensitivity; thesis Lemma 3.4 has 3 for the second 2);
    accounted as a subsampled Gaussian with multiplier ``z`` and ratio ``q = b/n`` (tight PLD).
    The test is then exact only as far as ``λ*`` is normal (large batches); the noise grows
    with ``n T``, so it is useful with tempering (``T = n0/n``), as the seeds found.

    Parameters
    ----------
    vars : list, optional
        Must be every free variable (the default); anything else is refused, because PyMC would
        sample the rest with a non-private step.
    budget : PrivacyBudget
        The (ε, δ) budget every chain reserves its iterations from.
    llr_clip : float or "auto"
        ``b_l``: per-row bound on the log-likelihood ratio per unit jump length. ``"auto"`` (the
        default): chosen by the private initialisation from a noisy histogram of per-row slopes
        along the directions the chain jumps in (theory §7); with the centred ratio (the
        default, ``control_variate``) none is needed, and ``llr_clip`` stays ``None``.
        Choosing it by looking at the data or at private runs costs privacy that is not
        accounted.
    noise_multiplier : float, optional
        ``z = σ / Δ``. At most one of ``noise_multiplier`` and ``tau``; with neither, ``z`` is
        calibrated so that the planned chains spend what is left of the budget exactly
        (budget-first; the default length aims at a released ratio of about 2 nats).
    tau : float, optional
        The seeds' parametrisation ``z = τ √n`` (full-data steps only; the minibatch thesis writes
        ``σ² = τ c²``, i.e. ``noise_multiplier = √τ``).
    batch_size : int, optional
        ``b``: rows per iteration for the minibatch penalty (``2 ≤ b ≤ n``). Default: all rows.
        The minibatch penalty has no automatic settings: give ``llr_clip`` and
        ``noise_multiplier``.
    proposal_scale : float, array or "auto"
        Random-walk standard deviation per coordinate, adapted during tuning from acceptance
        flags only (post-processing of released values). ``"auto"``: ``2.38 ŝ/√d`` from the
        private initialisation's posterior scale ``ŝ``, or 0.1 when the step has none.
    one_component, guided : bool
        One-component updates; guided walk (implies one-component).
    temperature : float
        ``T ∈ (0, 1]``; the likelihood is tempered, privacy is unchanged.
    target_accept : float, optional
        Acceptance rate tuning aims at (0.234, or 0.44 with one-component updates).
    independence : bool
        With a private initialisation, propose from a multivariate t around its Laplace
        approximation with probability 0.8 per iteration (with the Hastings term; ν = 7, or
        d/3 beyond 21 parameters). Default True.
    proposal_correlation : float or "auto"
        ``ρ ∈ [0, 1)``: with ``ρ > 0`` the independence proposal becomes the Crank–Nicolson
        move ``θ' = m + ρ(θ − m) + √(1 − ρ²) L ξ`` around the same Laplace approximation
        ``N(m, L Lᵀ)`` (Gaussian ``ξ``, with its Hastings term), which keeps a share ``ρ`` of
        the distance from ``m``: shorter moves, accepted more often where the approximation
        misses the posterior (many parameters). ``ρ = 0`` keeps the heavy-tailed t, which a
        Gaussian move does not replace where the posterior's tails are heavier than the
        approximation's. ``"auto"`` (the default): each chain tries
        ``ρ ∈ {0, 0.3, 0.5, 0.7, 0.8, 0.9}`` while tuning and keeps the one whose acceptance
        ``a`` gives the largest ``a(1 − ρ)`` (the most effective draws per iteration; ``0`` when
        tuning is too short to tell). Chosen from acceptance flags: no privacy cost.
        ``sample_stats.proposal_correlation`` holds each independence proposal's ``ρ`` (NaN
        on random-walk iterations), so the choice can be recomputed from the published
        stats.
    control_variate : bool
        Default True: on the automatic full-data step, release the ratio less its linear part
        at the private mode (theory §4.1, "the centred ratio"). One gradient release there,
        with what the planned sampler does not need of the budget, pays for the first-order
        term once; each iteration releases only the second-order remainder, whose clip is
        smaller by about the distance to the mode in posterior sd times the posterior's scale:
        hundreds of times more iterations for the same budget at n = 10⁵. The target is the
        posterior tilted by ``exp(ξ·θ)``, ``ξ`` the centre release's noise (its mean moves by
        about ``Σ ξ``, stated in the metadata as ``dp_centre_shift_sd``; the draws are reported
        widened for it, ``noise_aware``). False: the plain
        ratio of the DP penalty paper. Ignored with an explicit ``llr_clip``, ``batch_size`` or
        ``init_share=0``.
    noise_aware : bool
        Default True, with the centred ratio: the draws account for the centre release's noise
        as a noise-aware analysis of that release does (theory §4.1, "noise-aware draws"): the
        chain samples the tilted target, and each draw is reported through a public affine
        stretch about the target's mode that makes its covariance the noise-aware one, each
        direction's variance larger by ``1 + s²`` (``s`` the tilt in posterior sd), so that the
        intervals cover the shift the noise may have caused instead of being as narrow as the
        exact posterior's around a moved mean. Post-processing of released values: no privacy
        cost, the same chain (acceptance, R̂, ESS). False: the tilted target's draws as they are.
        Not with ``temperature < 1``, nor beside another DP step in one ``pm.sample`` call
        (the draws are then the tilted target's; the metadata say so).
    init_share : float, optional
        Share of the budget's Gaussian capacity spent on the private initialisation (start,
        scale, clip; theory §7). Default 0.1 when a setting is automatic, else none; 0 turns it
        off (every setting must then be given).
    noise_rng : int, optional
        Seed for reproducible DP noise (tests, research). Default: OS entropy.
    secure_noise : bool
        Default True: DP noise and secret batches from the operating system's cryptographic
        generator, each release snapped to a public grid (docs: security). ``False`` is a fast
        research mode (NumPy's PCG64, no snapping), recorded in the metadata and flagged by
        :func:`~pymc_dp.privacy_report`.
    nonprivate_diagnostics : bool
        Also store ``llr_clipped_fraction`` (share of rows, or of the batch, whose ratio was
        clipped) per iteration. Computed from the data without noise: the release is then
        **not** DP, and the privacy metadata say so.
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

    name = "dp_penalty"
    _centred_chain_length: ClassVar[int] = _CENTRED_CHAIN_LENGTH
    stats_dtypes_shapes: ClassVar[dict] = {
        **DPStep.stats_dtypes_shapes,
        "proposal_correlation": (np.float64, []),
    }
    _nonprivate_stats: ClassVar[dict] = {"llr_clipped_fraction": (np.float64, [])}
    _chain_state: ClassVar[tuple[str, ...]] = (
        *DPStep._chain_state,
        *("_scale", "_directions", "_adapt_scale", "_correlation_choice", "_correlation"),
    )
    _privacy_parameters: ClassVar[frozenset[str]] = DPStep._privacy_parameters | {
        "noise_multiplier",
        "llr_clip",
        "temperature",
        "batch_size",
        "_release",
        "_centring",
    }

    def __init__(
        self,
        vars: Any = None,
        *,
        budget: Any,
        llr_clip: float | str = "auto",
        noise_multiplier: float | None = None,
        tau: float | None = None,
        batch_size: int | None = None,
        proposal_scale: float | np.ndarray | str = "auto",
        one_component: bool = False,
        guided: bool = False,
        temperature: float = 1.0,
        target_accept: float | None = None,
        independence: bool = True,
        proposal_correlation: float | str = "auto",
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
        self._auto_llr_clip = isinstance(llr_clip, str) and llr_clip == "auto"
        self._auto_noise = noise_multiplier is None and tau is None
        if batch_size is not None:
            batch_size = check_batch_size(batch_size)
            if tau is not None:
                raise InvalidParameterError(
                    "tau is the seeds' full-data form z = τ·√n; with batch_size give "
                    "noise_multiplier instead (the minibatch thesis' σ² = τ·c² is "
                    "noise_multiplier = √τ)."
                )
            if self._auto_llr_clip or self._auto_noise:
                raise InvalidParameterError(
                    "The minibatch DP penalty (batch_size=...) has no automatic settings yet: "
                    "give llr_clip and noise_multiplier, or leave batch_size unset for the "
                    "full-data DPPenalty, which chooses them privately."
                )
        elif not (self._auto_noise or noise_multiplier is None or tau is None):
            noise_multiplier_from(noise_multiplier, tau, 1, name="noise_multiplier", tau_name="tau")
        self.batch_size = batch_size
        self.llr_clip = None if self._auto_llr_clip else positive_float(llr_clip, "llr_clip")
        self._noise_arguments = (noise_multiplier, tau)
        self._proposal_argument = proposal_scale
        self._independence_argument = check_flag(independence, "independence")
        self._correlation_argument = check_correlation(proposal_correlation)
        if not self._independence_argument and self._correlation_argument != "auto":
            raise InvalidParameterError(
                f"proposal_correlation={proposal_correlation!r} sets the independence "
                "proposal's correlation, but independence=False turns that proposal off: "
                "leave proposal_correlation unset, or set independence=True."
            )
        self._control_variate_argument = check_flag(control_variate, "control_variate")
        self.noise_aware = check_flag(noise_aware, "noise_aware")
        self._centring = None
        self._stretch = None
        self._independence = None
        self._independence_by_correlation: dict[float, IndependenceProposal] = {}
        self.temperature = check_temperature(temperature)
        self.guided = check_flag(guided, "guided")
        self.one_component = check_flag(one_component, "one_component") or self.guided
        default_target = _TARGET_OCU if self.one_component else _TARGET_RW
        self.target_accept = (
            default_target
            if target_accept is None
            else check_fraction(target_accept, "target_accept")
        )
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
        if self.batch_size is not None:
            check_batch_rows(self.batch_size, n)
        if not (self._independence_argument and (self.automatic or self.init_share)):
            # no private start, or no independence proposal: decided before PyMC reads the
            # stats (an unprepared step is prepared inside its first chain)
            self._drop_stats("proposal_correlation")
        self.noise_multiplier = (
            None
            if self._auto_noise
            else noise_multiplier_from(
                noise_multiplier, tau, n, name="noise_multiplier", tau_name="tau"
            )
        )
        if not (isinstance(proposal_scale, str) and proposal_scale == "auto"):
            self.proposal_scale = check_proposal_scale(proposal_scale, self.space.ndim)
        else:
            self.proposal_scale = None
        self._complete_build()

    # ---------------------------------------------------------------- automatic settings

    def _automatic_settings(self) -> list[str]:
        names = ["llr_clip"] if self._auto_llr_clip else []
        return names + (["noise_multiplier"] if self._auto_noise else [])

    def _noise_is_automatic(self) -> bool:
        return self._auto_noise

    def _uses_control_variate(self) -> bool:
        share = self.init_share
        return (
            self._control_variate_argument
            and self._auto_llr_clip
            and self.batch_size is None
            and share != 0
        )

    def _chain_length(self, chains: int, tune: float | int, draws: int | None) -> int:
        """With the centred ratio, the length the centring planned the budget split for."""
        if self._centring is not None:
            given = self._requested_length(tune, draws)
            return _CENTRED_CHAIN_LENGTH if given is None else given
        return super()._chain_length(chains, tune, draws)

    def _default_tune_fraction(self) -> float:
        """0.2 from a private initialisation (it starts in the bulk), else 0.5."""
        return 0.2 if self.automatic or self.init_share else 0.5

    def _refine_initialization(self) -> bool:
        return not self._uses_control_variate()  # the centre's gradient locates the posterior

    def _centring_independence_probability(self) -> float:
        return INDEPENDENCE_PROBABILITY if self._independence_argument else 0.0

    def _after_initialization(
        self, start: PrivateStart, chains: int, length: int | None
    ) -> PrivateStart:
        """The centring phase (:func:`~pymc_dp.step_methods.initialization.private_centring`)."""
        if not self._uses_control_variate():
            return start
        length = _CENTRED_CHAIN_LENGTH if length is None else length
        scale = 2.38 / np.sqrt(self.space.ndim) * start.scale
        metric = np.linalg.cholesky(start.covariance)
        proposal = (
            IndependenceProposal(start.theta, metric, df=independence_df(self.space.ndim))
            if self._independence_argument
            else None
        )
        typical = centred_bound_rms(
            metric,
            start.theta,
            scale,
            proposal,
            coordinates=self._channel.likelihood_coordinates,
            row_blocks=self._channel.row_blocks,
        )

        def sampler_mu(remainder_clip: float) -> float:
            """PLD ``μ`` of ``chains × length`` iterations at the target noise (the plan)."""
            z = _TARGET_CENTRED_NOISE / (2.0 * self.temperature * remainder_clip * typical)
            return chains * length / (2.0 * z**2)

        return self._centre(start, sampler_mu)

    def _configure(self, start: Any) -> None:
        """Ratio clip and random-walk scale from the private start (post-processing)."""
        if self._auto_llr_clip:
            self.llr_clip = start.llr_clip
        if self.proposal_scale is None:
            if start is None:
                self.proposal_scale = np.full(self.space.ndim, _DEFAULT_PROPOSAL_SCALE)
            else:  # the optimal random-walk scale for a Gaussian target (Roberts et al. 1997)
                self.proposal_scale = 2.38 / np.sqrt(self.space.ndim) * start.scale
        self._independence = None
        if start is not None and self._independence_argument:
            # the private Laplace approximation as an independence proposal (heavier tails)
            covariance = (
                start.covariance if self._centring is not None else start.proposal_covariance
            )
            root = np.linalg.cholesky(covariance)
            self._independence = IndependenceProposal(
                start.theta, root, df=independence_df(self.space.ndim)
            )
            given = () if self._correlation_argument == "auto" else (self._correlation_argument,)
            self._independence_by_correlation = {
                rho: self._independence.with_correlation(rho)
                for rho in (*CorrelationChoice.grid, *given)
            }

    def _target_noise_multiplier(self) -> float:
        """``z`` whose ratio noise is ``_TARGET_RATIO_NOISE`` nats at the typical jump."""
        if self._centring is not None:  # the root mean square of the centred bound
            typical = self._centring.remainder_clip * centred_bound_rms(
                self._centring.metric,
                self._centring.centre.theta,
                self.proposal_scale,
                self._independence,
                coordinates=self._channel.likelihood_coordinates,
                row_blocks=self._channel.row_blocks,
            )
            return _TARGET_CENTRED_NOISE / (2.0 * self.temperature * typical)
        jump = float(np.linalg.norm(self.proposal_scale))
        if self.one_component:
            jump = float(np.mean(self.proposal_scale))
        if self._independence is not None:  # root mean square over the mixture
            p = self._independence.probability
            df = self._independence.df
            far = 2.0 * df / (df - 2.0) * float(np.sum(self._independence.root**2))
            jump = float(np.sqrt((1 - p) * jump**2 + p * far))
        return _TARGET_RATIO_NOISE / (2.0 * self.temperature * self.llr_clip * jump)

    def _unit_cost(self, scale: float) -> Any:
        return GaussianCost.from_noise_multiplier(scale * self._target_noise_multiplier())

    def predicted_ess(self) -> float:
        """Effective draws this prepared step's plan can give (:mod:`pymc_dp.prediction`).

        Public quantities only: the noise multiplier, the clip, the private initialisation's
        posterior covariance and the planned chains and draws. ``nan`` without a private
        initialisation with the independence proposal, or before a plan. It takes the
        independence proposal at ``ρ = 0`` (the t) and the Laplace approximation as exact: a
        chain that keeps a correlated move (``proposal_correlation``) is not re-predicted.
        """
        start = self._private_start
        if self._independence is None or start is None or self._planned_iterations is None:
            return float("nan")
        centring = self._centring
        chains = self._planned_chains or DEFAULT_CHAINS
        draws = self._planned_iterations - (self._planned_tune or 0)
        return predict_penalty_ess(
            noise_multiplier=self.noise_multiplier,
            llr_clip=self.llr_clip,
            covariance=start.covariance,
            chains=chains,
            draws=draws,
            temperature=self.temperature,
            independence_probability=self._independence.probability,
            df=self._independence.df,
            remainder_clip=None if centring is None else centring.remainder_clip,
            coordinates=self._channel.likelihood_coordinates,
            row_blocks=self._channel.row_blocks,
            # the chains sample around the target's mode, the bounds grow from the centre
            offset=None if centring is None else start.theta - centring.centre.theta,
        ).ess

    def _build_mechanisms(self, noise_scale: float | None) -> None:
        if noise_scale is not None:
            self.noise_multiplier = noise_scale * self._target_noise_multiplier()
        options = dict(
            llr_clip=self.llr_clip,
            noise_multiplier=self.noise_multiplier,
            temperature=self.temperature,
            count_clipped=self.nonprivate_diagnostics,
        )
        if self._centring is not None:
            del options["llr_clip"]
            self._release = CentredLLRRelease(
                self._channel,
                centre=self._centring.centre,
                centre_gradient=self._centring.gradient,
                metric=self._centring.metric,
                remainder_clip=self._centring.remainder_clip,
                **options,
            )
        elif self.batch_size is None:
            self._release = LLRRelease(self._channel, **options)
        else:
            self._release = MinibatchLLRRelease(
                self._channel, batch_size=self.batch_size, **options
            )

    def _events(self) -> list:
        return [self._release.event]  # one ratio release per iteration

    def _reset_adaptation(self) -> None:
        self._scale = ScaleAdaptation(self.target_accept)
        self._directions = np.ones(self.space.ndim)
        # With the independence proposal taking most iterations, a short tuning leaves the
        # random walk too few acceptance flags to adapt its scale from (the recursion's first
        # gains are large); it then keeps its scale (2.38 ŝ/√d, or the one given). An unknown
        # tuning length adapts, as before.
        tune = self._planned_tune
        self._adapt_scale = (
            self._independence is None
            or tune is None
            or round(tune * (1.0 - self._independence.probability), 6) >= _MIN_SCALE_UPDATES
        )
        # the correlation: given, or chosen from this chain's tuning (None until then)
        self._correlation_choice = None
        self._correlation = None
        if self._independence is None:
            return
        if self._correlation_argument != "auto":
            self._correlation = self._correlation_argument
        elif tune is None or (
            round(tune * self._independence.probability, 6)
            >= _MIN_CORRELATION_TRIALS * len(CorrelationChoice.grid)
        ):
            self._correlation_choice = CorrelationChoice(_MIN_CORRELATION_TRIALS // 2)
        else:
            self._correlation = 0.0

    def _chain_independence(self) -> tuple[IndependenceProposal | None, int | None]:
        """This iteration's independence proposal, and its grid index while choosing ``ρ``."""
        if self._independence is None:
            return None, None
        choice = self._correlation_choice
        if self._correlation is None:
            if self.tune:
                index = choice.draw(self.rng)
                return self._independence_by_correlation[choice.grid[index]], index
            self._correlation = choice.choose()  # tuning is over: keep the best
        return self._independence_by_correlation[self._correlation], None

    def _iterate(self, theta: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        state = PenaltyState(theta, self._logprior_at(theta), self._directions)
        scale = self.proposal_scale * self._scale.factor
        independence, index = self._chain_independence()
        params = PenaltyParams(scale, self.one_component, self.guided, independence=independence)
        rows = self._channel.n_rows if self.batch_size is None else self.batch_size
        mechanisms = PenaltyMechanisms(self.space.logprior, self._release)
        new_state, info = penalty_kernel(state, params, self.rng, mechanisms)
        self._directions = new_state.directions
        self._remember_logprior(new_state.theta, new_state.logprior)
        if self.tune and self._adapt_scale and not info.independent:  # released flags: free
            self._scale.update(info.accepted)
        if index is not None and info.independent:
            self._correlation_choice.update(index, info.accepted)
        stats = {
            "accepted": info.accepted,
            "jump": info.jump,
            # public: the proposal's ρ (a public draw while tuning, then the chain's choice)
            "proposal_correlation": independence.correlation if info.independent else np.nan,
        }
        if self.nonprivate_diagnostics:
            stats["llr_clipped_fraction"] = info.llr_clipped / rows  # NOT private
        return new_state.theta, stats

    def privacy_metadata(self) -> dict[str, Any]:
        meta = super().privacy_metadata()
        if self._centring is None:  # the centred ratio clips at the remainder clip instead
            meta.update(dp_llr_clip=self.llr_clip)
        meta.update(
            dp_noise_multiplier=self._release.noise_multiplier,
            dp_temperature=self._release.temperature,
            dp_one_component=int(self.one_component),
            dp_guided=int(self.guided),
        )
        meta.update(self._centring_metadata())
        if self.batch_size is None:
            meta.update(dp_mu_per_iteration=self.cost.gaussian_mu())
        else:
            meta.update(
                dp_batch_size=self.batch_size,
                dp_sampling="without replacement, secret generator",
            )
        return meta
