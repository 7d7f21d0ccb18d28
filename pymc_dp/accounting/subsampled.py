"""PLD accounting for the subsampled Gaussian mechanism (theory §3, §4.2, §4.5).

Setting
-------
Each iteration draws a batch of ``b`` rows uniformly *without replacement* from the ``n`` rows
(``q = b/n``), evaluates a query on the batch whose **substitute-relation** sensitivity is
``Δ`` and adds ``N(0, σ²)`` noise; ``z = σ/Δ`` is our noise multiplier (theory §2). Neighbouring
datasets differ in one row (substitute relation, theory §1).

Which dominating pair
---------------------
Coupling the batches that miss the changed row with those that contain it shows that one
iteration is a mixture of pairs ``((1-q)N(0, σ²) + q N(u, σ²), (1-q)N(0, σ²) + q N(u', σ²))``
with ``‖u‖, ‖u'‖, ‖u - u'‖ ≤ Δ``. Both the "remove-like" pair ``(u, u') = (Δ, 0)`` and the
"add-like" pair ``(0, Δ)`` occur for real data (e.g. a clipped sum with every other row at
``-C`` and the changed row going from ``+C`` to ``-C``), and in an adaptive composition (an
MCMC chain: the query depends on the current state) the direction may change from one
iteration to the next. Dong, Roth & Su (2022, *Gaussian differential privacy*, JRSS-B,
Thm 9 — subsampling without replacement, substitute relation) prove that the subsampled
mechanism is ``C_q(G_{1/z})``-DP with ``C_q(f) = min{f_q, f_q^{-1}}**`` and
``f_q = q f + (1 - q) Id``, i.e. its trade-off function is the convex hull of the remove- and
add-direction trade-off functions. The privacy loss distribution (PLD) of that symmetric
dominating pair is

* for losses ``ℓ > 0``: the PLD of the remove-direction pair
  ``((1-q)N(0,1) + qN(1/z, 1), N(0, 1))``, which is exactly what
  :func:`dp_accounting.pld.privacy_loss_distribution.from_gaussian_mechanism` builds for a
  *Poisson*-subsampled Gaussian with ``sampling_prob = q`` under ``ADD_OR_REMOVE_ONE`` (its
  "remove" PMF, with the library's pessimistic connect-the-dots discretisation);
* for ``ℓ < 0``: the mirror image ``ω(-ℓ) = e^{-ℓ} ω(ℓ)`` (the pair is symmetric);
* an atom at ``ℓ = 0`` holding the remaining mass (the linear piece of the convex hull).

We build this PMF once per ``(z, q)`` from dp_accounting's remove-direction PMF, compose it
with dp_accounting's algorithm (``self_compose``: FFT, Chernoff tail truncation; done here so
that the truncation bound is computed once per PMF) and let dp_accounting convert it to (ε, δ).
Its (ε, δ)
profile is ``max(δ_remove(ε), δ_add(ε))`` for every ε, so for one iteration it coincides with
dp_accounting's ``PoissonSampledDpEvent`` under ``ADD_OR_REMOVE_ONE``; for ``k > 1`` it is
larger, because dp_accounting's add/remove accountant assumes one fixed direction for the
whole composition (max of the two self-compositions), which is right for add/remove Poisson
sampling but not for substitution with direction-switching adaptive queries (cf. Lebeda,
Regehr, Kamath & Steinke 2024, "Avoiding pitfalls for privacy accounting of subsampled
mechanisms under composition"). For ``q = 1`` it reduces to the Gaussian PLD ``N(μ, 2μ)``,
``μ = 1/(2z²)``.

Conventions pinned (google/differential-privacy#378)
----------------------------------------------------
dp_accounting's ``GaussianDpEvent(noise_multiplier)`` means ``σ / C`` with ``C`` the norm bound of
one record's contribution. Under ``ADD_OR_REMOVE_ONE`` the sum moves by ``C``, so our ``z``
(σ over the *substitute* sensitivity ``Δ``) is ``GaussianDpEvent(z)`` under
``ADD_OR_REMOVE_ONE`` (PLD ``N(1/(2z²), 1/z²)``). Under ``REPLACE_ONE`` the PLD accountant moves
the mean by ``2C``, so the same PLD is ``GaussianDpEvent(2z)`` there — whereas dp_accounting's
RDP accountant (``SampledWithoutReplacementDpEvent``, ``REPLACE_ONE``) treats the multiplier as
``σ`` over the replace-one sensitivity. The tests pin each of these.

This module also offers :func:`subsampled_gaussian_rdp` (WBK 2019 Thm 9 with the Gaussian's
``α/(2z²)``) for compositions that must be done in RDP (mixed with DP Barker).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from pymc_dp.accounting._checks import check_delta, check_int, check_positive
from pymc_dp.accounting.gaussian import gaussian_delta, gaussian_epsilon
from pymc_dp.accounting.rdp import rdp_to_epsilon, wbk_subsampled_rdp
from pymc_dp.errors import InvalidParameterError

if TYPE_CHECKING:
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

# dp_accounting (and the parts of SciPy it pulls in) is imported lazily, on first use.

__all__ = [
    "DEFAULT_DISCRETIZATION",
    "gaussian_pld",
    "subsampled_gaussian_delta",
    "subsampled_gaussian_epsilon",
    "subsampled_gaussian_pld",
    "subsampled_gaussian_rdp",
    "subsampled_gaussian_schedule_epsilon",
]

#: Loss discretisation (nats) for the PLD computations (dp_accounting's default).
DEFAULT_DISCRETIZATION = 1e-4


def _check_zq(noise_multiplier: object, sampling_ratio: object) -> tuple[float, float]:
    z = check_positive(
        noise_multiplier,
        "noise_multiplier",
        hint=" It is z = sigma / Delta, the noise std over the substitute-relation sensitivity.",
    )
    q = check_positive(sampling_ratio, "sampling_ratio")
    if q > 1.0:
        raise InvalidParameterError(
            f"sampling_ratio must be in (0, 1] (batch size / number of rows); got {q}."
        )
    return z, q


def _privacy_loss(z: float, q: float, adjacency: str) -> object:
    """dp_accounting's exact (continuous) privacy loss of the Poisson-subsampled Gaussian with
    sensitivity 1, noise std ``z`` and sampling probability ``q``: the pair
    ``((1-q)N(0, z²) + qN(1, z²), N(0, z²))`` for ``adjacency="REMOVE"``, and the reverse for
    ``"ADD"``, exactly as ``from_gaussian_mechanism`` builds each direction."""
    from dp_accounting.pld import privacy_loss_mechanism as plm

    return plm.GaussianPrivacyLoss(
        z,
        sensitivity=1.0,
        pessimistic_estimate=True,
        log_mass_truncation_bound=-50,  # from_gaussian_mechanism's default
        sampling_prob=q,
        adjacency_type=getattr(plm.AdjacencyType, adjacency),
    )


def _remove_pmf(z: float, q: float, discretization: float) -> tuple[int, np.ndarray, float]:
    """dp_accounting's pessimistic PMF of the remove-direction subsampled-Gaussian pair.

    The remove half of ``from_gaussian_mechanism(z, sampling_prob=q)`` under
    ``ADD_OR_REMOVE_ONE``, built alone: the library builds the add half too, which costs as
    much and which the construction does not use.
    """
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    try:
        pmf = pld_lib._create_pld_pmf_from_monotone_privacy_loss(
            _privacy_loss(z, q, "REMOVE"),
            pessimistic_estimate=True,
            value_discretization_interval=discretization,
            use_connect_dots=True,
        ).to_dense_pmf()
        lower, probs, inf_mass = pmf._lower_loss, np.asarray(pmf._probs), pmf._infinity_mass
    except AttributeError as exc:  # pragma: no cover - guards a dp_accounting refactor
        raise RuntimeError(
            "pymc_dp needs dp_accounting's _create_pld_pmf_from_monotone_privacy_loss and its "
            "dense PMF (_lower_loss/_probs/_infinity_mass); this dp_accounting version changed "
            "them."
        ) from exc
    return lower, probs, float(inf_mass)


def _symmetric_pld(z: float, q: float, discretization: float) -> pld_lib.PrivacyLossDistribution:
    """PLD of the Dong–Roth–Su dominating pair ``C_q(G_{1/z})`` (see module docstring)."""
    return _symmetric_pld_and_mean(z, q, discretization)[0]


def symmetric_pld_mean(z: float, q: float, discretization: float = DEFAULT_DISCRETIZATION) -> float:
    """Mean privacy loss (KL divergence) of one iteration under the dominating pair."""
    return _symmetric_pld_and_mean(z, q, discretization)[1]


@functools.lru_cache(maxsize=32)
def _symmetric_pld_and_mean(
    z: float, q: float, discretization: float
) -> tuple[pld_lib.PrivacyLossDistribution, float]:
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    lower, probs, inf_mass = _remove_pmf(z, q, discretization)
    idx = np.arange(probs.size, dtype=np.int64) + int(lower)
    keep = (idx > 0) & (probs > 0)
    pos_idx, pos_p = idx[keep], probs[keep]
    top = int(pos_idx.max()) if pos_idx.size else 0
    dense = np.zeros(2 * top + 1)
    dense[pos_idx + top] = pos_p
    # mirror: mass e^{-ℓ} ω(ℓ) at -ℓ (exact for a PMF supported on the grid)
    dense[top - pos_idx] += pos_p * np.exp(-pos_idx * discretization)
    atom = 1.0 - inf_mass - float(dense.sum())
    if atom < -1e-9:  # pragma: no cover - would mean the input PMF is not a valid PLD
        raise RuntimeError(f"symmetrised PLD has negative mass at zero loss ({atom}).")
    dense[top] += max(atom, 0.0)
    pmf = pld_pmf.DensePLDPmf(discretization, -top, dense, inf_mass, pessimistic_estimate=True)
    symmetric = pld_lib.PrivacyLossDistribution(pmf)
    # The construction takes the positive-loss part from the remove direction, which dominates
    # the add direction for ε ≥ 0 for the subsampled Gaussian. Check it rather than assume it:
    # the result must be at least the add direction's exact δ(ε) at every ε ≥ 0 (its remove
    # direction is dp_accounting's pessimistic PMF, at least the exact remove δ(ε)).
    # (the add direction's loss is at most −log(1 − q): its δ(ε) is 0 beyond, so look there)
    grid = np.linspace(
        0.0,
        min(max(top * discretization, discretization), -math.log1p(-q) if q < 1 else math.inf),
        65,
    )
    # ours at ε ≥ 0: only the positive losses count (δ(ε) = ω(∞) + Σ_{ℓ>ε} ω(ℓ)(1 − e^{ε−ℓ}))
    losses = pos_idx * discretization
    ours = np.array(
        [
            inf_mass + float(np.dot(pos_p[losses > e], -np.expm1(e - losses[losses > e])))
            for e in grid
        ]
    )
    theirs = np.asarray(_privacy_loss(z, q, "ADD").get_delta_for_epsilon(grid))
    if np.any(ours < theirs * (1.0 - 1e-9) - 1e-15):
        raise RuntimeError(  # pragma: no cover - would mean the add direction dominates
            f"subsampled Gaussian (z={z}, q={q}): the add direction dominates somewhere; the "
            "symmetrised PLD would under-report. Please report this."
        )
    mean = float(np.dot(np.arange(-top, top + 1) * discretization, dense))
    return symmetric, mean


def gaussian_pld(
    mu: float, discretization: float = DEFAULT_DISCRETIZATION
) -> pld_lib.PrivacyLossDistribution:
    """dp_accounting PLD of a Gaussian PLD parameter ``mu`` (``N(mu, 2 mu)``).

    Sensitivity 1 and ``σ = 1/√(2 mu)``, i.e. ``GaussianDpEvent(1/√(2 mu))`` under
    ``ADD_OR_REMOVE_ONE`` (see the conventions in the module docstring).
    """
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    m = check_positive(mu, "mu")
    return pld_lib.from_gaussian_mechanism(
        standard_deviation=1.0 / math.sqrt(2.0 * m),
        sensitivity=1.0,
        value_discretization_interval=discretization,
    )


def subsampled_gaussian_pld(
    noise_multiplier: float,
    sampling_ratio: float,
    iterations: int,
    *,
    discretization: float = DEFAULT_DISCRETIZATION,
) -> pld_lib.PrivacyLossDistribution:
    """Composed PLD of ``iterations`` subsampled-Gaussian releases (see module docstring).

    Parameters
    ----------
    noise_multiplier : float
        ``z = σ/Δ`` with ``Δ`` the substitute-relation sensitivity of the batch query.
    sampling_ratio : float
        ``q = b/n`` (batch drawn without replacement).
    iterations : int
        ``k ≥ 1``.
    discretization : float
        PLD loss grid (nats).

    Returns
    -------
    dp_accounting.pld.privacy_loss_distribution.PrivacyLossDistribution
        Pessimistic PLD of ``C_q(G_{1/z})^{⊗k}``.
    """
    z, q = _check_zq(noise_multiplier, sampling_ratio)
    k = check_int(iterations, "iterations", minimum=1)
    h = check_positive(discretization, "discretization")
    if q == 1.0:
        return gaussian_pld(k / (2.0 * z * z), h)
    return _self_composed_pld(z, q, h, k)


#: Tail mass a self-composition may drop (into the infinity mass: pessimistic), as in
#: dp_accounting's ``self_compose``.
_TAIL_MASS_TRUNCATION = 1e-15


@functools.lru_cache(maxsize=32)
def _log_mgfs(z: float, q: float, discretization: float) -> tuple[np.ndarray, np.ndarray]:
    """The base PMF's log moment-generating function at the orders of the Chernoff bound.

    dp_accounting's ``common.compute_self_convolve_bounds`` evaluates these (40 log-sum-exps
    over the whole PMF, about a second at the 10⁻⁴ grid) on every ``self_compose``; they
    depend only on the base PMF, so they are computed once per ``(z, q)`` here.
    """
    from scipy import special

    probs = _symmetric_pld(z, q, discretization)._pmf_remove._probs
    orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / len(probs)
    index = np.arange(len(probs))
    values = np.array([special.logsumexp(index * order, b=probs) for order in orders])
    return orders, values


def _truncation_bounds(z: float, q: float, discretization: float, k: int) -> tuple[int, int]:
    """Index range of the ``k``-fold self-convolution outside which at most
    :data:`_TAIL_MASS_TRUNCATION` of its mass lies (Chernoff bound at each order ``t``:
    ``P(S ≥ a) ≤ exp(k log M(t) − t a)``), exactly as dp_accounting computes it."""
    probs = _symmetric_pld(z, q, discretization)._pmf_remove._probs
    lower, upper = 0, (len(probs) - 1) * k
    orders, log_mgfs = _log_mgfs(z, q, discretization)
    for order, log_mgf in zip(orders, log_mgfs, strict=True):
        bound = (k * log_mgf + math.log(2 / _TAIL_MASS_TRUNCATION)) / order
        if not math.isfinite(bound):
            continue
        if order > 0:
            upper = min(upper, math.ceil(bound))
        else:
            lower = max(lower, math.floor(bound))
    return lower, upper


@functools.lru_cache(maxsize=4)
def _self_composed_pld(
    z: float, q: float, discretization: float, k: int
) -> pld_lib.PrivacyLossDistribution:
    """``C_q(G_{1/z})^{⊗k}``, cached: a reservation checks and reports the same ``k``.

    dp_accounting's ``DensePLDPmf.self_compose`` (the FFT of the base PMF raised to the
    ``k``-th power, tails beyond a Chernoff bound moved to the infinity mass) with the bound's
    log-MGFs computed once per base (:func:`_log_mgfs`). Only a few results are kept: a
    composed PLD of small noise can hold tens of MB.
    """
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from scipy import fft

    base = _symmetric_pld(z, q, discretization)
    if k == 1:
        return base
    pmf = base._pmf_remove  # the symmetric PLD has one PMF
    probs = np.asarray(pmf._probs)
    lower, upper = _truncation_bounds(z, q, discretization, k)
    size = upper - lower + 1
    fast = fft.next_fast_len(max(size, len(probs)))
    powered = np.real(fft.ifft(fft.fft(probs, fast) ** k))
    composed = np.roll(powered, -lower)[:size]  # the FFT wraps modulo its length
    infinity = _TAIL_MASS_TRUNCATION - math.expm1(k * math.log1p(-pmf._infinity_mass))
    return pld_lib.PrivacyLossDistribution(
        pld_pmf.DensePLDPmf(discretization, pmf._lower_loss * k + lower, composed, infinity, True)
    )


def subsampled_gaussian_epsilon(
    noise_multiplier: float,
    sampling_ratio: float,
    iterations: int,
    delta: float,
    *,
    discretization: float = DEFAULT_DISCRETIZATION,
) -> float:
    """ε at ``delta`` after ``iterations`` subsampled-Gaussian releases (theory §3, §4.2).

    Parameters
    ----------
    noise_multiplier : float
        ``z = σ/Δ`` (substitute-relation sensitivity ``Δ``; theory §2).
    sampling_ratio : float
        ``q = b/n``, batch drawn uniformly without replacement.
    iterations : int
        ``k ≥ 0``.
    delta : float
        Target δ in ``(0, 1)``.
    discretization : float
        PLD loss grid (nats); the result is an upper bound that tightens as it shrinks.

    Returns
    -------
    float
        ε (``q = 1`` uses the closed form of :func:`~pymc_dp.accounting.gaussian_epsilon`).
    """
    z, q = _check_zq(noise_multiplier, sampling_ratio)
    k = check_int(iterations, "iterations", minimum=0)
    d = check_delta(delta)
    if k == 0:
        return 0.0
    if q == 1.0:
        return float(gaussian_epsilon(d, k / (2.0 * z * z)))
    return _subsampled_epsilon(z, q, k, d, check_positive(discretization, "discretization"))


@functools.lru_cache(maxsize=4096)
def _subsampled_epsilon(z: float, q: float, k: int, delta: float, discretization: float) -> float:
    """:func:`subsampled_gaussian_epsilon` for ``q < 1``, remembered: every chain of a run
    (and every step built with the same settings) reports ε at the same iteration counts."""
    pld = subsampled_gaussian_pld(z, q, k, discretization=discretization)
    return max(0.0, float(pld.get_epsilon_for_delta(delta)))


def subsampled_gaussian_delta(
    noise_multiplier: float,
    sampling_ratio: float,
    iterations: int,
    epsilon: float,
    *,
    discretization: float = DEFAULT_DISCRETIZATION,
) -> float:
    """δ at ``epsilon`` after ``iterations`` subsampled-Gaussian releases (see module docs)."""
    z, q = _check_zq(noise_multiplier, sampling_ratio)
    k = check_int(iterations, "iterations", minimum=0)
    eps = float(epsilon)
    if not (math.isfinite(eps) and eps >= 0):
        raise InvalidParameterError(f"epsilon must be finite and >= 0; got {epsilon!r}.")
    if k == 0:
        return 0.0
    if q == 1.0:
        return float(gaussian_delta(eps, k / (2.0 * z * z)))
    pld = subsampled_gaussian_pld(z, q, k, discretization=discretization)
    return float(pld.get_delta_for_epsilon(eps))


def subsampled_gaussian_rdp(
    orders: np.ndarray, noise_multiplier: float, sampling_ratio: float
) -> np.ndarray:
    """Per-iteration RDP of the subsampled Gaussian (WBK 2019 Thm 9, base ``α/(2z²)``).

    Used only where a composition has to be done in RDP (together with DP Barker). Looser than
    the PLD accounting above, and than WBK's Gaussian-specific Thm 27, but valid for the
    substitute relation with sampling without replacement.

    Parameters
    ----------
    orders : numpy.ndarray
        Integer orders ``≥ 2``.
    noise_multiplier, sampling_ratio : float
        ``z`` and ``q``.
    """
    z, q = _check_zq(noise_multiplier, sampling_ratio)
    orders = np.asarray(orders)
    if q == 1.0:
        return orders / (2.0 * z * z)
    return wbk_subsampled_rdp(orders, lambda j: j / (2.0 * z * z), q)


#: Neighbouring relations :func:`subsampled_gaussian_schedule_epsilon` accounts under.
SCHEDULE_RELATIONS = ("substitute", "add_remove_poisson")


def subsampled_gaussian_schedule_epsilon(
    noise_multipliers: Sequence[float],
    sampling_ratio: float,
    delta: float,
    *,
    repeats: int = 1,
    relation: str = "substitute",
    accountant: str = "pld",
    discretization: float = DEFAULT_DISCRETIZATION,
) -> float:
    """ε at ``delta`` of a schedule: release ``t`` has multiplier ``z_t``, each ``repeats`` times.

    A decreasing step size makes every stochastic-gradient iteration its own event (theory
    §4.5): DP-SGHMC with ``η_t = β t^{-1/3}`` and ``J`` steps per iteration is
    ``noise_multipliers = (z_1, …, z_T)`` with ``repeats = J``.

    Parameters
    ----------
    noise_multipliers : sequence of float
        ``z_t = σ_t / Δ`` per iteration, ``Δ`` the sensitivity under ``relation``.
    sampling_ratio : float
        ``q``.
    delta : float
        Target δ.
    repeats : int
        Releases per multiplier (``J``).
    relation : {"substitute", "add_remove_poisson"}
        ``"substitute"`` (ours): substitute one row, fixed-size batches without replacement,
        the Dong–Roth–Su pair of this module (``Δ = 2C`` for a clipped sum).
        ``"add_remove_poisson"``:
        add/remove one row with Poisson sampling (``Δ = C``), dp_accounting's own
        ``PoissonSampledDpEvent``; only to compare with publications that account that way
        (e.g. the SGHMC thesis' Table 6.3), since our samplers draw fixed-size batches.
    accountant : {"pld", "rdp"}
        Tight PLD, or RDP (looser): WBK 2019 Thm 9 for ``"substitute"``, dp_accounting's
        Poisson RDP for ``"add_remove_poisson"``. Under ``"substitute"`` the PLD is the
        ledger's own composition (:func:`pymc_dp.accounting.costs.compose_epsilon` of
        ``SubsampledGaussianCost`` events).
    discretization : float
        PLD loss discretisation of the ``"add_remove_poisson"`` accountant.
    """
    if relation not in SCHEDULE_RELATIONS:
        raise InvalidParameterError(
            f"relation must be one of {SCHEDULE_RELATIONS}, got {relation!r}."
        )
    if accountant not in ("pld", "rdp"):
        raise InvalidParameterError(f"accountant must be 'pld' or 'rdp', got {accountant!r}.")
    zs = [_check_zq(z, sampling_ratio)[0] for z in noise_multipliers]
    q = _check_zq(1.0, sampling_ratio)[1]
    j = check_int(repeats, "repeats", minimum=1)
    d = check_delta(delta)
    if not zs:
        return 0.0
    if relation == "add_remove_poisson":
        import dp_accounting
        from dp_accounting import dp_event
        from dp_accounting.pld import pld_privacy_accountant
        from dp_accounting.rdp import rdp_privacy_accountant

        add_remove = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
        acc = (
            pld_privacy_accountant.PLDAccountant(
                neighboring_relation=add_remove, value_discretization_interval=discretization
            )
            if accountant == "pld"
            else rdp_privacy_accountant.RdpAccountant(neighboring_relation=add_remove)
        )
        for z in zs:
            acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), j)
        return max(0.0, float(acc.get_epsilon(d)))
    if accountant == "rdp":
        orders = np.arange(2, 257)
        total = sum(subsampled_gaussian_rdp(orders, z, q) for z in zs) * j
        return float(rdp_to_epsilon(orders, total, d)[0])
    from pymc_dp.accounting.costs import SubsampledGaussianCost, compose_epsilon  # (cycle)

    return compose_epsilon([(SubsampledGaussianCost(z, q), j) for z in zs], d)[0]
