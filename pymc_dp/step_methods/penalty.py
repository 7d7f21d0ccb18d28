"""``DPPenalty``: the DP penalty algorithm (theory §4.1) as a PyMC step method."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pymc_dp.errors import InvalidParameterError
from pymc_dp.kernels.penalty import (
    PenaltyMechanisms,
    PenaltyParams,
    PenaltyState,
    penalty_kernel,
)
from pymc_dp.mechanisms import LLRRelease, MinibatchLLRRelease
from pymc_dp.step_methods.adaptation import ScaleAdaptation
from pymc_dp.step_methods.base import DPStep
from pymc_dp.step_methods.options import (
    check_batch_size,
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


class DPPenalty(DPStep):
    """Differentially private penalty-method Metropolis–Hastings (theory §4.1, §4.2).

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
    llr_clip : float
        ``b_l``: per-row bound on the log-likelihood ratio per unit jump length. Choose it so that
        few rows are clipped (the seeds: under 10–20 %); choosing it by looking at private runs
        costs privacy that is not accounted.
    noise_multiplier : float, optional
        ``z = σ / Δ``. Give exactly one of ``noise_multiplier`` and ``tau``.
    tau : float, optional
        The seeds' parametrisation ``z = τ √n`` (full-data steps only; the minibatch thesis writes
        ``σ² = τ c²``, i.e. ``noise_multiplier = √τ``).
    batch_size : int, optional
        ``b``: rows per iteration for the minibatch penalty (``2 ≤ b ≤ n``). Default: all rows.
    proposal_scale : float or array, optional
        Random-walk standard deviation per coordinate (default 0.1), adapted during tuning from
        acceptance flags only (post-processing of released values).
    one_component, guided : bool
        One-component updates; guided walk (implies one-component).
    temperature : float
        ``T ∈ (0, 1]``; the likelihood is tempered, privacy is unchanged.
    target_accept : float, optional
        Acceptance rate tuning aims at (0.234, or 0.44 with one-component updates).
    noise_rng : int, optional
        Seed for reproducible DP noise (tests, research). Default: OS entropy.
    nonprivate_diagnostics : bool
        Also store ``llr_clipped_fraction`` (share of rows, or of the batch, whose ratio was
        clipped) per iteration. Computed from the data without noise: the release is then
        **not** DP, and the privacy metadata say so.
    """

    name = "dp_penalty"
    _nonprivate_stats: ClassVar[dict] = {"llr_clipped_fraction": (np.float64, [])}
    _chain_state: ClassVar[tuple[str, ...]] = (*DPStep._chain_state, *("_scale", "_directions"))
    _privacy_parameters: ClassVar[frozenset[str]] = DPStep._privacy_parameters | {
        "noise_multiplier",
        "llr_clip",
        "temperature",
        "batch_size",
        "_release",
    }

    def __init__(
        self,
        vars: Any = None,
        *,
        budget: Any,
        llr_clip: float,
        noise_multiplier: float | None = None,
        tau: float | None = None,
        batch_size: int | None = None,
        proposal_scale: float | np.ndarray = 0.1,
        one_component: bool = False,
        guided: bool = False,
        temperature: float = 1.0,
        target_accept: float | None = None,
        model: Any = None,
        noise_rng: int | None = None,
        row_data: Any = None,
        nonprivate_diagnostics: bool = False,
        blocked: bool = True,
        rng: Any = None,
    ) -> None:
        if batch_size is not None:
            batch_size = check_batch_size(batch_size)
            if tau is not None:
                raise InvalidParameterError(
                    "tau is the seeds' full-data form z = τ·√n; with batch_size give "
                    "noise_multiplier instead (the minibatch thesis' σ² = τ·c² is "
                    "noise_multiplier = √τ)."
                )
        self.batch_size = batch_size
        self.llr_clip = positive_float(llr_clip, "llr_clip")
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
            row_data=row_data,
            nonprivate_diagnostics=nonprivate_diagnostics,
            blocked=blocked,
            rng=rng,
        )
        n = self._channel.n_rows
        self.noise_multiplier = noise_multiplier_from(
            noise_multiplier, tau, n, name="noise_multiplier", tau_name="tau"
        )
        self.proposal_scale = check_proposal_scale(proposal_scale, self.space.ndim)
        options = dict(
            llr_clip=self.llr_clip,
            noise_multiplier=self.noise_multiplier,
            temperature=self.temperature,
            count_clipped=self.nonprivate_diagnostics,
        )
        if self.batch_size is None:
            self._release = LLRRelease(self._channel, **options)
        else:
            if not 2 <= self.batch_size <= n:
                raise InvalidParameterError(
                    f"batch_size={self.batch_size} must be between 2 and the number of rows "
                    f"n = {n}."
                )
            self._release = MinibatchLLRRelease(
                self._channel, batch_size=self.batch_size, **options
            )
        self._finish_build()

    def _events(self) -> list:
        return [self._release.event]  # one ratio release per iteration

    def _reset_adaptation(self) -> None:
        self._scale = ScaleAdaptation(self.target_accept)
        self._directions = np.ones(self.space.ndim)

    def _iterate(self, theta: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        state = PenaltyState(theta, self._logprior_at(theta), self._directions)
        scale = self.proposal_scale * self._scale.factor
        params = PenaltyParams(scale, self.one_component, self.guided)
        rows = self._channel.n_rows if self.batch_size is None else self.batch_size
        mechanisms = PenaltyMechanisms(self.space.logprior, self._release)
        new_state, info = penalty_kernel(state, params, self.rng, mechanisms)
        self._directions = new_state.directions
        self._remember_logprior(new_state.theta, new_state.logprior)
        if self.tune:  # acceptance flags are released: tuning on them is free
            self._scale.update(info.accepted)
        stats = {"accepted": info.accepted, "jump": info.jump}
        if self.nonprivate_diagnostics:
            stats["llr_clipped_fraction"] = info.llr_clipped / rows  # NOT private
        return new_state.theta, stats

    def privacy_metadata(self) -> dict[str, Any]:
        meta = super().privacy_metadata()
        meta.update(
            dp_llr_clip=self._release.llr_clip,
            dp_noise_multiplier=self._release.noise_multiplier,
            dp_temperature=self._release.temperature,
            dp_one_component=int(self.one_component),
            dp_guided=int(self.guided),
        )
        if self.batch_size is None:
            meta.update(dp_mu_per_iteration=self.cost.gaussian_mu())
        else:
            meta.update(
                dp_batch_size=self.batch_size,
                dp_sampling="without replacement, secret generator",
            )
        return meta
