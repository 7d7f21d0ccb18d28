"""Group-indexed variables (``a[g_i]``): the public zeros of the rows' Fisher information and
what they take out of its release's noise, the centring's whitening, and the centred ratio's
bound per group (theory §4.1 and §7, "Group-indexed variables")."""

import logging

import numpy as np
import pymc as pm
import pytest

from pymc_dp.kernels.fisher_noise import FisherNoise
from pymc_dp.kernels.initialization import covariance_from_fisher, unresolved_directions
from pymc_dp.mechanisms import CentredLLRRelease, PrivateChannel
from pymc_dp.noise import NoiseSource
from pymc_dp.oracle import RowLikelihood
from pymc_dp.releases import Centre, RemainderScale
from pymc_dp.step_methods.initialization import _centring_whitening, _whitening_of


@pytest.fixture(scope="module")
def grouped():
    """Intercepts and slopes read at the row's group, a third variable at another index, a
    coefficient every row reads, and hyperparameters only the prior reads."""
    rng = np.random.default_rng(0)
    n, groups = 400, 5
    g = rng.integers(0, groups, n)
    h = rng.integers(0, 3, n)
    x = rng.normal(size=n)
    y = rng.normal(size=n)
    with pm.Model() as model:
        mu = pm.Normal("mu")
        tau = pm.HalfNormal("tau")
        a = pm.Normal("a", mu, tau, shape=groups)
        b = pm.Normal("b", 0, 1, shape=groups)
        c = pm.Normal("c", 0, 1, shape=3)
        beta = pm.Normal("beta")
        sigma = pm.HalfNormal("sigma")
        pm.Normal("y", a[g] + b[g] * x + c[h] + beta * x, sigma, observed=y)
    return RowLikelihood(model), groups


def test_the_fisher_pattern_holds_every_rows_outer_product(grouped):
    oracle, groups = grouped
    pattern = oracle.fisher_pattern
    d = oracle.space.ndim
    rng = np.random.default_rng(1)
    for _ in range(3):
        theta = rng.normal(size=d)
        exact = oracle.clipped_fisher(theta, 1e12, np.eye(d))  # no clip: Σ_i g_i g_iᵀ
        assert np.all(exact[~pattern] == 0.0)
        assert np.all(np.abs(exact[pattern]) > 0)  # every allowed entry is reached here
    slices = {v.name: sl for v, sl, _ in oracle.space.slices}
    a, b, c = (np.arange(d)[slices[k]] for k in ("a", "b", "c"))
    beta = slices["beta"].start
    assert not pattern[slices["mu"]].any() and not pattern[slices["tau_log__"]].any()
    assert pattern[a[1], b[1]] and not pattern[a[1], b[2]] and not pattern[a[1], a[2]]
    assert pattern[np.ix_(a, c)].all() and pattern[np.ix_(b, c)].all()
    assert not pattern[c[0], c[1]] and pattern[beta].sum() == 2 * groups + 3 + 2
    assert oracle.gathered_blocks == [
        (slices[k].start, n, 1) for k, n in (("a", 5), ("b", 5), ("c", 3))
    ]


def test_the_preconditioned_clip_weighs_each_groups_entry_with_its_own_weight(grouped):
    # the clipped gradient sum's row norms ‖D g_i‖ read the weight of the group each gathered
    # entry sits at (a[g_i], b[g_i], c[h_i]): against the per-row gradients in NumPy
    oracle, _ = grouped
    d = oracle.space.ndim
    rng = np.random.default_rng(3)
    theta = rng.normal(0.0, 0.5, d)
    grads = oracle.grad_rows(theta)
    norms = np.linalg.norm(grads, axis=1)
    bound = float(np.quantile(norms, 0.5))  # half the rows clipped
    for _ in range(3):
        precond = rng.uniform(0.2, 5.0, d)  # every coordinate its own weight
        weighted = np.linalg.norm(grads * precond, axis=1)
        expected = (grads * np.minimum(1.0, bound / weighted)[:, None]).sum(axis=0)
        value = oracle.clipped_grad_sum(theta, bound, precond=precond).value
        np.testing.assert_allclose(value, expected, rtol=1e-10, atol=1e-10)
        # negative control: the same sum with the weights of other groups differs
        swapped = precond.copy()
        for v, sl, _ in oracle.space.slices:
            if v.name in ("a", "b", "c"):
                swapped[sl] = precond[sl][::-1]
        other = oracle.clipped_grad_sum(theta, bound, precond=swapped).value
        assert np.max(np.abs(other - expected)) > 1e-3 * np.max(np.abs(expected))


def test_without_group_indexed_variables_the_pattern_is_the_likelihoods_block():
    rng = np.random.default_rng(2)
    x = rng.normal(size=200)
    with pm.Model() as model:
        mu = pm.Normal("mu")
        tau = pm.HalfNormal("tau")
        beta = pm.Normal("beta", mu, tau, shape=2)
        pm.Normal("y", beta[0] + beta[1] * x, 1.0, observed=rng.normal(size=200))
    oracle = RowLikelihood(model)
    lik = oracle.likelihood_coordinates
    np.testing.assert_array_equal(oracle.fisher_pattern, np.outer(lik, lik))
    assert oracle.gathered_blocks == []


def _pattern_and_whitening(rng, d=10):
    pattern = np.zeros((d, d), dtype=bool)
    pattern[2:, 2:] = np.eye(d - 2, dtype=bool)  # a diagonal block (group intercepts)...
    pattern[2:, -1] = pattern[-1, 2:] = True  # ... and a coordinate every row reads
    whitening = rng.normal(size=(d, d)) + 3 * np.eye(d)
    return pattern, whitening


def test_the_fit_keeps_the_signal_and_only_the_noise_in_its_span():
    rng = np.random.default_rng(3)
    d, sigma = 10, 2.0
    pattern, whitening = _pattern_and_whitening(rng, d)
    noise = FisherNoise(sigma, whitening, pattern)
    assert noise.structured
    signal = np.where(pattern, rng.normal(size=(d, d)), 0.0)
    signal = whitening @ (signal + signal.T) @ whitening.T
    np.testing.assert_allclose(noise.project(signal), signal, atol=1e-9)
    # the noise left is its orthogonal projection: E‖Πν‖² = σ² · (entries F can have)
    p = int(np.triu(pattern).sum())
    upper = np.triu_indices(d)
    left = []
    for _ in range(400):
        draw = np.zeros((d, d))
        draw[upper] = rng.normal(size=upper[0].size) * sigma
        draw = draw + np.triu(draw, 1).T
        left.append(np.sum(noise.project(draw)[upper] ** 2))
    assert np.mean(left) == pytest.approx(sigma**2 * p, rel=0.1)
    assert p < 0.4 * upper[0].size


def test_without_public_zeros_the_dense_rule_holds():
    rng = np.random.default_rng(4)
    d, sigma = 6, 1.5
    whitening = rng.normal(size=(d, d)) + 3 * np.eye(d)
    for pattern in (None, np.ones((d, d), dtype=bool)):
        noise = FisherNoise(sigma, whitening, pattern)
        assert not noise.structured
        released = rng.normal(size=(d, d))
        np.testing.assert_allclose(noise.project(released), 0.5 * (released + released.T))
        values = np.linalg.eigvalsh(noise.project(released))
        np.testing.assert_allclose(noise.radii(values), 2 * sigma * np.sqrt(d))


def test_a_fit_too_large_to_make_keeps_the_dense_rule_and_says_so(monkeypatch, caplog):
    from pymc_dp.kernels import fisher_noise

    monkeypatch.setattr(fisher_noise, "_MAX_PROJECTION_WORK", 10.0)
    monkeypatch.setattr(fisher_noise, "_LOGGED", set())
    d, sigma = 5, 1.0
    with caplog.at_level(logging.INFO, logger="pymc"):
        noise = FisherNoise(sigma, np.eye(d), np.eye(d, dtype=bool))
        FisherNoise(sigma, np.eye(d), np.eye(d, dtype=bool))  # logged once
    assert not noise.structured
    np.testing.assert_allclose(noise.radii(np.zeros(d)), 2 * sigma * np.sqrt(d))
    messages = [r.getMessage() for r in caplog.records if "dense noise rule" in r.getMessage()]
    assert len(messages) == 1 and "10 public zeros" in messages[0]


def _hierarchy(rng, groups=60):
    """The rows' information of a varying-intercept regression, unequal groups, in a whitening
    from a rough covariance; coordinates: μ_a, log σ_a (prior only), the intercepts, β, log σ."""
    d = groups + 4
    a = np.arange(2, 2 + groups)
    rows = rng.dirichlet(np.full(groups, 2.0)) * 2e5
    info = np.zeros((d, d))
    info[a, a] = rows
    info[a, -2] = info[-2, a] = rows / 2
    info[-2, -2] = rows.sum() / 2
    info[-1, -1] = 2 * rows.sum()
    prior = np.zeros((d, d))
    prior[a, a] = 1 / 0.35**2
    prior[a, 0] = prior[0, a] = -1 / 0.35**2
    prior[0, 0] = groups / 0.35**2 + 0.01
    prior[1, 1] = 2 * groups
    prior[-2, -2] = prior[-1, -1] = 0.01
    pattern = np.zeros((d, d), dtype=bool)
    pattern[2:, 2:] = np.outer(np.r_[np.zeros(groups), 1, 1], np.ones(groups + 2)) > 0
    pattern |= pattern.T
    pattern[a, a] = True
    truth = np.linalg.inv(info + prior)
    # the centring's whitening, from an estimate whose sds are off by up to about 2 times
    rough = truth + np.diag(np.diag(truth) * np.exp(rng.normal(0, 0.5, d)))
    whitening = _centring_whitening(rough, [(2, groups, 1)])
    return info, prior, pattern, whitening, truth


def test_public_zeros_resolve_each_groups_information_where_the_dense_rule_cannot():
    """Noise at a tenth of the information of the least informed tenth of the directions (as
    in the final reads on a radon-style model at n = 10⁶). The dense radius ``2σ√d`` (16σ
    here) leaves 19–20 of 64 directions unresolved, and ``Σ̂`` (a fallback 25 times too wide
    there, kept down to three noise sds under the release's estimate) gets 30–48 % of its sds
    within 20 % of the truth (3–5 % with Weyl's radius as that bottom). Fitted to the pattern,
    with the spectral norm of the projected noise as the radius: 8–10 unresolved, 92–95 % of
    the sds within 20 % (72–88 % with Weyl's bottom)."""
    rng = np.random.default_rng(5)
    info, prior, pattern, whitening, truth = _hierarchy(rng)
    d = info.shape[0]
    fisher = whitening @ info @ whitening.T
    values = np.linalg.eigvalsh(fisher)
    sigma = 0.1 * np.quantile(values[values > 1e-9 * values[-1]], 0.1)
    upper = np.triu_indices(d)
    wrong = truth * 25.0  # a fallback far off
    for _ in range(3):
        draw = np.zeros((d, d))
        draw[upper] = rng.normal(size=upper[0].size) * sigma
        released = fisher + draw + np.triu(draw, 1).T
        dense = unresolved_directions(released, sigma)
        fitted = unresolved_directions(released, sigma, whitening, pattern)
        assert dense > d / 4 and fitted < 0.6 * dense
        close = {}
        for name, rule in (("fitted", pattern), ("dense", None)):
            estimate = covariance_from_fisher(
                released, whitening, sigma, -prior, fallback=wrong, pattern=rule
            )
            ratio = np.sqrt(np.diag(estimate) / np.diag(truth))
            close[name] = np.mean((ratio > 0.8) & (ratio < 1.35))
        assert close["fitted"] > 0.85 and close["fitted"] > close["dense"] + 0.3, close


def test_the_centring_whitening_gives_every_groups_rows_one_scale_and_keeps_correlations():
    rng = np.random.default_rng(6)
    groups, d = 8, 11
    gathered = [(2, groups, 1)]
    sds = np.exp(rng.normal(0, 1.0, d))
    correlation = np.eye(d)
    correlation[2:10, 10] = correlation[10, 2:10] = -0.3  # groups tied to a shared coordinate
    correlation[0, 1] = correlation[1, 0] = 0.3
    covariance = correlation * np.outer(sds, sds)
    whitening = _centring_whitening(covariance, gathered)
    # the same correlations, each group's sd the groups' common (geometric mean) sd
    implied = whitening.T @ whitening  # P = Wᵀ/c with W Wᵀ = Σ̃: Σ̃ ∝ Pᵀ P
    implied_sds = np.sqrt(np.diag(implied))
    np.testing.assert_allclose(implied / np.outer(implied_sds, implied_sds), correlation, atol=1e-9)
    np.testing.assert_allclose(implied_sds[2:10], implied_sds[2], rtol=1e-9)
    ratio = implied_sds / sds
    np.testing.assert_allclose(ratio[[0, 1, 10]], ratio[0], rtol=1e-9)
    assert implied_sds[2] / ratio[0] == pytest.approx(np.exp(np.mean(np.log(sds[2:10]))))
    # so a row's whitened norm does not depend on its group (a unit score on a_j)
    norms = [np.linalg.norm(whitening @ np.eye(d)[2 + j]) for j in range(groups)]
    np.testing.assert_allclose(norms, norms[0], rtol=1e-9)
    # the full whitening gives the widest group's rows the longest norms (negative control)
    full = _whitening_of(np.linalg.cholesky(covariance))
    full_norms = [np.linalg.norm(full @ np.eye(d)[2 + j]) for j in range(groups)]
    assert np.argmax(full_norms) == np.argmax(sds[2:10]) and np.ptp(full_norms) > 1.0
    np.testing.assert_allclose(_centring_whitening(covariance, []), full)


def test_each_groups_bound_holds_every_rows_remainder_and_one_coordinate_would_not():
    """``y_i ~ N(a_g + b x_i, 1)``: row ``i``'s Hessian is ``−v vᵀ``, ``v = e_{a_g} + x_i e_b``;
    in the metric of ``Σ̂``'s block on ``(a_g, b)`` its norm is ``vᵀ Σ̂ v``. With ``h`` the
    largest over rows, ``|r_i| ≤ h max_j ‖δ_j‖ (‖u_j‖ + ‖u'_j‖)/2`` for every row and pair, and
    with equality along ``Σ̂ v`` of the row with the largest ``h``; measuring a group's own
    intercept alone (without the shared ``b``) does not bound them (negative control), and
    the likelihood-wide scale is several times larger."""
    rng = np.random.default_rng(9)
    groups, n = 12, 600
    g = rng.integers(0, groups, n)
    x = rng.normal(size=n)
    with pm.Model() as model:
        a = pm.Normal("a", 0, 1, shape=groups)
        b = pm.Normal("b", 0, 1)
        pm.Normal("y", a[g] + b * x, 1.0, observed=rng.normal(size=n))
    oracle = RowLikelihood(model)
    d = oracle.space.ndim
    blocks = oracle.row_blocks
    np.testing.assert_array_equal(blocks, [[j, groups] for j in range(groups)])
    metric = np.tril(rng.normal(0.0, 0.3, (d, d)), -1) + np.diag(rng.uniform(0.5, 1.5, d))
    covariance = metric @ metric.T
    rows = np.zeros((n, d))
    rows[np.arange(n), g] = 1.0
    rows[:, groups] = x
    h = float(np.max(np.einsum("ij,jk,ik->i", rows, covariance, rows)))
    channel = PrivateChannel(oracle, NoiseSource(13))
    centre = Centre(rng.normal(0, 0.3, d), 1e9, np.eye(d))  # no row clipped at the centre
    release = CentredLLRRelease(
        channel,
        centre=centre,
        centre_gradient=np.zeros(d),
        metric=metric,
        remainder_clip=h,
        noise_multiplier=1.0,
    )
    wide = RemainderScale(metric, centre.theta, oracle.likelihood_coordinates)
    alone = RemainderScale(metric, centre.theta, oracle.likelihood_coordinates, blocks[:, :1])
    # random pairs, and one along Σ̂ v of the row with the largest Hessian (where the
    # Cauchy–Schwarz steps of the bound are equalities)
    top = int(np.argmax(np.einsum("ij,jk,ik->i", rows, covariance, rows)))
    block = blocks[g[top]]
    along = np.zeros(d)
    along[block] = covariance[np.ix_(block, block)] @ rows[top, block]
    pairs = [centre.theta + rng.normal(0.0, 0.5, (2, d)) for _ in range(40)]
    pairs.append(centre.theta + np.outer([0.1, 0.2], along))
    worst, worst_alone, ratio = 0.0, 0.0, []
    for theta, theta_new in pairs:
        remainders = np.abs(oracle.centred_ratio_rows(theta, theta_new, centre))
        worst = max(worst, float(remainders.max()) / release.bound(theta, theta_new))
        worst_alone = max(worst_alone, float(remainders.max()) / (h * alone(theta, theta_new)))
        ratio.append(wide(theta, theta_new) / release.scale(theta, theta_new))
    assert 0.5 < worst <= 1.0 + 1e-9
    assert worst_alone > 1.0
    assert np.median(ratio) > 2.0
