"""DP Barker: one iteration of theory §4.4 (Heikkilä, Jälkö, Dikmen & Honkela 2019; thesis Alg. 3).

From ``θ``:

1. propose ``θ' ~ N(θ, diag(s²))`` (symmetric: no proposal term);
2. the mechanism draws a secret batch of ``b`` rows without replacement, clips each
   ``r_j = ℓ_j(θ') − ℓ_j(θ)`` to ``|r_j| ≤ √b / n0`` and forms
   ``λ = (n0/b) Σ_j r_j + log p(θ') − log p(θ)``, with ``σ_b² = n0² Var_B(r) / b``;
3. it accepts iff ``λ + s + V_corr > 0`` with ``s ~ N(0, C − σ_b²)`` and ``V_corr`` the
   correction with ``N(0, C) + V_corr ≈ Logistic(0, 1)`` (Barker's test, Seita et al. 2017).

Only step 2 touches data, through the bound mechanism ``mechanisms.barker_test``, and releases
only the accept decision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from pymc_dp.releases import BarkerDecision

__all__ = [
    "BarkerInfo",
    "BarkerMechanisms",
    "BarkerParams",
    "BarkerState",
    "barker_kernel",
]


class BarkerState(NamedTuple):
    theta: np.ndarray
    logprior: float


class BarkerParams(NamedTuple):
    proposal_scale: np.ndarray  # s, one per coordinate


class BarkerMechanisms(NamedTuple):
    """What the kernel may evaluate: the public log-prior and the bound Barker test."""

    logprior: Callable[[np.ndarray], float]
    barker_test: Callable[[np.ndarray, np.ndarray, float], BarkerDecision]


class BarkerInfo(NamedTuple):
    accepted: bool
    jump: float
    batch_variance: float  # NOT private
    llr_clipped: int  # NOT private


def barker_kernel(
    state: BarkerState,
    params: BarkerParams,
    rng: np.random.Generator,
    mechanisms: BarkerMechanisms,
) -> tuple[BarkerState, BarkerInfo]:
    """One DP Barker iteration (theory §4.4). ``rng`` draws the proposal (public)."""
    scale = params.proposal_scale
    theta_new = state.theta + scale * rng.standard_normal(state.theta.shape[0])
    logprior_new = mechanisms.logprior(theta_new)
    jump = float(np.linalg.norm(theta_new - state.theta))
    if not np.isfinite(logprior_new):  # outside the prior's support: reject, read nothing
        return state, BarkerInfo(False, jump, 0.0, 0)
    decision = mechanisms.barker_test(state.theta, theta_new, logprior_new - state.logprior)
    info = BarkerInfo(decision.accepted, jump, decision.batch_variance, decision.n_clipped)
    if decision.accepted:
        return BarkerState(theta_new, logprior_new), info
    return state, info
