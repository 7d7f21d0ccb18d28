"""The bound as a feature: predicted effective draws from public quantities (pymc_dp.prediction)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import pymc_dp
from pymc_dp.kernels.penalty import INDEPENDENCE_PROBABILITY, IndependenceProposal
from pymc_dp.prediction import independence_acceptance, predict_penalty_ess


def simulated_acceptance(z: float, clip: float, cov: np.ndarray, steps: int = 40_000) -> float:
    """An independence Metropolis chain on N(0, Σ) with the penalty test's noise, run directly."""
    rng = np.random.default_rng(11)
    root = np.linalg.cholesky(cov)
    q = IndependenceProposal(np.zeros(cov.shape[0]), root, df=7.0, probability=1.0)
    target = stats.multivariate_normal(np.zeros(cov.shape[0]), cov)
    theta, accepted = np.zeros(cov.shape[0]), 0
    for _ in range(steps):
        new = q.sample(rng)
        sigma = 2 * z * clip * np.linalg.norm(new - theta)
        log_ratio = target.logpdf(new) - target.logpdf(theta) + q.logpdf(theta) - q.logpdf(new)
        log_ratio += rng.normal(0.0, sigma) - 0.5 * sigma**2
        if np.log(rng.uniform()) < log_ratio:
            theta, accepted = new, accepted + 1
    return accepted / steps


@pytest.mark.parametrize("z", [0.0, 20.0, 60.0])
def test_the_predicted_acceptance_is_that_of_the_chain(z):
    cov = np.array([[4e-4, 1e-4], [1e-4, 1e-4]])
    predicted = independence_acceptance(z, 3.0, cov)
    assert predicted == pytest.approx(simulated_acceptance(z, 3.0, cov), abs=0.02)


def simulated_centred_acceptance(z, h, cov, offset, steps=40_000):
    """The same chain with the centred ratio's noise ``σ = 2 z h s(θ, θ')``, its bound measured
    from a centre ``offset`` away from the target's (and the proposal's) mean."""
    from pymc_dp.releases import RemainderScale

    rng = np.random.default_rng(12)
    d = cov.shape[0]
    root = np.linalg.cholesky(cov)
    q = IndependenceProposal(np.asarray(offset, float), root, df=7.0, probability=1.0)
    target = stats.multivariate_normal(q.centre, cov)
    scale = RemainderScale(root, np.zeros(d), np.ones(d, bool), None)
    theta, accepted = q.centre.copy(), 0
    for _ in range(steps):
        new = q.sample(rng)
        sigma = 2 * z * h * float(scale(theta, new))
        log_ratio = target.logpdf(new) - target.logpdf(theta) + q.logpdf(theta) - q.logpdf(new)
        log_ratio += rng.normal(0.0, sigma) - 0.5 * sigma**2
        if np.log(rng.uniform()) < log_ratio:
            theta, accepted = new, accepted + 1
    return accepted / steps


def test_the_centred_prediction_counts_the_targets_distance_from_the_centre():
    """The centre's noise moves the target's mode m̂ off the centre θ_c, and every bound grows
    with the distance from θ_c: the prediction takes the chain where it samples (issue 17)."""
    cov = np.array([[4e-4, 1e-4], [1e-4, 1e-4]])
    root = np.linalg.cholesky(cov)
    at_centre = independence_acceptance(0.5, 1.0, cov, df=7.0, remainder_clip=1.0)
    values = []
    for whitened in (0.0, 3.0):
        offset = root @ np.array([whitened, 0.0])
        predicted = independence_acceptance(
            0.5, 1.0, cov, df=7.0, remainder_clip=1.0, offset=offset
        )
        simulated = simulated_centred_acceptance(0.5, 1.0, cov, offset)
        assert predicted == pytest.approx(simulated, abs=0.02)
        values.append(predicted)
    assert values[0] == pytest.approx(at_centre)
    assert values[1] < 0.6 * values[0]  # three sds from the centre: far noisier releases


def test_more_noise_buys_less_acceptance_and_the_ess_formula():
    cov = np.eye(3) * 1e-4
    values = [independence_acceptance(z, 2.0, cov) for z in (1.0, 30.0, 100.0, 300.0)]
    assert values == sorted(values, reverse=True) and values[-1] < 0.05 < 0.6 < values[0]
    prediction = predict_penalty_ess(
        noise_multiplier=30.0, llr_clip=2.0, covariance=cov, chains=4, draws=100
    )
    a = INDEPENDENCE_PROBABILITY * prediction.independence_acceptance
    assert prediction.ess == pytest.approx(400 * a / (2 - a))


def test_predict_ess_grows_with_epsilon_and_rows():
    def ess(epsilon, n):
        sd = 2.5 / np.sqrt(n)  # the quickstart's posterior sd is about 2.5/√n
        return pymc_dp.predict_ess(epsilon, 0.1 / n, scale=sd, d=3, llr_clip=2.83).ess

    assert ess(1, 1e5) < ess(5, 1e5) < ess(10, 1e5)
    assert ess(1, 1e5) < ess(1, 1e6)
    assert ess(1, 1e5) < 10  # the quickstart at ε = 1: a handful, as measured


# ---------------------------------------------------------------- the centre's tilt


def linear_model(n: int, seed: int):
    """A linear regression with five covariates (d = 7), written as PyMC's docs write it."""
    import pymc as pm

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    y = 0.5 + X @ np.array([1.0, -0.5, 0.3, 0.0, 0.2]) + rng.normal(size=n)
    with pm.Model() as model:
        alpha = pm.Normal("alpha", 0, 10)
        beta = pm.Normal("beta", 0, 10, shape=5)
        sigma = pm.HalfNormal("sigma", 5)
        pm.Normal("y", alpha + pm.math.dot(X, beta), sigma, observed=y)
    return model


def test_the_predicted_centre_shift_scales_as_the_noise_and_refuses_bad_input():
    base = pymc_dp.predict_centre_shift(1.0, 1e-6, n=10_000, d=4)
    assert pymc_dp.predict_centre_shift(1.0, 1e-6, n=40_000, d=4) == pytest.approx(base / 2)
    assert pymc_dp.predict_centre_shift(1.0, 1e-6, n=10_000, d=16) == pytest.approx(2 * base)
    assert pymc_dp.predict_centre_shift(5.0, 1e-6, n=10_000, d=4) < base / 3
    with pytest.raises(pymc_dp.InvalidParameterError, match="n must be a positive integer"):
        pymc_dp.predict_centre_shift(1.0, 1e-6, n=0, d=4)
    with pytest.raises(pymc_dp.InvalidParameterError, match="clip_multiple"):
        pymc_dp.predict_centre_shift(1.0, 1e-6, n=100, d=4, clip_multiple=-1.0)


@pytest.mark.parametrize(("n", "epsilon"), [(10_000, 1.0), (20_000, 0.5), (100_000, 5.0)])
def test_the_predicted_centre_shift_is_within_a_factor_two_and_a_half_of_the_stated_one(n, epsilon):
    # Over 12 public seeds the stated shift ranged 2.41–5.97 (predicted 2.48), 2.01–6.32
    # (3.34) and 0.09–0.11 (0.18): the prediction is a planning number. (Before the sharper
    # reads took the midpoint of their range, 1.28–2.91 and 1.85–3.39: the Σ̂ it was stated
    # with was then up to 100 times too narrow along directions the release left loose.)
    with linear_model(n, seed=1):
        step = pymc_dp.DPPenalty(budget=pymc_dp.PrivacyBudget(epsilon, 1e-6), noise_rng=1, rng=1)
        step.prepare(chains=2)  # the private initialisation and centring, nothing sampled
    stated = step.centre_shift_sd()
    predicted = pymc_dp.predict_centre_shift(epsilon, 1e-6, n=n, d=7)
    assert 0.4 < predicted / stated < 2.5, (predicted, stated)


def test_the_steps_prediction_counts_its_modes_distance_from_the_centre():
    """DPPenalty predicts its draws where its chains sample: at the tilted target's mode.
    (n = 2·10⁴, ε = 1, these seeds: the mode sits 10 sd, whitened, from the centre, and the
    prediction taken at the centre, 76 draws, falls to 0.2.)"""
    with linear_model(20_000, seed=2):
        step = pymc_dp.DPPenalty(budget=pymc_dp.PrivacyBudget(1.0, 1e-6), noise_rng=2, rng=2)
        tune, draws = step.prepare(chains=2)
        step.plan(tune=tune, draws=draws, chains=2)
    start, centring = step.private_start, step._centring
    offset = start.theta - centring.centre.theta
    assert np.linalg.norm(np.linalg.solve(np.linalg.cholesky(start.covariance), offset)) > 3
    at_centre = predict_penalty_ess(
        noise_multiplier=step.noise_multiplier,
        llr_clip=step.llr_clip,
        covariance=start.covariance,
        chains=2,
        draws=draws,
        independence_probability=step._independence.probability,
        df=step._independence.df,
        remainder_clip=centring.remainder_clip,
        coordinates=step._channel.likelihood_coordinates,
        row_blocks=step._channel.row_blocks,
    ).ess
    assert step.predicted_ess() < 0.1 * at_centre


def test_dphmc_counts_its_modes_distance_from_the_centre():
    """DPHMC's noise excess, and so its prediction, is taken where its chains sample: the
    centred bounds of states around the tilted target's mode, measured from the centre."""
    with linear_model(20_000, seed=2):
        step = pymc_dp.DPHMC(budget=pymc_dp.PrivacyBudget(1.0, 1e-6), noise_rng=2, rng=2)
        tune, draws = step.prepare(chains=2)
        step.plan(tune=tune, draws=draws, chains=2)
    start, centring = step.private_start, step._centring
    root = np.tril(centring.metric)
    whitened = np.linalg.solve(root, start.theta - centring.centre.theta)
    assert np.linalg.norm(whitened) > 3  # these seeds: the mode several sd from the centre
    # the typical offset bound: √(d + ‖o‖²) at the mode, √d at the centre (all coordinates
    # are the likelihood's, no groups)
    d = whitened.size
    at_mode = step._typical_bounds(root, centring.centre.theta, mode=start.theta)
    at_centre = step._typical_bounds(root, centring.centre.theta)
    np.testing.assert_allclose(at_centre[0], np.sqrt(d), rtol=0.05)
    np.testing.assert_allclose(at_mode[0], np.sqrt(d + whitened @ whitened), rtol=0.05)
    excess = step.noise_excess()
    z_centre, _ = step._centred_noise_multipliers(centring.remainder_clip, at_centre)
    assert excess == pytest.approx(
        step.grad_noise_multiplier / z_centre * at_mode[0] / at_centre[0]
    )
    assert step.predicted_ess() < 50  # warned before sampling


def test_sample_warns_when_the_centre_noise_tilts_the_target_by_more_than_a_sd():
    # n = 2·10⁴ at ε = 0.5: the stated shift is 3.2–8.9 sd (predicted 3.3), above 1 for any
    # public seed; random_seed fixes the initialisation's designs, noise_rng its noise
    with linear_model(20_000, seed=2):
        step = pymc_dp.DPPenalty(budget=pymc_dp.PrivacyBudget(0.5, 1e-6), noise_rng=2)
        with pytest.warns(pymc_dp.ConvergenceWarning, match="tilts the target by about") as rec:
            pymc_dp.sample(
                step, chains=2, tune=20, draws=40, cores=1, progressbar=False, random_seed=0
            )
    assert step.centre_shift_sd() > 1.0
    message = next(str(w.message) for w in rec if "tilts the target" in str(w.message))
    assert f"about {step.centre_shift_sd():.1f} posterior sd" in message
    # after its sharper reads the Fisher release leaves 1–6 of the 7 directions unresolved
    # (over 5 public seeds; 6 with this one): said too when that is more than half
    unresolved = step.unresolved_directions()
    assert unresolved > 3.5
    message = next(str(w.message) for w in rec if "curvature in only" in str(w.message))
    assert f"in only {7 - unresolved} of 7 directions" in message
    # a budget that pins the centre states a shift well under the warning threshold, and
    # resolves the curvature in every direction
    with linear_model(100_000, seed=2):
        step = pymc_dp.DPPenalty(budget=pymc_dp.PrivacyBudget(5.0, 1e-6), noise_rng=2, rng=2)
        step.prepare(chains=2)
    assert step.centre_shift_sd() < 0.5
    assert step.unresolved_directions() == 0
