"""The centring phase shared by the steps that use the centred releases (theory §4.1, §7).

A step with a *control variate* (:class:`~pymc_dp.step_methods.penalty.DPPenalty`'s centred
ratio, :class:`~pymc_dp.step_methods.hmc.DPHMC`'s centred gradients and ratio) runs
:func:`~pymc_dp.step_methods.initialization.private_centring` after the private
initialisation: a centre ``θ_c``, its noisy clipped gradient sum ``Ĝ``, the private posterior
covariance ``Σ̂ = W Wᵀ`` and the remainder clip ``h``. Everything after that release is
post-processing: the chains' start at the target's mode near the centre, and the noise-aware
stretch of the draws. The only thing the steps differ in is what their sampler spends per
iteration (``sampler_mu``), which decides how the centring splits the budget.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from pymc_dp.errors import ConvergenceWarning
from pymc_dp.kernels.initialization import prior_exact_step, prior_hessian, prior_information
from pymc_dp.kernels.noise_aware import noise_aware_stretch
from pymc_dp.step_methods.base import _given_length
from pymc_dp.step_methods.initialization import (
    Centring,
    PrivateStart,
    observes_curvature,
    private_centring,
)

#: Warned when a step on centred releases is first prepared on a likelihood with kinks.
KINKED_LIKELIHOOD_WARNING = (
    "The likelihood is not smooth in the parameters (a kink: Laplace or AsymmetricLaplace "
    "errors, an absolute value or a max of the parameters and the data). The step's centred "
    "releases bound each row's remainder at second order, which rows with a kink between two "
    "states exceed: their part is clipped and the posterior comes out biased and too wide, by "
    "several posterior sd at 10⁵ rows (docs: limitations). What helps: more rows, a smooth "
    "likelihood where the model allows it (Student-t errors instead of Laplace ones), or a "
    "larger epsilon."
)

__all__ = ["CENTRING_HISTOGRAM_SHARE", "CentredSampling"]

#: Share of the budget's capacity each of the centring's small releases spends (the Fisher
#: curvature, the centre's clip histogram, the remainder-clip histogram). The centre's
#: gradient then gets what the planned sampler does not need (at least half the rest): its
#: noise tilts the target, while the sampler's centred releases are cheap.
CENTRING_HISTOGRAM_SHARE = 0.03
#: Chains start this many posterior sd (Σ̂) around the target's mode: overdispersed, so that
#: R̂ compares chains that came from different places.
_START_SPREAD = 2.0
#: The target's mode is looked for within this many posterior sd of the centre.
_MAX_STEP = 10.0


class CentredSampling:
    """Mixin of a :class:`~pymc_dp.step_methods.base.DPStep` with the centring phase.

    The step sets ``self._centring = None`` and ``self.noise_aware`` in its ``__init__`` and
    calls :meth:`_centre` from its ``_after_initialization``.
    """

    _centring: Centring | None
    _auto_llr_clip: bool
    noise_aware: bool
    #: Iterations per chain the centring plans its budget split for (each step's own).
    _centred_chain_length: ClassVar[int]

    def _needs_ratio_clip(self) -> bool:
        """The plain ratio's clip, when it is automatic and the releases are not centred (the
        centred ones clip at the centring's remainder clip)."""
        return self._auto_llr_clip and not self._uses_control_variate()

    def _requested_length(self, tune: float | int, draws: int | None) -> int | None:
        """With the control variate, ``draws`` beyond the planned length lengthen the chain."""
        default = self._centred_chain_length if self._uses_control_variate() else None
        return _given_length(tune, draws, default)

    def _centring_independence_probability(self) -> float:
        """The share of independence draws among the pairs that set the remainder clip
        (:func:`~pymc_dp.step_methods.initialization.centring_pairs`): the sampler's."""
        raise NotImplementedError

    def _centre(self, start: PrivateStart, sampler_mu: Callable[[float], float]) -> PrivateStart:
        """Run the centring (accounted) and return the start it gives (post-processing).

        ``sampler_mu(h)``: the PLD ``μ`` the planned chains spend at their target noise, for a
        remainder clip ``h``. The returned start is the target's mode near the centre, with
        ``Σ̂`` as its covariance, chains spread ``_START_SPREAD`` sd around it, and the
        centring's ``μ`` and phases added for the privacy report.
        """
        centring = private_centring(
            self._channel,
            self.budget,
            start,
            histogram_share=CENTRING_HISTOGRAM_SHARE,
            sampler_mu=sampler_mu,
            public_rng=np.random.default_rng(self.rng.integers(2**63)),
            independence_probability=self._centring_independence_probability(),
        )
        self._centring = centring
        covariance = centring.metric @ centring.metric.T  # the curvature at the centre
        information = self._likelihood_information(centring.centre.theta, covariance)
        theta = self._centred_mode(centring, covariance, information)
        # the draws are reported widened by the centre's noise (the noise's tilt of a tempered
        # likelihood is not what the Fisher release measured: untempered targets only)
        if self.noise_aware and self.temperature == 1.0:
            self._stretch = noise_aware_stretch(
                theta,
                centring.centre.theta,
                centring.gradient,
                centring.gradient_covariance,
                information,
                covariance,
            )
        phases = dict(start.phases)
        for phase, mu in centring.phases.items():
            phases[phase] = phases.get(phase, 0.0) + mu
        return dataclasses.replace(
            start,
            theta=theta,
            covariance=covariance,
            location_covariance=(_START_SPREAD**2 - 1.0) * covariance,
            mu=start.mu + centring.mu,
            phases=phases,
            histograms=start.histograms + centring.histograms,
            releases=start.releases + centring.releases,
        )

    def _centred_mode(
        self, centring: Centring, covariance: np.ndarray, information: np.ndarray
    ) -> np.ndarray:
        """The target's mode near the centre (post-processing).

        The centred target's log density is ``log p(θ) + Ĝ·(θ − θ_c) + Σ_i r_i(θ)`` with the
        remainders' sum about ``−½ (θ − θ_c)ᵀ F (θ − θ_c)``, ``F = Σ̂⁻¹ − Π`` the likelihood's
        part of the curvature (``Π`` the prior's, at ``θ_c``). Its mode, with the public prior
        kept exact (:func:`~pymc_dp.kernels.initialization.prior_exact_step`; with a Gaussian
        prior the Newton step ``θ_c + Σ̂ (Ĝ + ∇log p(θ_c))``), is a point that already includes
        the centre's noise, so it is as good as the target it is the mode of. It stays within
        ``_MAX_STEP`` sd of the centre (a curvature far off) and inside the support.
        ``covariance`` is ``Σ̂`` and ``information`` ``F``.
        """
        return prior_exact_step(
            centring.centre.theta,
            centring.gradient,
            information,  # the remainders' curvature, F
            self.space.logprior,
            self.space.logprior_grad,
            covariance,
            _MAX_STEP,
            self.space.in_support,
        )

    def _likelihood_information(self, centre: np.ndarray, covariance: np.ndarray) -> np.ndarray:
        """``F = Σ̂⁻¹ − Π``: the likelihood's part of the released curvature ``Σ̂⁻¹`` at the
        centre (``Π`` the public prior's information there)."""
        prior = prior_information(prior_hessian(self.space.logprior_grad, centre))
        return np.linalg.inv(covariance) - prior

    def _before_preparing(self) -> None:
        if self.kinked_likelihood():  # public: settings and made-up rows, before any read
            warnings.warn(KINKED_LIKELIHOOD_WARNING, ConvergenceWarning, stacklevel=3)

    def kinked_likelihood(self) -> bool:
        """Whether this step will sample on centred releases of a likelihood with kinks.

        The centred ratio and gradient bound each row's remainder at second order in the move
        (theory §4.1); a row whose kink (Laplace or AsymmetricLaplace errors, an absolute
        value or a max of the parameters and the row) lies between two states has a
        first-order one, which is clipped: the likelihood flattens where its curvature lives
        (docs: limitations, "Likelihoods with kinks"). Public: the step's settings and the
        model's graph evaluated on made-up rows, known before any data are read.
        """
        return self._uses_control_variate() and self._channel.likelihood_has_kinks

    def centre_shift_sd(self) -> float:
        """How far, in posterior sd per direction, the centre's noise tilts the target.

        The largest sd of the mean's shift ``Σ ξ`` (:meth:`Centring.shift_sd
        <pymc_dp.step_methods.initialization.Centring.shift_sd>`): public, from the private
        posterior covariance and the noise scale. ``nan`` before the centring or without the
        control variate. :func:`pymc_dp.predict_centre_shift` predicts it before the data are
        read.
        """
        centring = self._centring
        return float("nan") if centring is None else float(centring.shift_sd())

    def unresolved_directions(self) -> int | None:
        """In how many of the ``d`` directions the budget did not resolve the curvature.

        The centring's Fisher release (public, post-processing): along these eigenvectors its
        noise is larger than the information, and the private posterior covariance ``Σ̂``
        (the proposals' scale, the chains' spread) takes a rougher guess within what the
        release allows (an earlier estimate; after sharper reads, the range's geometric
        midpoint), which can be far off where parameters are strongly correlated (a
        non-centred hierarchy). ``pymc_dp.sample`` warns when that is more than
        half of them.
        ``None`` before the centring or without the control variate.
        """
        centring = self._centring
        return None if centring is None else int(centring.unresolved)

    def curvature_unchecked(self) -> bool:
        """Whether the centring's metric could have been checked against the log likelihood's
        own curvature but was not.

        The Fisher releases estimate the rows' gradient variance; where the likelihood does
        not describe the data's variance (overdispersed counts under a Poisson likelihood)
        that is several times the posterior's curvature, and only the observed-curvature step
        of the centring corrects it (theory §7, step 8). It applies to models of at most 32
        parameters whose likelihood has no kinks; this is
        ``True`` when it applied but the budget left no room for it (the rounds that moved
        the centre spent it) or its histogram showed nothing. Public: budget decisions and
        post-processing. ``False`` before the centring or without the control variate.
        """
        centring = self._centring
        if centring is None or centring.curvature_checked:
            return False
        return observes_curvature(self._channel)

    def _centring_metadata(self) -> dict[str, Any]:
        """The centring's public numbers for the privacy metadata (empty without one)."""
        centring = self._centring
        meta: dict[str, Any] = {"dp_control_variate": int(centring is not None)}
        if centring is None:
            return meta
        meta.update(
            dp_remainder_clip=centring.remainder_clip,
            dp_centre_shift_sd=centring.shift_sd(),
            dp_unresolved_directions=int(centring.unresolved),
            dp_noise_aware=int(self._stretching()),
        )
        if self._stretching():
            meta.update(dp_noise_aware_variance_factor=self._stretch.variance_factor)
        return meta
