"""pymc_dp quickstart (foundation stage): the private-data oracle and the privacy budget.

Builds an ordinary PyMC logistic regression on 100 000 simulated rows, then shows the two pieces
every DP step method stands on:

* ``RowLikelihood``, the only code that reads the observed data: per-row log-likelihoods and the
  clipped sums that DP mechanisms noise (SPEC §2), next to PyMC's own log-density;
* ``PrivacyBudget``, which says how many noisy releases an (ε, δ) budget buys and refuses to
  overspend it.

The DP step methods (DPPenalty, DPHMC, DPBarker) build on these; when they land this script
becomes the end-to-end quickstart. Run: ``python examples/quickstart.py``.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pymc as pm

import pymc_dp

warnings.filterwarnings("ignore", category=FutureWarning)


def main() -> None:
    rng = np.random.default_rng(42)
    n, d = 100_000, 5
    X = rng.normal(size=(n, d))
    true_beta = np.array([1.0, -0.5, 0.25, 0.0, 2.0])
    y = rng.binomial(1, 1 / (1 + np.exp(-(X @ true_beta - 0.3))))

    with pm.Model() as model:
        X_data = pm.Data("X", X)
        alpha = pm.Normal("alpha", 0, 2)
        beta = pm.Normal("beta", 0, 2, shape=d)
        pm.Bernoulli("y", logit_p=alpha + X_data @ beta, observed=y)

    start = time.perf_counter()
    oracle = pymc_dp.RowLikelihood(model)
    print(f"built {oracle!r} in {time.perf_counter() - start:.1f} s")

    theta = oracle.ravel({"alpha": -0.3, "beta": true_beta})
    proposal = theta + rng.normal(0, 0.01, oracle.ndim)
    ell = oracle.loglik_rows(theta)
    print(f"per-row log-likelihood: {ell.shape[0]} rows, sum {ell.sum():.2f}")
    print(f"PyMC model.logp at the same point: {model.compile_logp()(oracle.unravel(theta)):.2f}")
    print(f"  (= sum of rows + log-prior {oracle.logprior(theta):.2f})")

    grad_clip = 2.0
    start = time.perf_counter()
    grad = oracle.clipped_grad_sum(theta, grad_clip)
    elapsed = (time.perf_counter() - start) * 1e3
    print(f"clipped gradient sum (b_g = {grad_clip}) in {elapsed:.1f} ms:")
    print(f"  {np.round(grad.value, 1)}")
    llr_clip = 1.0 * np.linalg.norm(proposal - theta)  # B = b_l * |theta' - theta|
    ratio = oracle.clipped_llr_sum(theta, proposal, llr_clip)
    print(f"clipped log-likelihood-ratio sum (B = {llr_clip:.4f}): {ratio.value:.3f}")
    print(
        "(clip counts, here "
        f"{grad.n_clipped} and {ratio.n_clipped} rows, are NOT private and are never released)"
    )

    budget = pymc_dp.PrivacyBudget(epsilon=1.0, delta=1e-6)
    noise_multiplier = 0.1 * np.sqrt(n)  # the seeds' form z = tau * sqrt(n), with tau = 0.1
    cost = pymc_dp.GaussianCost.from_noise_multiplier(noise_multiplier)
    print(f"\n{budget}: capacity mu = {budget.capacity_mu:.4f}")
    print(f"a DP penalty iteration with z = {noise_multiplier:.2f} costs mu = {cost.mu:.5f}")
    per_chain = budget.iterations_per_chain(cost, 4)
    print(f"-> {budget.iterations(cost)} iterations in total, {per_chain} per chain for 4 chains")
    budget.reserve(cost, per_chain, chain=0)
    print(f"chain 0 reserved {per_chain} iterations; spent: epsilon = {budget.epsilon_spent():.3f}")
    try:
        budget.reserve(cost, budget.iterations(cost) + 1)
    except pymc_dp.BudgetExceededError as err:
        print(f"over-reservation refused before any data is read:\n  {err}")


if __name__ == "__main__":
    main()
