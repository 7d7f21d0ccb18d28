"""How the oracle compiles its PyTensor functions: PyTensor's default mode plus one rewrite.

Per-row gradient graphs divide row vectors by parameter-only quantities again and again (the
gradient of a Normal log-density is ``(y − μ)/σ/σ``). A division costs several times a
multiplication, and PyTensor keeps it, since ``x/c`` and ``x·(1/c)`` can differ in the last
bit. On this hot path (theory §2; ``benchmarks/oracle.py``) that difference is immaterial, so the
rewrite ``_divide_by_reciprocal`` turns ``x / c`` into ``x · (1/c)`` whenever ``c`` is broadcast
along an axis of the result: the reciprocal is then computed once per parameter instead of once
per row. (The two differ beyond rounding only where ``1/c`` overflows, ``|c| < 10⁻³⁰⁸``; a
gradient that becomes infinite there is zeroed by the clipping, like any non-finite one.) It
runs after the algebraic canonicalisation, which would turn it back into a division, and
before elementwise fusion.

Compiled functions are also remembered (:func:`cached_compile`): a step built on a model with
the same graph as an earlier one (a re-run cell, the same model at several budgets, a test
suite) gets the earlier functions instead of compiling them again, about 1 s per build.

The backend is PyTensor's default linker (C on PyTensor 2, Numba on PyTensor 3) or, on request,
JAX (``compile_kwargs={"mode": "JAX"}`` on a step): XLA fuses a pass over the rows into a few
kernels and runs it on a GPU when JAX has one. JAX traces a function for fixed input shapes, and
a per-row graph computes some sizes from the number of rows (an ``Alloc`` of the batch, a
``Split``'s sizes), which JAX cannot read from a traced value. :class:`StaticShapeFunction`
therefore compiles the graph once per set of input shapes, with those shapes written into the
graph, so that every size is a constant: one function per chunk length (the full chunk, the
last one, a minibatch).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from typing import Any

import numpy as np
import pytensor
import pytensor.scalar as ps
import pytensor.tensor as pt
from pytensor.compile.mode import Mode, get_default_mode, get_mode, optdb
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant, equal_computations
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.replace import clone_replace
from pytensor.graph.rewriting.basic import (
    MergeOptimizer,
    SequentialGraphRewriter,
    in2out,
    node_rewriter,
)
from pytensor.graph.traversal import ancestors, io_toposort
from pytensor.tensor.elemwise import Elemwise

from pymc_dp._batching import unbatching_rewriters
from pymc_dp.errors import BackendNotSupportedError, InvalidParameterError

__all__ = [
    "BACKENDS",
    "RewriteGroup",
    "StaticShapeFunction",
    "backend_from_compile_kwargs",
    "cached_compile",
    "check_backend",
    "compile_function",
    "gc_paused",
]

#: The backends the oracle's per-row functions compile for: PyTensor's default mode (``None``)
#: and JAX (``"JAX"``, PyTensor's JAX linker).
BACKENDS = (None, "JAX")


def check_backend(backend: Any) -> str | None:
    """``None`` or ``"JAX"`` (any case); refuses anything else, and JAX when it is missing."""
    if backend is None or (isinstance(backend, str) and backend.upper() == "FAST_RUN"):
        return None
    if not (isinstance(backend, str) and backend.upper() == "JAX"):
        raise InvalidParameterError(
            f"compile_kwargs={{'mode': {backend!r}}} is not supported: the per-row functions "
            "compile with PyTensor's default mode (mode None or 'FAST_RUN') or with JAX (mode "
            "'JAX'). Use compile_kwargs={'mode': 'JAX'}, or leave compile_kwargs unset."
        )
    if importlib.util.find_spec("jax") is None:
        raise InvalidParameterError(
            "compile_kwargs={'mode': 'JAX'} needs the jax package, which is not installed. "
            "Install it (pip install 'pymc-dp[jax]', or pip install jax) or leave "
            "compile_kwargs unset."
        )
    return "JAX"


def backend_from_compile_kwargs(compile_kwargs: Any) -> str | None:
    """The backend a step's ``compile_kwargs`` asks for (``{"mode": ...}``, as in PyMC's steps).

    Only ``mode`` is read: the per-row functions are compiled by the oracle with its own
    rewrites and input handling, so other ``pytensor.function`` options do not apply.
    """
    if compile_kwargs is None:
        return None
    if not isinstance(compile_kwargs, dict):
        raise InvalidParameterError(
            f"compile_kwargs must be a dict such as {{'mode': 'JAX'}}, got "
            f"{type(compile_kwargs).__name__}."
        )
    unknown = sorted(set(compile_kwargs) - {"mode"})
    if unknown:
        raise InvalidParameterError(
            f"compile_kwargs accepts only 'mode' (None or 'JAX') for a DP step; got {unknown}. "
            "The oracle compiles its functions with its own rewrites."
        )
    return check_backend(compile_kwargs.get("mode"))


def _divide_by_reciprocal_node(fgraph, node):
    """``x / c`` → ``x · (1/c)`` when ``c`` is broadcast along an axis of the output."""
    if not isinstance(node.op.scalar_op, ps.TrueDiv):
        return None
    numerator, denominator = node.inputs
    [out] = node.outputs
    if not (numerator.dtype == denominator.dtype == out.dtype and out.dtype.startswith("float")):
        return None
    broadcast = zip(denominator.type.broadcastable, out.type.broadcastable, strict=True)
    if not any(den and not res for den, res in broadcast):
        return None
    return [pt.mul(numerator, pt.reciprocal(denominator))]


# The decorated rewriter gets its own name: compiled functions (which pickle with their mode)
# then refer to the plain function by the module attribute that holds it.
_divide_by_reciprocal = node_rewriter([Elemwise])(_divide_by_reciprocal_node)


# The native batched forms of _batching run again after canonicalize/stabilize/specialize
# (≤ 3): a Blockwise whose core inputs only become constants there (a Split of an ordinal
# likelihood's per-row gradient: its axis) would otherwise loop over the rows in Python (the
# clipped gradient of the zoo's ordinal regression: 160x PyMC's logp+dlogp).
# After canonicalize/specialize/stabilize (≤ 3) and add/mul flattening (48); before fusion (49).
# The merge makes the reciprocals of one divisor (used by several divisions) one node, so the
# fused per-row loop reads each parameter-only value once (Normal model of the benchmark: from
# 9 such inputs to 4, and 0.55 → 0.44 ms per 10⁵ rows).
# Built on first use, not at import: importing pymc_dp does no PyTensor work.
@cache
def _mode(check_bounds: bool, backend: str | None = None) -> Any:
    gathers, splits, softmax_grads = unbatching_rewriters()
    base = (get_default_mode() if backend is None else get_mode(backend)).register(
        (gathers, 3.5),  # once constants are folded (see below)
        (splits, 3.51),
        (softmax_grads, 3.52),
        (in2out(_divide_by_reciprocal), 48.5),
        (MergeOptimizer(), 48.6),
    )
    return base.including(_CHECKS_TO_NINF if check_bounds else _CHECKS_REMOVED).excluding(
        *_UNUSED_REWRITES
    )


def c_backend(backend: str | None) -> bool:
    """Whether functions compiled for ``backend`` run on PyTensor's C backend (PyTensor 2's
    VM linker). There a matrix product is a node implemented in Python, so a per-row product
    with a small public matrix is faster in NumPy after the compiled pass (the centred
    gradient sum of a logistic regression, d = 10, n = 10⁵: 3.6 ms against 4.9 ms; with Numba
    2.1 ms compiled against 2.8 ms)."""
    from pytensor.link.vm import VMLinker

    return backend is None and isinstance(get_default_mode().linker, VMLinker)


# PyTensor 3's rewrites of a matrix product with a diagonal or selection (one-hot) operand,
# which ask its assumption system about both operands of every product, on every pass. A
# per-row graph multiplies row data by parameters, seldom a diagonal or one-hot matrix (where
# a product is then computed as written: the same values, a little slower), yet these two
# took 10–30 % of the rewriting of the zoo's per-row gradient functions (negative binomial
# GLM: 0.35 → 0.25 s; linear: 0.18 → 0.13 s). Absent from PyTensor 2: a no-op there.
_UNUSED_REWRITES = ("dot_diag_to_elemwise", "selection_dot_to_indexing")


# PyMC's own treatment of a failed parameter check (``sigma > 0`` on a value that underflowed):
# the log-density is −∞ there, not an exception (``pymc.pytensorf.compile``). With the model's
# ``check_bounds=False`` the checks are removed instead, as PyMC does.
_CHECKS_TO_NINF = "local_check_parameter_to_ninf_switch"
_CHECKS_REMOVED = "local_remove_check_parameter"


@contextlib.contextmanager
def without_traces() -> Iterator[None]:
    """Build graphs without PyTensor's creation tracebacks (``traceback__limit=0``).

    PyTensor records a stack trace on every variable it creates, to point an error at the
    user's line; it was 6–8 % of a step's build (the zoo's hierarchical model and mixture).
    The graphs built here are the package's own (clones of the model's terms), so their traces
    point into pymc_dp, and a failure on the data withholds PyTensor's text anyway
    (:meth:`~pymc_dp.oracle.RowLikelihood._private_call`). The flag is PyTensor's global
    configuration, restored on exit (an exception too): another thread building graphs at the
    same time gets no traces either.
    """
    with pytensor.config.change_flags(traceback__limit=0):
        yield


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Build and compile with Python's cyclic garbage collector paused (restored on exit).

    Graph building and rewriting allocate many short-lived objects, which trigger collections
    of the whole heap, and with PyMC, PyTensor and Numba loaded that heap is large: the first
    step built in a fresh process ran two or three full collections of 0.2–0.25 s each (PyMC 6:
    linear regression 1.2–1.3 s, ordinal regression 2.2–2.5 s; paused, none: 0.9–1.35 s and
    2.0–2.1 s). The garbage of a build is collected after it, when the collector runs next. A
    collector the caller had already disabled stays disabled; nested uses are one pause.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def compile_function(
    inputs: list[Any], outputs: Any, *, check_bounds: bool = True, backend: str | None = None
) -> Any:
    """Compile with the oracle's mode, and with input checks off.

    Every caller passes arrays of the placeholders' dtypes and shapes, so the per-call input
    validation (measurable at 10⁵ rows split into chunks) is skipped. A failed parameter check
    makes the log-density −∞ (``check_bounds=True``, PyMC's default) instead of raising. With
    ``backend="JAX"`` the result is a :class:`StaticShapeFunction`, compiled on first call for
    each set of input shapes; it returns NumPy arrays, like PyTensor's own functions.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend is not None:
        return StaticShapeFunction(inputs, outputs, check_bounds=check_bounds, backend=backend)
    with without_traces(), gc_paused():
        return _compile_now(list(inputs), outputs, bool(check_bounds), None)


def _trusting_function(inputs: list[Any], outputs: Any, mode: Any, **kwargs: Any) -> Any:
    """``pytensor.function`` with its per-call input checks off (the callers pass arrays of
    the placeholders' dtypes and shapes), ready to pickle."""
    fn = pytensor.function(inputs, outputs, mode=mode, **kwargs)
    fn.trust_input = True
    # Constant folding may have run a Blockwise of the original graph, which keeps a closure
    # on its node's tag; the function pickles that graph too (pm.sample's worker processes),
    # and a closure does not pickle. The folded result is already compiled.
    _drop_gufunc_closures(fn.maker.fgraph)
    return fn


def _compile_now(inputs: list[Any], outputs: Any, check_bounds: bool, backend: str | None) -> Any:
    mode = _mode(check_bounds, backend)
    return cached_compile(
        inputs,
        outputs,
        lambda: _trusting_function(inputs, outputs, mode),
        key=("oracle", check_bounds, backend),
    )


# PyTensor's rewrites in the order of their positions in its database: those before this
# position are the algebra of a graph (canonicalize, stabilize, specialize, the BLAS rewrites,
# this module's unbatching rewrites), those after it how one function runs (add/mul
# flattening at 48, this module's reciprocal rewrite, elementwise fusion at 49, in-place
# operations from 49.5). Both PyTensor 2 and 3 place them so.
_LATE_REWRITES_FROM = 47.5


class _LateMode(Mode):
    """The default mode's linker with its late rewrites only (:func:`_split_rewrites`).

    What PyTensor derives from the active mode (an inner graph's rewrites: the mode recorded on
    the graph while it is rewritten, ``including``, ``excluding``, ``requiring``) is the
    default mode's, so inner graphs are rewritten in full as before; a pickled copy (a
    compiled function travelling to a worker process) is this module's mode again. Only what
    ``pytensor.function`` uses is provided (not ``clone`` or ``register``).
    """

    def __init__(self, full: Mode, late: Any, check_bounds: bool) -> None:
        super().__init__(linker=full.linker, optimizer=late)
        self._full = full
        self._check_bounds = check_bounds

    @property
    def optimizer(self) -> Any:
        # PyTensor 3 records the mode a graph is compiled with while its rewrites run, and
        # rewrites an inner graph (an OpFromGraph, a Scan, an IfElse's branches) with that
        # mode's whole optimizer: it must be the default mode's, not the late part alone
        wrap = getattr(pytensor.compile.mode, "_ActiveModeGraphRewriter", None)
        return self._optimizer if wrap is None else wrap(self._optimizer, self._full)

    def including(self, *tags: str) -> Mode:
        return self._full.including(*tags)

    def excluding(self, *tags: str) -> Mode:
        return self._full.excluding(*tags)

    def requiring(self, *tags: str) -> Mode:
        return self._full.requiring(*tags)

    def __reduce__(self) -> tuple[Any, tuple[bool]]:
        return _late_mode, (self._check_bounds,)


def _late_mode(check_bounds: bool) -> _LateMode:
    return _split_rewrites(check_bounds)[1]


@cache
def _split_rewrites(check_bounds: bool) -> tuple[Any, _LateMode]:
    """The default mode's rewrites split at :data:`_LATE_REWRITES_FROM`: the early ones as one
    rewriter, and a mode with the late ones and the default linker.

    The rewrites are the ones the mode itself would run (on PyTensor 3 its query for the
    linker, without the BLAS rewrites Numba has no use for), taken from the mode's database.
    """
    mode = _mode(check_bounds, None)
    query = getattr(mode, "_optimizer", mode.provided_optimizer)
    database = getattr(mode, "optdb", optdb)
    extra = {id(rewrite): position for rewrite, position in query.extra_rewrites}
    early, late = [], []
    for rewrite in database.query(query).data:  # sorted by position
        position = extra.get(id(rewrite), database.__position__.get(rewrite.name, 0.0))
        (early if position < _LATE_REWRITES_FROM else late).append(rewrite)
    return SequentialGraphRewriter(*early), _LateMode(
        mode, SequentialGraphRewriter(*late), check_bounds
    )


class RewriteGroup:
    """Functions of one model compiled with their algebra rewritten once, together.

    A step's per-row functions (the log-likelihood, the clipped gradient sum, the compact
    per-row gradients, the centred passes) are built from the same per-row log-likelihood and
    gradient graph, and compiling each one through the whole rewrite pipeline rewrites that
    graph again each time: most of a step's build. Here the graphs of all of them form one
    ``FunctionGraph`` that the early rewrites (:func:`_split_rewrites`: canonicalisation,
    stabilisation, specialisation) run on once, when the first of them is compiled; each
    function is then compiled from its rewritten outputs with the late rewrites only (fusion,
    in-place operations), so that each is fused for what it computes alone. Each computes what
    its graph computes, but not always in the form a compilation on its own would choose: a
    rewrite that looks at a subexpression's other uses sees those of the whole group (rewritten
    with the log-likelihood, a logistic regression's gradient keeps ``1 − σ(η)``, not
    ``σ(−η)``). The values agree to rounding at ordinary parameter values (the package's
    tests: relative 10⁻¹⁰); far out (``|θ|`` in the tens or hundreds) a form may overflow where
    the other does not (a huge finite gradient against ``±∞`` or NaN), which the clipping
    treats alike, as it bounds any row. Which functions share a group is therefore chosen
    by measuring their passes (:class:`~pymc_dp.oracle.RowLikelihood`).

    Only for PyTensor's default backend (``backend=None``); functions are remembered by their
    original graphs (:func:`cached_compile`), as :func:`compile_function`'s.
    """

    def __init__(self, graphs: dict[str, tuple[list[Any], Any]], *, check_bounds: bool) -> None:
        self.graphs = dict(graphs)
        self.check_bounds = bool(check_bounds)
        self._rewritten: dict[str, tuple[list[Any], list[Any]]] | None = None
        self._lock = threading.Lock()

    def compile(self, name: str) -> Any:
        """The compiled function of graph ``name`` (trusting its inputs, as compile_function's)."""
        inputs, outputs = self.graphs[name]
        many = isinstance(outputs, list | tuple)

        def build() -> pytensor.compile.function.types.Function:
            ins, outs = self._rewritten_graph(name)
            late = _late_mode(self.check_bounds)
            return _trusting_function(
                ins, outs if many else outs[0], late, on_unused_input="ignore"
            )

        with without_traces(), gc_paused():
            # remembered apart from functions compiled alone, and per family: the same graph
            # may be compiled to another form in another company (below)
            key = ("oracle", self.check_bounds, None, "group", tuple(self.graphs))
            return cached_compile(list(inputs), outputs, build, key=key)

    def _rewritten_graph(self, name: str) -> tuple[list[Any], list[Any]]:
        with self._lock:
            if self._rewritten is None:
                self._rewritten = self._rewrite()
        return self._rewritten[name]

    def _rewrite(self) -> dict[str, tuple[list[Any], list[Any]]]:
        inputs: dict[Any, None] = {}
        outputs: list[Any] = []
        for ins, outs in self.graphs.values():
            inputs.update(dict.fromkeys(ins))
            outputs.extend(outs if isinstance(outs, list | tuple) else [outs])
        # the inputs cloned (the group's own graph); the shared variables (PyMC's data and
        # dimension lengths, fixed values) kept, so that the functions read, and are
        # remembered by, them: inputs of the graph, as a FunctionGraph has no other leaves
        shared = _shared_leaves(io_toposort(list(inputs), outputs))
        fgraph = FunctionGraph([*inputs, *shared], outputs, clone=True, memo={v: v for v in shared})
        early, late = _split_rewrites(self.check_bounds)
        # PyTensor 3's rewrites read the compile target (the linker) from the graph, as the
        # mode's own optimizer sets it while it rewrites
        fgraph._compile_mode = late._full
        try:
            early.rewrite(fgraph)
        finally:
            del fgraph._compile_mode
        new_input = dict(zip(inputs, fgraph.inputs[: len(inputs)], strict=True))
        rewritten, start = {}, 0
        for name, (ins, outs) in self.graphs.items():
            count = len(outs) if isinstance(outs, list | tuple) else 1
            rewritten[name] = ([new_input[v] for v in ins], fgraph.outputs[start : start + count])
            start += count
        return rewritten

    def __getstate__(self) -> dict[str, Any]:
        # a copy (pm.sample's workers) rewrites again if it compiles a function of the group
        return {**self.__dict__, "_rewritten": None, "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())


#: The process in which the oracle first started JAX (JAX's runtime starts threads there; a
#: process forked from it inherits the runtime's state but not its threads).
_jax_process: int | None = None


def jax_started() -> None:
    """Record that this process starts JAX's runtime (call before any JAX work)."""
    global _jax_process
    if _jax_process is None:
        _jax_process = os.getpid()


def _check_not_forked(backend: str) -> None:
    jax_started()
    if _jax_process != os.getpid():
        raise InvalidParameterError(
            f"The step's per-row functions use {backend}, which was started in process "
            f"{_jax_process}; this process is a fork of it (pm.sample's worker processes start "
            "by fork on Linux), where JAX hangs. Sample with pymc_dp.sample (it starts the "
            "workers with mp_ctx='forkserver' for a JAX step), or pass mp_ctx='forkserver' to "
            "pm.sample, or cores=1."
        )


class StaticShapeFunction:
    """A graph compiled once per set of input shapes, with the shapes fixed in the graph.

    Calling it with arrays of shapes ``s₁, …, s_k`` runs the function compiled for the graph
    whose inputs have those static shapes (compiled on the first such call in a thread, through
    :func:`cached_compile`, and run once on zeros of those shapes, so that an operation the
    backend cannot trace fails there, on public values, as :class:`BackendNotSupportedError`).
    Outputs come back as read-only NumPy arrays. A pickled copy (``pm.sample``'s worker
    processes) carries the graph and compiles again on first use.
    """

    def __init__(
        self, inputs: Sequence[Any], outputs: Any, *, check_bounds: bool, backend: str
    ) -> None:
        self.inputs = list(inputs)
        self.outputs = outputs
        self.check_bounds = bool(check_bounds)
        self.backend = backend
        self._functions: dict[tuple, Any] = {}

    def function_for(self, shapes: tuple[tuple[int, ...], ...]) -> Any:
        """The compiled function for inputs of these shapes (one per thread, as compiled ones)."""
        key = (threading.get_ident(), shapes)
        fn = self._functions.get(key)
        if fn is None:
            fixed = [
                v.type.clone(shape=shape)(name=v.name)
                for v, shape in zip(self.inputs, shapes, strict=True)
            ]
            many = isinstance(self.outputs, list | tuple)
            outs = clone_replace(
                list(self.outputs) if many else [self.outputs],
                dict(zip(self.inputs, fixed, strict=True)),
            )
            try:
                with gc_paused():
                    fn = _compile_now(
                        fixed, outs if many else outs[0], self.check_bounds, self.backend
                    )
                    # traced here, on zeros: public values, whatever the backend's message shows
                    fn(*(np.zeros(v.type.shape, dtype=v.type.dtype) for v in fixed))
            except Exception as err:  # an operation the backend lacks or cannot trace
                lines = str(err).strip().splitlines()
                reason = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
                raise BackendNotSupportedError(
                    f"PyTensor's {self.backend} backend cannot compile this model's likelihood "
                    f"({reason}). Leave compile_kwargs unset (PyTensor's default backend)."
                ) from None
            self._functions[key] = fn
        return fn

    def __call__(self, *args: Any) -> Any:
        _check_not_forked(self.backend)
        out = self.function_for(tuple(np.shape(a) for a in args))(*args)
        if isinstance(out, list):
            return [np.asarray(o) for o in out]
        return np.asarray(out)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_functions": {}}


#: How many graph shapes :func:`cached_compile` keeps (least recently used go first), and
#: how many functions of one shape (graphs that differ in their constants only).
_CACHE_SIZE = 64
_CACHE_SIZE_PER_SHAPE = 8
#: Graphs holding more constant or shared elements than this are compiled afresh: the cache
#: would keep them (the data, in PyMC's own graphs) alive.
_CACHE_MAX_CONSTANT_SIZE = 100_000


def _held_size(leaves: set[Any]) -> int:
    """Elements of the constants and shared variables among a graph's leaves."""
    size = 0
    for leaf in leaves:
        if isinstance(leaf, Constant):
            size += int(np.size(leaf.data))
        elif isinstance(leaf, SharedVariable):
            size += int(np.size(leaf.get_value(borrow=True)))
    return size


_cache: OrderedDict[tuple, list[tuple[list[Any], list[Any], list[Any], Any]]] = OrderedDict()


def cached_compile(
    inputs: Sequence[Any], outputs: Any, build: Callable[[], Any], *, key: tuple
) -> Any:
    """``build()``, or the function it returned for an earlier graph that computes the same.

    Two graphs are the same computation when PyTensor's ``equal_computations`` says so with
    the inputs paired in order and the shared variables paired in the order the graph first
    reads them: the same operations on the same inputs, constants equal in value, type and
    bytes. Their compiled functions then return the same outputs for the same arguments, so
    the first one serves both, within one thread (a function has one set of input slots).
    Where the shared variables are other objects of the same types (PyMC's dimension lengths
    and ``pm.Data`` of a model built again), the earlier function is copied with the new
    ones swapped in (``Function.copy(swap=...)``: no rewriting or compiling again), so it
    reads their values, now and after a ``pm.set_data``. ``key`` names what ``build`` adds
    to the graph (its mode). Graphs whose operations cannot be hashed, with large constants
    or shared values, or reading a variable that is not among ``inputs``, are not remembered.
    """
    outs = list(outputs) if isinstance(outputs, list | tuple) else [outputs]
    ins = list(inputs)
    nodes = io_toposort(ins, outs)
    leaves = {v for node in nodes for v in node.inputs if v.owner is None} | {
        v for v in outs if v.owner is None
    }
    if _held_size(leaves) > _CACHE_MAX_CONSTANT_SIZE or not all(
        v in ins or isinstance(v, Constant | SharedVariable) for v in leaves
    ):
        return build()  # large constants; or an input not listed, which build() reports
    shared = _shared_leaves(nodes)
    signature = (
        key,
        threading.get_ident(),  # a Function has one set of input slots: never two threads
        isinstance(outputs, list | tuple),
        tuple(v.type for v in ins),
        tuple(v.type for v in outs),
        tuple(v.type for v in shared),
        tuple(node.op for node in nodes),
        # constants by their bytes: equal_computations compares values, and 0.0 == -0.0
        tuple(
            (i, v.data.dtype.str, v.data.shape, v.data.tobytes())
            for node in nodes
            for i, v in enumerate(node.inputs)
            if isinstance(v, Constant) and isinstance(v.data, np.ndarray)
        ),
    )
    try:
        candidates = _cache.get(signature)
    except TypeError:  # an operation without hashable properties
        return build()
    for cached_ins, cached_shared, cached_outs, fn in candidates or ():
        # equal_computations pairs the listed inputs but takes any other leaf as equal to
        # itself: the same variables listed in another order must not match
        if ins != cached_ins and not set(ins).isdisjoint(cached_ins):
            continue
        if equal_computations(outs, cached_outs, ins + shared, cached_ins + cached_shared):
            _cache.move_to_end(signature)
            return fn if shared == cached_shared else _swapped(fn, cached_shared, shared)
    fn = build()
    entries = _cache.setdefault(signature, [])
    entries.append((ins, shared, outs, fn))
    del entries[:-_CACHE_SIZE_PER_SHAPE]  # the same shape, other constants: the latest few
    _cache.move_to_end(signature)
    while len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return fn


def _shared_leaves(nodes: Sequence[Any]) -> list[Any]:
    """The shared variables ``nodes`` read, each once, in the order they are first read."""
    found: dict[Any, None] = {}
    for node in nodes:
        for v in node.inputs:
            if v.owner is None and isinstance(v, SharedVariable):
                found.setdefault(v, None)
    return list(found)


def _swapped(fn: Any, old: list[Any], new: list[Any]) -> Any:
    """``fn`` copied to read the shared variables ``new`` where it read ``old`` (paired)."""
    read = {i.variable for i in fn.maker.inputs}  # a variable it does not read needs no swap
    return fn.copy(swap={o: n for o, n in zip(old, new, strict=True) if o is not n and o in read})


def _drop_gufunc_closures(fgraph: Any) -> None:
    """Forget the per-node closures ``Blockwise`` keeps on a node's tag (they do not pickle).

    Constant folding runs a ``Blockwise`` once; its node, though replaced, stays reachable from
    the compiled graph's shape feature, which a pickled function carries along.
    """
    roots = list(fgraph.outputs)
    for feature in getattr(fgraph, "_features", []):
        shape_of = vars(feature).get("shape_of")  # PyTensor 3: a deprecated property
        if not isinstance(shape_of, dict):  # PyTensor 3 keeps no such graph here
            continue
        for var, shape in shape_of.items():
            roots.append(var)
            roots.extend(shape or ())
    for var in ancestors(roots):
        if var.owner is not None:
            var.owner.tag.__dict__.pop("gufunc", None)
