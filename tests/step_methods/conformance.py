"""``DPStepConformance``: the properties every DP step variant must have, in one test base.

A variant subclasses the base and provides one hook, :meth:`DPStepConformance.make_step`
(plus a few class attributes saying what to expect). The model is a Normal mean with known
scale and a Normal prior, so the (tempered) posterior is known in closed form. Every property
runs for every variant; tests/step_methods/test_conformance.py checks that every DP step class
exported by ``pymc_dp`` has a subclass.
"""

from __future__ import annotations

import pickle
import warnings
from typing import Any, ClassVar

import cloudpickle
import numpy as np
import pymc as pm
import pytest
from scipy import stats

import pymc_dp

from ._hooks import break_penalty, data_reads, releases_allowed, releases_made

N_ROWS = 400
PRIOR_SD = 10.0
DELTA = 1e-6
#: stats a DP step may record by default (privately computed or public)
PRIVATE_STATS = {
    "accepted",
    "jump",
    "epsilon_spent",
    "mu_spent",
    "diverging",
    "step_size",
    "thermostat",  # DP-SGNHT's ξ: computed from released gradients only
    "proposal_correlation",  # DPPenalty's ρ: chosen from acceptance flags only
}


def moved(stats: Any) -> Any:
    """Whether the chain moved at each draw: ``accepted``, or a nonzero ``jump`` for the
    stochastic-gradient samplers, which have no accept/reject step (stats dict or dataset)."""
    if "accepted" in stats:
        return np.asarray(stats["accepted"], dtype=bool)
    return np.asarray(stats["jump"]) > 0


def quiet(**kwargs: Any) -> dict[str, Any]:
    return {"progressbar": False, "compute_convergence_checks": False, **kwargs}


class DPStepConformance:
    """Test base (not collected: no ``Test`` prefix). Subclasses set the attributes below."""

    step_class: ClassVar[type]  # the pymc_dp class this variant covers
    temperature: ClassVar[float] = 1.0
    nonprivate_stats: ClassVar[set[str]] = {"llr_clipped_fraction"}
    invariance_iterations: ClassVar[int] = 20
    #: stats every draw must carry (besides epsilon_spent)
    expected_stats: ClassVar[set[str]] = {"accepted", "jump"}

    def make_step(self, budget: pymc_dp.PrivacyBudget, **overrides: Any) -> Any:
        """Build the variant inside the model's context (the one hook)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- the model

    @staticmethod
    def data() -> np.ndarray:
        return np.random.default_rng(11).normal(1.0, 1.0, N_ROWS)

    def model(self, prior_sd: float = PRIOR_SD) -> pm.Model:
        with pm.Model() as model:
            mu = pm.Normal("mu", 0.0, prior_sd)
            pm.Normal("y", mu, 1.0, observed=self.data())
        return model

    def posterior(self) -> tuple[float, float]:
        """Mean and sd of the posterior with the likelihood tempered by ``temperature``."""
        y = self.data()
        precision = 1 / PRIOR_SD**2 + self.temperature * y.size
        return self.temperature * y.sum() / precision, float(np.sqrt(1 / precision))

    def build(
        self, epsilon: float = 1e4, model: pm.Model | None = None, **overrides: Any
    ) -> tuple[pm.Model, Any]:
        model = self.model() if model is None else model
        with model:
            step = self.make_step(pymc_dp.PrivacyBudget(epsilon=epsilon, delta=DELTA), **overrides)
        return model, step

    def build_for(self, iterations: int) -> tuple[pm.Model, Any]:
        """A step whose budget buys about ``iterations`` iterations of its cost."""
        _, probe = self.build()
        return self.build(epsilon=float(probe.cost.epsilon(DELTA, iterations)))

    def start(self) -> dict[str, np.ndarray]:
        return {"mu": np.array(self.posterior()[0])}

    # ---------------------------------------------------------------- 1. budget, sequential

    def test_the_budget_is_respected_by_sequential_chains(self):
        model, step = self.build_for(40)
        plan = step.sampling_kwargs(chains=2)
        with model:
            pm.sample(step=step, cores=1, initvals=self.start(), random_seed=1, **plan, **quiet())
        report = step.budget.report()
        assert report.reserved_iterations == 2 * (plan["tune"] + plan["draws"])
        assert report.spent_epsilon <= step.budget.epsilon
        assert releases_made(step)  # the chain released something

    def test_a_run_that_does_not_fit_is_refused_before_reading(self):
        _model, step = self.build_for(40)
        plan = step.sampling_kwargs(chains=2)
        reads = data_reads(step)
        with pytest.raises(pymc_dp.BudgetExceededError):
            pymc_dp.sample(step, chains=2, tune=0, draws=10 * plan["draws"] + 10, **quiet())
        assert data_reads(step) == reads and step.budget.report().reservations == 0

    # ---------------------------------------------------------------- 2. budget, spawned workers

    @pytest.mark.slow
    def test_the_budget_is_respected_by_spawned_workers(self):
        model, step = self.build_for(40)
        plan = step.sampling_kwargs(chains=2)
        with model:
            idata = pm.sample(
                step=step, cores=2, mp_ctx="spawn", initvals=self.start(), **plan, **quiet()
            )
        report = step.budget.report()
        assert report.reserved_iterations == 2 * (plan["tune"] + plan["draws"])
        assert report.spent_epsilon <= step.budget.epsilon
        assert idata.posterior.sizes["chain"] == 2

    # ---------------------------------------------------------------- 3. releases = reservation

    def test_releases_equal_the_reservation(self):
        model, step = self.build()
        with model:
            idata = pm.sample(
                step=step, chains=1, cores=1, tune=5, draws=15, initvals=self.start(), **quiet()
            )
        made, allowed = releases_made(step), releases_allowed(step)
        assert allowed and set(made) <= set(allowed)
        assert all(made[event] <= allowed[event] for event in made)
        diverged = "diverging" in idata.sample_stats and idata.sample_stats.diverging.values.any()
        if not diverged:  # a diverging trajectory stops early and releases less
            assert made == allowed

    # ---------------------------------------------------------------- 4. stats allow-list

    def test_only_private_statistics_are_kept(self):
        _model, step = self.build()
        idata = pymc_dp.sample(
            step, chains=1, tune=0, draws=10, cores=1, initvals=self.start(), **quiet()
        )
        from pymc_dp._compat import group_names

        assert set(group_names(idata)) == {"posterior", "sample_stats"}
        kept = set(idata.sample_stats.data_vars)
        assert {*self.expected_stats, "epsilon_spent"} <= kept <= PRIVATE_STATS
        assert not kept & self.nonprivate_stats

    # ---------------------------------------------------------------- 5. secret noise

    def _chain(self, **overrides: Any) -> np.ndarray:
        model, step = self.build(**overrides)
        with model:
            idata = pm.sample(
                step=step,
                chains=1,
                cores=1,
                tune=0,
                draws=80,
                random_seed=7,
                initvals=self.start(),
                **quiet(),
            )
        assert moved(idata.sample_stats).any()  # the chain moves
        return idata.posterior["mu"].values.ravel()

    def test_dp_noise_does_not_come_from_random_seed(self):
        # same random_seed, so the same public proposals: fresh OS-entropy noise must still
        # give other accept decisions somewhere in 80 iterations (25 was once too few)
        a, b = self._chain(), self._chain()
        assert not np.array_equal(a, b)
        c, d = self._chain(noise_rng=5), self._chain(noise_rng=5)
        np.testing.assert_array_equal(c, d)  # same noise_rng and random_seed: same chain

    # ---------------------------------------------------------------- 6. non-private diagnostics

    def test_nonprivate_diagnostics_are_opt_in_and_loud(self, capsys):
        with pytest.warns(pymc_dp.PrivacyWarning, match="NOT differentially private"):
            _, step = self.build(nonprivate_diagnostics=True)
        idata = pymc_dp.sample(
            step, chains=1, tune=0, draws=5, cores=1, initvals=self.start(), **quiet()
        )
        assert self.nonprivate_stats <= set(idata.sample_stats.data_vars)
        report = pymc_dp.privacy_report(idata)
        assert report["dp_nonprivate_diagnostics"] == 1
        assert capsys.readouterr().out.startswith("NOT DIFFERENTIALLY PRIVATE")
        with warnings.catch_warnings():
            warnings.simplefilter("error", pymc_dp.PrivacyWarning)
            self.build()  # the default is private and silent

    # ---------------------------------------------------------------- 7. pickling

    def test_a_pickled_step_keeps_its_cost_and_read_only_parameters(self):
        # cloudpickle, as PyMC sends steps to spawned workers (PyMC's BlockedStep keeps its
        # constructor's model for unpickling, which plain pickle cannot serialise)
        _, step = self.build()
        copy = pickle.loads(cloudpickle.dumps(step))
        assert copy.cost == step.cost
        assert copy.budget.ledger_path == step.budget.ledger_path
        with pytest.raises(pymc_dp.ReadOnlyParameterError):
            copy.budget = pymc_dp.PrivacyBudget(epsilon=1e6, delta=DELTA)

    # ---------------------------------------------------------------- 8. restore state

    def test_restoring_the_sampling_state_gives_the_same_draw(self):
        model, step = self.build(noise_rng=3)
        point = {**model.initial_point(), "mu": self.start()["mu"]}
        for _ in range(4):
            point, _ = step.step(point)
        state = step.sampling_state
        made = sum(releases_made(step).values())
        draws = []
        for _ in range(2):
            step.sampling_state = state
            new, stats = step.step(point)
            draws.append((new, {k: v for k, v in stats[0].items() if not k.endswith("_spent")}))
        (a, stats_a), (b, stats_b) = draws
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
        assert stats_a.keys() == stats_b.keys()
        assert all(np.array_equal(stats_a[k], stats_b[k]) for k in stats_a)
        # restoring never rewinds the accounting: both iterations were counted
        assert sum(releases_made(step).values()) > made
        assert stats[0]["epsilon_spent"] > 0

    def test_the_chain_continues_from_the_point_it_is_handed(self):
        # the point a step returned is handed back by PyMC as it was: its state is reused, and
        # its arrays are read-only so that it cannot have changed; a point with a value replaced
        # is read (the chain continues from there)
        model, step = self.build(noise_rng=3)
        given, read = [], []
        iterate, ravel = step._iterate, step.space.ravel
        step._iterate = lambda theta: (given.append(np.array(theta)), iterate(theta))[1]
        step.space.ravel = lambda point: (read.append(1), ravel(point))[1]
        point = {**model.initial_point(), "mu": self.start()["mu"]}
        for _ in range(3):
            point, _ = step.step(point)
        assert not point["mu"].flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            point["mu"][...] = 0.0

        def draw_of(theta):
            return step._stretch.reported(theta) if step._stretching() else theta

        reads = len(read)
        returned, _ = step.step(point)  # from the state the last call ended in, not re-read
        np.testing.assert_allclose(draw_of(given[-1]), point["mu"].reshape(-1), rtol=1e-12)
        assert len(read) == reads
        replaced = {**returned, "mu": np.asarray(returned["mu"]) + 0.5}  # another dict
        returned, _ = step.step(replaced)
        np.testing.assert_allclose(draw_of(given[-1]), replaced["mu"].reshape(-1), rtol=1e-12)
        returned["mu"] = np.asarray(returned["mu"]) + 0.5  # the same dict, a new value
        step.step(returned)
        np.testing.assert_allclose(draw_of(given[-1]), returned["mu"].reshape(-1), rtol=1e-12)
        assert len(read) == reads + 2

    def test_a_sampling_state_of_another_step_is_refused(self):
        _, step = self.build()
        with pytest.raises(pymc_dp.InvalidParameterError, match="sampling_state"):
            step.sampling_state = object()

    # ---------------------------------------------------------------- 9. invariance

    def _final_states(
        self,
        chains: int,
        iterations: int | None = None,
        model: pm.Model | None = None,
        **overrides: Any,
    ):
        """Final states of ``chains`` independent chains started at exact posterior draws.

        They run through ``step.step`` as one reserved chain of ``chains · iterations``
        iterations (``step.setup_chain`` as PyMC 6 calls it): one reservation instead of one
        per chain, since ``pm.sample(chains=K)`` reserves per chain and each subsampled
        reservation composes a PLD (about a second). Chain k + 1 starts at its own draw; no
        tuning runs, so the only state carried over is the guided walk's direction, whose
        stationary law is uniform and independent of θ.
        """
        mean, sd = self.posterior()
        length = iterations or self.invariance_iterations
        starts = np.random.default_rng(21).normal(mean, sd, chains)
        _, step = self.build(epsilon=1e8, model=model, noise_rng=13, **overrides)
        step.setup_chain(np.random.default_rng(17), 0, chains * length)
        finals, accepted = [], 0
        for start in starts:
            point = {"mu": np.array(start)}
            for _ in range(length):
                point, stats_ = step.step(point)
                accepted += bool(moved(stats_[0]))
            finals.append(float(point["mu"]))
        # the chains move: staying put at exact draws is not what passes the invariance test
        # (a negative control needs no such check: stuck chains would pass, not fail, it)
        if model is None and not overrides:
            assert accepted / (chains * length) > 0.05, accepted
        return np.array(finals)

    @staticmethod
    def _matches(values: np.ndarray, mean: float, sd: float) -> tuple[bool, float, float]:
        """Two-sided z test of the mean and χ² test of the variance, each at level 0.001."""
        k = values.size
        z = (values.mean() - mean) / (sd / np.sqrt(k))
        chi2 = (k - 1) * values.var(ddof=1) / sd**2
        p_mean = 2 * stats.norm.sf(abs(z))
        p_var = 2 * min(stats.chi2.cdf(chi2, k - 1), stats.chi2.sf(chi2, k - 1))
        return min(p_mean, p_var) > 1e-3, p_mean, p_var

    @pytest.mark.slow
    def test_started_at_exact_posterior_draws_the_chains_stay_there(self):
        mean, sd = self.posterior()
        ok, p_mean, p_var = self._matches(self._final_states(200), mean, sd)
        assert ok, (p_mean, p_var)

    @pytest.mark.slow
    def test_negative_control_a_wrong_prior_is_detected(self):
        # the invariance check's power, for every variant: the same chains on a model whose
        # prior sd is twice the posterior's (4/5 of the variance, the mean 4 sds nearer 0,
        # mild enough that every variant still moves) must fail
        mean, sd = self.posterior()
        values = self._final_states(200, model=self.model(prior_sd=2 * sd))
        ok, p_mean, p_var = self._matches(values, mean, sd)
        assert not ok, (p_mean, p_var)


class PenaltyTermControl:
    """Mixin for variants whose test carries the −σ²/2 penalty: without it (and with large
    release noise, :meth:`noisy_overrides`) the invariance check must fail."""

    def noisy_overrides(self) -> dict[str, Any]:
        raise NotImplementedError

    @pytest.mark.slow
    def test_negative_control_without_the_penalty_term_leaves_the_posterior(self, monkeypatch):
        mean, sd = self.posterior()
        break_penalty(monkeypatch)
        values = self._final_states(200, 3 * self.invariance_iterations, **self.noisy_overrides())
        ok, p_mean, p_var = self._matches(values, mean, sd)
        assert not ok and values.var() > sd**2, (p_mean, p_var, values.var() / sd**2)
