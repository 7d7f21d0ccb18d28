"""How close the private initialisation gets to the posterior (quickstart logistic regression).

    python benchmarks/private_init_quality.py N EPSILON [REPEATS]

Prints, per repeat, the error of θ* in posterior sd, the sd ratio of Σ̂, and the chosen clips,
against a Laplace reference on the same data (non-private, evaluation only).
"""

import sys
import time
import warnings

import numpy as np
import pymc as pm
import scipy.optimize as so

import pymc_dp
from pymc_dp.noise import NoiseSource
from pymc_dp.step_methods.initialization import private_initialization

warnings.filterwarnings("ignore")
n, eps = int(sys.argv[1]), float(sys.argv[2])
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 4
rng = np.random.default_rng(42)
X = rng.normal(size=(n, 2))
y = rng.binomial(1, 1 / (1 + np.exp(-(-0.3 + X @ np.array([1.0, -0.5])))))
with pm.Model() as model:
    Xd = pm.Data("X", X)
    alpha = pm.Normal("alpha", 0, 2)
    beta = pm.Normal("beta", 0, 2, shape=2)
    pm.Bernoulli("y", logit_p=alpha + Xd @ beta, observed=y)
    step = pymc_dp.DPPenalty(
        budget=pymc_dp.PrivacyBudget(epsilon=1.0, delta=1e-6), llr_clip=1.5, noise_multiplier=100.0
    )


def nlp(t):
    eta = t[0] + X @ t[1:]
    return -(np.sum(y * eta - np.logaddexp(0, eta)) - np.sum(t**2) / 8)


ref = so.minimize(nlp, np.zeros(3)).x
p = 1 / (1 + np.exp(-(ref[0] + X @ ref[1:])))
Z = np.c_[np.ones(n), X]
sd = np.sqrt(np.diag(np.linalg.inv((Z * (p * (1 - p))[:, None]).T @ Z + np.eye(3) / 4)))
theta0 = step.space.ravel(model.initial_point())
for rep in range(repeats):
    budget = pymc_dp.PrivacyBudget(epsilon=eps, delta=0.1 / n)
    step._channel.start_chain(NoiseSource())
    t0 = time.perf_counter()
    start = private_initialization(
        step._channel, budget, theta0, public_rng=np.random.default_rng(rep)
    )
    print(
        f"n {n} ε {eps} | err/sd {np.round((start.theta - ref) / sd, 2)} | sd ratio "
        f"{np.round(start.scale / sd, 2)} | clips grad {start.grad_clip:.3g} llr "
        f"{start.llr_clip:.3g} ascent {start.ascent_clip:.3g} | {time.perf_counter() - t0:.1f}s"
    )
