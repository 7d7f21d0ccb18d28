"""Tuning from released values only: step-size dual averaging and a windowed diagonal mass.

Both consume what a DP step has already released (acceptance flags, the chain's own draws), so
they are post-processing and cost no privacy; the tuning iterations themselves are spent like any
other.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["CorrelationChoice", "DualAverage", "MassWindows", "ScaleAdaptation"]


class DualAverage:
    """Nesterov dual averaging of ``log η`` toward a target acceptance (Hoffman & Gelman 2014 §3.2).

    ``H̄_t = (1 − 1/(t+t₀)) H̄_{t−1} + (δ − a_t)/(t+t₀)``, ``log η_t = μ − √t H̄_t / γ``,
    ``log η̄_t = t^{−κ} log η_t + (1 − t^{−κ}) log η̄_{t−1}``, with ``μ = log(10 η₀)``. Here
    ``a_t ∈ {0, 1}`` is the acceptance flag: a DP chain does not release the acceptance
    probability, which depends on the data without noise.
    """

    def __init__(
        self,
        initial_step: float,
        target: float,
        gamma: float = 0.05,
        t0: float = 10.0,
        kappa: float = 0.75,
    ) -> None:
        self.target, self.gamma, self.t0, self.kappa = target, gamma, t0, kappa
        self.restart(initial_step)

    def restart(self, initial_step: float, bias: float = 10.0) -> None:
        """Start over from ``initial_step``, shrinking toward ``log(bias · initial_step)``."""
        self._mu = np.log(bias * initial_step)
        self._log_step = np.log(initial_step)
        self._log_bar = np.log(initial_step)
        self._hbar = 0.0
        self._count = 0

    def update(self, accepted: float) -> None:
        self._count += 1
        t = self._count
        w = 1.0 / (t + self.t0)
        self._hbar = (1.0 - w) * self._hbar + w * (self.target - float(accepted))
        self._log_step = self._mu - np.sqrt(t) * self._hbar / self.gamma
        m = t**-self.kappa
        self._log_bar = m * self._log_step + (1.0 - m) * self._log_bar

    @property
    def current(self) -> float:
        """Step size to use while tuning."""
        return float(np.exp(self._log_step))

    @property
    def final(self) -> float:
        """Step size to keep after tuning (the averaged iterate)."""
        return float(np.exp(self._log_bar))


class MassWindows:
    """Diagonal inverse mass from the variance of a chain's tuning draws, in doubling windows.

    After ``initial`` iterations of step-size-only tuning, draws are collected in windows of
    ``first, 2·first, 4·first, …`` iterations; at the end of each window the inverse mass becomes
    the regularised variance ``(m/(m+5)) s² + 10⁻³ · 5/(m+5)`` of its ``m`` draws (as Stan), and the
    caller restarts step-size adaptation. With ``stop_at`` (the tuning length minus a final
    step-size-only phase, when the tuning length is known) the last window is stretched or cut to
    close exactly there, as in Stan; without it a window cut short by the end of tuning is dropped.
    """

    def __init__(
        self, ndim: int, initial: int = 75, first: int = 25, stop_at: int | None = None
    ) -> None:
        self.ndim, self.initial, self.first, self.stop_at = ndim, initial, first, stop_at
        self._draws: list[np.ndarray] = []
        self._seen = 0
        self._window = first
        if stop_at is not None and initial + first > stop_at:
            self._window = 0  # too short to estimate a mass: step size only

    def update(self, theta: np.ndarray) -> np.ndarray | None:
        """Record a tuning draw; return the new inverse mass when a window closes."""
        self._seen += 1
        if self._seen <= self.initial or self._window < 1:
            return None
        self._draws.append(np.array(theta, dtype=float))
        if len(self._draws) < self._window:
            return None
        draws = np.asarray(self._draws)
        m = draws.shape[0]
        variance = draws.var(axis=0, ddof=1)
        self._draws = []
        self._window *= 2
        if self.stop_at is not None:
            left = self.stop_at - self._seen
            # the next window closes at stop_at if a window twice its size would not fit after it
            self._window = left if left < 3 * self._window else self._window
        inv_mass = (m / (m + 5.0)) * variance + 1e-3 * (5.0 / (m + 5.0))
        return inv_mass if np.all(np.isfinite(inv_mass) & (inv_mass > 0)) else None


class ScaleAdaptation:
    """Random-walk scale toward a target acceptance rate, from acceptance flags.

    A Robbins–Monro recursion on the log scale, ``log s ← log s + c (a_t − target) t^(−0.6)``
    with ``c = 3``: a large early gain, so that a chain started far from the posterior grows or
    shrinks its steps within tens of iterations (a budget rarely allows more than a few
    hundred), vanishing later so that the scale settles.
    """

    gain = 3.0
    decay = 0.6

    def __init__(self, target: float) -> None:
        self.target = target
        self.log_factor = 0.0
        self._count = 0

    def update(self, accepted: bool) -> None:
        self._count += 1
        self.log_factor += (float(accepted) - self.target) * self.gain * self._count**-self.decay

    @property
    def factor(self) -> float:
        """Multiplier of the user's proposal scale."""
        return math.exp(self.log_factor)


class CorrelationChoice:
    """The correlation ``ρ`` of DPPenalty's independence proposal, chosen from acceptance flags.

    While tuning, each independence proposal draws ``ρ`` uniformly from ``grid`` (``0``: the
    independent t; above: the Crank–Nicolson move, :class:`~pymc_dp.kernels.penalty.
    IndependenceProposal`); each choice is one kernel of a mixture picked without looking at
    the state, so every tuning iteration keeps the posterior invariant. At the end of tuning
    the chain keeps the ``ρ`` with the largest ``â(ρ)(1 − ρ)``, ``â`` its share of accepted
    proposals: a move accepted with probability ``a`` that keeps a share ``ρ`` of the
    distance from the centre gives a lag-one autocorrelation of about ``1 − a(1 − ρ)``, so
    effective draws per iteration of about ``a(1 − ρ)/(2 − a(1 − ρ))``, increasing in
    ``a(1 − ρ)``. Few parameters: the t's acceptance is high and ``ρ = 0`` wins; many: the
    independent draws are rarely accepted and a shorter move wins. Acceptance flags are
    released values: post-processing, no privacy cost. Ties go to the smaller ``ρ``; a ``ρ``
    tried fewer than ``min_trials`` times is not chosen (``0`` is the default).
    """

    grid: tuple[float, ...] = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9)

    def __init__(self, min_trials: int = 1) -> None:
        self.min_trials = int(min_trials)
        self.tried = np.zeros(len(self.grid), dtype=int)
        self.accepted = np.zeros(len(self.grid), dtype=int)

    def draw(self, rng: np.random.Generator) -> int:
        """Index of the ``ρ`` a tuning iteration's independence proposal uses."""
        return int(rng.integers(len(self.grid)))

    def update(self, index: int, accepted: bool) -> None:
        self.tried[index] += 1
        self.accepted[index] += bool(accepted)

    def choose(self) -> float:
        """``argmax â(ρ)(1 − ρ)`` over the ``ρ`` tried at least ``min_trials`` times (``0``
        when none was)."""
        tried = self.tried >= max(self.min_trials, 1)
        if not tried.any():
            return 0.0
        rho = np.asarray(self.grid)
        value = np.where(tried, self.accepted / np.maximum(self.tried, 1) * (1.0 - rho), -1.0)
        return float(rho[int(np.argmax(value))])  # argmax: the first of equals, the smaller ρ
