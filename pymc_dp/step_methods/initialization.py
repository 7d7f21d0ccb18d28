"""Private initialisation: start, clip bounds and scales from accounted releases only.

A DP step left on its automatic settings (``DPPenalty(budget=budget)``,
``DPHMC(budget=budget)``) cannot look at the data to choose where to start, what to clip or how
far to jump. :func:`private_initialization` spends a declared share of the budget (default
10 % of its Gaussian capacity ``M*``, theory §3) on releases that answer those questions, all
composed in the same ledger as the sampler, in two reservations, each made before its reads
(the first histogram alone, where a data set too small for the budget is refused, then the
rest; a data set so small that no histogram's bin could rise above its noise is refused before
either):

1. **Clip for the ascent.** A noisy histogram of the per-row gradient norms at PyMC's initial
   point ``θ₀`` (:class:`~pymc_dp.mechanisms.GradNormHistogram`); the bound ``C₀`` is the far
   tail of the released counts (:func:`~pymc_dp.releases.clip_from_counts`) where a release
   clipped there is mostly signal, else the largest grid edge, down to the median norm, where
   it is (:func:`_ascent_clip`). Far from the mode the rows' gradients point uphill
   together: a release clipped at ``C`` carries up to ``Σ_i min(‖∇ℓ_i‖, C)`` against noise of
   norm ``2zC√d``, so a clip below most norms keeps the direction with the noise of a typical
   row rather than the largest. With few rows for the budget the far tail is mostly noise:
   on PyMC's initial point of a linear regression (n = 2000, ε = 5; median norm 3.3, far tail
   27–45, signal-to-noise about 1 there) two of 12 default preparations started the chains
   40 and 10 times the sd they stated (``Σ̂ + Cov θ*``) from the mode, the farthest 89
   posterior sd; with this rule (``C₀`` = 5.7 there) none of 12 was more than 2.6 times it
   off. Where the far tail is signal enough the rule keeps it: 18 of the validation zoo's 21
   models at n = 2·10⁴, ε = 5 and at n = 10⁵, ε = 1. The three hierarchies (d = 54–89) get
   lower clips there (19 against 32–45 for the 50-group ones, 5.7 against 16–23 for the
   85-county one); on the centred 50-group one at n = 10⁵, ε = 5 (12 preparations each) the
   start was 0.8–2.3 posterior sd off before and 0.8–1.6 after, the centre of the releases
   1.1–3.9 and 1.2–6.4. A clip at the median where the tail is signal enough pulls the climb
   towards a robust estimate: on the zoo's mixture (n = 2·10⁴, ε = 5) it ended 170–190
   posterior sd off instead of 60–120, and the centring's sds reached 1.5 times the truth.
2. **Ascent.** Noisy clipped-gradient ascent of the log posterior from ``θ₀`` (Adam, the tail
   of the iterates averaged; :func:`~pymc_dp.kernels.initialization.noisy_gradient_ascent`):
   ``K_a`` :class:`~pymc_dp.mechanisms.GradientRelease` releases, the first half with bound
   ``C₀``. Each coordinate's step grows by 1.2 while the released gradient keeps the sign of
   the momentum and halves when it turns (never below Adam's rate): a model in its data's own
   units (an intercept of 1500 grams, slopes per year of age) has its mode thousands of
   Adam steps from PyMC's 0. On such a linear regression (ε = 5) plain Adam ended the climb
   850–2700 posterior sd from the mode in ``log σ`` (``σ`` inflated by the residuals of the
   unfitted mean); at n = 10⁶ two of two default preparations started the chains 265–1060 sd
   off; with the growing step (and up to five rounds of :func:`private_centring`) none of
   eight was more than 0.2 sd off.
3. **Gradient clip.** Halfway through the ascent, a second norm histogram: the gradient bound
   ``C`` of the second half and of the sampler, and ``E‖∇ℓ_i‖²``, whence a first guess of the
   posterior scale ``s₀ = √(d / (n E‖∇ℓ_i‖²))``. (The gradients far from the mode can be much
   smaller than near it, e.g. for a scale parameter: a clipped ascent converges to the point
   where the *clipped* gradients balance, so its end must use the bound of the bulk.)
4. **Curvature.** Gradient releases (bound ``C``) at ``θ_a ± h_j e_j`` give a finite-difference
   Hessian's diagonal (the preconditioner ``D``) and a first Newton step to ``θ₁``; a histogram
   of ``‖D ∇ℓ_i‖`` at ``θ₁`` gives the preconditioned clip; a second design at ``θ₁`` gives
   ``Σ̂ = (−Ĥ)⁻¹`` (:func:`~pymc_dp.kernels.initialization.newton_from_designs`) and the mode
   ``θ*`` pooled from every release near it, with its covariance ``Cov θ*``
   (:func:`~pymc_dp.kernels.initialization.pooled_mode`).
5. **Refinement** (only with ``max_share``; :func:`_refinement`): while ``Cov θ*`` places the
   mode no better than ``_LOCATION_TARGET`` posterior sd, a further reservation buys a fresh
   preconditioned norm histogram at ``θ*`` (its clip, for releases that will be averaged) and
   Newton steps from one-sd designs, ``Σ̂`` corrected by secants between their centres
   (:func:`~pymc_dp.kernels.initialization.secant_update`).
6. **Ratio clip** (only for a step that releases the plain ratio, ``ratio_clip=True``). A
   histogram of the directional derivatives ``|∇ℓ_i(θ*)·u_k|`` along ``m``
   public random directions ``u_k ∝ Σ̂^{1/2} ξ_k`` (the directions the sampler will jump in):
   the per-row log-likelihood-ratio bound per unit jump ``b_l``. A ratio over a jump ``Δ`` is
   ``ℓ_i(θ + Δ) − ℓ_i(θ) ≈ ∇ℓ_i·Δ``, so this is the quantity the ratio clip bounds, and it is
   smaller than the gradient norm by about ``√d``. The automatic ``DPPenalty`` and ``DPHMC``
   release the centred ratio instead, whose clip the centring chooses, and the stochastic-
   gradient steps release no ratio: for them this histogram is neither reserved nor made
   (its ``μ`` stays in the budget for the phases after it). With few rows for the budget it
   was also the histogram most likely to show no bin above its noise (the slopes spread
   over more bins than the norms), which refused a run after the rest of the
   initialisation had been spent.

Everything derived afterwards (``θ*``, ``Σ̂``, ``C``, ``b_l``, the chains' dispersed starts
``θ* + (Σ̂ + Cov θ*)^{1/2} ξ``, proposal scales and masses) is post-processing of these
releases and free.
The noise of the phases: each of the four histograms gets 7.5 % of the initialisation's
``μ``, the ``K = K_a + 2 d r`` gradient releases share the rest equally (without the ratio
clip's histogram its share is not reserved, and the gradients' noise is unchanged).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from pymc_dp.accounting import compose
from pymc_dp.accounting.costs import GaussianCost
from pymc_dp.errors import BudgetExceededError, InsufficientDataError, InvalidParameterError
from pymc_dp.kernels.initialization import (
    AscentParams,
    covariance_from_fisher,
    gradient_design,
    loose_directions,
    newton_from_designs,
    noisy_gradient_ascent,
    pooled_mode,
    prior_exact_step,
    prior_hessian,
    prior_information,
    relative_noise,
    secant_update,
    unresolved_directions,
)
from pymc_dp.mechanisms import (
    CentredLLRRelease,
    CentredRatioHistogram,
    CentreGradientRelease,
    CurvatureNormHistogram,
    CurvatureRelease,
    FisherRelease,
    GradientRelease,
    GradNormHistogram,
    PrivateChannel,
)
from pymc_dp.releases import (
    _VISIBLE_THRESHOLD,
    Centre,
    Release,
    _bin_middles,
    _visible,
    bias_balanced_clip,
    clip_from_counts,
    mean_square_from_counts,
    quantile_from_counts,
)

__all__ = [
    "DEFAULT_INIT_SHARE",
    "MAX_INIT_SHARE",
    "Centring",
    "PrivateStart",
    "private_centring",
    "private_initialization",
]

#: Share of the budget's Gaussian capacity spent on initialisation by default.
DEFAULT_INIT_SHARE = 0.1
#: On the default share, the most a refinement may raise it to (the sampler keeps the rest).
MAX_INIT_SHARE = 0.75
#: Histograms released, and the share of the initialisation's μ given to each.
_HISTOGRAMS = 4
_HISTOGRAM_SHARE = 0.075
_MIN_SIGNAL_TO_NOISE = 4.0  # a curvature estimate this many noise sd from zero is trusted
#: The climb's clip: the largest at which a release at θ₀ has this signal-to-noise ratio.
#: Adam moves each coordinate by its averaged gradient over that gradient's root mean square:
#: at a ratio about 1 (the far tail on a linear regression at n = 2000, ε = 5: 1.0) it
#: moves along the noise as much as along the signal. At 4 the far tail stays the clip of 18
#: of the validation zoo's 21 models at n = 2·10⁴, ε = 5 and at n = 10⁵, ε = 1.
_ASCENT_SIGNAL_TO_NOISE = 4.0
#: Histogram bins: edges 2^(k/4), k = −80 … 80 (10⁻⁶ … 10⁶), ratio 2^(1/4) between edges.
HISTOGRAM_EDGES = 2.0 ** (np.arange(-80, 81) / 4.0)
_ASCENT_ITERATIONS = 100
_FIRST_DESIGN_RELEASES = 32  # stage 1 (plain clip; the preconditioner); at least 2d
_CURVATURE_RELEASES = 96  # stage 2 (preconditioned; the mode and the Hessian); at least 4d
#: The refinement aims to know the mode to within this many posterior sd (one sd of θ*).
_LOCATION_TARGET = 0.4
_REFINEMENT_STEP = 1.0  # the refinement's design steps, in posterior sd
_REFINEMENT_STEPS = 4  # Newton steps the refinement's releases are split into
_REFINEMENT_HISTOGRAM_SHARE = 0.1  # of the refinement's reservation, for its norm histogram
_POOL_RADIUS = 6.0  # releases this far from the mode (Mahalanobis, in Σ̂) join the pooled mode
_DIRECTIONS = 8
_DESIGN_STEP = 10.0  # h_j in units of the scale guess s₀


@dataclass(frozen=True)
class PrivateStart:
    """What the private initialisation released, after post-processing (all public).

    Attributes
    ----------
    theta : ndarray
        ``θ*``: the estimated posterior mode (unconstrained space).
    covariance : ndarray
        ``Σ̂``: the estimated posterior covariance (Laplace, from released gradients).
    grad_clip : float
        Per-row gradient-norm bound for the sampler.
    llr_clip : float or None
        Per-row log-likelihood-ratio bound per unit jump length (``None`` when the step
        releases no plain ratio and the initialisation did not choose one).
    ascent_clip : float
        The bound the ascent used (chosen at PyMC's initial point).
    mu : float
        PLD parameter spent (Gaussian: it adds up with the sampler's).
    phases : dict
        ``μ`` per phase: ``"clip selection"`` (the three or four histograms, and the
        refinement's) and ``"initialisation"``
        (the gradient releases).
    releases : int
        Gradient releases made.
    """

    theta: np.ndarray
    covariance: np.ndarray
    grad_clip: float
    llr_clip: float | None
    ascent_clip: float
    mu: float
    phases: dict[str, float] = field(default_factory=dict)
    releases: int = 0
    ascent_theta: np.ndarray | None = None
    precond: np.ndarray | None = None
    precond_clip: float | None = None
    histograms: int = 0
    location_covariance: np.ndarray | None = None

    @property
    def scale(self) -> np.ndarray:
        """Per-coordinate posterior standard deviations ``√diag Σ̂``."""
        return np.sqrt(np.diag(self.covariance))

    @property
    def proposal_covariance(self) -> np.ndarray:
        """``Σ̂ + Cov θ*``: where the posterior may be, given the releases' noise.

        The posterior's own width plus the uncertainty of its estimated location; chains start
        and independence proposals are drawn from it, so that a small budget gives honest,
        wide draws rather than narrow ones around a noisy mode.
        """
        if self.location_covariance is None:
            return self.covariance
        return self.covariance + self.location_covariance

    def dispersed_start(self, rng: np.random.Generator, spread: float = 1.0) -> np.ndarray:
        """A chain's start ``θ* + spread · (Σ̂ + Cov θ*)^{1/2} ξ``, ``ξ ~ N(0, I)`` from a
        public generator."""
        root = np.linalg.cholesky(self.proposal_covariance)
        return self.theta + spread * root @ rng.standard_normal(self.theta.size)


def _hidden_margin(noise_std: float, n_rows: int) -> int:
    """Grid steps to add above the visible tail: rows that sub-threshold bins may hide.

    Up to about ``5σ`` rows can sit above the clip unseen; their bias on the mode is roughly
    ``3.6 σ / √n`` posterior sd (a clipped excess of about a third of the bound per row, a
    per-row information of about ``(b/3)²``). Each factor √2 (two grid steps) up roughly
    halves it.
    """
    bias = 3.6 * noise_std / math.sqrt(n_rows)
    return 0 if bias <= 0.25 else (2 if bias <= 0.5 else 4)


def _ascent_clip(
    counts: np.ndarray,
    histogram_noise_std: float,
    tail_clip: float,
    release_noise_multiplier: float,
    d: int,
    edges: np.ndarray = HISTOGRAM_EDGES,
) -> float:
    """The climb's clip: the largest grid edge up to ``tail_clip`` at which a release at
    ``θ₀`` is mostly signal.

    A release clipped at ``C`` carries at most ``S(C) = Σ_i min(‖∇ℓ_i‖, C)`` along the rows'
    common direction (far from the mode they point uphill together) against noise of norm
    about ``2 z C √d`` (:class:`~pymc_dp.mechanisms.GradientRelease`); ``S(C)/C`` falls as
    ``C`` grows, and clipping biases the climb less the larger ``C`` is. So ``C₀`` is the
    largest edge with ``S(C) ≥ _ASCENT_SIGNAL_TO_NOISE · 2 z C √d``, not below the median of
    the visible bins (unless ``tail_clip`` is). Post-processing of the histogram at ``θ₀``.

    Parameters
    ----------
    counts, histogram_noise_std : ndarray, float
        The released histogram of the norms at ``θ₀`` (one more count than ``edges``) and its
        noise sd; bins at most ``5σ`` count as empty, as in
        :func:`~pymc_dp.releases.clip_from_counts`, the others at their geometric middle.
    tail_clip : float
        The far-tail clip read off the same histogram (:func:`_clip`): the largest candidate.
    release_noise_multiplier : float
        ``z`` of the climb's gradient releases.
    d : int
        Length of ``θ``.
    edges : ndarray
        The histogram's edges.

    Returns
    -------
    float
        ``C₀``; ``tail_clip`` itself where no bin is visible or it is not finite.
    """
    visible = _visible(counts, histogram_noise_std, _VISIBLE_THRESHOLD)
    if not (np.isfinite(tail_clip) and np.any(visible > 0)):
        return float(tail_clip)
    middles = _bin_middles(edges)
    median = quantile_from_counts(visible, edges, 0.5)
    noise_per_clip = _ASCENT_SIGNAL_TO_NOISE * 2.0 * release_noise_multiplier * math.sqrt(d)
    for clip in edges[(edges >= median) & (edges <= tail_clip)][::-1]:
        if np.sum(visible * np.minimum(middles, clip)) >= noise_per_clip * clip:
            return float(clip)
    return float(min(median, tail_clip))


def _clip(
    counts: np.ndarray,
    noise_std: float,
    values: int,
    what: str,
    per_row: int = 1,
    spread: bool = False,
) -> float:
    n_rows = values // per_row
    bound = clip_from_counts(
        counts,
        HISTOGRAM_EDGES,
        noise_std,
        values,
        steps_up=_hidden_margin(noise_std / per_row, n_rows),
        spread=spread,
    )
    if np.isinf(bound):
        raise InsufficientDataError(
            f"The noisy histogram of {what} puts many rows above {HISTOGRAM_EDGES[-1]:g}: the "
            "per-row gradients are too large to bound privately here. Rescale the model's "
            "variables, or give the clip bounds and noise multipliers explicitly."
        )
    if not np.isfinite(bound):
        raise InsufficientDataError(
            f"The noisy histogram of {what} shows no bin above its noise (σ = {noise_std:.3g} "
            f"counts): too few rows for this budget to choose clip bounds privately. Give the "
            "clip bounds and noise multipliers explicitly, or use a larger epsilon."
        )
    return bound


def _pooled(
    records: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    covariance: np.ndarray,
    centre: np.ndarray,
    last: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The pooled mode (:func:`~pymc_dp.kernels.initialization.pooled_mode`) from the ``last``
    releases (the final design, always) and every earlier one within ``_POOL_RADIUS`` of
    ``centre`` in the metric of ``Σ̂``: where the quadratic model holds."""
    points, grads, variances = (np.array(x) for x in zip(*records, strict=True))
    inverse = np.linalg.inv(covariance)
    offsets = points - centre
    distance = np.sqrt(np.einsum("ti,ij,tj->t", offsets, inverse, offsets))
    keep = distance <= _POOL_RADIUS
    keep[-last:] = True
    return pooled_mode(points[keep], grads[keep], variances[keep], covariance)


def _with_secants(covariance: np.ndarray, designs: list) -> np.ndarray:
    """``Σ̂`` corrected along every long step between consecutive design centres by the
    secant of their mean gradients (:func:`~pymc_dp.kernels.initialization.secant_update`,
    only where the secant is resolved above the noise)."""
    for before, after in itertools.pairwise(designs):
        updated = secant_update(
            covariance,
            after.points.mean(axis=0) - before.points.mean(axis=0),
            after.gradient - before.gradient,
            before.gradient_noise**2 + after.gradient_noise**2,
        )
        if updated is not None:
            covariance = updated
    return covariance


def _recording(mechanism: GradientRelease, records: list, space) -> Callable[[np.ndarray], Release]:
    """``mechanism`` as a callable that also keeps (point, log-posterior gradient, noise
    variance) of each defined release in ``records``, for the pooled mode."""

    def call(theta: np.ndarray) -> Release:
        released = mechanism(theta)
        if np.all(np.isfinite(released.value)):
            scale = 1.0 if mechanism.precond is None else mechanism.precond
            variance = np.broadcast_to((released.noise_std / scale) ** 2, theta.shape)
            gradient = released.value + space.logprior_grad(theta)
            records.append((np.array(theta, dtype=float), gradient, variance.copy()))
        return released

    return call


class _Refined(NamedTuple):
    theta: np.ndarray
    covariance: np.ndarray
    location_covariance: np.ndarray
    mu: float  # the refinement reservation's μ
    histogram_mu: float  # of which its norm histogram
    releases: int


def _refinement(
    theta: np.ndarray,
    covariance: np.ndarray,
    location_covariance: np.ndarray,
    *,
    channel: PrivateChannel,
    budget: object,
    room: float,
    pooled_releases: int,
    z_grad: float,
    precond: np.ndarray,
    precond_clip: float,
    designs: list,
    prior: np.ndarray,
    label: str,
) -> _Refined | None:
    """Step 5 of the module docstring: more preconditioned releases near ``θ*`` while the
    released gradients place the mode no better than ``_LOCATION_TARGET`` posterior sd, in a
    further reservation of at most ``room`` (made before they are read); ``None`` when none is
    wanted or affordable.

    The reservation buys a norm histogram at ``θ*`` (``_REFINEMENT_HISTOGRAM_SHARE`` of it) and
    ``T`` gradient releases. Their clip is read off that histogram, less noisy than the first:
    the first one's clip, fine for one release, leaves a bias on a heavy-tailed per-row
    gradient (a scale parameter's) that an average of hundreds of releases would otherwise
    state as precisely known. The releases are split into ``_REFINEMENT_STEPS`` designs of
    ``±_REFINEMENT_STEP`` posterior sd, each centred at the current mode (Newton steps: the
    mode's estimate is a design's mean gradient, whose bias
    grows as the square of the step, and each step corrects what the curvature's error left of
    the one before). ``Σ̂`` is corrected by the secant between consecutive centres (a Newton
    iteration whose curvature is off by more than a factor two diverges without it), and the
    mode is pooled from these releases only (one clip, one bias).
    """
    space = channel.space
    d = space.ndim
    ratio = float(np.max(np.sqrt(np.diag(location_covariance) / np.diag(covariance))))
    wanted = (ratio / _LOCATION_TARGET) ** 2 - 1.0  # extra precision, in pooled units
    if wanted <= 0:
        return None
    release_event = GaussianCost.from_noise_multiplier(z_grad)
    per_release = float(release_event.gaussian_mu())
    affordable = int((1.0 - _REFINEMENT_HISTOGRAM_SHARE) * room / per_release)
    rounds = min(math.ceil(wanted * max(1, pooled_releases)), affordable) // (2 * d)
    if rounds < 1:
        return None
    count = 2 * d * rounds
    histogram_mu = _REFINEMENT_HISTOGRAM_SHARE / (1.0 - _REFINEMENT_HISTOGRAM_SHARE)
    histogram_mu *= count * per_release
    z_histogram = math.sqrt(1.0 / (2.0 * histogram_mu))
    histogram_event = GaussianCost.from_noise_multiplier(z_histogram)
    cost = compose((histogram_event, 1), (release_event, count))
    if not budget.fits(cost, 1):
        return None
    budget.reserve(cost, 1, mechanism=f"{label} (refinement)")
    channel.counter.allow(cost, 1)

    norms = GradNormHistogram(
        channel, edges=HISTOGRAM_EDGES, noise_multiplier=z_histogram, precond=precond
    )
    released = norms(theta)
    try:
        clip = _clip(released.value, released.noise_std, channel.n_rows, "scaled gradient norms")
    except InsufficientDataError:
        clip = precond_clip  # the first histogram's bound (the refinement's is no worse a guess)
    records: list = []
    release = _recording(
        GradientRelease(channel, grad_clip=clip, noise_multiplier=z_grad, precond=precond),
        records,
        space,
    )
    noise_std = z_grad * 2.0 * clip / precond
    size = rounds // _REFINEMENT_STEPS
    parts = [size] * (_REFINEMENT_STEPS - 1) + [rounds - (_REFINEMENT_STEPS - 1) * size]
    if size < 1:
        parts = [1] * rounds
    steps: list = []
    for part in parts:
        design = gradient_design(
            theta,
            _REFINEMENT_STEP * np.sqrt(np.diag(covariance)),
            part,
            release,
            space.logprior_grad,
            noise_std,
        )
        steps.append(design)
        refined = newton_from_designs(theta, [*designs, *steps], prior_hessian=prior).covariance
        if np.all(np.isfinite(refined)):
            covariance = refined
        covariance = _with_secants(covariance, steps)
        pooled, pooled_cov = _pooled(records, covariance, theta, len(design.points))
        if np.all(np.isfinite(pooled)) and space.in_support(pooled):
            theta, location_covariance = pooled, pooled_cov
    return _Refined(
        theta,
        covariance,
        location_covariance,
        float(cost.gaussian_mu()),
        float(histogram_event.gaussian_mu()),
        count,
    )


def private_initialization(
    channel: PrivateChannel,
    budget: object,
    theta0: np.ndarray,
    *,
    share: float = DEFAULT_INIT_SHARE,
    max_share: float | None = None,
    public_rng: np.random.Generator,
    label: str = "initialization",
    ratio_clip: bool = True,
) -> PrivateStart:
    """Run the phases of the module docstring from ``θ₀`` and return what they found.

    Parameters
    ----------
    channel : PrivateChannel
        The step's channel; its counter is limited to this reservation.
    budget : PrivacyBudget
        The step's budget; ``share · M*`` (less the ratio clip's histogram without
        ``ratio_clip``) is reserved in two parts, each before its reads.
    theta0 : ndarray
        The starting point (PyMC's initial point, unconstrained).
    share : float
        Share of the budget's Gaussian capacity ``M*`` to spend, in ``(0, 1)``.
    max_share : float, optional
        With ``max_share > share``, a refinement may spend up to ``max_share · M*`` in all
        (a further reservation, before its releases) while the released gradients place the mode
        no better than ``_LOCATION_TARGET`` posterior sd (step 5 of the module docstring).
    public_rng : numpy.random.Generator
        Public randomness (the directions of the ratio histogram).
    label : str
        Mechanism name recorded in the ledger.
    ratio_clip : bool
        Whether to choose the plain ratio's clip ``b_l`` (phase 6). ``False`` for a step that
        releases no plain ratio: the histogram is neither reserved nor made, and
        ``llr_clip`` is ``None``.
    """
    space = channel.space
    d, n = space.ndim, channel.n_rows
    mu_init = float(share) * budget.capacity_mu
    mu_histogram = _HISTOGRAM_SHARE * mu_init
    rounds_first = max(1, math.ceil(_FIRST_DESIGN_RELEASES / (2 * d)))
    rounds_second = max(2, math.ceil(_CURVATURE_RELEASES / (2 * d)))
    n_grads = _ASCENT_ITERATIONS + 2 * d * (rounds_first + rounds_second)
    z_histogram = math.sqrt(1.0 / (2.0 * mu_histogram))
    z_grad = math.sqrt(n_grads / (2.0 * (mu_init - _HISTOGRAMS * mu_histogram)))
    histogram_event = GaussianCost.from_noise_multiplier(z_histogram)
    grad_event = GaussianCost.from_noise_multiplier(z_grad)
    # the ratio clip's histogram only where the step releases a plain ratio; the gradients'
    # noise is the same either way (its share stays in the budget)
    histograms = _HISTOGRAMS if ratio_clip else _HISTOGRAMS - 1
    cost = compose((histogram_event, histograms), (grad_event, n_grads))

    norms0 = GradNormHistogram(channel, edges=HISTOGRAM_EDGES, noise_multiplier=z_histogram)
    channel.check_before_reading(theta0)
    # a bin is read only above _VISIBLE_THRESHOLD noise sds, and none holds more than the n
    # rows: with fewer rows than that no histogram here can show anything (public)
    fewest = _VISIBLE_THRESHOLD * norms0.noise_multiplier * norms0.sensitivity
    if n <= fewest:
        raise InsufficientDataError(
            f"{n} rows are too few for this budget to choose the automatic settings privately: "
            "the private initialisation's histograms have noise of "
            f"{fewest / _VISIBLE_THRESHOLD:.3g} counts, and a bin is read only above "
            f"{fewest:.3g}: no bin's count can reach that with fewer rows. Nothing was read or "
            "reserved. Use a larger epsilon or more rows (or give every setting explicitly "
            "with init_share=0)."
        )
    if not budget.fits(cost, 1):
        raise BudgetExceededError(
            f"{budget.spent_summary()}; the private initialisation ({share:.0%} of the budget's "
            "capacity) does not fit beside what is already spent on this dataset. Nothing was "
            "read. Use a new budget for new data, or give every setting explicitly with "
            "init_share=0."
        )
    # the first histogram alone first: it is where a data set too small for the budget is
    # refused, and a refusal then spends only that histogram, not the whole share
    budget.reserve(histogram_event, 1, mechanism=f"{label} (clip for the climb)")
    channel.counter.allow(histogram_event, 1)
    released_before = channel.counter.mu

    # 1. clip for the ascent, at θ₀
    released = norms0(theta0)
    tail_clip = _clip(released.value, released.noise_std, n, "gradient norms at the start")
    rest = compose((histogram_event, histograms - 1), (grad_event, n_grads))
    budget.reserve(rest, 1, mechanism=label)
    channel.counter.allow(rest, 1)
    # the first half climbs: with a clip below the far tail where that is mostly noise
    ascent_clip = _ascent_clip(released.value, released.noise_std, tail_clip, z_grad, d)

    # 2.–3. ascent; halfway, the gradient clip and a scale guess from a histogram there
    records: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def record(mechanism: GradientRelease) -> Callable[[np.ndarray], Release]:
        return _recording(mechanism, records, space)

    ascent_release = record(
        GradientRelease(channel, grad_clip=ascent_clip, noise_multiplier=z_grad)
    )
    chosen: dict[str, float] = {}

    def release(theta: np.ndarray):
        nonlocal ascent_release
        if len(chosen) == 0 and release.calls == _ASCENT_ITERATIONS // 2:
            norms = GradNormHistogram(channel, edges=HISTOGRAM_EDGES, noise_multiplier=z_histogram)
            counts = norms(theta)
            chosen["grad_clip"] = _clip(counts.value, counts.noise_std, n, "gradient norms")
            chosen["mean_square"] = mean_square_from_counts(
                counts.value, HISTOGRAM_EDGES, counts.noise_std
            )
            ascent_release = record(
                GradientRelease(channel, grad_clip=chosen["grad_clip"], noise_multiplier=z_grad)
            )
        release.calls += 1
        return ascent_release(theta)

    release.calls = 0
    ascent = noisy_gradient_ascent(
        theta0, AscentParams(iterations=_ASCENT_ITERATIONS), release, space.logprior_grad
    )
    theta_a = ascent.theta
    if not chosen:  # every release was undefined (the ascent never left the support's edge)
        raise InsufficientDataError(
            "The private ascent found no point where the gradient is defined; give the "
            "settings explicitly (init_share=0) and a start with initvals."
        )
    grad_clip = chosen["grad_clip"]
    mean_square = min(chosen["mean_square"], grad_clip**2)
    scale_guess = math.sqrt(d / (n * mean_square)) if mean_square > 0 else 1.0

    # 4. curvature, stage 1: plain clip C, steps h = 10 s₀; per-coordinate information
    sigma = z_grad * 2.0 * grad_clip
    plain = record(GradientRelease(channel, grad_clip=grad_clip, noise_multiplier=z_grad))
    first = gradient_design(
        theta_a,
        np.full(d, _DESIGN_STEP * scale_guess),
        rounds_first,
        plain,
        space.logprior_grad,
        sigma,
    )
    curvature = -np.diag(first.columns)
    noise = np.diag(first.noise)
    known = curvature >= _MIN_SIGNAL_TO_NOISE * noise
    # per-row information of coordinate j: I_j ≈ −H_jj / n, bounded below by what the noise
    # allows; the preconditioner D_j = 1/√I_j puts every coordinate's gradients on one scale
    information = np.maximum(curvature, 2.0 * noise) / n
    precond = 1.0 / np.sqrt(information)
    precond /= np.exp(np.mean(np.log(precond)))  # geometric mean one: only ratios matter
    step2 = np.where(known, 4.0 / np.sqrt(np.where(known, curvature, 1.0)), 4.0 * first.step)
    step2 = np.maximum(step2, first.step)
    prior = prior_hessian(space.logprior_grad, theta_a)  # public
    # a first Newton step: the second design is centred nearer the mode
    reads = channel.likelihood_coordinates
    theta_1 = newton_from_designs(theta_a, [first], prior_hessian=prior, reads=reads).theta
    if not (np.all(np.isfinite(theta_1)) and space.in_support(theta_1)):
        theta_1 = theta_a

    # 5. the preconditioned clip: a histogram of ‖D ∇ℓ_i‖ at θ₁
    scaled_norms = GradNormHistogram(
        channel, edges=HISTOGRAM_EDGES, noise_multiplier=z_histogram, precond=precond
    )
    released = scaled_norms(theta_1)
    precond_clip = _clip(released.value, released.noise_std, n, "scaled gradient norms")

    # 6. curvature, stage 2: preconditioned releases at θ₁, steps of about four sd; the Hessian
    # of both designs, then the mode from every release near it (generalised least squares)
    scaled = record(
        GradientRelease(channel, grad_clip=precond_clip, noise_multiplier=z_grad, precond=precond)
    )
    second = gradient_design(
        theta_1,
        step2,
        rounds_second,
        scaled,
        space.logprior_grad,
        z_grad * 2.0 * precond_clip / precond,
    )
    curvature = newton_from_designs(theta_1, [first, second], prior_hessian=prior, reads=reads)
    covariance, step_covariance = curvature.covariance, curvature.step_covariance
    if not np.all(np.isfinite(covariance)):
        covariance = step_covariance = np.diag(1.0 / (n * information))
    reach = 3.0 * step2  # the quadratic was fitted within the design's steps
    centre = theta_1 + np.clip(step_covariance @ second.gradient, -reach, reach)
    # the pooled mode's extrapolation as short as the step's along unresolved coordinates; its
    # stated uncertainty from Σ̂ (the floored curvature would state it too precisely there)
    theta_star, _ = _pooled(records, step_covariance, centre, len(second.points))
    _, location_covariance = _pooled(records, covariance, centre, len(second.points))
    if not (np.all(np.isfinite(theta_star)) and space.in_support(theta_star)):
        theta_star, location_covariance = theta_1, covariance
    # the pooled mode stays where the quadratic was fitted: a pooled fit through unresolved
    # curvature (all noise, e.g. a Student-t's degrees of freedom at ε = 1) once put
    # log ν thirty units away, and nothing after it brings a chain back from there
    theta_star = np.clip(theta_star, theta_1 - 2.0 * reach, theta_1 + 2.0 * reach)
    if not space.in_support(theta_star):
        theta_star = theta_1

    # 7. refinement (only when allowed), in a further reservation
    refined = None
    if max_share is not None and max_share > share:
        refined = _refinement(
            theta_star,
            covariance,
            location_covariance,
            channel=channel,
            budget=budget,
            room=(max_share - share) * budget.capacity_mu,
            pooled_releases=len(second.points),
            z_grad=z_grad,
            precond=precond,
            precond_clip=precond_clip,
            designs=[first, second],
            prior=prior,
            label=label,
        )
    extra_mu = extra_histogram_mu = 0.0
    extra_releases = 0
    if refined is not None:
        theta_star, covariance = refined.theta, refined.covariance
        location_covariance = refined.location_covariance
        extra_mu, extra_histogram_mu = refined.mu, refined.histogram_mu
        extra_releases = refined.releases

    # 8. ratio clip along the directions the sampler jumps in (a plain ratio's only)
    llr_clip = None
    if ratio_clip:
        root = np.sqrt(np.diag(covariance))
        directions = public_rng.standard_normal((_DIRECTIONS, d)) * root
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        slopes = GradNormHistogram(
            channel, edges=HISTOGRAM_EDGES, noise_multiplier=z_histogram, directions=directions
        )
        released = slopes(theta_star)
        llr_clip = _clip(
            released.value,
            released.noise_std,
            n * _DIRECTIONS,
            "log-likelihood slopes",
            per_row=_DIRECTIONS,
        )
    if channel.counter.mu - released_before > (cost.gaussian_mu() + extra_mu) * (1 + 1e-9):
        raise InvalidParameterError(  # pragma: no cover - the counter refuses it first
            "internal error: the initialisation released more than it reserved"
        )
    return PrivateStart(
        theta=theta_star,
        covariance=covariance,
        location_covariance=location_covariance,
        grad_clip=grad_clip,
        llr_clip=llr_clip,
        ascent_clip=ascent_clip,
        mu=float(cost.gaussian_mu()) + extra_mu,
        phases={
            "clip selection": histograms * float(histogram_event.gaussian_mu())
            + extra_histogram_mu,
            "initialisation": n_grads * float(grad_event.gaussian_mu())
            + extra_mu
            - extra_histogram_mu,
        },
        releases=n_grads + extra_releases,
        ascent_theta=theta_a,
        precond=precond,
        precond_clip=precond_clip,
        histograms=histograms + (refined is not None),
    )


#: The centring's releases of a histogram's size: norms at θ* and at θ_c, Fisher, ratios.
_CENTRING_HISTOGRAMS = 4
#: Public pairs of points at which the centred ratios are counted.
_CENTRING_PAIRS = 8
#: The longest Newton step from θ* to the centre, in posterior sds, up to this many
#: parameters; beyond, it grows with √d.
_MAX_CENTRE_STEP = 25.0
_TRUST_DIMENSION = 16.0
#: ... and up to this many times that while long steps keep going uphill (:func:`_centre_steps`)
_CENTRE_REACH_GROWTH = 256.0
#: The Newton steps' gradients: this share of what is left after the histograms; a round's
#: steps share it, each full release a third of it (:func:`_centre_steps`).
_CENTRE_STEP_SHARE = 0.25
_CENTRE_STEPS = 3
#: Later steps' noise length: about this fraction of the last step's length (in sds of Σ̂)...
_CENTRE_STEP_PRECISION = 8.0
#: ... and at most this many releases per round.
_CENTRE_MAX_RELEASES = 12
#: A step whose gradient is within this many noise lengths of zero ends the Newton steps.
_CENTRE_STOP_SIGNAL = 3.0
#: Extra Fisher releases at a round's centre, in all, while the last one bounds some direction's
#: information only loosely (:func:`~pymc_dp.kernels.initialization.loose_directions`) or, for a
#: metric taken from them, is too rough (``_SHARPENING_PRECISION``).
_SHARPENING_READS = 4
#: ... while what is left after one is at least this share of what the first round's steps
#: began with (``Ĝ`` and the sampler keep that much; a loose direction's metric can be off by
#: hundreds of times, a read costs a few per cent of the capacity).
_SHARPENING_LEFT = 1.0 / 6.0
#: A sharper read is whitened with the last estimate's ``P`` while that estimate leaves a
#: direction loose and ``P`` rescales some direction by more than this factor against the
#: whitening the pooled reads were made in; else it is made in that whitening and clip, and
#: pooled with them.
_POOL_CHANGE = 2.0
#: Where the sampler's metric is taken from the Fisher reads (no observed curvature, step 5),
#: they go on, loose directions or not, while their noise radius is over this share of the
#: median information they state (:func:`~pymc_dp.kernels.initialization.relative_noise`).
#: With 41–89 parameters at n = 10⁵–10⁶ four pooled reads end at 0.3–0.37, so there it means
#: every read that ``_SHARPENING_READS`` and ``_SHARPENING_LEFT`` allow.
_SHARPENING_PRECISION = 0.2
#: Whether the centring releases the log likelihood's observed information at the centre
#: (:func:`private_centring`, step 5), and up to how many parameters: its ``2d`` dense
#: gradient passes cost about ``d²`` times a Fisher release's one (89 parameters, 10⁵ rows:
#: 54 s against 0.1 s, beside two test suites on this machine's two cores).
_OBSERVED_CURVATURE = True
_OBSERVED_CURVATURE_MAX_DIM = 32
#: Rounds of (Fisher, Newton steps, norm histogram) at most (each round's steps reach about
#: 300 sd: a climb in a model's own units can end a thousand sd out, and with three rounds two
#: of eight preparations of such a regression at n = 10⁶ stayed 75–250 sd off, none of eight
#: with five); another round when the last one's steps moved the centre further than this
#: many posterior sds from where it read the Fisher.
_CENTRING_ROUNDS = 5
_RECENTRE_SD = 5.0
#: ... and further than this many noise lengths of the round's steps (in large d, noise alone
#: moves far).
_RECENTRE_NOISE = 3.0
#: ... while at least this share of what the first round's steps began with is left after it.
_RECENTRE_LEFT = 1.0 / 3.0


class Centring(NamedTuple):
    """What the centring phase released (all public): the control variate of the ratio.

    Attributes
    ----------
    centre : Centre
        ``θ_c`` (the private mode ``θ*``) and the clip of its per-row gradients.
    gradient : ndarray
        ``Ĝ``: the noisy clipped log-likelihood gradient sum at ``θ_c``.
    gradient_covariance : ndarray
        Covariance of ``Ĝ``'s noise (``σ² P⁻¹ P⁻ᵀ`` conditioned on the coordinates the
        likelihood does not read, where it is 0: :class:`CentreGradientRelease`).
    metric : ndarray
        ``W``: Cholesky factor of the private posterior covariance ``Σ̂`` (the last usable
        round's Fisher release, with the prior's Hessian at ``θ_c``; the initialisation's
        ``Σ̂₀`` if no round gave a usable one; the last sharper reads' when there were any,
        pooled where they shared a whitening).
    remainder_clip : float
        ``h``: per-row bound on the centred ratio per unit of ``‖δ‖ (‖u‖ + ‖u'‖)/2``.
    mu : float
        PLD parameter spent (every reservation of the centring).
    phases : dict
        ``μ`` per phase: the norm and ratio histograms under ``"clip selection"``, the Fisher
        information (one per round, and the sharper reads) and the gradients under
        ``"initialisation"``.
    releases : int
        Releases other than histograms: the Fisher information and the gradients.
    unresolved : int
        Directions in which the last Fisher release does not resolve the information from its
        noise (:func:`~pymc_dp.kernels.initialization.unresolved_directions`); there ``Σ̂``
        takes a rougher guess within what the release allows (an earlier estimate; after
        sharper reads, the range's geometric midpoint).
    rounds : int
        Rounds of (Fisher, Newton steps, norm histogram) (:func:`private_centring`).
    sharpened : int
        Fisher releases at the centre after the rounds, for loosely bounded directions or a
        rough metric (:func:`private_centring`, step 4).
    histograms : int
        Histogram releases: the norm histograms (one per round and one at ``θ*``), the
        ratio histogram and the observed curvature's norm histogram (a round dropped for a
        singular curvature reserved its norm histogram too, and is counted).
    curvature_checked : bool
        Whether the log likelihood's observed information was released at the centre
        (:func:`private_centring`, step 5); ``metric`` is then from it where it was usable
        (not indefinite beyond its noise, not numerically singular).
    """

    centre: Centre
    gradient: np.ndarray
    gradient_covariance: np.ndarray
    metric: np.ndarray
    remainder_clip: float
    mu: float
    phases: dict[str, float]
    releases: int = 3
    unresolved: int = 0
    rounds: int = 1
    histograms: int = 3
    sharpened: int = 0
    curvature_checked: bool = False

    def shift_sd(self) -> float:
        """The largest standard deviation, in posterior sd, of the mean's shift ``Σ ξ``.

        The target is the posterior tilted by ``exp(ξ·θ)``, ``ξ`` the noise of ``Ĝ``
        (covariance ``gradient_covariance``); for a Gaussian posterior with covariance
        ``Σ = W Wᵀ`` its mean moves by ``Σ ξ``. Public (from ``Σ̂`` and the noise scale).
        """
        covariance = self.metric @ self.metric.T
        moved = covariance @ self.gradient_covariance @ covariance
        return float(np.max(np.sqrt(np.diag(moved) / np.diag(covariance))))


#: The independence proposal's degrees of freedom: 7, or d/3 beyond 21 parameters.
_INDEPENDENCE_DF = 7.0


def independence_df(d: int) -> float:
    """Degrees of freedom of DPPenalty's independence proposal (a t) in ``d`` dimensions.

    The t's heavy tails cover a private covariance that is too narrow, but in many dimensions
    its radius, ``‖u‖² ~ d·F(d, ν)``, strays far from a Gaussian target's (``d ± √(2d)``), and
    the Hastings weights with it: with the exact covariance and no noise, ``t₇`` accepts 81 %
    of its draws in d = 5 and 33 % in d = 89; ``t₃₀`` 59 % in d = 89, and with every sd off by
    10 % (as the centring's ``Σ̂`` can be) 26 % against ``t₇``'s 15 % (public Monte Carlo).
    """
    return max(_INDEPENDENCE_DF, d / 3.0)


def centring_pairs(
    theta: np.ndarray,
    metric: np.ndarray,
    rng: np.random.Generator,
    m: int,
    independence_probability: float,
) -> np.ndarray:
    """``m`` public pairs ``(θ, θ')`` like the sampler's: ``θ ~ N(θ_c, Σ̂)``, then a random-walk
    jump (``2.38/√d`` in ``Σ̂``) or an independence draw (``t_ν(θ_c, Σ̂)``,
    ``ν`` = :func:`independence_df`), in the sampler's proportions: the first
    ``round(m (1 − p))`` pairs (at least one) walk, the rest are independence draws, for the
    share ``p`` of independence proposals."""
    theta = np.asarray(theta, dtype=float)
    d = theta.size
    df = independence_df(d)
    walks = max(1, round(m * (1.0 - independence_probability)))
    pairs = np.empty((m, 2, d))
    for k in range(m):
        u = rng.standard_normal(d)
        if k < walks:
            u_new = u + 2.38 / math.sqrt(d) * rng.standard_normal(d)
        else:
            u_new = rng.standard_normal(d) / math.sqrt(rng.chisquare(df) / df)
        pairs[k] = theta + np.stack([u, u_new]) @ metric.T
    return pairs


def private_centring(
    channel: PrivateChannel,
    budget: object,
    start: PrivateStart,
    *,
    histogram_share: float,
    sampler_mu: Callable[[float], float],
    public_rng: np.random.Generator,
    independence_probability: float,
    label: str = "initialization",
) -> Centring:
    """The control variate of :class:`~pymc_dp.mechanisms.CentredLLRRelease`, privately.

    Reservations, each made before its read (theory §7, step 8):

    1. Four releases of ``histogram_share · M*`` each. At ``θ*``, whitened with ``P₀`` (from
       the initialisation's ``Σ̂₀``; ``P = Wᵀ/|det W|^{1/d}`` for a Cholesky factor ``W``): a
       :class:`~pymc_dp.mechanisms.GradNormHistogram` of ``‖P₀ ∇ℓ_i‖`` (its far tail is the
       clip ``C₀``), then a :class:`~pymc_dp.mechanisms.FisherRelease` with that clip, whence
       the curvature ``Σ̂ = (P₀⁻¹ F P₀⁻ᵀ − H_prior)⁻¹``
       (:func:`~pymc_dp.kernels.initialization.covariance_from_fisher`; a direction the release
       does not resolve keeps ``Σ̂₀``'s information). Whitening with the initialisation's
       curvature gives every direction an equal share of the clip, so the Fisher resolves
       the weak ones. ``P`` (from ``Σ̂``) whitens the centre's releases (their noise then moves
       every direction of the target by the same number of posterior sds); the Newton steps
       use the clip ``C₀`` rescaled by the ratio of the rows' expected norms under ``P`` and
       ``P₀``. The third, after the steps, a histogram of ``‖P ∇ℓ_i(θ_c)‖`` gives the clip
       ``C`` there (the tail at ``θ_c`` can be far heavier than at ``θ*``). The fourth, a
       :class:`~pymc_dp.mechanisms.CentredRatioHistogram` at ``_CENTRING_PAIRS`` public pairs
       around the centre drawn like the sampler's proposals (:func:`centring_pairs`), gives
       ``h``, its far tail (the rule of the gradient clips).
       With group-indexed variables every whitening here gives a variable's groups one common sd
       (:func:`_centring_whitening`), and every Fisher release is fitted to the likelihood's
       public zeros (``channel.fisher_pattern``,
       :class:`~pymc_dp.kernels.fisher_noise.FisherNoise`).
    2. Newton steps to the centre ``θ_c`` (:func:`_centre_steps`: ``_CENTRE_STEP_SHARE`` of
       what is left between them, a full release a third of it, rougher ones for long steps,
       the public prior kept exact and the likelihood's part shrunk by its noise, until a full
       one is within ``_CENTRE_STOP_SIGNAL`` noise lengths of zero). Then ``Σ̂`` is recomputed
       from the same Fisher release with the prior's Hessian at ``θ_c`` (a hierarchical
       prior's curvature can change by orders of magnitude on the way), and ``P`` from it
       (the clip rescaled as above). A curvature that comes out numerically singular is not
       used: in the first round ``Σ̂₀`` stands in; a later round is dropped (its releases stay
       spent) and the last one's result kept. The remainders' bound grows with the centre's
       distance from the mode, and the initialisation's mode can be tens of sds off when a
       scale parameter's per-row gradients are heavy-tailed.
    3. **Another round** when the steps moved the centre further than
       ``max(_RECENTRE_SD, _RECENTRE_NOISE · τ)`` (the length of the move in ``Σ̂``'s metric,
       ``τ`` the root sum of squares of the steps' noise lengths), at most
       ``_CENTRING_ROUNDS`` rounds, while two more histogram-sized releases fit and leave at
       least ``_RECENTRE_LEFT`` of what the first round's steps began with: far from the mode
       the rows' Fisher information can be far from the posterior's (on the zoo's mixture,
       100–200 sd out, ``Σ̂``'s sds came out 2.6–4.4 times the truth and the centre stayed
       20–45 sd off). A reservation of two releases of ``histogram_share · M*``: the Fisher at
       ``θ_c`` with the clip ``C`` and a whitening from the last release (the geometric
       midpoint of the information it allows along a direction it does not resolve, as in 4,
       rather than ``Σ̂``'s top of that range; ``C`` carried over by the rows' typical norms),
       then Newton steps with it (the first round's allowance), then a norm histogram at the
       new ``θ_c``. ``Σ̂``, ``P`` and ``Ĝ``'s clip are the last usable round's.
    4. **Sharper curvature for the sampler.** While the last Fisher release leaves a direction
       whose information it bounds only loosely
       (:func:`~pymc_dp.kernels.initialization.loose_directions`: the top of its range more
       than four times the bottom, the prior's information included), or, where the sampler's
       metric is taken from these releases (no step 5 for the model), while its noise radius
       is over ``_SHARPENING_PRECISION`` of the median information it states
       (:func:`~pymc_dp.kernels.initialization.relative_noise`), up to
       ``_SHARPENING_READS`` more :class:`~pymc_dp.mechanisms.FisherRelease` at ``θ_c`` (while
       what is left after one is at least ``_SHARPENING_LEFT`` of what the first round's steps
       began with), each of ``histogram_share · M*`` reserved before its read. The first is
       whitened with the last round's release's midpoint, as between rounds
       (:func:`_midpoint_read`); each later one with the ``P`` the last estimate gives, its
       clip carried over by the rows' typical norms, where that ``P`` rescales some direction
       by more than ``_POOL_CHANGE`` (:func:`_whitening_change`) while a direction is loose,
       and otherwise with the last read's ``P`` and clip, and then pooled with the reads made
       in them
       (:func:`_pooled_fisher`: their precision-weighted mean, the noise sd of the pool;
       post-processing). The reads after the loose directions close are pooled (where the
       first leaves one loose, the three after it: their noise divided by √3): on a
       41-parameter regression at n = 10⁵,
       ε = 5, ``Σ̂``'s error against the exact covariance (rms of the log eigenvalues of
       ``Σ̂ Σ⁻¹``) went from 0.25 (each read replacing the last) to 0.16, on the zoo's centred
       hierarchy from 0.15 to 0.08. The first read also reserves a norm histogram of
       ``‖P ∇ℓ_i(θ_c)‖`` in the last estimate's ``P``, which gives ``Ĝ``'s clip there.
       A loose direction is a ridge the likelihood does not inform (a non-centred
       hierarchy's ``μ_a, σ_a`` against its ``z_j``) or one the whitening squeezed; the new
       whitening spreads the clip over it, and each read tightens its bound (by 6–8 times on
       the zoo's hierarchy at n = 10⁶). In
       these reads an unresolved direction takes the geometric midpoint of the information
       the release allows (``covariance_from_fisher(..., midpoint=True)``), not the earlier
       estimate, which in the release's whitening claims the top of the range.
       ``Σ̂`` (the sampler's metric) is then the last pool's, ``P`` the whitening it gives
       and the clip of ``Ĝ`` from the norm histogram in that ``P``;
       the Newton steps above keep the tighter curvature, which holds them near a curved
       ridge.
    5. **The observed curvature.** For at most ``_OBSERVED_CURVATURE_MAX_DIM`` parameters and
       a likelihood without kinks (``channel.likelihood_has_kinks``: there the rows'
       Hessians are zero but at the kinks, where all the curvature is), while two more
       histogram-sized releases fit and leave at
       least ``_SHARPENING_LEFT`` of what the first round's steps began with: a
       :class:`~pymc_dp.mechanisms.CurvatureNormHistogram` and a
       :class:`~pymc_dp.mechanisms.CurvatureRelease` at ``θ_c`` in the last ``P``
       (:func:`_observed_curvature`). Every Fisher release above estimates the rows' gradient
       variance ``J``, which is the log likelihood's curvature ``H`` (the posterior's) only
       where the likelihood describes the rows' variance: for overdispersed counts under a
       Poisson likelihood ``J`` is 3–7 times ``H``, ``Σ̂`` that many times too narrow, and the
       chains did not mix (the zoo's ``poisson_overdispersed`` at ``n = 10⁵``, ε = 5:
       R̂ 1.46, 8 effective draws). ``Σ̂`` and ``P`` are then the curvature's (``Ĝ``'s clip
       carried over by the rows' typical norms), unless the release is indefinite beyond its
       noise (a mixture's far from its mode) or unusable.
    6. ``Ĝ``: one :class:`~pymc_dp.mechanisms.CentreGradientRelease` at ``θ_c`` with what is
       left of the budget once the sampler's need ``sampler_mu(h)`` (PLD ``μ`` of the planned
       run at its target noise, a function of the released ``h``) is set aside, and at least
       half of it. Its clip is the one above (carried to ``P``), moved up the grid to where
       the excess of the rows a model of the histogram's tail puts above it balances the
       noise of ``Ĝ`` at half of what is left (:func:`_balanced_clip`,
       :func:`~pymc_dp.releases.bias_balanced_clip`: post-processing), before the ratio
       histogram (the fourth release of 1) is read: its remainders use it. The noise of
       ``Ĝ`` tilts the sampler's target by ``exp(ξ·θ)`` (:meth:`Centring.shift_sd`), so
       whatever the sampler does not need goes here.
    """
    space = channel.space
    n = channel.n_rows
    d = space.ndim
    # the entries of the rows' Fisher information that can be non-zero, and the variables
    # each row reads at one group (public: the graph)
    pattern, gathered = channel.fisher_pattern, channel.gathered_blocks
    # the directions along which no row's log-likelihood changes (public: the graph): their
    # information is the prior's, known without a read
    flat = channel.likelihood_flat_directions
    mu_histogram = float(histogram_share) * budget.capacity_mu
    z_histogram = math.sqrt(1.0 / (2.0 * mu_histogram))
    histogram_event = GaussianCost.from_noise_multiplier(z_histogram)
    if not budget.fits(histogram_event, _CENTRING_HISTOGRAMS):
        raise BudgetExceededError(
            f"{budget.spent_summary()}; the centring of the ratio does not fit beside what is "
            "already spent. Nothing was read."
        )
    budget.reserve(
        histogram_event,
        _CENTRING_HISTOGRAMS,
        mechanism=f"{label} (centring: curvature, histograms)",
    )
    channel.counter.allow(histogram_event, _CENTRING_HISTOGRAMS)
    # the clip in the initialisation's whitened coordinates: a histogram of ‖P₀ ∇ℓ_i(θ*)‖
    whitening = _centring_whitening(start.covariance, gathered)
    # (``tail``: the histogram the current clip of Ĝ came from, for its balance at the end)
    tail: _NormClip | None = _norm_clip(channel, start.theta, whitening, z_histogram)
    clip = tail.clip
    if not np.isfinite(clip):  # nothing visible: four times the typical norm if Σ̂₀ is right
        clip, tail = 4.0 * _typical_norm(np.linalg.inv(start.covariance), whitening, n), None
    theta_c = np.array(start.theta, dtype=float)
    step_mus, rounds, next_mu, sharpened = [], 0, None, 0
    checked = 0  # the observed curvature's releases (step 5)
    curvature_read = False  # whether its curvature release was made (not only reserved)
    covariance, fisher = start.covariance, None
    # the whitening and clip of the next Fisher read (the last estimate's, unless a round
    # gives a better one for reading below)
    read_whitening, read_clip = whitening, clip

    def remaining_mu() -> float:  # what the ledger has left, this centring's releases counted
        return _remaining_mu(
            budget,
            start,
            _centring_histograms(rounds, sharpened) + 2 * checked,
            mu_histogram,
            step_mus,
        )

    while True:
        rounds += 1
        # the last round's result, kept should this round's curvature come out unusable
        kept = (theta_c, covariance, whitening, clip, fisher, tail)
        # the curvature at the current centre: the clipped Fisher information, whitened as
        # the last round chose (with Σ̂₀ in the first round)
        fisher = FisherRelease(
            channel, grad_clip=read_clip, noise_multiplier=z_histogram, whitening=read_whitening
        )(theta_c)
        prior = prior_hessian(space.logprior_grad, theta_c)  # public
        covariance = covariance_from_fisher(
            fisher.value,
            read_whitening,
            fisher.noise_std,
            prior,
            fallback=start.covariance,
            pattern=pattern,
            flat=flat,
        )
        if not _usable(covariance):  # numerically singular: the previous round's result
            if rounds > 1:
                # (old_whitening, which the kept release was read in, is reassigned only
                # below, so it stays paired with that release for the sharper reads)
                theta_c, covariance, whitening, clip, fisher, tail = kept
                break
            covariance = start.covariance
        information = np.linalg.inv(covariance)
        old_whitening, whitening = read_whitening, _centring_whitening(covariance, gathered)
        clip = _rescaled_clip(read_clip, information, whitening, old_whitening, n)
        # Newton steps from there with whitened gradients: each step's share is fixed in the
        # first round (a share of what is left then, split evenly)
        remaining = remaining_mu()
        if rounds == 1:
            first_remaining = remaining
            step_mu = _CENTRE_STEP_SHARE * remaining / _CENTRE_STEPS
        round_start = theta_c
        theta_c, taken, noise_length, next_mu = _centre_steps(
            channel,
            budget,
            theta_c,
            covariance,
            clip,
            whitening,
            step_mu,
            label,
            first_mu=next_mu,
            prior_part=prior_information(prior),
        )
        step_mus += taken
        # the curvature at the new centre: the same release, the prior's part where the centre
        # now is (a hierarchical prior's curvature can change by orders of magnitude on the way)
        round_covariance = covariance
        moved_prior = prior_hessian(space.logprior_grad, theta_c)  # public
        moved_covariance = covariance_from_fisher(
            fisher.value,
            old_whitening,
            fisher.noise_std,
            moved_prior,
            fallback=start.covariance,
            pattern=pattern,
            flat=flat,
        )
        if _usable(moved_covariance):
            covariance = moved_covariance
            information = np.linalg.inv(covariance)
            previous_whitening = whitening
            whitening = _centring_whitening(covariance, gathered)
            clip = _rescaled_clip(clip, information, whitening, previous_whitening, n)
        # the clip at the new centre from the rows' whitened norms there: their tail can be
        # far heavier than where the round began (a mixture's responsibilities), and a clip
        # below it biases what is released there by the clipped rows' excess (14 sd of Ĝ on
        # the zoo's mixture)
        centre_norms = _norm_clip(channel, theta_c, whitening, z_histogram)
        if np.isfinite(centre_norms.clip):
            clip, tail = centre_norms.clip, centre_norms
        # a long way from where the curvature was read (the length of the move in Σ̂, beyond
        # what the steps' noise alone would give): read it again there (a Fisher far from the
        # mode can be far from the information, e.g. a mixture's), and the norms. Another round
        # only while what is left after its histograms is at least a third of what the first
        # round's steps began with, so that Ĝ and the sampler keep a good part of theirs
        moved = float(
            np.linalg.norm(
                np.linalg.solve(np.linalg.cholesky(round_covariance), theta_c - round_start)
            )
        )
        left = remaining_mu() - 2 * mu_histogram
        if (
            rounds >= _CENTRING_ROUNDS
            or moved <= max(_RECENTRE_SD, _RECENTRE_NOISE * noise_length)
            or not budget.fits(histogram_event, 2)
            or left < _RECENTRE_LEFT * first_remaining
        ):
            break
        budget.reserve(histogram_event, 2, mechanism=f"{label} (centring: curvature again)")
        channel.counter.allow(histogram_event, 2)
        # the next read's whitening: where this release left a direction unresolved, the
        # Newton steps took the top of its range (an earlier estimate's information, which
        # keeps them short), but whitening the next read with it keeps that direction
        # squeezed, and it is resolved only a little better each round (a regression in its
        # covariates' own units: the intercept's sd 0.08, 0.2, 0.5 of the truth in three
        # rounds). The range's geometric midpoint, as the sharper reads below take it, spreads
        # the next read's clip over such directions (there: 0.08, 0.5, 1.0)
        read_whitening, read_clip = _midpoint_read(
            fisher,
            old_whitening,
            moved_prior,
            whitening,
            clip,
            gathered,
            n,
            pattern=pattern,
            flat=flat,
        )
    # directions the last release bounds only loosely (a ridge the likelihood does not inform,
    # a hierarchy's μ_a, σ_a against its z_j; or one its whitening squeezed): read the
    # curvature again at the centre, in the whitening the last estimate gives (its range's
    # midpoint along what it does not resolve, as between rounds), which spreads
    # the clip over those directions and tightens their bound. Only the sampler's metric takes
    # it: the Newton steps above keep the tighter curvature, which holds them near a curved
    # ridge. The centre's gradient is released in the new whitening (its noise then tilts every
    # direction by the same number of posterior sds; in the old one, a squeezed direction's
    # noise was stretched back by as much), with the clip of a norm histogram in it
    fisher_whitening = old_whitening
    prior = prior_hessian(space.logprior_grad, theta_c)  # public
    sharp_clip, sharp_whitening = clip, whitening
    # the first read whitened as between rounds, with the last release's midpoint (on the
    # zoo's centred hierarchy at n = 10⁵, ε = 5, ten seeds: the same or closer starts, two
    # 2.6 → 1.8 and 1.4 → 0.8 sd, the latter after one read instead of four)
    read_whitening, read_clip = _midpoint_read(
        fisher, fisher_whitening, prior, whitening, clip, gathered, n, pattern=pattern, flat=flat
    )
    pool: _PooledFisher | None = None  # the reads at θ_c in the current read whitening
    # whether the sampler's metric will be these reads' (else the observed curvature's, step 5)
    metric_from_fisher = not observes_curvature(channel)

    fit = {"pattern": pattern, "flat": flat}

    def release() -> tuple:  # the last estimate's release, as the noise-model functions take it
        return fisher.value, fisher_whitening, fisher.noise_std, prior

    loose = loose_directions(*release(), **fit)  # of the last estimate, once per read
    while True:
        # the first read also reserves the norm histogram that gives Ĝ's clip afterwards
        events = 1 if sharpened else 2
        if (
            sharpened >= _SHARPENING_READS
            # a loose direction, or (for the metric) too rough an estimate
            or not (
                loose
                or (
                    metric_from_fisher and relative_noise(*release(), **fit) > _SHARPENING_PRECISION
                )
            )
            or not budget.fits(histogram_event, events)
            or remaining_mu() - events * mu_histogram < _SHARPENING_LEFT * first_remaining
        ):
            break
        budget.reserve(histogram_event, events, mechanism=f"{label} (centring: sharper curvature)")
        channel.counter.allow(histogram_event, events)
        sharpened += 1
        sharper = FisherRelease(
            channel, grad_clip=read_clip, noise_multiplier=z_histogram, whitening=read_whitening
        )(theta_c)
        # a read in the whitening and clip of the last ones at this point estimates the same
        # matrix: their precision-weighted mean (post-processing) has their pooled noise
        sharper = _pooled_fisher(pool, sharper, read_whitening, read_clip)
        sharper_covariance = covariance_from_fisher(
            sharper.value,
            read_whitening,
            sharper.noise_std,
            prior,
            midpoint=True,
            pattern=pattern,
            flat=flat,
        )
        if not _usable(sharper_covariance):
            break
        fisher, fisher_whitening, covariance = sharper, read_whitening, sharper_covariance
        pool = sharper
        sharp_whitening = _centring_whitening(covariance, gathered)
        sharp_clip = _rescaled_clip(
            read_clip, np.linalg.inv(covariance), sharp_whitening, fisher_whitening, n
        )
        # the next read: in the whitening this estimate gives while it leaves a direction loose
        # and moves some direction's scale by more than _POOL_CHANGE from the whitening of the
        # pooled reads (a ridge still being resolved: the new whitening spreads the clip over
        # it); else in the same one, to be pooled with these (on a 41-parameter regression at
        # n = 10⁵, ε = 5, four reads each replacing the last left sds 0.81–1.36 times the
        # exact ones: their noise, not the whitening's)
        loose = loose_directions(*release(), **fit)
        if loose and _whitening_change(sharp_whitening, read_whitening) > math.log(_POOL_CHANGE):
            read_whitening, read_clip = sharp_whitening, sharp_clip
    whitening, clip = sharp_whitening, sharp_clip
    if sharpened:  # Ĝ's clip from the rows' norms in the new whitening (reserved above)
        sharp_norms = _norm_clip(channel, theta_c, whitening, z_histogram)
        if np.isfinite(sharp_norms.clip):
            clip, tail = sharp_norms.clip, sharp_norms
    # the log likelihood's own curvature at the centre: the Fisher releases above measure the
    # rows' gradient variance, which is the curvature only where the likelihood describes the
    # rows' variance (overdispersed counts under a Poisson likelihood: 3–7 times it)
    # (not for a likelihood with kinks: its rows' Hessians are zero but at their kinks, where
    # all its curvature is, and the differences of each row's gradients miss it; the zoo's
    # median regression at n = 10⁵, ε = 5 went from R̂ 1.08, 0.8 sd to R̂ 4.6, 60 sd with it)
    if (
        observes_curvature(channel)
        and budget.fits(histogram_event, 2)
        and remaining_mu() - 2 * mu_histogram >= _SHARPENING_LEFT * first_remaining
    ):
        budget.reserve(histogram_event, 2, mechanism=f"{label} (centring: observed curvature)")
        channel.counter.allow(histogram_event, 2)
        checked = 1
        observed, curvature = _observed_curvature(
            channel,
            theta_c,
            covariance,
            whitening,
            z_histogram,
            prior_hessian(space.logprior_grad, theta_c),
            pattern=pattern,
            flat=flat,
        )
        curvature_read = curvature is not None
        if observed is not None:
            observed_covariance = observed
            observed_whitening = _centring_whitening(observed_covariance, gathered)
            # Ĝ's clip carried over by the rows' typical norms, which the gradient variance
            # (the Fisher's estimate) sets, not the curvature (read again in the new
            # whitening, on the zoo's overdispersed counts at ε = 5, it moved from 64.7 to 64)
            clip = _rescaled_clip(clip, np.linalg.inv(covariance), observed_whitening, whitening, n)
            fisher, fisher_whitening = curvature, whitening
            covariance, whitening = observed_covariance, observed_whitening
    # Ĝ's clip where the bias of the rows above it balances its noise (the far-tail rule
    # leaves a heavy tail's rows out: on the zoo's robust regression at n = 10⁵, ε = 5, 1.0 sd
    # of bias in ν and σ), planned at the least Ĝ gets, half of what is left (the sampler's
    # share depends on h, which depends on this clip)
    planned_mu = 0.5 * remaining_mu()
    planned_z = math.sqrt(1.0 / (2.0 * planned_mu))
    read_directions = int(np.sum(channel.likelihood_coordinates)) - np.shape(flat)[1]
    clip = _balanced_clip(tail, clip, planned_z, max(read_directions, 1))
    metric = np.linalg.cholesky(covariance)
    histograms = _centring_histograms(rounds, sharpened) + 2 * checked
    centre = Centre(theta_c, float(clip), whitening)
    template = CentredLLRRelease(  # for the bound only: it releases nothing
        channel,
        centre=centre,
        centre_gradient=np.zeros(d),
        metric=metric,
        remainder_clip=1.0,
        noise_multiplier=1.0,
    )
    pairs = centring_pairs(theta_c, metric, public_rng, _CENTRING_PAIRS, independence_probability)
    pairs = np.array([p for p in pairs if space.in_support(p[0]) and space.in_support(p[1])])
    histogram = CentredRatioHistogram(
        channel, ratio=template, pairs=pairs, edges=HISTOGRAM_EDGES, noise_multiplier=z_histogram
    )
    counts = histogram()
    m = pairs.shape[0]
    # with kinks, above a tail too thin for any one bin to show: every row's remainder is of
    # second order but the few whose kink lies between the points, which carry all of the
    # curvature (on the zoo's median regression at n = 10⁵, ε = 5, 2–4 σ per bin over a dozen
    # grid steps; a clip under them flattened the target: R̂ 2.1–3.0). Not for a smooth
    # likelihood: there such a tail is the rows whose gradient Ĝ's clip cut, whose bias the
    # clip's balance has weighed, and reading it cost 15–50 % of the predicted draws in some
    # preparations of the overdispersed counts and the negative binomial at ε = 1
    remainder_clip = _clip(
        counts.value,
        counts.noise_std,
        n * m,
        "centred ratios",
        per_row=m,
        spread=channel.likelihood_has_kinks,  # public: the graph on made-up rows
    )

    remaining = remaining_mu()
    mu_gradient = max(remaining - float(sampler_mu(remainder_clip)), 0.5 * remaining)
    z_gradient = math.sqrt(1.0 / (2.0 * mu_gradient))
    gradient_event = GaussianCost.from_noise_multiplier(z_gradient)
    budget.reserve(gradient_event, 1, mechanism=f"{label} (centre)")
    channel.counter.allow(gradient_event, 1)
    release = CentreGradientRelease(channel, centre=centre, noise_multiplier=z_gradient)
    released = release()
    steps_mu = math.fsum(step_mus)
    histogram_mu = float(histogram_event.gaussian_mu())
    return Centring(
        centre=centre,
        gradient=np.asarray(released.value, dtype=float),
        gradient_covariance=release.noise_covariance,
        metric=metric,
        remainder_clip=remainder_clip,
        mu=float(histograms * histogram_mu + steps_mu + gradient_event.gaussian_mu()),
        phases={
            # the norm histograms and the ratio histogram; the Fisher releases are curvature
            "clip selection": (histograms - rounds - sharpened - checked) * histogram_mu,
            "initialisation": float(
                (rounds + sharpened + checked) * histogram_mu
                + steps_mu
                + gradient_event.gaussian_mu()
            ),
        },
        releases=1 + rounds + sharpened + curvature_read + len(step_mus),
        unresolved=unresolved_directions(
            fisher.value, fisher.noise_std, fisher_whitening, pattern, flat=flat
        ),
        rounds=rounds,
        histograms=rounds + 2 + (sharpened > 0) + checked,
        sharpened=sharpened,
        curvature_checked=curvature_read,
    )


def observes_curvature(channel: PrivateChannel) -> bool:
    """Whether :func:`private_centring`'s step 5 (the observed curvature) applies to the
    channel's model: at most ``_OBSERVED_CURVATURE_MAX_DIM`` parameters and a likelihood
    without kinks (public: the graph, made-up rows)."""
    return (
        _OBSERVED_CURVATURE
        and channel.space.ndim <= _OBSERVED_CURVATURE_MAX_DIM
        and not channel.likelihood_has_kinks
    )


def _observed_curvature(
    channel: PrivateChannel,
    theta: np.ndarray,
    covariance: np.ndarray,
    whitening: np.ndarray,
    noise_multiplier: float,
    prior: np.ndarray,
    *,
    pattern: np.ndarray | None,
    flat: np.ndarray | None,
) -> tuple[np.ndarray | None, Release | None]:
    """``(Σ̂, release)``: ``Σ̂`` from the log likelihood's observed information at ``θ``, or
    ``None`` to keep ``covariance`` (the Fisher's); the curvature release, or ``None`` where it
    was not made. Reads up to two releases reserved by the caller.

    A :class:`~pymc_dp.mechanisms.CurvatureNormHistogram` of ``‖P ∇²ℓ_i P ᵀ‖_F`` gives the
    clip (the rule of the gradient clips), then a :class:`~pymc_dp.mechanisms.CurvatureRelease`
    with it; ``Σ̂`` follows as from a Fisher release
    (:func:`~pymc_dp.kernels.initialization.covariance_from_fisher`), a direction it does not
    resolve keeping the Fisher's information within what it allows. Where the likelihood
    describes the rows' variance the two estimate one matrix; where it does not (overdispersed
    counts), the curvature is the posterior's. Kept out: a release with an eigenvalue more than
    its noise's radius below zero (the log likelihood is not concave there: a mixture's far
    from its mode, where the Fisher's Gauss–Newton curvature is the safer one), no visible bin,
    or a numerically singular result. Post-processing of the two releases.
    """
    n, d = channel.n_rows, channel.space.ndim
    norms = CurvatureNormHistogram(
        channel, edges=HISTOGRAM_EDGES, noise_multiplier=noise_multiplier, whitening=whitening
    )(theta)
    steps_up = _hidden_margin(norms.noise_std, n)
    clip = clip_from_counts(norms.value, HISTOGRAM_EDGES, norms.noise_std, n, steps_up=steps_up)
    if not np.isfinite(clip):  # no bin visible: too few rows for the noise
        return None, None
    curvature = CurvatureRelease(
        channel, curvature_clip=clip, noise_multiplier=noise_multiplier, whitening=whitening
    )(theta)
    radius = 2.0 * curvature.noise_std * math.sqrt(d)  # the noise's spectral norm (Weyl)
    if np.linalg.eigvalsh(curvature.value)[0] < -radius:
        return None, curvature
    observed = covariance_from_fisher(
        curvature.value,
        whitening,
        curvature.noise_std,
        prior,
        fallback=covariance,
        pattern=pattern,
        flat=flat,
    )
    return (observed if _usable(observed) else None), curvature


class _NormClip(NamedTuple):
    """:func:`_norm_clip`'s clip and the released histogram it came from (public)."""

    clip: float
    counts: np.ndarray
    noise_std: float


def _norm_clip(
    channel: PrivateChannel, theta: np.ndarray, whitening: np.ndarray, noise_multiplier: float
) -> _NormClip:
    """The clip rule (:func:`~pymc_dp.releases.clip_from_counts`, with the hidden rows' margin)
    on one :class:`~pymc_dp.mechanisms.GradNormHistogram` of ``‖P ∇ℓ_i(θ)‖``; reserved by the
    caller. The clip is ``nan`` when no bin is visible."""
    norms = GradNormHistogram(
        channel, edges=HISTOGRAM_EDGES, noise_multiplier=noise_multiplier, whitening=whitening
    )(theta)
    n = channel.n_rows
    steps_up = _hidden_margin(norms.noise_std, n)
    clip = clip_from_counts(norms.value, HISTOGRAM_EDGES, norms.noise_std, n, steps_up=steps_up)
    return _NormClip(clip, np.asarray(norms.value, dtype=float), float(norms.noise_std))


def _balanced_clip(
    tail: _NormClip | None, clip: float, noise_multiplier: float, dimensions: int
) -> float:
    """``Ĝ``'s clip moved up to where its bias balances its noise
    (:func:`~pymc_dp.releases.bias_balanced_clip` on the norm histogram ``tail`` it came
    from; post-processing). ``clip`` is ``tail.clip`` carried to ``Ĝ``'s whitening
    (:func:`_rescaled_clip`), so both scale by ``clip / tail.clip``; ``clip`` as it is when no
    histogram gave it (a ``tail`` is kept only with a finite clip)."""
    if tail is None:
        return clip
    balanced = bias_balanced_clip(
        tail.counts, HISTOGRAM_EDGES, tail.noise_std, tail.clip, 2.0 * noise_multiplier, dimensions
    )
    return clip * balanced / tail.clip


def _centre_steps(
    channel: PrivateChannel,
    budget: object,
    theta: np.ndarray,
    covariance: np.ndarray,
    clip: float,
    whitening: np.ndarray,
    step_mu: float,
    label: str,
    first_mu: float | None = None,
    prior_part: np.ndarray | None = None,
) -> tuple[np.ndarray, list[float], float, float]:
    """Noise-shrunk Newton steps from ``θ`` (theory §7, step 8), each reserved before its read.

    A whitened :class:`~pymc_dp.mechanisms.CentreGradientRelease` ``ĝ`` at the current point
    ``θ``, then the step to the maximum of the log prior plus the likelihood's quadratic
    ``s ĝᵀ(x − θ) − ½ (x − θ)ᵀ F_ℓ (x − θ)``
    (:func:`~pymc_dp.kernels.initialization.prior_exact_step`; ``F_ℓ = Σ̂⁻¹ − Π``, ``Π`` the
    prior's information at the round's start, ``prior_part``; ``s`` the positive-part
    James–Stein factor of the likelihood's part of the step), the likelihood's curvature
    along consecutive steps corrected by their secant where it is resolved (and lowered to
    the upper bound, two noise sds above the measured curvature, that an unresolved secant
    gives, where it claims more:
    :func:`~pymc_dp.kernels.initialization.secant_update` with ``bound_unresolved``), until a
    full release's step is within ``_CENTRE_STOP_SIGNAL`` noise lengths of zero. Each step
    stays within the trust region of ``_MAX_CENTRE_STEP`` sds of the current curvature
    (``√(d/16)`` times that beyond 16 parameters), which doubles, up to
    ``_CENTRE_REACH_GROWTH`` times, after a step of at least half of it at whose end the
    released gradient still points along it, and halves back after one at whose end it
    points back (far from the mode a Fisher read can state sds a hundredth of the truth). The steps
    share ``_CENTRE_STEPS · step_mu`` (PLD ``μ``). The first release has ``μ = first_mu``
    (``step_mu`` when not given); a later one only what keeps its noise length near
    ``1/_CENTRE_STEP_PRECISION`` of the last step's length (within ``[step_mu/25, step_mu]``):
    far from the mode a step is long and a rough gradient moves it as well, so the allowance
    buys more steps where more are needed (the log posterior far from the mode can be flatter
    than its quadratic, and Newton steps then fall short); a rough release that sees no
    signal is followed by a full one. At most ``_CENTRE_MAX_RELEASES`` releases. Returns the
    new point, each release's ``μ``, the root sum of squares of the steps' noise lengths (in
    posterior sds of ``Σ̂``: how far the noise alone could have moved the point; public) and
    the ``μ`` planned for a next step (``first_mu`` of a next round: where the last round's
    steps were long, the next round's are too).
    """
    space = channel.space
    theta = np.array(theta, dtype=float)
    if prior_part is None:
        prior_part = prior_information(prior_hessian(space.logprior_grad, theta))
    mus: list[float] = []
    if step_mu <= 0:  # a noisy step is shrunk towards nothing: no floor on its share
        return theta, mus, 0.0, 0.0
    allowance, floor = _CENTRE_STEPS * step_mu, step_mu / 25.0
    # the trust region grows with √d beyond 16 parameters: a point a few sds off in every
    # direction is that far
    max_step = _MAX_CENTRE_STEP * max(1.0, math.sqrt(space.ndim / _TRUST_DIMENSION))
    planned = step_mu if first_mu is None else float(np.clip(first_mu, floor, step_mu))
    newton_covariance, previous, noise_squares = covariance, None, 0.0
    reach = max_step  # the trust region now: it grows while long steps keep going uphill
    while len(mus) < _CENTRE_MAX_RELEASES:
        mu = min(planned, allowance - math.fsum(mus))  # what the allowance still has
        if mu < floor * (1 - 1e-9):
            break
        z = math.sqrt(1.0 / (2.0 * mu))
        event = GaussianCost.from_noise_multiplier(z)
        budget.reserve(event, 1, mechanism=f"{label} (centring: Newton step)")
        channel.counter.allow(event, 1)
        mus.append(float(event.gaussian_mu()))
        release = CentreGradientRelease(
            channel, centre=Centre(theta, float(clip), whitening), noise_multiplier=z
        )
        likelihood_gradient = release().value
        gradient = likelihood_gradient + space.logprior_grad(theta)
        # the gradient of the model the curvature describes: the likelihood plus the prior's
        # quadratic at the round's start, so that the secant corrects the likelihood's part
        # only (the prior's own curvature enters exactly, in prior_exact_step)
        modelled = likelihood_gradient - prior_part @ theta
        if previous is not None:
            # a long step after which the log posterior still rises along it: the trust
            # region, in a curvature read far from the mode, is too short (a Fisher where σ is
            # far too small states sds a hundredth of the truth); it doubles, and halves back
            # once a step overshoots
            last = theta - previous[0]
            uphill = float(gradient @ last)
            length = float(np.linalg.norm(np.linalg.solve(previous[3], last)))
            if length >= 0.5 * reach and uphill > 0:
                reach = min(2.0 * reach, _CENTRE_REACH_GROWTH * max_step)
            elif uphill < 0:
                reach = max(0.5 * reach, max_step)
            # the curvature along the last step, where it is resolved
            updated = secant_update(
                newton_covariance,
                last,
                modelled - previous[1],
                previous[2] + release.noise_covariance,
                bound_unresolved=True,
            )
            # an update that rounding left short of positive definite (a precision matrix
            # near singular on a 54-parameter hierarchy) is not taken
            if updated is not None and _usable(updated):
                newton_covariance = updated
        root = np.linalg.cholesky(newton_covariance)
        # in posterior sds the step is Lᵀ g, its noise has covariance Lᵀ V L
        noise_length = math.sqrt(float(np.trace(root.T @ release.noise_covariance @ root)))
        noise_squares += noise_length**2
        signal = float(np.linalg.norm(root.T @ gradient))
        if not math.isfinite(signal):  # an undefined gradient: nothing to step on
            break
        # the step with the prior exact and the likelihood's gradient shrunk by its noise
        # (positive-part James–Stein, on the likelihood's part of the step: the only noisy one)
        heard = float(np.linalg.norm(root.T @ likelihood_gradient))
        shrink = max(0.0, 1.0 - (noise_length / heard) ** 2) if heard > 0 else 0.0
        likelihood_information = np.linalg.inv(newton_covariance) - prior_part
        moved = prior_exact_step(
            theta,
            shrink * likelihood_gradient,
            likelihood_information,
            space.logprior,
            space.logprior_grad,
            newton_covariance,
            reach,
            space.in_support,
        )
        previous = (theta, modelled, release.noise_covariance, root)
        theta = moved  # inside the support
        # (a rougher release that sees no signal says nothing: the next one has the full μ)
        if signal <= _CENTRE_STOP_SIGNAL * noise_length:
            if mu >= step_mu * (1 - 1e-9):
                break
            planned = step_mu
        else:  # noise length ∝ 1/√μ, aimed at a fraction of this step's length (taken as at
            # most max_step, not the grown trust region: a long walk keeps precise releases)
            wanted = _CENTRE_STEP_PRECISION * noise_length / min(signal, max_step)
            planned = float(np.clip(mu * wanted**2, floor, step_mu))
    return theta, mus, math.sqrt(noise_squares), planned


def _midpoint_read(
    fisher: object,
    fisher_whitening: np.ndarray,
    prior: np.ndarray,
    whitening: np.ndarray,
    clip: float,
    gathered: list[tuple[int, int, int]],
    n: int,
    **fit: object,
) -> tuple[np.ndarray, float]:
    """The whitening and clip of the next Fisher read after the release ``fisher`` (public).

    Along a direction the release does not resolve, ``Σ̂`` keeps the top of the range it
    allows (an earlier estimate's information), which keeps the Newton steps short; whitened
    with it, the next read sees that direction as squeezed as before. The next read is
    whitened with the range's geometric midpoint instead
    (``covariance_from_fisher(..., midpoint=True)``, the public prior Hessian ``prior``), its
    clip ``clip`` (of ``‖P ∇ℓ_i‖`` in ``whitening``) carried over by the rows' typical norms;
    ``(whitening, clip)`` when that curvature is not usable.
    """
    midpoint = covariance_from_fisher(
        fisher.value, fisher_whitening, fisher.noise_std, prior, midpoint=True, **fit
    )
    if not _usable(midpoint):
        return whitening, clip
    read_whitening = _centring_whitening(midpoint, gathered)
    return read_whitening, _rescaled_clip(
        clip, np.linalg.inv(midpoint), read_whitening, whitening, n
    )


class _PooledFisher(NamedTuple):
    """Fisher reads at one point in one whitening and clip, pooled (public: post-processing).

    ``value``: the mean of the released matrices weighted by their precision ``1/σ_k²``;
    ``noise_std``: its entries' noise sd, ``(Σ_k 1/σ_k²)^(-1/2)`` (the reads' noises are
    independent). ``reads``: how many; ``whitening``, ``clip``: what they were read with.
    """

    value: np.ndarray
    noise_std: float
    reads: int
    whitening: np.ndarray
    clip: float


def _pooled_fisher(
    pool: _PooledFisher | None, release: object, whitening: np.ndarray, clip: float
) -> _PooledFisher:
    """``release`` (a :class:`~pymc_dp.mechanisms.FisherRelease`'s result, read with
    ``whitening`` and ``clip`` at the point of ``pool``'s reads) pooled with ``pool`` when
    those were read with the same whitening and clip; alone otherwise (public).

    Every read estimates ``Σ_i c(P ∇ℓ_i) c(P ∇ℓ_i)ᵀ`` at that point (``c`` the clip) with
    independent ``N(0, σ_k²)`` noise on each upper-triangle entry, so the precision-weighted
    mean is unbiased with entry sd ``(Σ_k 1/σ_k²)^(-1/2)``: the noise model of one release,
    which the estimates of :func:`~pymc_dp.kernels.initialization.covariance_from_fisher`
    take as they are.
    """
    value = np.asarray(release.value, dtype=float)
    sd = float(release.noise_std)
    if (
        pool is None
        or not np.array_equal(pool.whitening, whitening)
        or pool.clip != clip
        or not (sd > 0 and pool.noise_std > 0)
    ):
        return _PooledFisher(value, sd, 1, whitening, clip)
    weight, pooled_weight = sd**-2, pool.noise_std**-2
    total = weight + pooled_weight
    return _PooledFisher(
        (pooled_weight * pool.value + weight * value) / total,
        total**-0.5,
        pool.reads + 1,
        whitening,
        clip,
    )


def _whitening_change(new: np.ndarray, old: np.ndarray) -> float:
    """The largest factor, as ``|log|``, by which going from whitening ``old`` to ``new``
    rescales some direction (the singular values of ``P_new P_old⁻¹``); ``inf`` where that is
    undefined (public)."""
    new, old = np.asarray(new, dtype=float), np.asarray(old, dtype=float)
    if new.ndim == 1:
        new = np.diag(new)
    if old.ndim == 1:
        old = np.diag(old)
    try:
        values = np.linalg.svd(new @ np.linalg.inv(old), compute_uv=False)
    except np.linalg.LinAlgError:
        return math.inf
    if not (np.all(np.isfinite(values)) and values[-1] > 0):
        return math.inf
    return float(np.max(np.abs(np.log(values))))


def _usable(covariance: np.ndarray) -> bool:
    """Whether a covariance is finite and numerically positive definite (public)."""
    if not np.all(np.isfinite(covariance)):
        return False
    values = np.linalg.eigvalsh(0.5 * (covariance + covariance.T))
    return bool(values[0] > 0 and values[-1] < 1e12 * values[0])


def _centring_histograms(rounds: int, sharpened: int = 0) -> int:
    """Histogram-sized releases of a centring of ``rounds`` rounds (two more per extra round)
    and ``sharpened`` extra Fisher releases with, when there are any, their norm histogram
    (:func:`private_centring`, step 4)."""
    return _CENTRING_HISTOGRAMS + 2 * (rounds - 1) + sharpened + (sharpened > 0)


def _remaining_mu(
    budget: object, start: PrivateStart, histograms: int, mu_histogram: float, step_mus: list[float]
) -> float:
    """What the ledger has left (PLD ``μ``); on a ledger with non-Gaussian spending, the
    capacity less the initialisation, the centring's ``histograms`` histogram-sized releases
    and its Newton steps so far."""
    remaining = budget.report().remaining_mu
    if remaining is None:
        remaining = budget.capacity_mu - start.mu - histograms * mu_histogram - sum(step_mus)
    return max(float(remaining), 0.0)


def _whitening_of(metric: np.ndarray) -> np.ndarray:
    """``P = Wᵀ / |det W|^{1/d}`` for a Cholesky factor ``W`` of a posterior covariance: the
    rows' gradients in the coordinates where that posterior is round, scaled to keep the
    volume (public)."""
    scale = math.exp(np.mean(np.log(np.abs(np.diag(metric)))))
    return metric.T / scale


def _centring_whitening(covariance: np.ndarray, gathered: list[tuple[int, int, int]]) -> np.ndarray:
    """The whitening of the centring's releases, from a private covariance ``Σ̂`` (public).

    Without group-indexed variables, :func:`_whitening_of` ``Σ̂``. With them, that of ``D Σ̂ D``:
    each coordinate of a variable ``a`` that rows read at one group (``a[g_i]``) rescaled to
    one sd for all its groups (per coordinate of a group, the geometric mean over groups of
    ``Σ̂``'s sds), every correlation kept. A row's whitened norm then does not depend on which
    group it reads:

    * a group whose sd ``Σ̂`` overstates does not set the clip (and so the noise) of a whole
      release: on a radon-style model (85 groups, n = 10⁶) the initialisation's ``Σ̂₀``
      overstated one group's sd 24 times, and its rows put the clip of the first Fisher
      release at 150, against 6 with the common sd;
    * with the true ``Σ̂`` too, the rows of the smallest groups (the widest sds) set a full
      whitening's clip, and the noise of a gradient released in it moves every direction by
      that many sds; here a group's direction moves by ``sd_j / s`` times a typical clip's
      noise, never more (``s`` the common sd);
    * the correlations stay: where the posterior ties the groups to a coordinate every row
      reads (an intercept beside free group offsets, along a ridge), a whitening without them
      put the centre release's noise across the ridge (its tilt went from 0.1 to 5 sd on the
      zoo's ``group_offsets``).
    """
    covariance = np.asarray(covariance, dtype=float)
    if not gathered:
        return _whitening_of(np.linalg.cholesky(covariance))
    sds = np.sqrt(np.diag(covariance))
    common = sds.copy()
    for first, groups, width in gathered:
        stop = first + groups * width
        per_group = sds[first:stop].reshape(groups, width)
        common[first:stop] = np.tile(np.exp(np.mean(np.log(per_group), axis=0)), groups)
    scale = common / sds
    return _whitening_of(np.linalg.cholesky(covariance * np.outer(scale, scale)))


def _rescaled_clip(
    clip: float, information: np.ndarray, whitening: np.ndarray, old: np.ndarray, n: int
) -> float:
    """A clip of ``‖P_old ∇ℓ_i‖`` carried to ``‖P ∇ℓ_i‖`` by the ratio of the rows' typical
    norms under the two whitenings (unchanged where that ratio is not defined; public)."""
    ratio = _typical_norm(information, whitening, n) / max(
        _typical_norm(information, old, n), 1e-300
    )
    return clip * ratio if math.isfinite(ratio) and ratio > 0 else clip


def _typical_norm(information: np.ndarray, whitening: np.ndarray, n: int) -> float:
    """``√(tr(P I Pᵀ) / n)``: the root mean square of ``‖P ∇ℓ_i‖`` when the rows' gradients
    carry the information ``I`` (near the mode of a well-specified model; public)."""
    return math.sqrt(max(float(np.trace(whitening @ information @ whitening.T)), 0.0) / n)
