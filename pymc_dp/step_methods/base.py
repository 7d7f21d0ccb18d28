"""What every DP step method shares: the private channel, the budget, the noise, per-chain state.

A :class:`DPStep` is a PyMC ``BlockedStep``. PyMC runs chains either sequentially with one step
object or in worker processes with cloudpickled copies, and starts each chain with ``set_rng``
(PyMC 5) or ``setup_chain`` (PyMC 6). Every path goes through :meth:`DPStep._setup_chain`,
which resets the per-chain counters, draws a fresh secret noise source and learns the chain's
length from PyMC (:mod:`pymc_dp._compat`). Before its first read of the data a chain

1. refuses to run beside a non-DP step (a compound step would hand the data to it),
2. checks that the row data are still those the step was built on (``pm.set_data``),
3. checks its starting point (finite, inside the support: named variable otherwise),
4. reserves exactly its iterations from the budget's ledger (atomic across processes),

so a chain that would leak or overspend stops before reading anything. Every release is then
checked against the reservation (:class:`~pymc_dp.mechanisms.ReleaseCounter`), and the privacy
parameters of a step are read-only once it is built (:attr:`DPStep._privacy_parameters`).

A step holds the model's public :class:`~pymc_dp.parameter_space.ParameterSpace` (``space``),
a :class:`~pymc_dp.mechanisms.PrivateChannel` and the mechanisms bound to it; it never holds
the oracle. Its per-iteration cost is the composition of its mechanisms' privacy events
(:meth:`DPStep._events`).
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from abc import abstractmethod
from dataclasses import field
from typing import Any, ClassVar

import numpy as np
import pymc as pm
from pymc.step_methods.compound import BlockedStep, StepMethodState
from pymc.step_methods.state import dataclass_state
from pymc.util import get_random_generator, get_state_from_generator, random_generator_from_state
from rich.progress import TextColumn
from rich.table import Column

from pymc_dp._compat import chain_setup_from_caller
from pymc_dp._compile import backend_from_compile_kwargs
from pymc_dp.accounting import PrivacyBudget, compose, gaussian_epsilon
from pymc_dp.accounting._search import largest_fitting
from pymc_dp.accounting.costs import PrivacyCost, compose_epsilon
from pymc_dp.accounting.gaussian import gaussian_epsilon_curve
from pymc_dp.errors import (
    BudgetExceededError,
    InsufficientDataError,
    InvalidParameterError,
    PrivacyLeakError,
    PrivacyWarning,
    ReadOnlyParameterError,
)
from pymc_dp.mechanisms import PrivateChannel, ReleaseCounter
from pymc_dp.noise import NoiseSource
from pymc_dp.noncentred import CentredCoordinates, centred_coordinates
from pymc_dp.planning import plan_iterations
from pymc_dp.step_methods.initialization import (
    DEFAULT_INIT_SHARE,
    MAX_INIT_SHARE,
    PrivateStart,
    private_initialization,
)
from pymc_dp.step_methods.options import check_flag, check_fraction, check_noise_rng

__all__ = ["DPStep", "DPStepState"]

# Iterations reserved at a time when no sampling plan was given (plain ``pm.sample``).
_RESERVATION_BLOCK = 100
# iterations whose ε stat is computed together (one vectorised root-find, ~7 ms)
_EPSILON_BLOCK = 512
# The default plan of a step on automatic settings: chains, and the range of each chain's
# length (tuning included) that the noise is calibrated for.
DEFAULT_CHAINS = 4
_MIN_CHAIN_LENGTH = 50
_MAX_CHAIN_LENGTH = 4000


def _given_length(tune: float | int, draws: int | None, default: int | None = None) -> int | None:
    """Iterations per chain asked for, or ``None`` where the step's plan decides.

    ``tune + draws`` when both are counts. With ``draws`` a count and ``tune`` a fraction ``f``
    of each chain: ``None`` when ``⌊f·default⌋ + draws`` fits in the ``default`` planned length
    (as without ``draws``), else the shortest chain whose first ``⌊f·length⌋`` iterations leave
    ``draws`` (``draws = 8000`` at ``f = 0.2``: 10 000), so asking for more draws than the
    default plan holds gives a longer chain with more noise per iteration, not an error.
    """
    if isinstance(draws, bool) or not isinstance(draws, int | np.integer) or draws < 1:
        return None
    if isinstance(tune, int | np.integer) and not isinstance(tune, bool):
        return int(tune) + int(draws)
    if not (isinstance(tune, float | np.floating) and 0.0 <= tune < 1.0):
        return None
    if default is not None and math.floor(float(tune) * default) + int(draws) <= default:
        return None
    # the shortest: L − ⌊f·L⌋ grows by 0 or 1 with L, lies in (L(1 − f), L(1 − f) + 1], so
    # the shortest L is above (draws − 1)/(1 − f) (one less, for rounding)
    length = max(int(draws), math.floor((int(draws) - 1) / (1.0 - float(tune))) - 1)
    while length - math.floor(float(tune) * length) < int(draws):
        length += 1
    return length


@dataclass_state
class DPStepState(StepMethodState):
    """A DP step's restorable state (``step.sampling_state``): public state only.

    ``public`` holds the chain's public state (tuning, adaptation, the cached log-prior);
    ``noise`` the secret generator's state, only when the noise is reproducible (a seeded
    ``noise_rng``, for tests and research). Restoring never rewinds privacy accounting: the
    iteration count, the reservation and the release counter go on, so a restored chain's
    releases are counted again; with secret (OS-entropy) noise the noise is never replayed.
    """

    tune: bool = field(default=True)
    public: dict = field(default_factory=dict)
    noise: Any = field(default=None)


class DPStep(BlockedStep):
    """Base class of the DP step methods (not used directly)."""

    _state_class = DPStepState
    #: Per-chain public attributes restored with ``sampling_state`` (subclasses add theirs).
    _chain_state: ClassVar[tuple[str, ...]] = ("_last_logprior", "_last_reported")
    #: A public affine map the draws are reported through (the chain's state is its preimage),
    #: e.g. ``DPPenalty``'s noise-aware stretch; ``None``: the states as they are.
    _stretch: Any = None
    #: The last ``(state, reported draw)``: the next iteration starts from that exact state.
    _last_reported: tuple[np.ndarray, np.ndarray] | None = None

    default_blocked = True
    #: Shortest chain (tuning included) the automatic noise is calibrated for.
    _min_chain_length: ClassVar[int] = _MIN_CHAIN_LENGTH
    stats_dtypes_shapes: ClassVar[dict] = {
        "accepted": (bool, []),
        "jump": (np.float64, []),
        "mu_spent": (np.float64, []),
        "epsilon_spent": (np.float64, []),
    }
    #: Data-dependent numbers computed without noise, kept only with nonprivate_diagnostics=True.
    _nonprivate_stats: ClassVar[dict] = {}
    #: Attributes that decide what a release costs or reveals: read-only once the step is built
    #: (subclasses add theirs). Changing one would make the releases differ from the reservation.
    _privacy_parameters: ClassVar[frozenset[str]] = frozenset(
        {
            "budget",
            "space",
            "_channel",
            "nonprivate_diagnostics",
            "noise_reproducible",
            "_noise_seed",
            "secure_noise",
            "init_share",
            "_private_start",
            "_coordinates",
        }
    )

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._privacy_parameters and self.__dict__.get("_built", False):
            raise ReadOnlyParameterError(
                f"{type(self).__name__}.{name} is a privacy parameter and cannot change after "
                "the step is built: the budget reserves what the step's parameters release. "
                f"Build a new {type(self).__name__} with {name.lstrip('_')}=... instead."
            )
        super().__setattr__(name, value)

    def _complete_build(self) -> None:
        """End of a subclass's ``__init__``: build now, or defer to :meth:`prepare`.

        A step with automatic settings (or an explicit ``init_share``) is built by
        :meth:`prepare`, after the private initialisation; an explicit one is built here.
        """
        self._built_in_process = os.getpid()  # a forked worker's copy must not prepare itself
        self._constructed = True
        if self.automatic or self.init_share:
            return
        self._configure(None)
        self._build_mechanisms(None)
        self._mechanisms_ready = True
        self._finish_build()

    def _finish_build(self) -> None:
        """Once the mechanisms are built: privacy parameters become read-only."""
        self._constructed = True
        self._mechanisms_ready = True
        if self.cost.gaussian_mu() is None:
            self._drop_stats("mu_spent")  # only a plain Gaussian cost has a PLD parameter μ
        n = self._channel.n_rows
        if self.budget.delta >= 1.0 / n:
            warnings.warn(
                f"delta = {self.budget.delta:g} is at least 1/n = 1/{n}: an (ε, δ)-DP release "
                "with δ ≥ 1/n allows publishing one individual's row outright. Use δ well below "
                f"1/n (e.g. delta={0.1 / n:.1g}, the seeds' 0.1/n).",
                PrivacyWarning,
                stacklevel=3,
            )
        self._built = True

    def __init__(
        self,
        vars: Any = None,
        *,
        budget: PrivacyBudget,
        model: pm.Model | None = None,
        noise_rng: int | None = None,
        secure_noise: bool = True,
        row_data: Any = None,
        nonprivate_diagnostics: bool = False,
        blocked: bool = True,
        rng: Any = None,
        init_share: float | None = None,
        compile_kwargs: dict[str, Any] | None = None,
        centre_hierarchies: bool = True,
    ) -> None:
        model = pm.modelcontext(model)
        backend = backend_from_compile_kwargs(compile_kwargs)
        noise_rng = check_noise_rng(noise_rng)
        nonprivate_diagnostics = check_flag(nonprivate_diagnostics, "nonprivate_diagnostics")
        if not isinstance(budget, PrivacyBudget):
            raise InvalidParameterError(
                f"budget must be a pymc_dp.PrivacyBudget, got {type(budget).__name__}. Create "
                "one with pymc_dp.PrivacyBudget(epsilon=..., delta=...)."
            )
        if not check_flag(blocked, "blocked"):
            raise InvalidParameterError(
                f"{type(self).__name__} must update all variables together (blocked=True): one "
                "step per variable would read the data once per variable."
            )
        value_vars = (
            list(model.value_vars)
            if vars is None
            else [model.rvs_to_values.get(v, v) for v in vars]
        )
        missing = [v.name for v in model.value_vars if v not in value_vars]
        if missing:
            raise PrivacyLeakError(
                f"{type(self).__name__} must sample every free variable, but {missing} are not in "
                "vars: pm.sample would give them to NUTS or Metropolis, which read the raw data "
                "without noise. Leave vars=None (all free variables)."
            )
        # a non-centred hierarchy is sampled in its centred coordinates (a change of variables
        # of the parameters: pymc_dp.noncentred); the draws are reported in the model's own
        coordinates = (
            centred_coordinates(model)
            if check_flag(centre_hierarchies, "centre_hierarchies")
            else None
        )
        self._coordinates = coordinates
        sampled = model if coordinates is None else coordinates.centred_model
        self._channel = PrivateChannel.open(
            sampled, value_vars if coordinates is None else None, row_data=row_data, backend=backend
        )
        self.space = self._channel.space
        self.vars = list(self.space.value_vars) if coordinates is None else list(model.value_vars)
        self._check_published_deterministics()  # the oracle checked the centred model's
        self.budget = budget
        self.nonprivate_diagnostics = nonprivate_diagnostics
        if self.nonprivate_diagnostics:  # opt-in, recorded, and loud: the release is not DP
            warnings.warn(
                f"{type(self).__name__}(nonprivate_diagnostics=True) stores statistics computed "
                "from the data without noise (clip counts) at every iteration: the output is "
                "NOT differentially private and its privacy metadata say so. Use it on "
                "synthetic or public data only.",
                PrivacyWarning,
                stacklevel=3,
            )
            shapes = {**type(self).stats_dtypes_shapes, **self._nonprivate_stats}
            self.stats_dtypes_shapes = shapes
            self.stats_dtypes = [{name: dtype for name, (dtype, _) in shapes.items()}]
        self.noise_reproducible = noise_rng is not None
        self._noise_seed = noise_rng
        self.secure_noise = check_flag(secure_noise, "secure_noise")
        if init_share is not None and init_share != 0:
            init_share = check_fraction(init_share, "init_share")
        self.init_share = init_share
        self._private_start: PrivateStart | None = None
        self._planned_iterations: int | None = None
        self._planned_chains: int | None = None
        self._planned_tune: int | None = None
        self._epsilon_points: dict[tuple, float] = {}  # ε of a non-Gaussian cost, by point
        # True until PyMC calls stop_tuning (worker processes get a copy and no other signal)
        self.tune = True
        self.rng = np.random.default_rng(rng)  # a Generator passes through unchanged
        self._setup_chain()

    @property
    def compile_backend(self) -> str | None:
        """What the per-row functions compile to: None (PyTensor's default) or ``"JAX"``."""
        return self._channel.backend

    # ---------------------------------------------------------------- what subclasses provide

    @abstractmethod
    def _events(self) -> list[PrivacyCost | tuple[PrivacyCost, int]]:
        """The privacy events of one iteration: ``(mechanism.event, calls)`` per mechanism."""

    @property
    def cost(self) -> PrivacyCost:
        """Privacy cost of one iteration: the composition of its mechanisms' events."""
        if not (self.prepared or self.__dict__.get("_mechanisms_ready", False)):
            raise InvalidParameterError(
                f"This {type(self).__name__} chooses its settings privately from the data and "
                "has not done so yet, so its cost per iteration is not known. Call "
                "step.prepare(chains=...) (pymc_dp.sample and step.sampling_kwargs do)."
            )
        # composed once per set of events: every iteration asks for it (its stats, its spend)
        events = tuple(self._events())
        cached = self.__dict__.get("_cost_cache")
        if cached is None or cached[0] != events:
            cached = (events, compose(*events))
            self.__dict__["_cost_cache"] = cached
        return cached[1]

    @property
    def uniform_cost(self) -> bool:
        """Whether every iteration costs :attr:`cost` (false under a step-size schedule, whose
        later iterations cost less: :meth:`chain_spending`)."""
        return True

    def chain_spending(self, first: int, last: int) -> list[tuple[PrivacyCost, int]]:
        """The cost of a chain's iterations ``first, …, last − 1``: ``(cost, iterations)`` pairs.

        One pair per stage of constant cost, in order; a step whose iterations all cost
        :attr:`cost` has one. This is what a chain reserves in the ledger and what its
        ``epsilon_spent`` composes.
        """
        count = int(last) - int(first)
        return [(self.cost, count)] if count > 0 else []

    # ---------------------------------------------------------------- automatic settings

    @property
    def automatic(self) -> bool:
        """Whether some privacy setting is left to the private initialisation."""
        return bool(self._automatic_settings())

    def _automatic_settings(self) -> list[str]:
        """Names of the settings left automatic (subclasses with automatic settings override)."""
        return []

    @property
    def prepared(self) -> bool:
        """Whether the step's privacy parameters are fixed (explicit, or privately chosen)."""
        return bool(self.__dict__.get("_built", False))

    @property
    def private_start(self) -> PrivateStart | None:
        """What the private initialisation released (``None`` before it, or without one)."""
        return self._private_start

    def _configure(self, start: PrivateStart | None) -> None:
        """Fix the automatic settings from the private start, except the noise (subclasses)."""

    def _unit_cost(self, scale: float) -> PrivacyCost:
        """Cost of one iteration when the automatic noise is ``scale`` times its target."""
        raise NotImplementedError

    def _build_mechanisms(self, noise_scale: float | None) -> None:
        """Build the mechanisms; ``noise_scale`` multiplies the target noise (automatic noise)."""
        raise NotImplementedError

    def _noise_is_automatic(self) -> bool:
        return False

    def _default_tune_fraction(self) -> float:
        """Share of each chain ``pymc_dp.sample`` tunes for when not told: 0.5 (subclasses
        whose private start is already in the bulk tune less)."""
        return 0.5

    def _before_preparing(self) -> None:
        """Public checks when the step is first prepared, before anything reads the data
        (warnings about what the model's graph shows)."""

    def _refine_initialization(self) -> bool:
        """Whether the default initialisation may refine the mode (a further reservation)."""
        return True

    def _needs_ratio_clip(self) -> bool:
        """Whether the initialisation should choose a plain ratio's clip (its histogram costs a
        share of the budget; default: no, the step releases no plain ratio)."""
        return False

    def _after_initialization(
        self, start: PrivateStart, chains: int, length: int | None
    ) -> PrivateStart:
        """Further accounted releases a step needs after the initialisation (default: none).

        ``chains`` and ``length`` (iterations per chain, ``None`` when not given) are the plan.
        Returns the start with their ``μ`` and phases added, for the privacy report."""
        return start

    def prepare(
        self, chains: int = DEFAULT_CHAINS, tune: float | int = 0.5, draws: int | None = None
    ) -> tuple[int, int]:
        """Choose the automatic settings privately and plan ``chains`` chains; ``(tune, draws)``.

        On a step with automatic settings, the first call runs the private initialisation
        (:mod:`pymc_dp.step_methods.initialization`, at most ``init_share`` of the budget's
        capacity, reserved in the ledger before each read): it finds a start, a scale, and the
        clip bounds. The noise
        is then calibrated budget-first (:meth:`PrivacyBudget.calibrate_noise`) so that
        ``chains`` chains of the planned length spend the rest of the budget exactly; the
        default length gives each release a noise near the step's target (a few nats for a
        ratio) within ``[200, 4000]`` iterations per chain, and ``tune``/``draws`` counts fix it
        instead. Later calls (and explicit steps) only plan (:func:`plan_iterations`).
        """
        if self.prepared:
            return plan_iterations(self, chains=chains, tune=tune, draws=draws)
        n_chains = chains
        if isinstance(n_chains, bool) or not isinstance(n_chains, int | np.integer) or chains < 1:
            raise InvalidParameterError(f"chains must be a positive integer, got {chains!r}.")
        self._before_preparing()
        start = None
        share = DEFAULT_INIT_SHARE if self.init_share is None else self.init_share
        if share:
            self._channel.start_chain(
                NoiseSource.for_chain(self._noise_seed, self.rng, secure=self.secure_noise)
            )
            theta0 = self.space.ravel(self._channel.model.initial_point())
            reservations = len(self.budget.history())
            try:
                start = private_initialization(
                    self._channel,
                    self.budget,
                    theta0,
                    share=share,
                    # on the default share, a refinement may add more while the mode is
                    # uncertain
                    max_share=(
                        MAX_INIT_SHARE
                        if self.init_share is None and self._refine_initialization()
                        else None
                    ),
                    public_rng=np.random.default_rng(self.rng.integers(2**63)),
                    ratio_clip=self._needs_ratio_clip(),
                )
                length = self._requested_length(tune, draws)
                self._private_start = self._after_initialization(start, int(chains), length)
            except InsufficientDataError as err:
                if len(self.budget.history()) == reservations:
                    raise  # refused before reserving anything (public numbers only)
                # refused after reading: say what the refused preparation has cost
                raise InsufficientDataError(
                    f"{err} {self.budget.spent_summary()}, this refused preparation's "
                    "reservations included: each was made before its reads and stays spent."
                ) from err
            start = self._private_start
        elif self.automatic:
            raise InvalidParameterError(
                f"init_share=0 leaves no budget to choose {self._automatic_settings()} "
                "privately: give them explicitly, or leave init_share unset."
            )
        self._configure(start)
        noise_scale = None
        if self._noise_is_automatic():
            length = self._chain_length(chains, tune, draws)
            noise_scale = self.budget.calibrate_noise(self._unit_cost, int(chains) * length)
        self._build_mechanisms(noise_scale)
        self._mechanisms_ready = True
        self._finish_build()
        self._setup_chain()
        return plan_iterations(self, chains=chains, tune=tune, draws=draws)

    def _requested_length(self, tune: float | int, draws: int | None) -> int | None:
        """The chain length ``tune`` and ``draws`` ask for (:func:`_given_length`), ``None``
        where the plan decides; a step with a planned default length passes it."""
        return _given_length(tune, draws)

    def _chain_length(self, chains: int, tune: float | int, draws: int | None) -> int:
        """Each chain's planned length: given counts, else the target noise's (clamped), or
        longer where ``draws`` ask for more (:func:`_given_length`)."""
        planned = self._budget_length(chains)
        given = _given_length(tune, draws, planned)
        return planned if given is None else given

    def _budget_length(self, chains: int) -> int:
        """Iterations per chain the rest of the budget buys at the target noise (clamped)."""
        remaining = self.budget.report().remaining_mu
        mu_target = self._unit_cost(1.0).gaussian_mu()
        if remaining is None or mu_target is None or mu_target <= 0:
            return self._min_chain_length
        length = int(remaining / mu_target) // int(chains)
        return min(max(length, self._min_chain_length), _MAX_CHAIN_LENGTH)

    @property
    def model(self) -> pm.Model | None:
        """The model the step was built on (``None`` in a pickled copy)."""
        if self._coordinates is not None:
            return self._coordinates.published_model
        return self._channel.model

    @property
    def centred_coordinates(self) -> CentredCoordinates | None:
        """The centred coordinates this step samples a non-centred hierarchy in (``None``: the
        model's own coordinates; :mod:`pymc_dp.noncentred`)."""
        return self._coordinates

    def _sampled_point(self, point: dict[str, Any]) -> dict[str, Any]:
        """The point of the sampled coordinates for a point of the model."""
        return point if self._coordinates is None else self._coordinates.to_centred(point)

    def _model_point(self, point: dict[str, Any]) -> dict[str, Any]:
        """The point of the model for a point of the sampled coordinates (post-processing)."""
        return point if self._coordinates is None else self._coordinates.to_published(point)

    def _check_published_deterministics(self) -> None:
        """The deterministics ``pm.sample`` stores are the model's, not the centred model's:
        checked at the build, before the first read and before the step is pickled (a worker
        process's copy has no model to check)."""
        model = self.model
        if self._coordinates is not None and model is not None:
            self._channel.check_deterministics(model)

    def __getstate__(self) -> dict[str, Any]:
        self._check_published_deterministics()
        state = dict(super().__getstate__())  # a copy: object's is the live __dict__
        if "_last_step" in state:  # the last point returned: a shortcut of this process only
            state["_last_step"] = None
        return state

    @property
    def counter(self) -> ReleaseCounter:
        """This chain's release counter."""
        return self._channel.counter

    @property
    def noise(self) -> NoiseSource:
        """This chain's secret noise source."""
        return self._channel.noise

    def check_model_unchanged(self) -> None:
        """Refuse a model changed since the build: data set with ``pm.set_data``
        (:class:`~pymc_dp.errors.DataChangedError`) or a deterministic that reads row data
        (:class:`~pymc_dp.errors.PrivacyLeakError`). Reads no data values into any output."""
        self._channel.check_data_unchanged()
        self.check_deterministics()

    def check_deterministics(self) -> None:
        """Refuse the model's deterministics that read row data, ones added after the build
        too: ``pm.sample`` stores them at every draw (:class:`~pymc_dp.errors.PrivacyLeakError`).
        """
        self._channel.check_deterministics()
        self._check_published_deterministics()

    @abstractmethod
    def _iterate(self, theta: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """One iteration from θ: the new θ and the subclass's stats (``accepted``, ``jump``)."""

    def _reset_adaptation(self) -> None:
        """Reset per-chain adaptation state (subclasses with tuning override)."""

    def _logprior_at(self, theta: np.ndarray) -> float:
        """``log p(θ)``, reusing the value of the state the last iteration ended in."""
        cached = self._last_logprior
        if cached is not None and np.array_equal(cached[0], theta):
            return cached[1]
        return self.space.logprior(theta)

    def _remember_logprior(self, theta: np.ndarray, logprior: float) -> None:
        self._last_logprior = (theta, logprior)

    # ---------------------------------------------------------------- planning

    def sampling_kwargs(self, chains: int = 4, tune_fraction: float = 0.5) -> dict[str, int]:
        """``draws``, ``tune`` and ``chains`` for ``pm.sample`` that spend exactly this budget.

        Every chain reads the same data, so chains compose; tuning iterations count like any
        other. The split is :func:`pymc_dp.planning.plan_iterations`'s with
        ``tune=tune_fraction``; each chain then reserves exactly ``tune + draws`` iterations at
        its first step.
        """
        if tune_fraction != 0:
            tune_fraction = check_fraction(tune_fraction, "tune_fraction")
        n_tune, n_draws = self.prepare(chains=chains, tune=float(tune_fraction))
        self.plan(tune=n_tune, draws=n_draws, chains=chains)
        return {"draws": n_draws, "tune": n_tune, "chains": chains}

    def plan(self, *, tune: int, draws: int, chains: int | None = None) -> None:
        """Tell the step each chain's length, so a chain reserves exactly ``tune + draws``."""
        self._planned_iterations = int(tune) + int(draws)
        self._planned_tune = int(tune)
        if chains is not None:
            self._planned_chains = int(chains)

    # ---------------------------------------------------------------- per-chain lifecycle

    def set_rng(self, rng: Any) -> None:
        """PyMC 5 calls this at the start of every chain: reset the per-chain state.

        The chain's length is read from PyMC's sampler (:mod:`pymc_dp._compat`). Sequential
        chains get ``step.tune = bool(tune)`` right after this; worker processes get no other
        signal than ``stop_tuning`` at ``draw == tune``, so every chain starts tuning.
        """
        setup = chain_setup_from_caller()
        tune = True if setup.tune is None else setup.tune > 0
        self._start_chain(rng, setup.iterations, setup.tune, tune, setup.compound)

    def setup_chain(self, rng: Any, tune: int, draws: int) -> None:
        """PyMC 6 calls this at the start of every chain with its tuning and draw counts."""
        setup = chain_setup_from_caller()
        self._start_chain(rng, int(tune) + int(draws), int(tune), int(tune) > 0, setup.compound)

    def _start_chain(
        self, rng: Any, iterations: int | None, tune: int | None, tuning: bool, compound: Any
    ) -> None:
        self.rng = get_random_generator(rng, copy=False)
        self.tune = tuning
        self._check_compound(compound)
        if iterations is not None and tune is not None:
            self._planned_iterations = iterations
            self._planned_tune = tune
        self._setup_chain()

    def _check_compound(self, compound: Any) -> None:
        """Remember a refusal if PyMC runs this step beside a non-DP step (raised before reading).

        ``pm.sample(step=[dp_step, pm.NUTS([mu])])`` gives ``mu`` to NUTS as well, which reads the
        raw data at every leapfrog step and stores its exact log-density (``lp``). Two DP steps
        together are allowed only when they share one budget (the same ledger and dataset).
        """
        self._compound_refusal = None
        self._stretch_off = False
        if compound is None:
            return
        others = [m for m in compound.methods if m is not self]
        # beside another step, that step would take this one's reported draw as its state: the
        # draws are then reported as they are
        self._stretch_off = bool(others)
        foreign = [type(m).__name__ for m in others if not isinstance(m, DPStep)]
        ledgers = {
            (m.budget.ledger_path, m.budget.dataset) for m in others if isinstance(m, DPStep)
        }
        if foreign:
            self._compound_refusal = PrivacyLeakError(
                f"{type(self).__name__} is running beside {foreign} in one pm.sample call. Those "
                "steps read the raw data without noise (and store exact log-densities), so the "
                f"output would not be private. Give only the {type(self).__name__} to pm.sample "
                "(step=dp_step): it samples every free variable. The DP step read nothing; a "
                "step that ran before it in this compound may have: do not publish its output."
            )
        elif ledgers - {(self.budget.ledger_path, self.budget.dataset)}:
            self._compound_refusal = PrivacyLeakError(
                "Several DP steps with different privacy budgets are running in one pm.sample "
                "call: they read the same data, so they must share one PrivacyBudget. Nothing "
                "was read."
            )

    def _setup_chain(self) -> None:
        # Secret noise from OS entropy, never derived from random_seed (reproducible noise for
        # tests and research mixes the noise seed with this chain's public generator state).
        self._channel.start_chain(
            NoiseSource.for_chain(self._noise_seed, self.rng, secure=self.secure_noise)
        )
        self._last_logprior: tuple[np.ndarray, float] | None = None
        self._last_reported = None
        self._reservations: list = []  # the chain's ledger reservations, oldest first
        self._reserved = 0
        self._chain_mu: float | None = None  # μ per iteration once reserved (uniform Gaussian)
        # the point the last iteration returned, its arrays and the chain's state there
        self._last_step: tuple[dict, dict, np.ndarray] | None = None
        self._iteration = 0
        self._reset_adaptation()

    def _before_first_read(self, theta: np.ndarray) -> None:
        """A chain's checks before it reads anything (see the module docstring)."""
        if getattr(self, "_compound_refusal", None) is not None:
            raise self._compound_refusal
        self._check_published_deterministics()
        self._channel.check_before_reading(theta)

    def _reserve(self) -> None:
        """Reserve iterations before reading data (atomic across processes).

        A chain whose length PyMC told the step (or that was planned) reserves exactly that
        many; otherwise blocks of up to ``_RESERVATION_BLOCK``, never more than fits.
        """
        planned = self._planned_iterations
        start = self._reserved
        if planned is not None and start == 0:
            wanted = planned
        elif self.budget.fits_spending(self.chain_spending(start, start + _RESERVATION_BLOCK)):
            wanted = _RESERVATION_BLOCK  # one check, no search
        else:
            wanted = self._iterations_that_fit(start)
        if wanted < 1:
            raise BudgetExceededError(
                f"{self.budget.spent_summary()}; not one more iteration of "
                f"{type(self).__name__} fits (this chain ran {self._iteration}). Nothing more "
                "was read; the draws so far are all this budget buys. Plan runs with "
                "pymc_dp.sample or step.sampling_kwargs(chains=...)."
            )
        parts = self.chain_spending(start, start + wanted)  # all stages in one transaction
        self._reservations.extend(self.budget.reserve_parts(parts, mechanism=type(self).__name__))
        for cost, count in parts:
            self.counter.allow(cost, count)
        self._reserved += wanted
        # what every iteration's stats report, fixed with the reservation (the cost cannot
        # change: the counter refuses a release the reservation does not cover)
        mu = self.cost.gaussian_mu() if self.uniform_cost else None
        self._chain_mu = mu if mu is not None and mu > 0 else None

    def _iterations_that_fit(self, start: int) -> int:
        """How many more iterations from this chain's iteration ``start`` the budget allows."""
        if self.uniform_cost:
            return self.budget.iterations(self.cost)
        return largest_fitting(
            lambda k: self.budget.fits_spending(self.chain_spending(start, start + k)),
            _RESERVATION_BLOCK,
        )

    def _spend_iteration(self) -> None:
        """Record one iteration against the chain's oldest reservation that has room."""
        while self._reservations[0].remaining == 0:
            self._reservations.pop(0)
        self._reservations[0].spend(1)

    # ---------------------------------------------------------------- PyMC step

    def step(self, point: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[dict]]:
        last = self._last_step  # None before a chain's first iteration (_setup_chain)
        if last is not None and point is last[0] and self._unchanged(point, last[1]):
            theta = last[2]  # the state the last iteration ended in, not re-read
        else:
            given = self.space.ravel(self._sampled_point(point))
            theta = self._chain_theta(given)
        if self._iteration >= self._reserved:
            if not self.prepared:
                self._prepare_in_chain()
            if self._reserved == 0:
                self._before_first_read(given)
                if self._private_start is not None:  # public: post-processing of releases
                    theta = self._private_start.dispersed_start(self.rng)
            elif self._planned_iterations is not None:
                raise BudgetExceededError(
                    f"This chain reserved {self._reserved} iterations (tune + draws) and was asked "
                    "for more; nothing more was read. Use the draws/tune of "
                    "step.sampling_kwargs(chains=...)."
                )
            self._reserve()
        new_theta, stats = self._iterate(theta)
        self._iteration += 1
        self._spend_iteration()
        stats.update(self._spent(self._iteration))
        stats = {name: stats[name] for name in self.stats_dtypes_shapes}  # drops the non-private
        draw = np.array(self._reported_theta(new_theta), copy=True)
        draw.flags.writeable = False  # its views stay read-only: the next call trusts them
        reported = self._model_point(self.space.unravel(draw))
        for value in reported.values():
            if isinstance(value, np.ndarray):
                value.flags.writeable = False
        out = {**point, **reported}
        self._last_step = (out, reported, new_theta)
        return out, [stats]

    @staticmethod
    def _unchanged(point: dict[str, Any], values: dict[str, Any]) -> bool:
        """Whether ``point`` still holds the very (read-only) arrays this step returned in it."""
        return all(point.get(name) is value for name, value in values.items())

    def _stretching(self) -> bool:
        """Whether the draws are reported through ``_stretch`` (not beside another step)."""
        return self._stretch is not None and not self.__dict__.get("_stretch_off", False)

    def _chain_theta(self, reported: np.ndarray) -> np.ndarray:
        """The chain's state for the draw PyMC hands back (the preimage under ``_stretch``)."""
        if not self._stretching():
            return reported
        last = self._last_reported
        if last is not None and np.array_equal(last[1], reported):
            return last[0]  # exactly the state the last iteration ended in
        return self._stretch.internal(reported)

    def _reported_theta(self, theta: np.ndarray) -> np.ndarray:
        """The draw released for the state ``θ``: ``_stretch``'s image (post-processing), or
        ``θ`` itself where the image would leave the support."""
        if not self._stretching():
            return theta
        last = self._last_reported
        if last is not None and np.array_equal(last[0], theta):
            return last[1]  # a rejection: the state, and so its draw, as before
        reported = self._stretch.reported(theta)
        if not self.space.in_support(reported):
            reported = np.array(theta, copy=True)
        self._last_reported = (np.array(theta, copy=True), reported)
        return reported

    def _prepare_in_chain(self) -> None:
        """Plain ``pm.sample`` with a step that was never prepared: prepare it here, once.

        Only the step object built in this session can (sequential chains share it); a copy in a
        worker process would run its own initialisation per chain. A spawned worker's copy has
        no model; a forked one (``mp_ctx="fork"``, PyMC's default on Linux up to Python 3.13)
        keeps it, and is told apart by its process.
        """
        if not self.__dict__.get("_constructed", False):
            raise InvalidParameterError(
                f"{type(self).__name__} was not fully built (its __init__ did not finish)."
            )
        if self.model is None or self.__dict__.get("_built_in_process") != os.getpid():
            raise InvalidParameterError(
                f"This {type(self).__name__} chooses its settings privately, once, before "
                "sampling, but pm.sample copied it to worker processes first. Use "
                "pymc_dp.sample(step), or pm.sample(step=step, **step.sampling_kwargs(chains=4))."
            )
        planned = self._planned_iterations
        tune = self._planned_tune
        if planned is not None and tune is not None and planned > tune:
            self.prepare(chains=DEFAULT_CHAINS, tune=tune, draws=planned - tune)
        else:
            self.prepare(chains=DEFAULT_CHAINS)
        self._planned_iterations, self._planned_tune = planned, tune

    # ---------------------------------------------------------------- restorable state

    @property
    def sampling_state(self) -> DPStepState:
        """The chain's restorable public state (:class:`DPStepState`)."""
        noise = self.noise
        return DPStepState(
            var_names=[v.name for v in self.vars],
            rng=get_state_from_generator(self.rng),
            tune=bool(self.tune),
            public={name: copy.deepcopy(getattr(self, name)) for name in self._chain_state},
            noise=copy.deepcopy(noise.state) if noise.reproducible else None,
        )

    @sampling_state.setter
    def sampling_state(self, state: DPStepState) -> None:
        if not isinstance(state, DPStepState):
            raise InvalidParameterError(
                f"sampling_state must be a DPStepState (from {type(self).__name__}."
                f"sampling_state), got {type(state).__name__}."
            )
        names = [v.name for v in self.vars]
        if list(state.var_names) != names:
            raise InvalidParameterError(
                f"This sampling state is for {list(state.var_names)}, not {names}."
            )
        self.rng = random_generator_from_state(copy.deepcopy(state.rng))
        self.tune = bool(state.tune)
        for name, value in state.public.items():
            if name in self._chain_state:
                setattr(self, name, copy.deepcopy(value))
        if state.noise is not None and self.noise.reproducible:
            self.noise.state = copy.deepcopy(state.noise)
        self._last_step = None  # the next point is read, not taken for the last one returned

    # ---------------------------------------------------------------- progress bar

    @staticmethod
    def _progressbar_config(n_chains: int = 1) -> tuple[list, dict]:
        """PyMC's progress bar shows each chain's privacy spend (its own ε at the budget's δ)."""
        columns = [
            TextColumn(
                "{task.fields[epsilon_spent]:0.3g}", table_column=Column("ε spent", ratio=1)
            ),
        ]
        return columns, {"epsilon_spent": [0.0] * n_chains}

    @staticmethod
    def _make_progressbar_update_functions() -> tuple:
        def update_stats(step_stats: dict[str, Any]) -> dict[str, Any]:
            return {"epsilon_spent": step_stats["epsilon_spent"]}

        return (update_stats,)

    def _spent(self, iterations: int) -> dict[str, float]:
        """What the accountant charges this chain after ``iterations`` (its ``μ`` and ε at δ).

        Every iteration costs its full ``μ``, even one that made fewer releases (a diverging
        DP-HMC trajectory stops early); under a step-size schedule the chain's iterations are
        composed stage by stage (:meth:`chain_spending`). A cost that is not a plain Gaussian
        (a subsampled release) has no ``μ``; its ε is composed numerically (about 0.2 s per
        evaluation, more with many stages), so it is evaluated only at powers of two and at
        the chain's reservation, and iteration ``k`` reports the value at the next such point:
        an upper bound (ε grows with ``k``) that is exact at the end of a planned chain.
        """
        mu_1 = self.__dict__.get("_chain_mu")
        if mu_1 is not None:  # the chain's reservation fixed it (every iteration asks)
            epsilon = self._gaussian_epsilon_at(iterations, mu_1)
            return {"mu_spent": iterations * mu_1, "epsilon_spent": epsilon}
        if self.uniform_cost:
            mu_per_iteration = self.cost.gaussian_mu()
            mu = None if mu_per_iteration is None else iterations * mu_per_iteration
        else:
            parts = [(c.gaussian_mu(), k) for c, k in self.chain_spending(0, iterations)]
            gaussian = all(m is not None for m, _ in parts)
            mu = sum(m * k for m, k in parts) if gaussian else None
        if mu is None:
            return {"epsilon_spent": self._epsilon_at_most(iterations)}
        if self.uniform_cost and mu_per_iteration > 0:
            epsilon = self._gaussian_epsilon_at(iterations, mu_per_iteration)
            return {"mu_spent": mu, "epsilon_spent": epsilon}
        epsilon = float(gaussian_epsilon(self.budget.delta, mu)) if mu > 0 else 0.0
        return {"mu_spent": mu, "epsilon_spent": epsilon}

    def _gaussian_epsilon_at(self, iterations: int, mu_1: float) -> float:
        """ε at the budget's δ after ``iterations`` of a uniform Gaussian cost ``μ₁`` (exact).

        A scalar root-find per iteration cost more than a pass over 10⁵ rows; the values for
        the next block of iterations are found together (:func:`gaussian_epsilon_curve`) and
        kept. ``μ`` is ``iterations · μ₁`` as in :meth:`_spent`.
        """
        key = (mu_1, self.budget.delta)
        table = self.__dict__.get("_epsilon_table")
        if table is None or table[0] != key or not 0 <= iterations - table[1] < table[2].size:
            ks = np.arange(iterations, iterations + _EPSILON_BLOCK, dtype=float)
            table = (key, iterations, gaussian_epsilon_curve(self.budget.delta, ks * mu_1))
            self._epsilon_table = table
        return float(table[2][iterations - table[1]])

    def _epsilon_at_most(self, iterations: int) -> float:
        if iterations <= 0:
            return 0.0
        point = min(1 << (iterations - 1).bit_length(), max(self._reserved, iterations))
        key = (self.cost, self.budget.delta, point)
        if key not in self._epsilon_points:
            if self.uniform_cost:
                epsilon = self.cost.epsilon(self.budget.delta, point)
            else:
                epsilon = compose_epsilon(self.chain_spending(0, point), self.budget.delta)[0]
            self._epsilon_points[key] = float(epsilon)
        return self._epsilon_points[key]

    def _drop_stats(self, *names: str) -> None:
        """Leave ``names`` out of this step's sample stats (e.g. ``mu_spent`` of a non-Gaussian)."""
        shapes = {k: v for k, v in self.stats_dtypes_shapes.items() if k not in names}
        self.stats_dtypes_shapes = shapes
        self.stats_dtypes = [{name: dtype for name, (dtype, _) in shapes.items()}]

    def privacy_metadata(self) -> dict[str, Any]:
        """A flat dict of scalars and strings: mechanism, parameters, budget, n, what was spent."""
        return {
            "dp_step": type(self).__name__,
            "dp_epsilon": self.budget.epsilon,
            "dp_delta": self.budget.delta,
            "dp_neighbouring_relation": "substitute one row",
            "dp_n_rows": self._channel.n_rows,
            "dp_noise_reproducible": int(self.noise_reproducible),
            "dp_secure_noise": int(self.secure_noise),
            "dp_nonprivate_diagnostics": int(self.nonprivate_diagnostics),
            "dp_iterations_this_chain": self._iteration,
            "dp_epsilon_this_chain": self._spent(self._iteration)["epsilon_spent"],
            **(
                {}
                if self._coordinates is None
                else {"dp_centred_coordinates": self._coordinates.describe()}
            ),
            **self._initialization_metadata(),
        }

    def _initialization_metadata(self) -> dict[str, Any]:
        start = self._private_start
        if start is None:
            return {"dp_private_initialization": 0}
        return {
            "dp_private_initialization": 1,
            "dp_init_share": float(start.mu / self.budget.capacity_mu),
            "dp_init_gradient_releases": int(start.releases),
            "dp_init_histograms": int(start.histograms),
            "dp_automatic_settings": ", ".join(self._automatic_settings()) or "none",
        }
