"""Parameters only the prior reads (a centred hierarchy's ``μ``, ``τ``): public zeros.

The likelihood's gradient is 0 along them for every dataset, and a row's centred remainder does
not depend on them (theory §4.1). So the gradient releases return 0 there (the centre's, with
its other coordinates conditioned on that known noise), and the centred ratio's bound measures
the likelihood's coordinates only: a move of the hyperparameters alone reads nothing.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pymc as pm
import pytest

from pymc_dp import RowLikelihood
from pymc_dp.mechanisms import (
    CentredLLRRelease,
    CentreGradientRelease,
    GradientRelease,
    PrivateChannel,
    conditioned_on_zeros,
)
from pymc_dp.noise import NoiseSource
from pymc_dp.prediction import centred_bound_rms
from pymc_dp.releases import Centre

GROUPS = 3


@cache
def hierarchy() -> RowLikelihood:
    rng = np.random.default_rng(4)
    group = rng.integers(0, GROUPS, 300)
    y = rng.normal(1.0 + 0.5 * group, 1.0)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        tau = pm.HalfNormal("tau", 1.0)
        a = pm.Normal("a", mu, tau, shape=GROUPS)
        pm.Normal("y", a[group], 1.0, observed=y)
    return RowLikelihood(model)


def _slices(oracle: RowLikelihood) -> dict[str, slice]:
    return {v.name: sl for v, sl, _ in oracle.space.slices}


def _lower(rng: np.random.Generator, d: int) -> np.ndarray:
    """A dense lower-triangular whitening: it mixes every coordinate into every other."""
    return np.tril(rng.normal(0.0, 0.6, (d, d)), -1) + np.diag(rng.uniform(0.5, 2.0, d))


def test_the_likelihood_coordinates_are_the_ones_its_graph_reads():
    oracle = hierarchy()
    expected = np.zeros(oracle.space.ndim, dtype=bool)
    expected[_slices(oracle)["a"]] = True
    np.testing.assert_array_equal(oracle.likelihood_coordinates, expected)
    np.testing.assert_array_equal(PrivateChannel(oracle).likelihood_coordinates, expected)
    with pm.Model() as flat:  # every parameter in the likelihood
        m = pm.Normal("m", 0.0, 1.0)
        pm.Normal("y", m, pm.HalfNormal("s", 1.0), observed=np.arange(5.0))
    assert RowLikelihood(flat).likelihood_coordinates.all()


def test_conditioning_on_known_zeros_gives_the_conditional_gaussian():
    rng = np.random.default_rng(0)
    root = _lower(rng, 4)
    covariance = root @ root.T
    kept = np.array([True, False, True, False])
    exact = np.array([1.5, 0.0, -2.0, 0.0])
    noise = rng.standard_normal((20_000, 4)) @ root.T
    conditioned = np.array([conditioned_on_zeros(exact + xi, covariance, kept)[0] for xi in noise])
    _, conditional = conditioned_on_zeros(np.zeros(4), covariance, kept)
    assert np.all(conditioned[:, ~kept] == 0.0)
    assert np.all(conditional[~kept] == 0.0) and np.all(conditional[:, ~kept] == 0.0)
    np.testing.assert_allclose(conditioned.mean(axis=0), exact, atol=0.05)
    np.testing.assert_allclose(np.cov(conditioned.T), conditional, atol=0.06)
    # the negative control: the release's own noise along the kept coordinates is larger
    plain = covariance[np.ix_(kept, kept)]
    assert np.trace(conditional) < 0.8 * np.trace(plain)


def test_the_centre_gradient_is_zero_off_the_likelihood_and_conditioned_on_it():
    oracle = hierarchy()
    d = oracle.space.ndim
    kept = oracle.likelihood_coordinates
    channel = PrivateChannel(oracle, NoiseSource(8))
    centre = Centre(np.linspace(-0.5, 0.5, d), 30.0, _lower(np.random.default_rng(1), d))
    release = CentreGradientRelease(channel, centre=centre, noise_multiplier=0.5)
    channel.counter.allow(release.event, 3000)
    exact = oracle.centre_rows(centre).sum(axis=0)
    assert np.all(exact[~kept] == 0.0)
    draws = np.array([release().value for _ in range(3000)])
    assert np.all(draws[:, ~kept] == 0.0)
    covariance = release.noise_covariance
    assert np.all(covariance[~kept] == 0.0)
    np.testing.assert_allclose(np.cov(draws[:, kept].T), covariance[np.ix_(kept, kept)], rtol=0.15)
    sd = np.sqrt(np.diag(covariance)[kept])
    assert np.all(np.abs(draws[:, kept].mean(axis=0) - exact[kept]) < 4 * sd / np.sqrt(3000))
    inverse = np.linalg.inv(centre.whitening)  # the release's noise before conditioning
    unconditioned = release.noise_std**2 * inverse @ inverse.T
    assert np.trace(covariance) < np.trace(unconditioned[np.ix_(kept, kept)])


def test_a_gradient_release_is_zero_where_the_likelihood_reads_nothing():
    oracle = hierarchy()
    kept = oracle.likelihood_coordinates
    channel = PrivateChannel(oracle, NoiseSource(9))
    release = GradientRelease(channel, grad_clip=5.0, noise_multiplier=1.0)
    channel.counter.allow(release.event, 50)
    theta = np.full(oracle.space.ndim, 0.2)
    values = np.array([release(theta).value for _ in range(50)])
    assert np.all(values[:, ~kept] == 0.0)
    assert np.all(np.std(values[:, kept], axis=0) > 0.5 * release.noise_multiplier * 2 * 5.0)


def _centred(channel: PrivateChannel, metric: np.ndarray) -> CentredLLRRelease:
    d = channel.space.ndim
    return CentredLLRRelease(
        channel,
        centre=Centre(np.zeros(d), 30.0, np.eye(d)),
        centre_gradient=np.linspace(1.0, 2.0, d),
        metric=metric,
        remainder_clip=0.4,
        noise_multiplier=2.0,
    )


def test_the_centred_bound_measures_the_likelihood_coordinates_in_their_marginal_metric():
    oracle = hierarchy()
    d, kept = oracle.space.ndim, oracle.likelihood_coordinates
    channel = PrivateChannel(oracle, NoiseSource(10))
    metric = _lower(np.random.default_rng(2), d)
    release = _centred(channel, metric)
    rng = np.random.default_rng(3)
    covariance = metric @ metric.T
    marginal = np.linalg.cholesky(covariance[np.ix_(kept, kept)])
    blocks = oracle.row_blocks  # each group's rows: its effect and the shared coefficients
    assert blocks is not None and blocks.shape[0] > 1

    def scale(factor, x, x_new):
        u, u_new = np.linalg.solve(factor, x), np.linalg.solve(factor, x_new)
        return 0.2 * np.linalg.norm(u_new - u) * (np.linalg.norm(u) + np.linalg.norm(u_new))

    for _ in range(20):
        theta, theta_new = rng.normal(size=d), rng.normal(size=d)
        per_group = max(
            scale(np.linalg.cholesky(covariance[np.ix_(b, b)]), theta[b], theta_new[b])
            for b in blocks
        )
        assert release.bound(theta, theta_new) == pytest.approx(per_group, rel=1e-10)
        # never above the bound on all the likelihood's coordinates, nor the full metric's
        assert per_group <= scale(marginal, theta[kept], theta_new[kept]) * (1 + 1e-12)
        w, w_new = np.linalg.solve(metric, theta), np.linalg.solve(metric, theta_new)
        full = 0.2 * np.linalg.norm(w_new - w) * (np.linalg.norm(w) + np.linalg.norm(w_new))
        assert release.bound(theta, theta_new) <= full * (1 + 1e-12)


def test_a_move_of_the_hyperparameters_alone_reads_nothing_and_is_the_linear_term():
    oracle = hierarchy()
    d, kept = oracle.space.ndim, oracle.likelihood_coordinates
    channel = PrivateChannel(oracle, NoiseSource(11))
    release = _centred(channel, _lower(np.random.default_rng(5), d))
    channel.counter.allow(release.event, 2)
    theta = np.full(d, 0.3)
    theta_new = theta.copy()
    theta_new[~kept] += np.array([1.0, -0.7])  # μ and log τ
    reads = channel.reads
    out = release(theta, theta_new)
    assert channel.reads == reads and out.noise_std == 0.0
    assert out.value == pytest.approx(np.linspace(1.0, 2.0, d) @ (theta_new - theta))
    theta_new[kept] += 0.1  # a move of the group effects reads the data
    assert release(theta, theta_new).noise_std > 0 and channel.reads > reads


def test_the_planned_bound_measures_the_likelihood_coordinates_too():
    rng = np.random.default_rng(6)
    d = 5
    metric = np.diag(rng.uniform(0.5, 2.0, d))
    centre, scale = np.zeros(d), np.full(d, 0.3)
    every = centred_bound_rms(metric, centre, scale, None)
    kept = np.array([True, True, True, False, False])
    some = centred_bound_rms(metric, centre, scale, None, coordinates=kept)
    # the marginal problem in three dimensions: the same distribution of the bound
    alone = centred_bound_rms(metric[:3, :3], centre[:3], scale[:3], None, seed=1)
    assert some == pytest.approx(alone, rel=0.05) and some < 0.8 * every


def test_the_bound_on_the_likelihood_coordinates_bounds_every_row_remainder():
    # y_i ~ N(a_g, 1): row i's Hessian is −e_g e_gᵀ, whose norm in the metric W_L is
    # (Σ_LL)_gg; with h their largest, |r_i| ≤ h ‖δ‖ (‖u‖ + ‖u'‖)/2 for every row and pair
    oracle = hierarchy()
    d, kept = oracle.space.ndim, oracle.likelihood_coordinates
    metric = _lower(np.random.default_rng(7), d)
    h = float(np.max(np.diag((metric @ metric.T)[np.ix_(kept, kept)])))
    channel = PrivateChannel(oracle, NoiseSource(12))
    centre = Centre(np.linspace(-0.4, 0.6, d), 1e9, np.eye(d))  # no row clipped at the centre
    release = CentredLLRRelease(
        channel,
        centre=centre,
        centre_gradient=np.zeros(d),
        metric=metric,
        remainder_clip=h,
        noise_multiplier=1.0,
    )
    rng = np.random.default_rng(8)
    worst = 0.0
    for _ in range(30):
        theta, theta_new = rng.normal(0.0, 2.0, (2, d))
        remainders = oracle.centred_ratio_rows(theta, theta_new, centre)
        worst = max(worst, float(np.max(np.abs(remainders))) / release.bound(theta, theta_new))
    assert worst <= 1.0 + 1e-9
    assert worst > 0.5  # and not loose: with half of h some remainder would exceed it


# ------------------------------------------------------------ directions only the prior reads


def _flat_model(form: str) -> RowLikelihood:
    rng = np.random.default_rng(6)
    n = 400
    g, h = rng.integers(0, 4, n), rng.integers(0, 3, n)
    x = rng.normal(size=n)
    with pm.Model() as model:
        g_data, h_data, x_data = pm.Data("g", g), pm.Data("h", h), pm.Data("x", x)
        a = pm.Normal("a", 0.0, 10.0)
        beta = pm.Normal("beta", 0.0, 1.0)
        b = pm.Normal("b", 0.0, 1.0, shape=4)
        if form == "intercept and offsets":  # a + b[g]: along (1, -1, -1, -1, -1)
            mu = a + b[g_data] + beta * x_data
        elif form == "two intercepts":  # a + c: along a − c
            c = pm.Normal("c", 0.0, 1.0)
            mu = a + c + beta * x_data
        elif form == "one index, two variables":  # b[g] + c[g]: along b_j − c_j for each j
            c = pm.Normal("c", 0.0, 1.0, shape=4)
            mu = a * x_data + b[g_data] + c[g_data]
        elif form == "crossed offsets":  # b[g] + c[h]: along Σ b − Σ c
            c = pm.Normal("c", 0.0, 1.0, shape=3)
            mu = a * x_data + b[g_data] + c[h_data]
        elif form == "scaled offsets":  # a + s·b[g]: curved, not a straight line: none
            s = pm.HalfNormal("s", 1.0)
            mu = a + s * b[g_data] + beta * x_data
        elif form == "a branch on an integer":  # made-up small integers never reach 18
            age = pm.Data("age", rng.integers(0, 80, n))
            mu = beta + pm.math.switch(age >= 18, a, b[0]) + x_data
        elif form == "a branch on a float":  # made-up floats in (0.1, 0.9) alone never reach 1
            mu = beta + pm.math.switch(x_data * x_data < 1.0, a, b[0])
        elif form == "common and group slopes":  # (β + b[g])·x: along β − Σ b
            mu = a + beta * x_data + b[g_data] * x_data
        else:  # "group intercepts and a slope": nothing flat
            mu = a * x_data + b[g_data] + beta * x_data**2
        pm.Normal("y", mu, 1.0, observed=rng.normal(size=n))
    return RowLikelihood(model)


def _unit(oracle: RowLikelihood, weights: dict[str, float | list[float]]) -> np.ndarray:
    vector = np.zeros(oracle.ndim)
    for var, sl, _ in oracle.space.slices:
        if var.name in weights:
            vector[sl] = weights[var.name]
    return vector


@pytest.mark.parametrize(
    ("form", "expected"),
    [
        ("intercept and offsets", [{"a": 1.0, "b": -1.0}]),
        ("two intercepts", [{"a": 1.0, "c": -1.0}]),
        (
            "one index, two variables",
            [{"b": list(np.eye(4)[j]), "c": list(-np.eye(4)[j])} for j in range(4)],
        ),
        ("crossed offsets", [{"b": 1.0, "c": -1.0}]),
        ("common and group slopes", [{"beta": 1.0, "b": -1.0}]),
        ("scaled offsets", []),
        # two columns equal on some rows only: not flat (b[0] and β agree below 18 only)
        ("a branch on an integer", []),
        ("a branch on a float", []),
        ("group intercepts and a slope", []),
    ],
)
def test_the_likelihoods_flat_directions_are_found_in_the_graph(form, expected):
    """Directions along which no row's log-likelihood changes, for any data: the span is
    exactly the expected one, and every row's gradient (on the real rows, here only to check)
    is orthogonal to it."""
    oracle = _flat_model(form)
    flat = oracle.likelihood_flat_directions
    assert flat.shape == (oracle.ndim, len(expected))
    np.testing.assert_allclose(flat.T @ flat, np.eye(len(expected)), atol=1e-12)
    for weights in expected:
        vector = _unit(oracle, weights)
        # in the span: its projection is itself
        np.testing.assert_allclose(flat @ (flat.T @ vector), vector, atol=1e-12)
    theta = oracle.space.ravel(oracle.model.initial_point()) + 0.3
    rows = oracle.grad_rows(theta)
    assert np.max(np.abs(rows @ flat), initial=0.0) <= 1e-10 * np.max(np.abs(rows))


def test_flat_directions_follow_the_values_of_variables_held_fixed():
    """``s·a + b`` with ``s`` held fixed: flat along ``a − b`` at ``s = 1`` only."""
    rng = np.random.default_rng(8)
    with pm.Model() as model:
        a, b = pm.Normal("a"), pm.Normal("b")
        s = pm.Normal("s", 1.0, 1.0)
        pm.Normal("y", s * a + b, 1.0, observed=rng.normal(size=200))
    oracle = RowLikelihood(model, vars=[a, b])
    oracle.set_fixed_values({"s": 1.0})
    np.testing.assert_allclose(
        np.abs(oracle.likelihood_flat_directions[:, 0]), [2**-0.5, 2**-0.5], rtol=1e-12
    )
    oracle.set_fixed_values({"s": 2.0})
    assert oracle.likelihood_flat_directions.shape == (2, 0)


def test_a_release_conditioned_on_a_flat_direction_is_the_gaussian_conditional():
    """``Nᵀx = 0`` known: the release less ``E[ξ | Nᵀξ]`` and the conditional covariance, as a
    Monte Carlo of the joint Gaussian gives them (and nothing changes without directions)."""
    from pymc_dp.mechanisms import conditioned_on_flat

    rng = np.random.default_rng(9)
    d = 4
    root = rng.normal(size=(d, d))
    covariance = root @ root.T + np.eye(d)
    flat = np.linalg.qr(rng.normal(size=(d, 1)))[0]
    x = rng.normal(size=d)
    x -= flat[:, 0] * (flat[:, 0] @ x)  # Nᵀx = 0
    noise = rng.multivariate_normal(np.zeros(d), covariance, size=200_000)
    value, conditional = conditioned_on_flat(x + noise[0], covariance, flat)
    assert abs(flat[:, 0] @ value) < 1e-12  # the known part is exact
    # the conditional covariance is that of ξ − E[ξ | Nᵀξ] over many draws
    residuals = np.array([conditioned_on_flat(e, covariance, flat)[0] for e in noise[:20_000]])
    np.testing.assert_allclose(
        np.cov(residuals.T), conditional, atol=0.08 * np.abs(covariance).max()
    )
    # and it is less noisy than the release along every direction it keeps
    assert np.all(np.diag(conditional) <= np.diag(covariance) + 1e-12)
    same, same_cov = conditioned_on_flat(x, covariance, np.zeros((d, 0)))
    np.testing.assert_array_equal(same, x)
    assert same_cov is covariance
    # white noise (no covariance given): the orthogonal projection
    white, _ = conditioned_on_flat(x + noise[1], None, flat)
    np.testing.assert_allclose(white, (x + noise[1]) - flat @ (flat.T @ (x + noise[1])))


def test_the_centre_gradient_and_gradient_releases_are_zero_along_flat_directions():
    """The rows' gradient sum is 0 along a flat direction for every dataset: the releases
    return 0 there, and are still unbiased where the rows have a gradient."""
    oracle = _flat_model("intercept and offsets")
    d = oracle.space.ndim
    flat = oracle.likelihood_flat_directions
    assert flat.shape[1] == 1
    channel = PrivateChannel(oracle, NoiseSource(10))
    centre = Centre(np.linspace(-0.5, 0.5, d), 30.0, _lower(np.random.default_rng(2), d))
    release = CentreGradientRelease(channel, centre=centre, noise_multiplier=0.5)
    channel.counter.allow(release.event, 2000)
    exact = oracle.centre_rows(centre).sum(axis=0)
    assert abs(flat[:, 0] @ exact) < 1e-9 * np.abs(exact).max()
    draws = np.array([release().value for _ in range(2000)])
    assert np.max(np.abs(draws @ flat)) < 1e-9 * np.abs(draws).max()
    covariance = release.noise_covariance
    np.testing.assert_allclose(covariance @ flat, 0.0, atol=1e-9 * np.abs(covariance).max())
    np.testing.assert_allclose(np.cov(draws.T), covariance, atol=0.15 * np.abs(covariance).max())
    sd = np.sqrt(np.diag(covariance))
    assert np.all(np.abs(draws.mean(axis=0) - exact) < 4 * sd / np.sqrt(2000) + 1e-9)
    gradient = GradientRelease(channel, grad_clip=2.0, noise_multiplier=1.0)
    channel.counter.allow(gradient.event, 1)
    value = gradient(np.zeros(d)).value
    assert abs(flat[:, 0] @ value) < 1e-9 * np.abs(value).max()


def test_dphmc_centred_gradients_are_zero_along_flat_directions():
    from pymc_dp.mechanisms import CentredGradientRelease

    oracle = _flat_model("intercept and offsets")
    d = oracle.space.ndim
    flat = oracle.likelihood_flat_directions[:, 0]
    channel = PrivateChannel(oracle, NoiseSource(11))
    theta_c = np.linspace(-0.2, 0.2, d)
    centre_gradient = oracle.centre_rows(Centre(theta_c, 30.0, np.eye(d))).sum(axis=0)
    release = CentredGradientRelease(
        channel,
        centre=Centre(theta_c, 30.0, np.eye(d)),
        centre_gradient=centre_gradient,
        metric=_lower(np.random.default_rng(3), d),
        remainder_clip=0.5,
        noise_multiplier=2.0,
    )
    channel.counter.allow(release.event, 400)
    theta = theta_c + np.random.default_rng(4).normal(0.0, 0.05, d)
    exact = oracle.grad_sum(theta)
    draws = np.array([release(theta).value for _ in range(400)])
    assert np.max(np.abs(draws @ flat)) < 1e-9 * np.abs(draws).max()
    # unbiased: the mean is Ĝ plus the clipped differences mapped back (4 sd of the mean)
    import scipy.linalg

    clipped = oracle.clipped_centred_grad_sum(
        theta,
        release.centre,
        release.marginal,
        release.likelihood_coordinates,
        release.bound(theta),
    ).value
    expected = centre_gradient + scipy.linalg.solve_triangular(release.marginal.T, clipped)
    spread = draws.std(axis=0) / np.sqrt(400)
    assert np.all(np.abs(draws.mean(axis=0) - expected) < 4 * spread + 1e-9)
    assert not np.allclose(expected, exact)  # some rows clipped: the clip matters here


def _hierarchical_offsets() -> RowLikelihood:
    """``a + b[g]`` with ``b ~ N(0, τ)``: ``τ`` only the prior reads, ``a − Σ b`` flat."""
    rng = np.random.default_rng(12)
    g = rng.integers(0, 4, 300)
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 10.0)
        tau = pm.HalfNormal("tau", 1.0)
        b = pm.Normal("b", 0.0, tau, shape=4)
        pm.Normal("y", a + b[pm.Data("g", g)], 1.0, observed=rng.normal(size=300))
    return RowLikelihood(model)


def test_the_flat_conditionings_are_the_closed_form_gaussian_conditionals():
    """Against ``C − C A (AᵀCA)⁻¹ AᵀC`` with ``A`` the known zeros (coordinates only the prior
    reads, and the flat directions): the minimum-variance release, not just any projection."""
    from pymc_dp.mechanisms import CentredGradientRelease

    oracle = _hierarchical_offsets()
    d = oracle.space.ndim
    kept, flat = oracle.likelihood_coordinates, oracle.likelihood_flat_directions
    assert (~kept).sum() == 1 and flat.shape[1] == 1
    channel = PrivateChannel(oracle, NoiseSource(13))
    whitening = _lower(np.random.default_rng(5), d)
    release = CentreGradientRelease(
        channel, centre=Centre(np.zeros(d), 20.0, whitening), noise_multiplier=0.7
    )
    inverse = np.linalg.inv(release.centre.whitening)
    covariance = release.noise_std**2 * inverse @ inverse.T
    known = np.concatenate([np.eye(d)[:, ~kept], flat], axis=1)
    cross = covariance @ known
    expected = covariance - cross @ np.linalg.solve(known.T @ cross, cross.T)
    np.testing.assert_allclose(release.noise_covariance, expected, atol=1e-10 * covariance.max())
    # DPHMC's differences, in the metric W_L of the likelihood's coordinates
    metric = _lower(np.random.default_rng(6), d)
    centred = CentredGradientRelease(
        channel,
        centre=Centre(np.zeros(d), 20.0, np.eye(d)),
        centre_gradient=np.zeros(d),
        metric=metric,
        remainder_clip=0.5,
        noise_multiplier=2.0,
    )
    root = np.linalg.inv(centred.marginal).T  # W_L⁻ᵀ
    inner = root @ root.T
    flat_l = flat[kept]
    projector = np.eye(kept.sum()) - inner @ flat_l @ np.linalg.solve(
        flat_l.T @ inner @ flat_l, flat_l.T
    )
    spread, gain = centred._flat_correction
    np.testing.assert_allclose(np.eye(kept.sum()) - spread @ gain, projector, atol=1e-10)


def test_a_preconditioned_gradient_release_is_conditioned_with_its_noise_variances():
    oracle = _flat_model("intercept and offsets")
    d = oracle.space.ndim
    flat = oracle.likelihood_flat_directions
    channel = PrivateChannel(oracle, NoiseSource(14))
    precond = np.linspace(0.5, 3.0, d)
    release = GradientRelease(channel, grad_clip=2.0, noise_multiplier=1.0, precond=precond)
    channel.counter.allow(release.event, 3000)
    draws = np.array([release(np.zeros(d)).value for _ in range(3000)])
    sigma = 2.0 * 2.0
    variances = sigma**2 / precond**2
    spread = variances[:, None] * flat
    expected = np.diag(variances) - spread @ np.linalg.solve(flat.T @ spread, spread.T)
    np.testing.assert_allclose(np.cov(draws.T), expected, atol=0.08 * variances.max())
    assert np.max(np.abs(draws @ flat)) < 1e-9 * np.abs(draws).max()
