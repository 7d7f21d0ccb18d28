"""Private initialisation: noisy clipped-gradient ascent of the log posterior (issue 17).

From PyMC's initial point ``θ₀`` (unconstrained space), for ``t = 1..K``:

1. ``g_t = T · (G(θ) + N(0, σ² I)) + ∇ log p(θ)``: the released clipped gradient sum (one
   Gaussian mechanism, ``σ = z · 2 b_g``) plus the public log-prior gradient;
2. an Adam step ``θ ← θ + η_t ⊙ m̂_t / (√v̂_t + ϵ)`` (first and second moments of ``g``),
   with the schedule ``λ_t = λ₀`` for the first half and a geometric decay to
   ``λ₀ · decay`` over the second;
3. per coordinate, the step ``η_{t,j}`` grows by ``growth`` while the released gradient keeps
   the sign of the momentum (``sign g_{t,j} = sign m_{t−1,j}``: still climbing the same way)
   and halves when it turns, never below ``λ_t`` (nor above ``10⁶ λ_t``). Adam moves a
   coordinate by about ``λ_t`` per step whatever its units: 100 steps of 0.1 cannot take an
   intercept from PyMC's 0 to a weight of 1500 grams. The step travels geometrically while
   the climb is signal; near the mode the noise turns the sign about half the time and the
   step stays at ``λ_t`` or near it, so the settling is plain Adam's (Rprop's sign rule,
   with Adam's moments);
4. the result is the average of the iterates of the last quarter (Polyak averaging: the
   noise of the iterates averages out while the drift has stopped).

Everything after the releases is post-processing: the average, the spread of the tail iterates
(a per-coordinate scale), the tail itself. The privacy cost is ``K`` Gaussian releases,
composed in the same ledger as the sampler.

NumPy only: the gradient release and the log-prior gradient come in as callables.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from pymc_dp.kernels.fisher_noise import FisherNoise
from pymc_dp.releases import Release

__all__ = [
    "AscentParams",
    "AscentResult",
    "covariance_from_fisher",
    "gradient_design",
    "loose_directions",
    "newton_from_designs",
    "newton_step",
    "noisy_gradient_ascent",
    "pooled_mode",
    "prior_exact_step",
    "prior_hessian",
    "prior_information",
    "relative_noise",
    "secant_update",
    "unresolved_directions",
]


class AscentParams(NamedTuple):
    """Public settings of the ascent."""

    iterations: int = 200
    learning_rate: float = 0.1
    decay: float = 1e-2  # final learning rate as a fraction of the first
    beta1: float = 0.9
    beta2: float = 0.999
    tail: float = 0.25  # fraction of the last iterates averaged
    growth: float = 1.2  # per-coordinate step: × growth while the gradient keeps its sign


class AscentResult(NamedTuple):
    """What the ascent gives (all post-processing of the releases)."""

    theta: np.ndarray  # the average of the tail iterates
    spread: np.ndarray  # per-coordinate sd of the tail iterates
    tail: np.ndarray  # (k, d) the tail iterates
    path: np.ndarray  # (K + 1, d) every iterate, the start included
    stopped: int  # iterations run (fewer when a release was undefined)
    points: np.ndarray  # (m, d) where each defined gradient was released
    grads: np.ndarray  # (m, d) the released log-posterior gradients there


#: A coordinate's step is at most this many times the schedule's rate.
_MAX_GAIN = 1e6


def _schedule(params: AscentParams) -> np.ndarray:
    k = params.iterations
    half = k // 2
    rates = np.full(k, params.learning_rate)
    if k - half > 0:
        rates[half:] = params.learning_rate * params.decay ** (
            np.arange(1, k - half + 1) / (k - half)
        )
    return rates


def noisy_gradient_ascent(
    theta0: np.ndarray,
    params: AscentParams,
    release_grad: Callable[[np.ndarray], Release],
    logprior_grad: Callable[[np.ndarray], np.ndarray],
) -> AscentResult:
    """Run the ascent of the module docstring from ``theta0``.

    A release that is undefined (the iterate left the model's support: NaN, nothing read or
    spent) halves the learning rate and every coordinate's step, and returns to the previous
    iterate. ``params.growth = 1`` is plain Adam.
    """
    theta = np.array(theta0, dtype=float)
    m = np.zeros_like(theta)
    v = np.zeros_like(theta)
    rates = _schedule(params)
    path = [theta.copy()]
    points, grads = [], []
    scale = 1.0
    step = np.full_like(theta, params.learning_rate)
    t = 0
    for rate in rates:
        released = release_grad(theta)
        grad = np.asarray(released.value, dtype=float) + logprior_grad(theta)
        if not np.all(np.isfinite(grad)):
            scale *= 0.5
            step = 0.5 * step
            theta = path[-2].copy() if len(path) > 1 else path[0].copy()
            path.append(theta.copy())
            continue
        t += 1
        points.append(theta.copy())
        grads.append(grad)
        if t == 1 or params.growth <= 1.0:
            step = np.full_like(theta, rate)
        else:
            agree = np.sign(grad) == np.sign(m)
            step = np.where(agree, step * params.growth, 0.5 * step)
            step = np.clip(step, rate, rate * _MAX_GAIN)
        m = params.beta1 * m + (1 - params.beta1) * grad
        v = params.beta2 * v + (1 - params.beta2) * grad**2
        m_hat = m / (1 - params.beta1**t)
        v_hat = v / (1 - params.beta2**t)
        theta = theta + scale * step * m_hat / (np.sqrt(v_hat) + 1e-12)
        path.append(theta.copy())
    trajectory = np.array(path)
    k = max(2, round(params.tail * params.iterations))
    tail = trajectory[-k:]
    return AscentResult(
        tail.mean(axis=0),
        tail.std(axis=0, ddof=1),
        tail,
        trajectory,
        t,
        np.array(points).reshape(-1, theta.size),
        np.array(grads).reshape(-1, theta.size),
    )


class Design(NamedTuple):
    """Released gradients at ``θ ± h_j e_j``: finite-difference Hessian columns and their noise.

    ``columns[:, j] = (ḡ(θ + h_j e_j) − ḡ(θ − h_j e_j)) / (2 h_j)``; entry ``(k, j)`` has noise
    sd ``σ_k / (h_j √(2r))`` (``σ_k`` the releases' noise sd in coordinate ``k``, public).
    ``gradient`` is the mean of all ``2 d r`` releases, an estimate of ``∇ log π(θ)`` (the
    symmetric design cancels the linear term), with noise sd ``σ_k / √(2 d r)``.
    """

    columns: np.ndarray
    noise: np.ndarray  # (d, d) per entry
    gradient: np.ndarray
    gradient_noise: np.ndarray  # (d,)
    step: np.ndarray
    points: np.ndarray
    grads: np.ndarray


def gradient_design(
    theta: np.ndarray,
    step: np.ndarray,
    rounds: int,
    release_grad: Callable[[np.ndarray], Release],
    logprior_grad: Callable[[np.ndarray], np.ndarray],
    noise_std: np.ndarray,
) -> Design:
    """Release ``rounds`` gradients at each of ``θ ± h_j e_j`` (``h = step``)."""
    theta = np.asarray(theta, dtype=float)
    step = np.asarray(step, dtype=float)
    noise_std = np.broadcast_to(np.asarray(noise_std, dtype=float), theta.shape)
    d = theta.size
    plus = np.zeros((d, d))
    minus = np.zeros((d, d))
    points, grads = [], []
    for _ in range(rounds):
        for j in range(d):
            for sign, side in ((1.0, plus), (-1.0, minus)):
                x = theta.copy()
                x[j] += sign * step[j]
                g = np.asarray(release_grad(x).value, dtype=float) + logprior_grad(x)
                side[:, j] += g
                points.append(x)
                grads.append(g)
    count = 2 * d * rounds
    gradient = (plus.sum(axis=1) + minus.sum(axis=1)) / count
    columns = (plus - minus) / (rounds * 2.0 * step[None, :])
    noise = noise_std[:, None] / (step[None, :] * np.sqrt(2.0 * rounds))
    return Design(
        columns,
        noise,
        gradient,
        noise_std / np.sqrt(count),
        step,
        np.array(points),
        np.array(grads),
    )


def prior_hessian(
    logprior_grad: Callable[[np.ndarray], np.ndarray], theta: np.ndarray, step: float = 1e-4
) -> np.ndarray:
    """The log-prior's Hessian at ``θ`` by central differences of its (public) gradient."""
    theta = np.asarray(theta, dtype=float)
    d = theta.size
    hessian = np.zeros((d, d))
    for j in range(d):
        h = step * max(1.0, abs(theta[j]))
        e = np.zeros(d)
        e[j] = h
        hessian[:, j] = (logprior_grad(theta + e) - logprior_grad(theta - e)) / (2.0 * h)
    return 0.5 * (hessian + hessian.T)


def prior_information(hessian: np.ndarray) -> np.ndarray:
    """The positive part of ``−H_prior``: the information a log prior's Hessian carries.

    A prior that is not log-concave where it is evaluated (a hierarchical prior's funnel)
    contributes none along its convex directions. Public.
    """
    values, vectors = np.linalg.eigh(-0.5 * (hessian + hessian.T))
    return (vectors * np.maximum(values, 0.0)) @ vectors.T


def prior_exact_step(
    theta: np.ndarray,
    gradient: np.ndarray,
    information: np.ndarray,
    logprior: Callable[[np.ndarray], float],
    logprior_grad: Callable[[np.ndarray], np.ndarray],
    covariance: np.ndarray,
    max_sd: float,
    in_support: Callable[[np.ndarray], bool] = lambda _: True,
    iterations: int = 20,
) -> np.ndarray:
    """The maximum near ``θ`` of ``log p(x) + gᵀ(x − θ) − ½ (x − θ)ᵀ F (x − θ)``.

    The log posterior with its likelihood replaced by a quadratic — a released likelihood
    gradient ``g`` and information ``F`` at ``θ`` — and its prior kept exact (it is public).
    With a Gaussian prior it is the Newton step ``(F + Π)⁻¹ (g + ∇log p(θ))``. Where the
    prior's curvature changes fast (a hierarchical prior's ``σ_a``, on a log scale, along
    which the likelihood carries no information) a Newton step with the curvature at ``θ``
    overshoots by orders of magnitude; here the prior's own maximum is found instead.
    Damped Newton iterations with the prior's Hessian at each iterate (its negative-definite
    part, :func:`prior_information`; no direction flatter than ``covariance``'s flattest),
    kept within ``max_sd`` posterior sds of ``θ`` in ``covariance``'s metric and inside the
    support. Post-processing of the releases.
    """
    theta = np.asarray(theta, dtype=float)
    gradient = np.asarray(gradient, dtype=float)
    information = 0.5 * (information + information.T)
    values, vectors = np.linalg.eigh(information)
    information = (vectors * np.maximum(values, 0.0)) @ vectors.T
    root = np.linalg.cholesky(covariance)

    def objective(x: np.ndarray) -> float:
        u = x - theta
        return float(logprior(x) + gradient @ u - 0.5 * u @ information @ u)

    def length(x: np.ndarray) -> float:
        return float(np.linalg.norm(np.linalg.solve(root, x - theta)))

    x, current = theta.copy(), objective(theta)
    if not np.isfinite(current):
        return x
    # no direction flatter than the flattest that ``covariance`` knows: where neither the
    # prior nor the quadratic bends one, a small gradient would otherwise go all of max_sd
    floor = float(np.min(np.linalg.eigvalsh(np.linalg.inv(covariance))))
    for _ in range(iterations):
        slope = logprior_grad(x) + gradient - information @ (x - theta)
        curvature = prior_information(prior_hessian(logprior_grad, x)) + information
        values, vectors = np.linalg.eigh(0.5 * (curvature + curvature.T))
        direction = vectors @ ((vectors.T @ slope) / np.maximum(values, floor))
        if not np.all(np.isfinite(direction)) or float(slope @ direction) < 1e-10:
            break
        for _ in range(40):
            candidate = x + direction
            if length(candidate) <= max_sd and in_support(candidate):
                value = objective(candidate)
                if np.isfinite(value) and value >= current:
                    break
            direction = direction / 2
        else:
            break
        x, current = candidate, value
    return x


def covariance_from_fisher(
    fisher: np.ndarray,
    whitening: np.ndarray,
    noise_std: float,
    prior_hessian: np.ndarray,
    fallback: np.ndarray | None = None,
    *,
    midpoint: bool = False,
    pattern: np.ndarray | None = None,
    flat: np.ndarray | None = None,
) -> np.ndarray:
    """Posterior covariance ``(P⁻¹ F P⁻ᵀ − H_prior)⁻¹`` from a released Fisher matrix.

    With the likelihood's ``pattern`` (``RowLikelihood.fisher_pattern``) the release is first
    fitted to the entries it can have and ``r`` is the projected noise's spectral norm
    (:class:`~pymc_dp.kernels.fisher_noise.FisherNoise`); otherwise as follows.
    ``F`` is :class:`~pymc_dp.mechanisms.FisherRelease`'s noisy ``Σ_i v_i v_iᵀ``, ``v_i = P ∇ℓ_i``
    (``whitening`` ``P``, a ``d × d`` matrix, or a vector for a diagonal one). Its noise
    (entries of sd ``σ``) has spectral norm about ``r = 2σ√d``, so each eigenvalue ``λ_k`` of
    ``F`` is known to within ``±r`` (Weyl). An eigenvalue above ``r`` is kept. One below it is
    not resolved by the release: it takes the information that ``fallback`` (an earlier private
    posterior covariance, e.g. the initialisation's) gives along its eigenvector ``e_k`` (the
    likelihood's part, ``eₖᵀ P (Σ_f⁻¹ + H_prior) Pᵀ eₖ``), kept inside what the release allows,
    ``[max(λ_k − min(3σ, r), 0), λ_k + r]`` (at the bottom three sd of one direction's
    quadratic form, as with ``midpoint`` below); then, within the span of the unresolved
    directions, the
    likelihood's and the prior's information together are raised to at least ``r/100``: where
    the prior informs a direction (a centred hierarchy's ``μ_a``, on which the likelihood does
    not depend) the likelihood's part may be zero, and a direction neither informs keeps
    ``r/100``. Without a fallback (and without ``midpoint``), ``r`` (a direction the data do
    not inform keeps the noise's information, never a negative one). The log
    prior's Hessian enters with its negative-definite part (:func:`prior_information`).
    Post-processing of the releases.

    With ``midpoint=True`` an unresolved direction takes instead the geometric midpoint
    ``√(lo·hi)`` of the posterior information the release allows there, less ``π_k`` (the
    prior's information along ``e_k``), with ``hi = π_k + λ_k + r`` and
    ``lo = max(π_k + max(λ_k − min(3σ, r), 0), r/100)``. At the bottom it takes three sd of
    one direction's quadratic form, ``3σ``, rather than Weyl's radius (which
    :func:`loose_directions` keeps, to decide whether to read again): with ``λ_k − r`` an
    informed direction just under ``r`` came out 2–2.7 times too wide. Where the floor
    ``r/100`` is above ``π_k`` (a ridge the current whitening squeezes hard) the range no
    longer holds the truth, and a read widens the direction by less. Otherwise the guess is
    off by about ``√(hi/lo)`` at most, either way, and a Fisher read in the whitening it gives
    sees the prior's share of that direction grow by the square of the widening, so repeated
    reads close the range (:func:`loose_directions`) like a bisection on the log
    information. It is meant for the sampler's metric after repeated reads at one point. On
    a ridge the likelihood does not inform, ``hi/lo`` starts 10⁴–10⁶ wide; the fallback,
    round in the release's whitening, claims the top, so each read widened the ridge only
    about 1.6 times.

    Returns a matrix of NaN where the information is singular in floating point (NumPy's
    ``LinAlgError``); callers check every result and keep what they had.

    (Taking the lower end wherever the fallback claims more than ``λ_k + r`` — a ridge the
    likelihood does not inform — made the zoo's mixture, whose Fisher far from the mode
    resolves few directions, 10–50 times too wide and its centre 100–1400 sd off.)

    ``flat`` (``d × k``, ``RowLikelihood.likelihood_flat_directions``): directions of ``θ``
    along which no row's log-likelihood changes, for any data (public: the graph; an
    intercept beside free group offsets, ``a + b[g]``, along ``a + c, b − c``). There the
    rows' Fisher information is exactly zero: the release is taken on the other directions
    only, and these keep the prior's information alone, neither resolved by the noise nor
    guessed (the floor above only where the prior gives them none, a flat prior).
    """
    fisher, matrix, noise = _released_fisher(fisher, whitening, noise_std, pattern)
    prior_part = prior_information(prior_hessian)
    values, vectors, structural = _released_eigen(fisher, matrix, flat)
    radius = noise.radii(values)
    unresolved = (values < radius) & ~structural
    kept = np.where(unresolved, radius, values)
    if midpoint and np.any(unresolved):
        along = _along_each(vectors, matrix @ prior_part @ matrix.T)
        below = values - np.minimum(3.0 * float(noise_std), radius)  # one direction's noise, 3 sd
        low = np.maximum(along + np.maximum(below, 0.0), 0.01 * radius)
        high = np.maximum(along + values + radius, low)
        kept = np.where(unresolved, np.maximum(np.sqrt(low * high) - along, 0.0), values)
    elif fallback is not None and np.any(unresolved):
        earlier = np.linalg.inv(np.asarray(fallback, dtype=float)) - prior_part
        earlier = matrix @ earlier @ matrix.T  # in the release's coordinates
        along = _along_each(vectors, earlier)
        along = np.where(np.isfinite(along), along, np.inf)
        # at the bottom one direction's noise, three sd, as in the midpoint: Weyl's radius
        # let an earlier estimate claim next to nothing along an informed direction just
        # under it (the zoo's radon model at n = 10⁶, ε = 5: its smallest counties' variances
        # 11–72 times the exact ones in 5 of 10 preparations, and the Newton steps with them
        # ended 28–412 whitened units off in 3)
        below = values - np.minimum(3.0 * float(noise_std), radius)
        guess = np.clip(along, np.maximum(below, 0.0), values + radius)
        kept = np.where(unresolved, guess, values)
    kept = np.where(structural, 0.0, kept)
    fisher = (vectors * kept) @ vectors.T
    floor = 0.01 * float(np.max(radius)) if radius.size else 0.0
    # within the flat directions the prior's information as it is, where it has any
    lifts = [(vectors[:, structural], 1e-12 * floor)]
    if fallback is not None or midpoint:
        # within the unresolved directions, the likelihood's and the prior's information
        # together at least r/100 (in the release's coordinates): where the prior informs a
        # direction the likelihood's part may be zero, where nothing does the floor holds
        lifts.insert(0, (vectors[:, unresolved], floor))
    for span, least in lifts:
        if span.shape[1] == 0:
            continue
        total = span.T @ (fisher + matrix @ prior_part @ matrix.T) @ span
        lows, turns = np.linalg.eigh(0.5 * (total + total.T))
        lift = span @ turns
        fisher = fisher + (lift * np.where(lows < least, floor - lows, 0.0)) @ lift.T
    inverse = np.linalg.inv(matrix)
    information = inverse @ fisher @ inverse.T + prior_part
    try:
        covariance = np.linalg.inv(information)
    except np.linalg.LinAlgError:
        # singular in floating point: a prior's curvature of 1e44 beside the release's (a
        # centre at a hierarchy's funnel neck, σ → 0); the callers check the result
        # (``_usable``: a nearly singular one too) and keep their last usable covariance
        return np.full_like(information, np.nan)
    return 0.5 * (covariance + covariance.T)


#: An unresolved direction is loose when its information's range spans more than this factor.
_LOOSE_FACTOR = 4.0


def _along_each(vectors: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """``e_kᵀ A e_k`` for each column ``e_k`` of ``vectors``: a quadratic form along each."""
    return np.einsum("ik,ij,jk->k", vectors, matrix, vectors)


def _released_fisher(
    fisher: np.ndarray,
    whitening: np.ndarray,
    noise_std: float,
    pattern: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, FisherNoise]:
    """A released Fisher matrix symmetrised and fitted to the entries ``pattern`` allows, its
    whitening as a ``d × d`` matrix, and its noise model
    (:class:`~pymc_dp.kernels.fisher_noise.FisherNoise`)."""
    matrix = np.asarray(whitening, dtype=float)
    if matrix.ndim == 1:
        matrix = np.diag(matrix)
    noise = FisherNoise(noise_std, matrix, pattern)
    return noise.project(fisher), matrix, noise


def _released_eigen(
    fisher: np.ndarray, matrix: np.ndarray, flat: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eigenvalues and eigenvectors of a fitted release (``matrix``: its whitening ``P``), the
    likelihood's ``flat`` directions of ``θ`` apart: ``(values, vectors, structural)``.

    Along a flat direction ``n`` every row's ``∇ℓ_i · n = 0``, so in the release's coordinates
    (``v_i = P ∇ℓ_i``) ``u = P⁻ᵀ n`` has ``v_i · u = 0``: the rows' Fisher information is zero
    on the span of these ``u``. The release is decomposed on the orthogonal complement; the
    span's orthonormal basis follows with value 0 and ``structural`` set. Without flat
    directions this is ``eigh(fisher)``.
    """
    d = fisher.shape[0]
    if flat is None or np.size(flat) == 0:
        values, vectors = np.linalg.eigh(fisher)
        return values, vectors, np.zeros(d, dtype=bool)
    null = np.linalg.solve(matrix.T, np.asarray(flat, dtype=float).reshape(d, -1))
    basis, sizes, _ = np.linalg.svd(null, full_matrices=True)
    k = int(np.sum(sizes > 1e-10 * sizes[0]))
    span, rest = basis[:, :k], basis[:, k:]
    values, turns = np.linalg.eigh(rest.T @ fisher @ rest)
    vectors = np.concatenate([rest @ turns, span], axis=1)
    structural = np.concatenate([np.zeros(d - k, dtype=bool), np.ones(k, dtype=bool)])
    return np.concatenate([values, np.zeros(k)]), vectors, structural


def unresolved_directions(
    fisher: np.ndarray,
    noise_std: float,
    whitening: np.ndarray | None = None,
    pattern: np.ndarray | None = None,
    flat: np.ndarray | None = None,
) -> int:
    """How many eigenvalues of a released Fisher matrix are below their noise radius.

    With a ``pattern``, give the release's ``whitening`` too (the fit is in its coordinates).

    The radius is ``2σ√d`` without public zeros; with the likelihood's ``pattern`` of entries
    that can be non-zero (and the release's ``whitening``), the released matrix is fitted to
    it and each direction gets the radius of
    :meth:`~pymc_dp.kernels.fisher_noise.FisherNoise.radii`. Along those eigenvectors the
    release does not tell the information from its noise, and :func:`covariance_from_fisher`
    takes a rougher guess there (an earlier estimate, or the range's geometric midpoint).
    The likelihood's ``flat`` directions (:func:`covariance_from_fisher`) are not counted:
    their information is known to be zero. Public (post-processing of the release).
    """
    d = np.shape(fisher)[0]
    fisher, matrix, noise = _released_fisher(
        fisher, np.eye(d) if whitening is None else whitening, noise_std, pattern
    )
    values, _, structural = _released_eigen(fisher, matrix, flat)
    return int(np.sum((values < noise.radii(values)) & ~structural))


def loose_directions(
    fisher: np.ndarray,
    whitening: np.ndarray,
    noise_std: float,
    prior_hessian: np.ndarray,
    factor: float = _LOOSE_FACTOR,
    pattern: np.ndarray | None = None,
    flat: np.ndarray | None = None,
) -> int:
    """How many unresolved directions of a released Fisher matrix leave the posterior's
    information along them uncertain by more than ``factor``.

    Along an eigenvector ``e_k`` of ``F`` below the noise radius ``r``
    (:func:`unresolved_directions`) the likelihood's information is somewhere in
    ``[max(λ_k − r, 0), λ_k + r]``, and the posterior's in that range plus the prior's
    ``π_k = e_kᵀ P Π Pᵀ e_k`` (``P`` the release's ``whitening``, ``Π`` the prior's information,
    :func:`prior_information`). The direction is *loose* when the top of the range is more than
    ``factor`` times its bottom. A loose direction is either a ridge the likelihood does not
    inform (a hierarchy's ``μ_a, σ_a`` against its ``z_j``), or one the whitening squeezed (a
    curved ridge read with the curvature of another point): a release in the whitening the
    first one gives spreads the clip over it and tightens the range in both cases. A ridge
    that is one of the likelihood's ``flat`` directions (:func:`covariance_from_fisher`) is
    known exactly and is not counted. Public (post-processing of the release).
    """
    fisher, matrix, noise = _released_fisher(fisher, whitening, noise_std, pattern)
    values, vectors, structural = _released_eigen(fisher, matrix, flat)
    radius = noise.radii(values)
    prior = matrix @ prior_information(prior_hessian) @ matrix.T
    along = _along_each(vectors, prior)
    low = along + np.maximum(values - radius, 0.0)
    high = along + values + radius
    return int(np.sum((values < radius) & (high > factor * low) & ~structural))


def relative_noise(
    fisher: np.ndarray,
    whitening: np.ndarray,
    noise_std: float,
    prior_hessian: np.ndarray,
    pattern: np.ndarray | None = None,
    flat: np.ndarray | None = None,
) -> float:
    """A released Fisher matrix's noise radius over the median posterior information it
    states along its eigenvectors: ``r / median_k(λ_k + π_k)``.

    ``r`` is the noise radius of :func:`unresolved_directions`, ``λ_k`` the fitted release's
    eigenvalues (floored at 0) and ``π_k = e_kᵀ P Π Pᵀ e_k`` the prior's information along each
    (:func:`loose_directions`); the likelihood's ``flat`` directions are left out (their
    information is known). A sampler metric taken from the release is off along a typical
    direction by up to about half this, as a log: on a 41-parameter logistic regression at
    n = 10⁵, ε = 5, about 0.35 after pooled reads left an rms log error of 0.16 (of the
    covariance's eigenvalues against the exact one); on the zoo's centred hierarchy, 0.3 left
    0.08. ``0`` when every direction is flat (nothing to read); ``inf`` when the median
    information stated is not positive. Public (post-processing of the release).
    """
    fisher, matrix, noise = _released_fisher(fisher, whitening, noise_std, pattern)
    values, vectors, structural = _released_eigen(fisher, matrix, flat)
    if np.all(structural):
        return 0.0
    radius = noise.radii(values)
    prior = matrix @ prior_information(prior_hessian) @ matrix.T
    information = _along_each(vectors, prior) + np.maximum(values, 0.0)
    typical = float(np.median(information[~structural]))
    return float(np.max(radius[~structural])) / typical if typical > 0 else math.inf


def newton_step(
    theta: np.ndarray,
    covariance: np.ndarray,
    gradient: np.ndarray,
    max_sd: float,
    noise_length: float = 0.0,
) -> np.ndarray:
    """``θ + Σ g``, shrunk by its noise and shortened to ``max_sd`` sds (post-processing).

    ``g`` is a (released) gradient of the log posterior at ``θ`` and ``Σ = W Wᵀ`` the posterior
    covariance: for a Gaussian posterior the step lands on the mode. In posterior sds the step
    is ``u = Wᵀ g``; when the gradient's noise puts ``noise_length²`` into ``E‖u‖²`` (isotropic
    noise in those coordinates), the step is multiplied by ``max(0, 1 − noise_length²/‖u‖²)``
    (positive-part James–Stein shrinkage: a step that is mostly noise is mostly not taken). A
    longer step than ``max_sd`` sds means the curvature or the gradient is far off; ``θ``
    itself when the step is not finite.
    """
    theta = np.asarray(theta, dtype=float)
    step = covariance @ np.asarray(gradient, dtype=float)
    length = float(np.linalg.norm(np.linalg.solve(np.linalg.cholesky(covariance), step)))
    if not np.isfinite(length):
        return theta.copy()
    if length > 0 and noise_length > 0:
        shrink = max(0.0, 1.0 - (noise_length / length) ** 2)
        step *= shrink
        length *= shrink
    if length > max_sd:
        step *= max_sd / length
    return theta + step


class CurvatureResult(NamedTuple):
    """A Newton step from one or more gradient designs (post-processing)."""

    theta: np.ndarray  # θ + Σ̂_s ḡ, kept inside the designs' trust region
    covariance: np.ndarray  # Σ̂ = (−Ĥ)⁻¹, Ĥ made negative definite
    hessian: np.ndarray  # Ĥ, symmetrised
    gradient: np.ndarray  # ḡ
    step_covariance: np.ndarray  # Σ̂_s: Σ̂ with the likelihood's information floored, for steps


def newton_from_designs(
    theta: np.ndarray,
    designs: list[Design],
    *,
    prior_hessian: np.ndarray | None = None,
    reads: np.ndarray | None = None,
    trust: float = 3.0,
) -> CurvatureResult:
    """Combine designs at ``θ`` (each entry weighted by ``1/noise²``) and take a Newton step.

    With the log-prior's Hessian at ``θ`` (public), the likelihood's part ``Ĥ − H_prior`` is
    projected onto the negative semi-definite matrices (a likelihood's information is never
    negative) before the prior's is added back: the estimated posterior is then never wider
    than the prior, whatever the noise did to a weakly identified direction.

    The step ``Σ̂_s ḡ`` takes, along each coordinate the likelihood reads (``reads``, public:
    ``PrivateChannel.likelihood_coordinates``; all by default) and the prior couples to
    another (a hierarchy's ``a_j``, to ``μ_a`` and ``σ_a``), at least the likelihood
    information its designs' noise could hide there (twice their noise sd, the
    preconditioner's floor too): an unresolved coordinate then moves no further than the
    shortest step the noise is consistent with, rather than as far as the prior's width
    allows, which the prior's coupling would pass on to the others. (Not under an
    independent prior: on a logistic regression in its covariates' own units at ε = 1, whose
    climb ends far out along a ridge, the floor on every coordinate held the steps, and the
    start was 37 sd off instead of under 3.5.) ``Σ̂`` itself, the estimate of the
    posterior's covariance, is left without that floor (it would make an unresolved
    coordinate too narrow for a sampler's metric: a rare covariate's sd came out 0.25–0.29 of
    the truth). Without the floor a centred hierarchy's
    steps went wild: on a 60-group logistic hierarchy (n = 10⁵, ε = 5) the first design's
    noise on each group's curvature (sd about 700 against an information of about 330) left
    21 of the 60 groups with none; their ``a_j`` had the prior's width alone, and through the
    prior's coupling ``μ_a`` and ``log σ_a`` moved 1.2 (the trust region's edge) from a climb
    that had ended at the mode, and the next step 3–5 more. In three of four default DP HMC
    preparations the centring went on from there into ``σ_a → 0`` (``log σ_a`` −35 with every
    ``a_j = μ_a``): the chains diverged at every iteration and reported ``z`` of 10¹³. The step
    is kept within ``trust · h_j`` of ``θ`` per coordinate (the largest design step): the
    quadratic was fitted there only.
    """
    theta = np.asarray(theta, dtype=float)
    weights = [1.0 / np.maximum(design.noise, 1e-300) ** 2 for design in designs]
    hessian = sum(w * design.columns for w, design in zip(weights, designs, strict=True))
    hessian = hessian / sum(weights)
    hessian = 0.5 * (hessian + hessian.T)
    # off-diagonal entries within the noise of zero are noise: soft-thresholded, so that a
    # noisy design does not invent correlations. Among m = d(d−1)/2 pairs of pure noise the
    # largest is about σ√(2 log m) (the universal threshold): two sd would keep 4.6 % of them,
    # dozens at d = 54, enough to send a Newton step far along a sharp coordinate
    variance = 1.0 / sum(weights)
    noise = 0.5 * np.sqrt(variance + variance.T)  # sd of the symmetrised entry
    d = hessian.shape[0]
    off = ~np.eye(d, dtype=bool)
    threshold = max(2.0, math.sqrt(2.0 * math.log(max(d * (d - 1) / 2.0, 1.0))))
    shrunk = np.sign(hessian) * np.maximum(np.abs(hessian) - threshold * noise, 0.0)
    hessian = np.where(off, shrunk, hessian)
    g_weights = [1.0 / np.maximum(design.gradient_noise, 1e-300) ** 2 for design in designs]
    gradient = sum(w * design.gradient for w, design in zip(g_weights, designs, strict=True))
    gradient = gradient / sum(g_weights)
    if not (np.all(np.isfinite(hessian)) and np.all(np.isfinite(gradient))):
        # a design point left the support (an undefined release): no step, no curvature
        undefined = np.full(hessian.shape, np.nan)
        return CurvatureResult(theta, undefined, hessian, gradient, undefined)
    if prior_hessian is not None:
        prior = 0.5 * (prior_hessian + prior_hessian.T)
        values, vectors = np.linalg.eigh(-(hessian - prior))
        information = (vectors * np.maximum(values, 0.0)) @ vectors.T
        hidden = np.maximum(2.0 * np.sqrt(np.diag(variance)) - np.diag(information), 0.0)
        if reads is not None:  # along the others it is zero for every dataset
            hidden = np.where(np.asarray(reads, dtype=bool), hidden, 0.0)
        # only where the prior couples the coordinate to others (a hierarchy's a_j to μ_a, σ_a):
        # an independent prior's width moves that coordinate alone
        hidden = np.where(_coupled(prior), hidden, 0.0)
        covariance = _inverse_information(information - prior)
        step_covariance = _inverse_information(information + np.diag(hidden) - prior)
    else:
        covariance = step_covariance = _inverse_information(-hessian)
    reach = trust * np.max([design.step for design in designs], axis=0)
    newton = np.clip(step_covariance @ gradient, -reach, reach)
    return CurvatureResult(theta + newton, covariance, hessian, gradient, step_covariance)


def _coupled(prior_hessian: np.ndarray) -> np.ndarray:
    """Which coordinates the log prior's Hessian couples to another (an off-diagonal entry
    above ``10⁻⁸`` of the geometric mean of the two diagonal entries)."""
    scale = np.sqrt(np.abs(np.diag(prior_hessian)))
    off = np.abs(prior_hessian) > 1e-8 * np.outer(scale, scale)
    np.fill_diagonal(off, False)
    return off.any(axis=1)


def _inverse_information(information: np.ndarray) -> np.ndarray:
    """``A⁻¹`` of a symmetric ``A`` with its eigenvalues raised to ``10⁻⁶`` of the largest."""
    values, vectors = np.linalg.eigh(information)
    values = np.maximum(values, max(values.max(), 1e-12) * 1e-6)
    return (vectors / values) @ vectors.T


def pooled_mode(
    points: np.ndarray,
    grads: np.ndarray,
    noise_var: np.ndarray,
    covariance: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The mode from every released gradient under the quadratic model, by generalised least
    squares; ``(θ̂, Cov θ̂)``.

    Under ``log π(x) ≈ −½ (x − θ)ᵀ Σ⁻¹ (x − θ)`` each release ``g_t = Σ⁻¹(θ − x_t) + ξ_t``
    (``ξ_t ~ N(0, diag V_t)``, ``V_t`` public) gives ``o_t = Σ⁻¹ x_t + g_t = Σ⁻¹ θ − ξ_t``: one
    noisy observation of ``Σ⁻¹ θ`` per release, coordinate by coordinate. Their inverse-variance
    weighted mean ``m`` gives ``θ̂ = Σ m`` with ``Cov θ̂ = Σ diag(φ_j / Σ_t V_tj⁻¹) Σ``: the
    releases' noise, scaled up by the overdispersion ``φ_j = max(1, χ²_j / (T − d − 1))`` of
    the residuals of ``o_tj`` about a line in ``x_t`` (a log-density that is not quadratic over
    the points, or noisier releases than stated). The curvature's own error and a bias every
    release shares (a clip's) are not in it: the refinement's Newton steps and secants keep the
    first small, its clip histogram the second. Post-processing of released values.
    """
    points = np.asarray(points, dtype=float)
    grads = np.asarray(grads, dtype=float)
    weights = 1.0 / np.maximum(np.asarray(noise_var, dtype=float), 1e-300)
    precision = np.linalg.inv(covariance)
    observed = points @ precision.T + grads
    total = weights.sum(axis=0)
    mean = np.sum(weights * observed, axis=0) / total
    theta = covariance @ mean
    variance = 1.0 / total
    count, d = points.shape
    if count > d + 1:
        design = np.column_stack([np.ones(count), points - theta])
        for j in range(d):
            w = weights[:, j]
            coef, *_ = np.linalg.lstsq(
                design * np.sqrt(w)[:, None], observed[:, j] * np.sqrt(w), rcond=None
            )
            residual = observed[:, j] - design @ coef
            chi2 = float(np.sum(w * residual**2))
            if np.isfinite(chi2):
                variance[j] *= max(1.0, chi2 / (count - d - 1))
    return theta, (covariance * variance) @ covariance


def secant_update(
    covariance: np.ndarray,
    step: np.ndarray,
    gradient_change: np.ndarray,
    change_var: np.ndarray,
    *,
    resolution: float = 4.0,
    bound_unresolved: bool = False,
    bound_margin: float = 2.0,
) -> np.ndarray | None:
    """The curvature along a long step, from the gradients at its two ends (a BFGS update).

    Two design centres ``x₀, x₁ = x₀ + s`` with mean log-posterior gradients ``ḡ₀, ḡ₁`` give
    the secant ``q = −(ḡ₁ − ḡ₀) ≈ P s`` of the precision ``P = Σ⁻¹`` along ``s``. A Newton
    iteration with a curvature off by more than a factor two along ``s`` diverges; the secant
    measures that curvature from two precise averages over a long baseline, where a design's
    own finite differences (short steps, noisy) cannot. When ``sᵀq`` is at least
    ``resolution`` of its noise sd (``√Σ_j s_j² Var(Δg_j)``, the gradients' noise ``change_var``
    public; ``√(sᵀ V s)`` when it is a covariance matrix ``V``),
    ``P ← P − P s sᵀ P / (sᵀ P s) + q qᵀ / (qᵀ s)`` (positive definite since ``qᵀ s > 0``)
    and ``Σ = P⁻¹`` is returned; else ``None`` (the secant is noise). A short
    step (the design already at the mode) is never resolved. Post-processing of released values.

    With ``bound_unresolved``, an unresolved secant still bounds the mean curvature ``c`` of
    the (clipped) gradients along ``s`` over the step from above, with ``bound_margin`` noise
    sds to spare: ``u = max(sᵀq, 0) + bound_margin · noise``. Where ``u < sᵀPs`` (the model
    claims more) the model's curvature along ``s`` is lowered to ``u``:
    ``P ← P − (1 − u/sᵀPs) P s sᵀ P / (sᵀPs)``, which gives ``sᵀP's = u``, leaves ``P``
    unchanged on the directions ``P``-orthogonal to ``s`` and stays positive definite
    (``xᵀP'x ≥ (u/sᵀPs) xᵀPx``). ``u`` is below ``c`` only when the noise is more than
    ``bound_margin`` sds low, and below ``c/2`` (a Newton step along ``s`` past twice the
    mode's distance, the point where a Newton iteration diverges) only when it is more than
    ``2 · bound_margin`` sds low (``u ≥ bound_margin · noise`` needs ``c > 2 · bound_margin ·
    noise``, and ``sᵀq < c/2 − bound_margin · noise`` a noise below
    ``−(c/2 + bound_margin · noise)``; 4 sds with the default). So, per secant, the next
    Newton step along ``s`` falls short of the mode unless the noise is more than
    ``bound_margin`` sds low, then past it by less than its distance (still converging),
    and past twice the distance only beyond ``2 · bound_margin`` sds; a ridge
    whose information a Fisher read far from the mode overstated is walked at the pace the
    released gradients allow. (Where ``u`` is below the prior's share of ``sᵀPs``, the
    caller's step uses the prior's.)
    """
    step = np.asarray(step, dtype=float)
    q = -np.asarray(gradient_change, dtype=float)
    curvature = float(step @ q)
    change_var = np.asarray(change_var, dtype=float)
    if change_var.ndim == 2:
        noise = float(np.sqrt(max(step @ change_var @ step, 0.0)))
    else:
        noise = float(np.sqrt(np.sum(step**2 * change_var)))
    resolved = np.isfinite(curvature) and curvature > resolution * noise and curvature > 0
    if not (resolved or bound_unresolved):
        return None
    precision = np.linalg.inv(covariance)
    precision = 0.5 * (precision + precision.T)
    ps = precision @ step
    modelled = float(step @ ps)
    if not resolved:
        bound = max(curvature, 0.0) + bound_margin * noise
        if not (np.isfinite(bound) and 0 < bound < modelled):
            return None
        updated = precision - (1.0 - bound / modelled) * np.outer(ps, ps) / modelled
    else:
        updated = precision - np.outer(ps, ps) / modelled + np.outer(q, q) / curvature
    updated = 0.5 * (updated + updated.T)
    try:
        result = np.linalg.inv(updated)
    except np.linalg.LinAlgError:
        return None
    result = 0.5 * (result + result.T)
    if not np.all(np.isfinite(result)) or np.any(np.linalg.eigvalsh(result) <= 0):
        return None
    return result
