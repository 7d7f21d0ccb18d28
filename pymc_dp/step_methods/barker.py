"""``DPBarker``: the DP Barker test on secret minibatches (theory §4.4) as a PyMC step method."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pymc_dp.accounting import BarkerCost
from pymc_dp.barker_correction import BarkerCorrection
from pymc_dp.errors import InvalidParameterError
from pymc_dp.kernels.barker import BarkerMechanisms, BarkerParams, BarkerState, barker_kernel
from pymc_dp.mechanisms import BarkerTest
from pymc_dp.step_methods.adaptation import ScaleAdaptation
from pymc_dp.step_methods.base import DPStep
from pymc_dp.step_methods.options import (
    check_batch_size,
    check_fraction,
    check_proposal_scale,
    check_temperature,
    positive_float,
)

__all__ = ["DPBarker"]

_TARGET_ACCEPT = 0.234  # random-walk proposals
# Thesis Thm 3.3 bounds the privacy of the test for total normal variance C = 2.
_PROVED_NORMAL_VARIANCE = 2.0


class DPBarker(DPStep):
    """Differentially private Barker MCMC on secret minibatches (theory §4.4).

    Each iteration proposes ``θ' ~ N(θ, diag(s²))``, draws ``b`` of the ``n`` rows without
    replacement from the secret noise generator (the other rows are never evaluated), clips the
    per-row log-likelihood ratios to ``|r_j| ≤ √b / n0`` (``n0 = T n``) and accepts with
    Barker's test made exact for the minibatch noise by a correction distribution
    (``N(0, C) + V_corr ≈ Logistic(0, 1)``, ``C = 2``). Only the accept decision is released;
    privacy comes from the test's own randomness amplified by subsampling (thesis Thm 3.3, RDP,
    accounted by ``BarkerCost``). The clip bound is fixed by the proof: with ``T = 1`` and large
    ``n`` it clips most ratios, so the method is meant for tempered posteriors (``n0 ≪ n``).

    Parameters
    ----------
    budget : PrivacyBudget
        The (ε, δ) budget; iterations are counted with the RDP bound of theory §4.4.
    batch_size : int
        ``b`` rows per iteration (``16 ≤ b ≤ n``; the RDP bound needs orders ``3 ≤ α < b/5``).
    proposal_scale : float or array
        Random-walk standard deviation per coordinate; adapted during tuning toward 0.234 from
        the acceptance flags (post-processing, free).
    temperature : float
        ``T = n0 / n ∈ (0, 1]``.
    normal_variance : float
        ``C``, the total normal variance of the test; only ``C = 2`` has a privacy proof.
    noise_rng : int, optional
        Seed for reproducible noise and batches (tests, research). Default: OS entropy.
    secure_noise : bool
        Default True: DP noise and secret batches from the operating system's cryptographic
        generator, each release snapped to a public grid (docs: security). ``False`` is a fast
        research mode (NumPy's PCG64, no snapping), recorded in the metadata and flagged by
        :func:`~pymc_dp.privacy_report`.
    nonprivate_diagnostics : bool
        Also store per iteration the share of batch ratios clipped and the batch variance
        ``σ_b²`` (computed without noise: the release is then **not** DP).
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

    name = "dp_barker"
    _nonprivate_stats: ClassVar[dict] = {
        "llr_clipped_fraction": (np.float64, []),
        "batch_variance": (np.float64, []),
    }
    _chain_state: ClassVar[tuple[str, ...]] = (*DPStep._chain_state, *("_scale",))
    _privacy_parameters: ClassVar[frozenset[str]] = DPStep._privacy_parameters | {
        "batch_size",
        "temperature",
        "correction",
        "_test",
    }

    def __init__(
        self,
        vars: Any = None,
        *,
        budget: Any,
        batch_size: int,
        proposal_scale: float | np.ndarray = 0.1,
        temperature: float = 1.0,
        normal_variance: float = 2.0,
        target_accept: float = _TARGET_ACCEPT,
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
        self.temperature = check_temperature(temperature)
        if positive_float(normal_variance, "normal_variance") != _PROVED_NORMAL_VARIANCE:
            raise InvalidParameterError(
                f"normal_variance={normal_variance}: the privacy bound of DP Barker (thesis "
                "Thm 3.3) is proved for C = 2 only; leave normal_variance=2.0."
            )
        self.correction = BarkerCorrection.load(_PROVED_NORMAL_VARIANCE)
        self.target_accept = check_fraction(target_accept, "target_accept")
        self.batch_size = check_batch_size(batch_size)
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
        )
        BarkerCost(self.batch_size, self._channel.n_rows)  # checks b against n, naming both
        self.proposal_scale = check_proposal_scale(proposal_scale, self.space.ndim)
        self._test = BarkerTest(
            self._channel,
            batch_size=self.batch_size,
            temperature=self.temperature,
            correction=self.correction,
        )
        self._finish_build()

    def _events(self) -> list:
        return [self._test.event]  # one test per iteration

    def _reset_adaptation(self) -> None:
        self._scale = ScaleAdaptation(self.target_accept)

    def _iterate(self, theta: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        new_state, info = barker_kernel(
            BarkerState(theta, self._logprior_at(theta)),
            BarkerParams(self.proposal_scale * self._scale.factor),
            self.rng,
            BarkerMechanisms(self.space.logprior, self._test),
        )
        self._remember_logprior(new_state.theta, new_state.logprior)
        if self.tune:  # acceptance flags are released: tuning on them is free
            self._scale.update(info.accepted)
        stats = {
            "accepted": info.accepted,
            "jump": info.jump,
            "llr_clipped_fraction": info.llr_clipped / self.batch_size,  # NOT private
            "batch_variance": info.batch_variance,  # NOT private
        }
        return new_state.theta, stats

    def privacy_metadata(self) -> dict[str, Any]:
        meta = super().privacy_metadata()
        meta.update(
            dp_batch_size=self.batch_size,
            dp_sampling="without replacement, secret generator",
            dp_llr_clip="sqrt(b)/n0 (fixed by the proof)",
            dp_normal_variance=self.correction.normal_variance,
            dp_correction_cdf_error=float(self.correction.cdf_error),
            dp_temperature=self.temperature,
        )
        return meta
