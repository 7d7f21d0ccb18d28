"""How many effective draws a budget buys: the bound, from public quantities only.

For the DP penalty, every iteration releases one clipped ratio whose noise is
``σ = 2 z T b_l ‖θ' − θ‖``; the budget fixes ``Σ 1/(2z²)`` over all iterations, so more iterations
mean more noise on each, and the acceptance of the noisy test falls as ``2Φ(−σ/2)`` (the
penalty method's acceptance at a neutral proposal). With the automatic settings of
:class:`~pymc_dp.DPPenalty` (theory §7) the draws that count are the accepted independence
proposals from the private Laplace approximation: a chain that jumps to a fresh draw with
probability ``a`` per iteration and stays otherwise has autocorrelation ``(1 − a)^k``, so its
effective sample size per iteration is ``a / (2 − a)``.

:func:`predict_penalty_ess` evaluates that for a given noise multiplier, clip and posterior
covariance (a guess, or the private initialisation's), by Monte Carlo over public draws:
the exact Metropolis–Hastings acceptance of the t proposal against a Gaussian posterior, times
the penalty for the released noise. With the centred ratio the Gaussian sits at the tilted
target's mode, where the chains sample, and the noise grows with the distance from the
releases' centre. It ignores what the random-walk share of the proposals adds and the Laplace
approximation's own error, so it is the bound of a well-initialised chain.
:func:`predict_ess` plans the default run first (the noise and chain length the step would
choose) from ``(ε, δ)``, the clip and a scale guess.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pymc_dp.accounting import gaussian_capacity
from pymc_dp.errors import InvalidParameterError
from pymc_dp.kernels.penalty import INDEPENDENCE_PROBABILITY
from pymc_dp.releases import RemainderScale

__all__ = [
    "ESSPrediction",
    "centred_bound_rms",
    "predict_centre_shift",
    "predict_ess",
    "predict_penalty_ess",
]

_SAMPLES = 4000


@dataclass(frozen=True)
class ESSPrediction:
    """A predicted run: effective draws, the noise multiplier, and the acceptance behind it."""

    ess: float
    noise_multiplier: float
    iterations_per_chain: int
    draws_per_chain: int
    chains: int
    independence_acceptance: float

    def __str__(self) -> str:
        return (
            f"about {self.ess:.0f} effective draws ({self.chains} chains × "
            f"{self.draws_per_chain} draws, z = {self.noise_multiplier:.3g}, independence "
            f"acceptance {self.independence_acceptance:.2f})"
        )


def _covariance(covariance: np.ndarray | float, d: int | None) -> np.ndarray:
    cov = np.asarray(covariance, dtype=float)
    if cov.ndim == 0:
        if d is None:
            raise InvalidParameterError("a scalar scale needs d, the number of parameters.")
        cov = np.eye(d) * float(cov)
    elif cov.ndim == 1:
        cov = np.diag(cov)
    if cov.shape[0] != cov.shape[1] or not np.all(np.isfinite(cov)):
        raise InvalidParameterError("covariance must be a finite square matrix (or variances).")
    return cov


def independence_acceptance(
    noise_multiplier: float,
    llr_clip: float | None,
    covariance: np.ndarray,
    *,
    temperature: float = 1.0,
    df: float = 7.0,
    seed: int = 0,
    remainder_clip: float | None = None,
    coordinates: np.ndarray | None = None,
    row_blocks: np.ndarray | None = None,
    offset: np.ndarray | None = None,
) -> float:
    """Mean acceptance of a ``t_df(0, Σ)`` independence proposal against ``N(0, Σ)`` with the
    penalty test's noise ``σ = 2 z T b_l ‖θ' − θ‖``: ``E min(1, w'/w · e^{ξ − σ²/2})``.

    With ``remainder_clip`` ``h`` the ratio is the centred one
    (:class:`~pymc_dp.mechanisms.CentredLLRRelease`, metric ``Σ^{1/2}``):
    ``σ = 2 z T h s(θ, θ')`` with the bound's scale ``s``
    (:class:`~pymc_dp.releases.RemainderScale`: on the likelihood's ``coordinates``, per
    group with ``row_blocks``; ``‖δ‖ (‖u‖ + ‖u'‖)/2`` in whitened coordinates without them),
    and ``llr_clip`` is unused. ``offset`` is where the target and the proposal are centred
    relative to the release's centre ``θ_c`` (``m̂ − θ_c``: the centre's noise tilts the
    target's mode ``m̂`` away from ``θ_c``, and every bound grows with the distance from
    ``θ_c``); default 0, the centre at the mean."""
    rng = np.random.default_rng(seed)
    d = covariance.shape[0]
    root = np.linalg.cholesky(covariance)
    white = rng.standard_normal((_SAMPLES, d))
    chi = rng.chisquare(df, _SAMPLES)
    proposal_white = rng.standard_normal((_SAMPLES, d)) * np.sqrt(df / chi)[:, None]

    def log_weight(u: np.ndarray) -> np.ndarray:  # log N(u) − log t(u), whitened, no constants
        sq = np.sum(u * u, axis=1)
        return -0.5 * sq + 0.5 * (df + d) * np.log1p(sq / df)

    if remainder_clip is None:
        jump = np.linalg.norm((proposal_white - white) @ root.T, axis=1)
        sigma = 2.0 * noise_multiplier * temperature * llr_clip * jump
    else:
        kept = np.ones(d, dtype=bool) if coordinates is None else np.asarray(coordinates, bool)
        scale = RemainderScale(root, np.zeros(d), kept, row_blocks)
        shift = np.zeros(d) if offset is None else np.asarray(offset, dtype=float)
        if shift.shape != (d,):
            raise InvalidParameterError(
                f"offset must have one entry per parameter, shape ({d},); got {shift.shape}."
            )
        sigma = (
            2.0
            * noise_multiplier
            * temperature
            * remainder_clip
            * scale(shift + white @ root.T, shift + proposal_white @ root.T)
        )
    xi = rng.standard_normal(_SAMPLES) * sigma
    log_ratio = log_weight(proposal_white) - log_weight(white) + xi - 0.5 * sigma**2
    return float(np.mean(np.exp(np.minimum(log_ratio, 0.0))))


def predict_penalty_ess(
    *,
    noise_multiplier: float,
    llr_clip: float | None,
    covariance: np.ndarray,
    chains: int,
    draws: int,
    temperature: float = 1.0,
    independence_probability: float = INDEPENDENCE_PROBABILITY,
    df: float = 7.0,
    iterations: int | None = None,
    remainder_clip: float | None = None,
    coordinates: np.ndarray | None = None,
    row_blocks: np.ndarray | None = None,
    offset: np.ndarray | None = None,
) -> ESSPrediction:
    """Effective draws of ``chains × draws`` DP-penalty draws with the independence mixture.

    With ``remainder_clip`` the step releases the centred ratio (see
    :func:`independence_acceptance`, which takes ``coordinates``, ``row_blocks`` and the
    target's ``offset`` from the centre)."""
    a = independence_acceptance(
        noise_multiplier,
        llr_clip,
        covariance,
        temperature=temperature,
        df=df,
        remainder_clip=remainder_clip,
        coordinates=coordinates,
        row_blocks=row_blocks,
        offset=offset,
    )
    moving = independence_probability * a
    ess = chains * draws * moving / (2.0 - moving)
    return ESSPrediction(ess, noise_multiplier, iterations or draws, draws, chains, a)


def centred_bound_rms(
    metric: np.ndarray,
    centre: np.ndarray,
    proposal_scale: np.ndarray,
    independence: object | None,
    *,
    coordinates: np.ndarray | None = None,
    row_blocks: np.ndarray | None = None,
    seed: int = 0,
) -> float:
    """Root mean square of the centred ratio's bound per unit clip, ``‖δ‖ (‖u‖ + ‖u'‖)/2``.

    Public Monte Carlo over a chain at stationarity in ``N(θ_c, W Wᵀ)`` and the step's proposal
    mixture: a random walk with per-coordinate ``proposal_scale``, or (with probability
    ``independence.probability``) a draw of the independence proposal
    (:class:`~pymc_dp.kernels.penalty.IndependenceProposal`). With ``coordinates`` (the
    likelihood's, a boolean mask) the offsets are taken on those only, in the metric of
    ``W Wᵀ``'s block there, and with ``row_blocks`` (the coordinates each group's rows read)
    per group, the largest over groups, as :class:`~pymc_dp.mechanisms.CentredLLRRelease`
    takes them (:class:`~pymc_dp.releases.RemainderScale`).
    """
    rng = np.random.default_rng(seed)
    d = centre.size
    white = rng.standard_normal((_SAMPLES, d))
    theta = centre + white @ metric.T
    proposed = theta + rng.standard_normal((_SAMPLES, d)) * np.asarray(proposal_scale)
    if independence is not None:
        chi = rng.chisquare(independence.df, _SAMPLES)
        t = rng.standard_normal((_SAMPLES, d)) * np.sqrt(independence.df / chi)[:, None]
        drawn = independence.centre + t @ independence.root.T
        pick = rng.uniform(size=_SAMPLES) < independence.probability
        proposed = np.where(pick[:, None], drawn, proposed)
    kept = np.ones(d, dtype=bool) if coordinates is None else np.asarray(coordinates, dtype=bool)
    bound = RemainderScale(metric, centre, kept, row_blocks)(theta, proposed)
    return float(np.sqrt(np.mean(bound**2)))


def predict_ess(
    epsilon: float,
    delta: float,
    *,
    scale: np.ndarray | float,
    llr_clip: float | None,
    d: int | None = None,
    chains: int = 4,
    init_share: float = 0.1,
    tune_fraction: float = 0.2,
    temperature: float = 1.0,
) -> ESSPrediction:
    """Predicted effective draws of ``DPPenalty(budget=PrivacyBudget(epsilon, delta))``.

    From public quantities only: the budget, a guess of the posterior's standard deviations
    ``scale`` (per parameter, in the unconstrained space; e.g. ``1/√(n I)`` with ``I`` a
    per-row Fisher information guess), the ratio clip (the private initialisation's is about
    the far tail of the per-row slopes) and the plan. It replays the step's default plan
    (a released ratio of about 2 nats at the typical jump, 50–4000 iterations per chain) and
    evaluates :func:`predict_penalty_ess`. Use it before touching the data: a prediction below
    a few dozen means no sampler can give a converged posterior at this budget.
    """
    from pymc_dp.step_methods.base import _MAX_CHAIN_LENGTH, _MIN_CHAIN_LENGTH
    from pymc_dp.step_methods.initialization import independence_df
    from pymc_dp.step_methods.penalty import _TARGET_RATIO_NOISE

    sd = np.atleast_1d(np.asarray(scale, dtype=float))
    if d is not None and sd.size == 1:
        sd = np.full(int(d), float(sd[0]))
    covariance = _covariance(sd**2, None)
    d = sd.size
    mu_available = (1.0 - init_share) * float(gaussian_capacity(epsilon, delta))
    df, p = independence_df(d), INDEPENDENCE_PROBABILITY  # the step's independence t
    random_walk = 2.38 / np.sqrt(d) * sd
    far = 2.0 * df / (df - 2.0) * float(np.sum(sd**2))
    jump = float(np.sqrt((1 - p) * np.sum(random_walk**2) + p * far))
    z_target = _TARGET_RATIO_NOISE / (2.0 * temperature * llr_clip * jump)
    length = int(mu_available * 2.0 * z_target**2) // chains
    length = min(max(length, _MIN_CHAIN_LENGTH), _MAX_CHAIN_LENGTH)
    z = float(np.sqrt(chains * length / (2.0 * mu_available)))
    draws = length - int(np.floor(tune_fraction * length))
    return predict_penalty_ess(
        noise_multiplier=z,
        llr_clip=llr_clip,
        covariance=covariance,
        chains=chains,
        draws=draws,
        temperature=temperature,
        independence_probability=p,
        df=df,
        iterations=length,
    )


def predict_centre_shift(
    epsilon: float,
    delta: float,
    *,
    n: int,
    d: int,
    clip_multiple: float = 6.0,
    init_share: float = 0.1,
) -> float:
    """Predicted tilt of the default ``DPPenalty``'s target, in posterior sd per direction.

    The default step (``control_variate=True``) releases the clipped log-likelihood gradient at
    its centre once, with noise ``ξ``; its target is the posterior tilted by ``exp(ξ·θ)``, whose
    mean moves by ``Σ ξ`` (theory, the centred ratio; the step reports its draws widened by
    ``√(1 + s²)`` per direction for it, ``noise_aware``). Whitened, that is
    ``2 z κ √(d/n)`` posterior sd per direction: ``z`` the release's noise multiplier and
    ``κ`` (``clip_multiple``) the clip's multiple of the typical row's whitened gradient norm
    (the private clip is a far tail: 4–12 on the validation zoo). ``z = 1/√(2μ_G)`` with
    ``μ_G`` the part of the Gaussian capacity ``M*`` the plan leaves for that release at
    least: after the initialisation (``init_share``), the centring's four histogram-sized releases
    (3 % of ``M*`` each) and its Newton steps (a quarter of the rest), half of what is left.
    That is one round of the centring: when the initialisation ends far from the mode, each
    further round (theory §7, step 8) takes up to another 6 % of ``M*`` and another quarter,
    and the tilt can be up to about 1.3 times the prediction after two rounds, about 2.8
    times after three. Where the released curvature bounds a direction only loosely (a ridge
    the likelihood does not inform), up to four sharper Fisher reads and a histogram take
    another 3 % of ``M*`` each, leaving at least a sixth of the first round's start: up to
    about 2.4 times the prediction with one round.
    Public quantities only: use it before touching the data. At about 1 or more, the
    released posterior's means can be off by a posterior sd or more whatever the sampler
    does; what helps is a larger ``epsilon`` or more rows. After the private initialisation,
    the step states the actual value (``step.centre_shift_sd()``, ``centre_shift_sd`` in the
    privacy report).
    """
    from pymc_dp.step_methods.centred import CENTRING_HISTOGRAM_SHARE
    from pymc_dp.step_methods.initialization import _CENTRE_STEP_SHARE, _CENTRING_HISTOGRAMS

    for name, value in (("n", n), ("d", d)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise InvalidParameterError(f"{name} must be a positive integer, got {value!r}.")
    if not (float(clip_multiple) > 0 and 0 <= float(init_share) < 1):
        raise InvalidParameterError(
            "clip_multiple must be positive and init_share in [0, 1), got "
            f"{clip_multiple!r} and {init_share!r}."
        )
    capacity = float(gaussian_capacity(epsilon, delta))
    left = (1.0 - float(init_share) - _CENTRING_HISTOGRAMS * CENTRING_HISTOGRAM_SHARE) * capacity
    mu_gradient = 0.5 * (1.0 - _CENTRE_STEP_SHARE) * max(left, 0.0)
    if mu_gradient <= 0:
        return float("inf")
    z = 1.0 / np.sqrt(2.0 * mu_gradient)
    return float(2.0 * z * float(clip_multiple) * np.sqrt(d / n))
