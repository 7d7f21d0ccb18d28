"""The private-data oracle: the only code in pymc_dp that reads observed data.

:class:`RowLikelihood` splits a PyMC model's log-density into

* a **public** part, the log-prior ``log p(θ)`` (every term that involves no data, transform
  Jacobians included), and
* a **private** part, the per-row log-likelihood ``ℓ_i(θ) = log p(x_i | θ)``, one term per row
  (theory §1: a row is position ``i`` along the leading axis of every observed variable and of every
  row-aligned data container).

It compiles PyTensor functions for the quantities the DP mechanisms clip and noise (theory §2):

* the per-row log-likelihood vector ``(ℓ_1, …, ℓ_n)``;
* the clipped gradient sum ``G(θ) = Σ_i clip_b(∇_θ ℓ_i(θ))``;
* the clipped log-likelihood-ratio sum ``R(θ, θ') = Σ_i clip(ℓ_i(θ') − ℓ_i(θ), −B, B)``;

on all rows (evaluated in chunks, so memory stays bounded) or on a given subset of rows
(minibatches, evaluating no other row). The oracle returns numbers; it never adds noise and never
decides anything. Clipped sums come back as :class:`ClippedSum`, whose ``n_clipped`` field is
*not* private: mechanisms must drop it unless the user asked for non-private diagnostics.

Per-row gradients are built from the model's own graph in one of two ways:

``"vectorize"`` (fast path)
    Build the log-likelihood of a single row (every row input replaced by a placeholder holding
    one row), take its gradient per value variable, and batch that graph over rows with
    :func:`pytensor.graph.replace.vectorize_graph`. Each row's value is computed from that row's
    data only, by construction.
``"jacobian"`` (exact fallback)
    Differentiate ``Σ_i u_i ℓ_i(θ)`` with respect to each value variable and take the Jacobian of
    that with respect to ``u`` (reverse over reverse), at ``u = 1``. It needs no single-row graph.

Both are validated when the oracle is built: the per-row values computed on subsets of rows must
equal PyMC's own per-row log-likelihood on the full data (a likelihood that couples rows fails
this), and the unclipped sums plus the log-prior must equal PyMC's ``logp``/``dlogp``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np
import pymc as pm
import pytensor
import pytensor.scalar as ps
import pytensor.scalar.math as ps_math
import pytensor.tensor as pt
from pytensor.compile.builders import OpFromGraph
from pytensor.compile.mode import Mode
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.replace import clone_replace, vectorize_graph
from pytensor.graph.rewriting.basic import in2out, node_rewriter
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.graph.traversal import ancestors, io_toposort
from pytensor.tensor.basic import Alloc
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.exceptions import NotScalarConstantError
from pytensor.tensor.rewriting.math import is_neg
from pytensor.tensor.shape import SpecifyShape
from pytensor.tensor.type import integer_dtypes

from pymc_dp import _compile, releases
from pymc_dp._batching import unbatch_blockwise
from pymc_dp._compat import inline_ofg_node, leading_axis_indices
from pymc_dp._compile import (
    RewriteGroup,
    cached_compile,
    check_backend,
    compile_function,
    gc_paused,
    without_traces,
)
from pymc_dp._gathers import (
    fisher_pattern,
    lift_gathers,
    row_blocks,
    row_gathers,
    shared_index_groups,
)
from pymc_dp._leaks import (
    check_deterministics,
    check_terms,
    describe_leaf,
    is_data_leaf,
    leaf_value,
)
from pymc_dp._row_axis import drop_row_axis
from pymc_dp.errors import (
    BackendNotSupportedError,
    CoupledRowsError,
    DataChangedError,
    InvalidParameterError,
    ModelNotSupportedError,
    PrivateEvaluationError,
    PyMCDPError,
)
from pymc_dp.parameter_space import ParameterSpace, prior_and_observed_terms, resolve_vars

__all__ = ["ClippedSum", "RowLikelihood", "clip_ratio_graph", "count_clipped_graph"]

GradientMethod = Literal["auto", "vectorize", "jacobian"]

# Rows per compiled call: the per-row gradient matrix of a chunk, (chunk, d) float64, is kept
# near 1 MiB so that it and its temporaries stay in cache (measured on the logistic regression
# of benchmarks/oracle.py: 8k-16k rows at d = 10 is ~1.7x faster than one call on 100k rows).
_CHUNK_BYTES = 2**20
_MIN_CHUNK = 512
# With JAX: 8 MiB chunks on a CPU (the logistic regression of benchmarks/scale.py at n = 10⁶:
# 25 ns per row and pass, against 100 with 128 MiB chunks, whose intermediates leave the
# cache), 128 MiB on an accelerator, where a launch costs more than a chunk's memory. Each
# distinct chunk length is one more compilation (StaticShapeFunction).
_CHUNK_BYTES_JAX = {"cpu": 2**23, "accelerator": 2**27}


class ClippedSum(NamedTuple):
    """A clipped sum and, when asked for, how many rows were clipped.

    ``value`` is what a mechanism may noise and release. ``n_clipped`` is computed from the data
    without noise: it is **not** differentially private and must not be released by default.
    It is ``None`` unless the caller passed ``count_clipped=True``.
    """

    value: Any
    n_clipped: int | None


# The range of a bound on the rows' gradient norms and of a preconditioner's entries
# (RowLikelihood._check_norm_bound).
NORM_BOUND_RANGE = (1e-50, 1e50)


def bounded_entries(g: Variable, *, c_backend: bool = False) -> Variable:
    """Per-row gradient entries as the clipping reads them (theory §2): ``NaN → 0``, and an
    entry beyond ``±L`` (an overflow to ``±∞`` included) ``±L``; ``L`` = √(largest float)·10⁻⁴,
    so that a row's squared norm of a few entries still fits (float64: ``L`` ≈ 1.3·10¹⁵⁰).

    An infinite entry keeps its direction: the row is then clipped towards it, as a row with
    a huge finite entry would be (while ``L`` times the entry's preconditioner over the clip
    squares to a double; beyond that the row's scaled norm is ``∞`` and it adds 0). Each
    entry is bounded by one element-wise expression of that entry alone, which PyTensor's
    rewrites cannot fold into the products that use it (a multiplication by a row's scale
    ``s_i = 0`` flattened into an overflowing gradient's factors never forms the ``∞`` a
    later test would look for). Two forms with the same values, whichever is faster
    (``benchmarks/oracle.py``): ``clip(switch(isnan(g), 0, g), −L, L)`` on PyTensor 3 (Numba;
    with the 175-parameter varying slopes 0.77 → 0.68 ms against ``switch(|g| < ∞, g, 0)``),
    and nested switches on PyTensor 2's C backend (a logistic regression with 10 coefficients
    3.8 → 4.7 ms with the clip, 3.8 with the switches).
    """
    dtype = g.type.dtype
    limit = pt.constant(np.sqrt(np.finfo(dtype).max) * 1e-4, dtype=dtype)
    if c_backend:
        beyond = pt.switch(pt.gt(g, 0), limit, pt.switch(pt.lt(g, 0), -limit, 0.0))
        return pt.switch(pt.lt(pt.abs(g), limit), g, beyond)
    return pt.clip(pt.switch(pt.isnan(g), 0.0, g), -limit, limit)


def _fused_column(column: Variable) -> bool:
    """Whether a scalar parameter's per-row gradient column is elementary, with no special
    function (a scalar operation of ``pytensor.scalar.math`` other than the logistic sigmoid,
    softplus and ``log1mexp``: digamma, erf, log-gamma, …) among its element-wise operations.

    On PyTensor 3 such a column's clipped sum ``Σ_i s_i g_i`` is a sum fused into the loop
    computing the gradients; one with special functions is faster as a product ``sᵀg``
    (PyMC 6, n = 10⁵: the Student-t regression's clipped sum 1.87 ms fused, 1.32 as products).
    """
    for node in io_toposort([], [column]):
        scalar_op = getattr(node.op, "scalar_op", None)
        if (
            isinstance(node.op, Elemwise)
            and type(scalar_op).__module__ == ps_math.__name__
            and not isinstance(scalar_op, _ELEMENTARY_MATH)
        ):
            return False
    return True


# the functions of pytensor.scalar.math that are elementary (an exponential or logarithm and
# arithmetic): a column with them is still summed in the fused loop
_ELEMENTARY_MATH = tuple(
    getattr(ps_math, name)
    for name in ("Sigmoid", "Softplus", "Log1mexp")
    if isinstance(getattr(ps_math, name, None), type)
)


# The validation's reference (PyMC's own graphs, evaluated once per build): compiled with the
# rewrites tagged fast_compile (canonicalisation, constant folding, merging) and C code, not
# PyMC's full pipeline. A build compiles several functions, and this one's full rewriting cost
# as much as PyMC's whole logp_dlogp_function. On the zoo models at n = 2·10⁵ it compiles in
# 0.25–1.2 s against 0.44–2.3 s and evaluates in 1.0–1.6× the time of a fully rewritten one
# (PyTensor's FAST_COMPILE mode would evaluate in Python: 25x slower at n = 2·10⁶).
# pm.pytensorf.compile adds PyMC's treatment of parameter checks to it.
_REFERENCE_MODE = Mode(linker="cvm", optimizer="fast_compile")


def _compile_once(inputs: list[Variable], outputs: list[Variable]) -> Any:
    """A function of the model's value variables evaluated once per build (reference, checks).

    Compiled with PyMC's compile (its RNG and check-bounds handling) in the light mode
    :data:`_REFERENCE_MODE`, and remembered (:func:`cached_compile`) for a rebuild of the
    same graph.
    """
    return cached_compile(
        inputs,
        outputs,
        lambda: pm.pytensorf.compile(
            inputs, outputs, on_unused_input="ignore", mode=_REFERENCE_MODE
        ),
        key=("reference", _active_check_bounds()),
    )


@dataclass(frozen=True)
class _CompactLayout:
    """Where the columns of the compact per-row gradient sit in ``θ`` (public: the graph).

    Column ``k`` of row ``i`` is coordinate ``first[k] + stride[k] · index[i, group[k]]``,
    where ``index[i, j]`` is the entry row ``i`` reads of the gathered variables of index
    group ``j`` (``groups[j]`` entries); ``group[k] = -1`` (stride 0) for a column at the same
    coordinate in every row. ``index`` is ``None`` when there is no gathered variable.
    """

    first: np.ndarray
    stride: np.ndarray
    group: np.ndarray
    groups: np.ndarray

    @property
    def shared(self) -> np.ndarray:
        """Positions of the columns every row has at the same coordinate."""
        return np.flatnonzero(self.group < 0)

    @property
    def gathered(self) -> np.ndarray:
        """Positions of the columns at the row's group entry."""
        return np.flatnonzero(self.group >= 0)

    def entries(self, k: int) -> np.ndarray:
        """The coordinates column ``k`` can sit at, one per group of its index."""
        return self.first[k] + self.stride[k] * np.arange(self.groups[self.group[k]])

    def places(self, k: int) -> np.ndarray:
        """Every coordinate column ``k`` can sit at: one for a shared column, else
        :meth:`entries`."""
        return self.first[k : k + 1] if self.group[k] < 0 else self.entries(k)

    def coordinates(self, index: np.ndarray) -> np.ndarray:
        """Every row's coordinates, ``(m, K)``."""
        return self.first + self.stride * index[:, np.maximum(self.group, 0)]

    def dense(self, values: np.ndarray, index: np.ndarray | None, d: int) -> np.ndarray:
        """The rows as the ``(m, d)`` matrix they stand for (zero off their coordinates)."""
        rows = np.zeros((values.shape[0], d))
        if index is None:
            rows[:, self.first] = values
        else:
            np.put_along_axis(rows, self.coordinates(index), values, axis=1)
        return rows

    def total(self, values: np.ndarray, index: np.ndarray | None, d: int) -> np.ndarray:
        """``Σ_i v_i`` as a ``d``-vector."""
        out = np.zeros(d)
        shared = self.shared  # every column when nothing is gathered
        out[self.first[shared]] = values[:, shared].sum(axis=0)
        if index is not None:
            for k in self.gathered:
                group = self.group[k]
                out[self.entries(k)] += np.bincount(
                    index[:, group], weights=values[:, k], minlength=self.groups[group]
                )
        return out

    def outer_total(self, values: np.ndarray, index: np.ndarray | None, d: int) -> np.ndarray:
        """``Σ_i v_i v_iᵀ`` as a ``d × d`` matrix."""
        out = np.zeros((d, d))
        if index is None:
            out[np.ix_(self.first, self.first)] = values.T @ values
            return out
        shared, gathered = self.shared, self.gathered
        places = self.first[shared]
        out[np.ix_(places, places)] = values[:, shared].T @ values[:, shared]
        coords = self.coordinates(index)
        flat = out.reshape(-1)
        for k in gathered:
            for j in range(values.shape[1]):
                if j in shared:  # both (k, j) and (j, k)
                    cross = np.bincount(
                        coords[:, k] * d + coords[:, j],
                        weights=values[:, k] * values[:, j],
                        minlength=d * d,
                    )
                    flat += cross
                    flat += cross.reshape(d, d).T.reshape(-1)
                else:
                    flat += np.bincount(
                        coords[:, k] * d + coords[:, j],
                        weights=values[:, k] * values[:, j],
                        minlength=d * d,
                    )
        return out

    def dot(self, values: np.ndarray, index: np.ndarray | None, step: np.ndarray) -> np.ndarray:
        """Per row ``v_i · step`` (``step``: a ``d``-vector)."""
        if index is None:
            return values @ step[self.first]
        shared = self.shared
        out = values[:, shared] @ step[self.first[shared]]
        for k in self.gathered:
            out += values[:, k] * step[self.entries(k)][index[:, self.group[k]]]
        return out


class _RowMap:
    """A public linear map ``A`` (``r × d``) on per-row vectors held in compact form.

    ``norms`` gives ``‖A v_i‖`` and ``weighted_sum`` gives ``Σ_i s_i A v_i`` without forming the
    ``(m, d)`` rows. With gathered columns the norms come from ``AᵀA``: its block on the shared
    columns, and per gathered column a table over the groups of its entries with the shared
    columns and the other gathered ones, so a row with ``K`` entries costs about ``K²``
    instead of ``d r``.

    The Gram form's rounding error is relative to ``‖|A| |v|‖²``, which exceeds ``‖A v‖²`` by
    up to ``1/ρ``, ``ρ = λ_min(AᵀA) / λ_max(|A|ᵀ|A|)`` on the coordinates the rows reach: it
    is used only while that error bound, ``e = (r + K² + 4) u / ρ`` (``u`` the unit roundoff),
    is at most ``10⁻⁶``, and its norms are raised by the factor ``1 + e``, so that a row scaled
    to a bound never exceeds it; otherwise each row is mapped directly.
    """

    def __init__(self, matrix: np.ndarray, layout: _CompactLayout) -> None:
        self.matrix = np.asarray(matrix, dtype=float)
        self.layout = layout
        self.columns = self.matrix[:, layout.first]
        r, d = self.matrix.shape
        k = layout.first.size
        self.gram = None
        self.inflation = 1.0
        if layout.groups.size and k * k < d * r:  # else the (m, d) rows times Aᵀ
            gram = self.matrix.T @ self.matrix
            shared = layout.first[layout.shared]
            reached = np.unique(
                np.concatenate([shared, *[layout.entries(c) for c in layout.gathered]])
            )
            low = np.linalg.eigvalsh(gram[np.ix_(reached, reached)])[0]
            magnitude = np.abs(self.matrix[:, reached])
            high = np.linalg.eigvalsh(magnitude.T @ magnitude)[-1]
            error = (r + k * k + 4) * np.finfo(float).eps / (low / high) if low > 0 else np.inf
            if high == 0.0:  # A is zero where the rows are: every norm is 0
                error = 0.0
            if error > 1e-6:
                return
            self.inflation = 1.0 + error
            self.gram = gram[np.ix_(shared, shared)]
            self.cross = {}  # gathered k: (groups, |shared|)
            self.pairs = {}  # gathered k ≤ l: (groups_k,) or (groups_k, groups_l)
            gathered = layout.gathered
            for i, c in enumerate(gathered):
                entries = layout.entries(c)
                self.cross[c] = gram[np.ix_(entries, shared)]
                for other in gathered[i:]:
                    block = gram[np.ix_(entries, layout.entries(other))]
                    same = layout.group[c] == layout.group[other]
                    self.pairs[c, other] = np.diagonal(block).copy() if same else block

    def norms(self, values: np.ndarray, index: np.ndarray | None) -> np.ndarray:
        """``‖A v_i‖``. A row whose entries are finite but so large that the arithmetic
        overflows (a leapfrog far out in the tails) is computed again scaled by its largest
        entry: its norm is then ``∞`` or right, never NaN."""
        with np.errstate(over="ignore", invalid="ignore"):
            norms = self._norms(values, index)
        bad = ~np.isfinite(norms)
        if bad.any():
            rows = values[bad]
            largest = np.max(np.abs(rows), axis=1, initial=0.0)
            ok = np.isfinite(largest) & (largest > 0)  # non-finite entries: left to the caller
            if ok.any():
                at = np.flatnonzero(bad)[ok]
                unit = rows[ok] / largest[ok, None]
                with np.errstate(over="ignore"):
                    norms[at] = largest[ok] * self._norms(
                        unit, None if index is None else index[at]
                    )
        return norms

    def _norms(self, values: np.ndarray, index: np.ndarray | None) -> np.ndarray:
        if index is None:
            mapped = values @ self.columns.T
            return np.sqrt(np.einsum("ij,ij->i", mapped, mapped))
        if self.gram is None:
            mapped = self.layout.dense(values, index, self.matrix.shape[1]) @ self.matrix.T
            return np.sqrt(np.einsum("ij,ij->i", mapped, mapped))
        layout = self.layout
        shared = values[:, layout.shared]
        sq = np.einsum("ij,ij->i", shared @ self.gram, shared)
        for c in layout.gathered:
            at = index[:, layout.group[c]]
            vc = values[:, c]
            sq += 2.0 * vc * np.einsum("ij,ij->i", shared, self.cross[c][at])
            for (first, other), table in self.pairs.items():
                if first != c:
                    continue
                if other == c:
                    sq += vc * vc * table[at]
                elif table.ndim == 1:
                    sq += 2.0 * vc * values[:, other] * table[at]
                else:
                    sq += 2.0 * vc * values[:, other] * table[at, index[:, layout.group[other]]]
        # a term that overflowed leaves sq at ±∞ or NaN: ∞ here, so that norms() rescales the
        # row (a cross term at −∞ clamped to 0 by the maximum left a row of norm 5·10¹⁵³
        # unclipped; found in review)
        sq = np.where(np.isfinite(sq), np.maximum(sq, 0.0), np.inf)
        return np.sqrt(sq) * self.inflation

    def weighted_sum(
        self, weights: np.ndarray, values: np.ndarray, index: np.ndarray | None
    ) -> np.ndarray:
        if index is None:
            return self.columns @ (weights @ values)
        weighted = values * weights[:, None]
        return self.matrix @ self.layout.total(weighted, index, self.matrix.shape[1])


def _device_for(backend: str | None) -> str | None:
    """Where the backend's functions run: ``None`` (PyTensor's default), or with JAX
    ``"cpu"`` or ``"accelerator"`` (JAX's default device)."""
    if backend is None:
        return None
    _compile.jax_started()  # the fork check's reference: JAX starts in this process here
    import jax  # check_backend found it

    return "cpu" if jax.default_backend() == "cpu" else "accelerator"


def _chunk_bytes_for(device: str | None) -> int:
    """Bytes per chunk of rows for the device (:func:`_device_for`)."""
    return _CHUNK_BYTES if device is None else _CHUNK_BYTES_JAX[device]


def _on_device(host: np.ndarray) -> Any:
    """A copy of ``host`` in the accelerator's memory (JAX's default device), or ``host``
    itself when JAX would not keep its dtype there (64-bit values with JAX's x64 mode off) or
    the copy does not fit (each pass then sends its chunks, as on a CPU)."""
    import jax
    import pytensor.link.jax.dispatch  # noqa: F401  (sets JAX's x64 mode for floatX float64)

    try:
        copy = jax.device_put(host)
    except Exception:  # out of device memory (the message names sizes only, never values)
        return host
    return copy if copy.dtype == host.dtype else host


def _joined(parts: list[np.ndarray], empty_shape: tuple[int, ...]) -> np.ndarray:
    """The chunks' per-row values as one array; a single chunk as it is (no copy of n rows)."""
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(empty_shape)


def _active_check_bounds() -> bool:
    """The ``check_bounds`` that ``pm.pytensorf.compile`` takes from the model in context."""
    try:
        return bool(pm.modelcontext(None).check_bounds)
    except TypeError:  # no model in context: PyMC's default
        return True


def clip_ratio_graph(ratio: Variable, bound: Variable) -> Variable:
    """:func:`pymc_dp.releases.clip_ratio` as a PyTensor graph: NaN counts as ``−B``, then
    ``clip(r, −B, B)`` (theory §2). A test checks that the two agree."""
    return pt.clip(pt.switch(pt.isnan(ratio), -bound, ratio), -bound, bound)


def count_clipped_graph(ratio: Variable, bound: Variable) -> Variable:
    """:func:`pymc_dp.releases.count_clipped` as a PyTensor graph (``|r| > B`` or NaN)."""
    return pt.sum(pt.invert(pt.le(pt.abs(ratio), bound)))


@node_rewriter([SpecifyShape])
def _drop_specify_shape(fgraph: Any, node: Any) -> list[Variable] | None:
    """``specify_shape(x, shape)`` → ``x`` where the types allow it (a shape assertion only)."""
    [out] = node.outputs
    x = node.inputs[0]
    if x.type.ndim != out.type.ndim:
        return None
    if not out.type.is_super(x.type):
        x = pt.specify_broadcastable(x, *[i for i, b in enumerate(out.type.broadcastable) if b])
        if not out.type.is_super(x.type):
            return None
    return [x]


def _negated(var: Variable) -> Variable | None:
    """``x`` where the float ``var`` is ``−x`` (``neg(x)``, or ``mul(−1, x)``: PyTensor 2's
    canonical negation; PyTensor's ``is_neg``), else ``None`` (an unsigned integer's negation
    wraps around)."""
    return is_neg(var) if var.dtype.startswith("float") else None


@node_rewriter([Elemwise])
def _log1p_neg_sigmoid(fgraph: Any, node: Any) -> list[Variable] | None:
    """``log1p(−σ(x))`` → ``−softplus(x)``: a Bernoulli's ``log(1 − p)`` with ``p = σ(η)``,
    which PyTensor's stabilisation misses where the negation has PyTensor 2's canonical form
    ``mul(−1, ·)`` (``log1p(−σ(η))`` is −∞ from ``η ≈ 37`` on, its gradient NaN)."""
    if not isinstance(node.op.scalar_op, ps.Log1p):
        return None
    inner = _negated(node.inputs[0])
    if inner is None or inner.owner is None or not isinstance(inner.owner.op, Elemwise):
        return None
    if not isinstance(inner.owner.op.scalar_op, ps_math.Sigmoid):
        return None
    [out] = node.outputs
    result = -pt.softplus(inner.owner.inputs[0])
    return [result] if out.type.is_super(result.type) else None


@node_rewriter([Elemwise])
def _softplus_of_negation(fgraph: Any, node: Any) -> list[Variable] | None:
    """``softplus(−x)`` → ``softplus(x) − x`` where ``softplus(x)`` is computed too.

    A Bernoulli row's log-likelihood, stabilised, is ``switch(y, −softplus(−η),
    −softplus(η))``, and a switch computes both branches: two softplus (two ``exp``, two
    ``log1p``) per row, where one serves both (a logistic regression's log-likelihood pass,
    d = 10, n = 10⁵: 3.8 ms against 2.4 ms before the stabilisation). The identity is exact; in
    floating point ``softplus(x) − x`` loses ``softplus(−x)`` below the rounding of ``x``
    (``e^{−x}`` against ``10⁻¹⁶ x`` for large ``x``), an absolute error of a log-likelihood of
    at most that rounding; at ``x = +∞``, where the difference is undefined, it is 0."""
    if not isinstance(node.op.scalar_op, ps_math.Softplus):
        return None
    x = _negated(node.inputs[0])
    if x is None:
        return None
    clients = fgraph.clients.get(x, []) if hasattr(fgraph, "clients") else []
    if not any(
        isinstance(getattr(client, "op", None), Elemwise)
        and isinstance(client.op.scalar_op, ps_math.Softplus)
        for client, _ in clients
    ):
        return None
    [out] = node.outputs
    # softplus(x) is x from x ≈ 33 on, so at x = +∞ the difference is ∞ − ∞: 0 there
    result = pt.switch(pt.eq(x, np.inf), 0.0, pt.softplus(x) - x)
    return [result] if out.type.is_super(result.type) else None


@node_rewriter([Elemwise])
def _sigmoid_range_check(fgraph: Any, node: Any) -> list[Variable] | None:
    """``σ(x) ≥ c`` for ``c ≤ 0`` and ``σ(x) ≤ c`` for ``c ≥ 1`` → ``¬isnan(x)``: the same
    truth value for every ``x`` (``±∞`` included). PyMC checks ``0 ≤ p ≤ 1`` on a Bernoulli's
    ``p = σ(η)``, which otherwise computes ``σ(η)`` for the check alone once the log-likelihood
    is taken as ``−softplus(∓η)`` (an ``exp`` and a division per row)."""
    scalar = node.op.scalar_op
    if not isinstance(scalar, ps.GE | ps.LE) or len(node.inputs) != 2:
        return None
    p, bound = node.inputs
    if p.owner is None or not isinstance(p.owner.op, Elemwise):
        return None
    if not isinstance(p.owner.op.scalar_op, ps_math.Sigmoid):
        return None
    try:
        c = float(pt.get_underlying_scalar_constant_value(bound, only_process_constants=True))
    except NotScalarConstantError:
        return None
    if not (c <= 0.0 if isinstance(scalar, ps.GE) else c >= 1.0):
        return None
    [out] = node.outputs
    result = pt.invert(pt.isnan(p.owner.inputs[0]))
    return [result] if out.type.is_super(result.type) else None


@node_rewriter([OpFromGraph])
def _inline_op_from_graph(fgraph: Any, node: Any) -> list[Variable]:
    """Expand an ``OpFromGraph`` (PyTensor 3's ``logsumexp``...): its output types are fixed."""
    return inline_ofg_node(node)


def _resized_rows_shape(
    var: Variable, n: int, m: Variable, rows: list[Variable]
) -> Variable | None:
    """``var`` made with ``m`` rows where a public ``Alloc`` gives it ``n``.

    The canonical likelihood is rewritten with placeholders of the true length ``n``, so a
    shape read from the rows (``X.shape[0]``) is folded to the constant ``n``: an array built
    with it must follow the rows when they are resized. Only where the shape argument along the
    first axis is the constant ``n`` and its fill value and other lengths do not read the rows
    (``None`` otherwise: the graph is left as it is).
    """
    node = var.owner
    if isinstance(node.op, Alloc):
        value, first, *rest = node.inputs
        if not _is_constant(first, n) or _reads(rows, [value, *rest]):
            return None
        return pt.alloc(value, m, *rest)
    return None


def _is_constant(var: Variable, value: int) -> bool:
    return isinstance(var, pt.TensorConstant) and var.data.ndim == 0 and int(var.data) == value


def _reads(rows: list[Variable], graphs: list[Variable]) -> bool:
    found = set(ancestors(graphs))
    return any(r in found for r in rows)


def _row_name(var: Variable) -> str:
    return var.name or describe_leaf(var)


def _row_data_key(row_data: Any) -> tuple:
    items = [row_data] if isinstance(row_data, str | Variable) else list(row_data)
    return tuple(item if isinstance(item, str) else id(item) for item in items)


@dataclass(frozen=True)
class _RowInput:
    """A graph input whose leading axis is the row axis."""

    name: str
    variable: Variable
    data: np.ndarray
    observed: bool


class RowLikelihood:
    """Per-row log-likelihood, its clipped sums, and the public log-prior of a PyMC model.

    This is the only object in pymc_dp that reads observed data (theory §1–§2).

    Parameters
    ----------
    model : pymc.Model, optional
        The model. Defaults to the model on the context stack.
    vars : sequence of variables or names, optional
        The free variables the sampler moves (random variables, their value variables, or names).
        Defaults to every free variable, in the order PyMC's samplers use
        (``model.value_vars``). Free variables not listed are held fixed at the values given to
        :meth:`set_fixed_values` (by default the model's initial point).
    row_data : sequence of variables or names, optional
        The data containers (``pm.Data``) or constants whose leading axis is the row axis, besides
        the observed values, which always are. By default every shared variable or constant with
        ndim ≥ 1 and leading length ``n`` that the likelihood reads is treated as row data. Give
        the list explicitly when a public array happens to have length ``n`` (it then stays
        public) — anything the likelihood reads per row but that is not listed makes validation
        fail, so a mistake here cannot go unnoticed.
    chunk_size : int, optional
        Rows per compiled call when evaluating all rows. Defaults to a size that keeps a
        chunk's per-row gradient matrix near 1 MiB, so that it stays in cache (a gathered
        variable such as a group intercept counts one column, not one per group).
    gradient_method : {"auto", "vectorize", "jacobian"}
        How per-row gradients are built (see the module docstring). ``"auto"`` tries
        ``"vectorize"`` and falls back to ``"jacobian"`` if it cannot be built or fails
        validation.
    validate : bool
        Check, at a random point, that the per-row values on subsets of rows agree with PyMC's
        per-row log-likelihood on all rows (no coupling between rows) and that the unclipped
        sums agree with PyMC's ``logp``/``dlogp``. Disable only for models already validated.
    backend : {None, "JAX"}
        What the per-row functions compile to: PyTensor's default (``None``: C on PyTensor 2,
        Numba on PyTensor 3) or JAX (needs the ``jax`` package; runs on a GPU when JAX has
        one, with the rows copied to its memory on the first pass over all of them and kept
        there). The validation checks either against PyMC's own log-density.

    Attributes
    ----------
    likelihood_coordinates : ndarray of bool
        Which coordinates of the raveled ``θ`` the log-likelihood reads (public: the model's
        graph). The others (e.g. a centred hierarchy's ``μ_a``, ``σ_a``, read by the prior
        only) have a zero per-row gradient for every dataset.
    fisher_pattern : ndarray of bool
        ``d × d``: the entries of ``Σ_i ∇ℓ_i ∇ℓ_iᵀ`` that can be non-zero for some dataset
        (public: the graph). Zero off the likelihood's coordinates and between two groups'
        entries of variables each row reads at one group of the same index (``a[g_i]``, ``b[g_i]``).
    gathered_blocks : list of tuple
        The variables each row reads at one group, as ``(first coordinate, groups,
        coordinates per group)`` in ``θ``.
    row_blocks : ndarray of int or None
        ``(groups, m)``: the coordinates of ``θ`` each group's rows read, when every gathered
        variable is read at one index with the same number of groups; else ``None``.

    Notes
    -----
    Validation reads the data (its outcome only decides whether the model is accepted; nothing
    it computes is returned). Data-dependent constants computed *outside* the model (e.g. a
    covariate standardised with the data's own mean before building the model) are invisible
    to any check: use public constants for such transforms.
    """

    def __init__(
        self,
        model: pm.Model | None = None,
        vars: Sequence[Any] | None = None,
        *,
        row_data: Sequence[Any] | None = None,
        chunk_size: int | None = None,
        gradient_method: GradientMethod = "auto",
        validate: bool = True,
        backend: str | None = None,
    ) -> None:
        # the package's own graphs: PyTensor's tracebacks are not shown; no collections of the
        # whole heap while the graphs are built and compiled
        with without_traces(), gc_paused():
            self._build(model, vars, row_data, chunk_size, gradient_method, validate, backend)

    def _build(
        self,
        model: pm.Model | None,
        vars: Sequence[Any] | None,
        row_data: Sequence[Any] | None,
        chunk_size: int | None,
        gradient_method: GradientMethod,
        validate: bool,
        backend: str | None,
    ) -> None:
        self.model = pm.modelcontext(model)
        self.backend = check_backend(backend)
        self._device = _device_for(self.backend)
        self._chunk_bytes = _chunk_bytes_for(self._device)  # once: _chunks reads it every pass
        # on an accelerator, the row data's copy in its memory (made on the first full pass):
        # a pass then moves θ and the sums, not the n rows
        self._resident: list[Any] | None = None
        if gradient_method not in ("auto", "vectorize", "jacobian"):
            raise InvalidParameterError(
                f"gradient_method={gradient_method!r} is not one of 'auto', 'vectorize', "
                "'jacobian'."
            )
        self._check_bounds = bool(getattr(self.model, "check_bounds", True))
        self.value_vars = resolve_vars(self.model, vars)
        self._initial_point = self.model.initial_point()
        self._observed = self._check_observed()
        self.n_rows = self._observed[0].data.shape[0]
        lik_terms, prior = self._split_logp()
        self._prior = prior
        self._rows = self._find_row_inputs(lik_terms, row_data)
        self._check_no_leaks(prior)
        self._public_data = self._snapshot_public_data([*lik_terms, *(t for _, t in prior)])
        self._check_row_indices(lik_terms)
        self._lik_terms = lik_terms
        # the public part: θ's layout, the log-prior and the likelihood's parameter-only checks
        self.space = ParameterSpace(
            self.model,
            self.value_vars,
            prior=prior,
            support_checks=self._support_checks(lik_terms),
            initial_point=self._initial_point,
        )
        self.ndim = self.space.ndim
        self._auto_chunk = chunk_size is None
        if chunk_size is None:  # refined once the per-row gradient's width is known
            chunk_size = max(_MIN_CHUNK, self._chunk_bytes // (8 * max(self.ndim, 1)))
        if int(chunk_size) < 1:
            raise InvalidParameterError(f"chunk_size must be a positive integer, got {chunk_size}.")
        self.chunk_size = int(chunk_size)
        self.rows_read = 0  # rows passed to compiled likelihood functions (instrumentation)
        self.calls = 0
        self._loglik_cache: list[tuple[bytes, np.ndarray]] = []
        self._centre_cache: tuple[bytes, tuple, tuple] | None = None
        # [centre key, (θ, c(θ)), (θ', c(θ'))]: c(θ) = ℓ(θ) − ĝ·(θ − θ_c) per row (the centred
        # ratio's per-row values), for the chain's current state and last proposal
        self._centred_cache: list[Any] = []
        self._metric_map: tuple[bytes, _RowMap, float] | None = None  # public: last metric

        methods = ["vectorize", "jacobian"] if gradient_method == "auto" else [gradient_method]
        failures: list[str] = []
        backend_failures: list[str] = []  # messages of BackendNotSupportedError (data-free)
        coupled = False
        reference = self._reference_values() if validate else None
        for method in methods:
            try:
                self._build_likelihood(method)
            except Exception as err:
                # the type only: a build error's text may print a constant's values
                failures.append(f"{method}: could not be built ({type(err).__name__})")
                continue
            if not validate:
                break
            try:
                problem, is_coupling = self._validate(reference)
            except BackendNotSupportedError as err:  # this method's graph; the other may pass
                backend_failures.append(str(err))
                failures.append(f"{method}: the {self.backend} backend cannot compile it")
                continue
            if problem is None:
                break
            coupled = coupled or is_coupling
            failures.append(f"{method}: {problem}")
        else:
            detail = "; ".join(failures)
            if backend_failures and len(backend_failures) == len(failures):
                raise BackendNotSupportedError(backend_failures[0])
            if coupled:
                raise CoupledRowsError(
                    "The log-likelihood does not split into terms that each depend on one row "
                    f"only ({detail}). Each row's term must read only that row of the observed "
                    "data and of the row-aligned data: a cross-row statistic such as "
                    "`x - x.mean()` or one multivariate distribution spanning all rows makes one "
                    "person's data move every term, which DP clipping cannot bound. Compute "
                    "such transforms with public constants instead."
                )
            raise ModelNotSupportedError(
                f"Could not build per-row log-likelihood gradients for this model ({detail})."
            )
        self.gradient_method = method

    @classmethod
    def for_model(
        cls,
        model: pm.Model | None = None,
        vars: Sequence[Any] | None = None,
        *,
        row_data: Sequence[Any] | None = None,
        backend: str | None = None,
    ) -> RowLikelihood:
        """The oracle of ``model``, built once and shared by every step built on it.

        A second step on the same model (``DPHMC`` after ``DPPenalty``, a rerun with another
        budget) reuses the compiled oracle instead of compiling it again. The oracle is kept on
        the model object and reused only while nothing it was built from has changed: the same
        variables (by identity, so a variable or deterministic added since is a new model), the
        same initial values and ``check_bounds``, and the same data (``pm.set_data`` since the
        build makes a new oracle, validated on the new data). A step that moves only some of
        the free variables gets its own oracle (it holds the others fixed at its own values).
        """
        model = pm.modelcontext(model)
        value_vars = resolve_vars(model, vars)
        if len(value_vars) != len(model.value_vars):
            return cls(model, vars, row_data=row_data, backend=backend)
        key = (
            check_backend(backend),
            tuple(v.name for v in value_vars),
            None if row_data is None else _row_data_key(row_data),
            tuple((name, id(var)) for name, var in model.named_vars.items()),
            tuple((id(rv), id(value)) for rv, value in model.rvs_to_initial_values.items()),
            bool(getattr(model, "check_bounds", True)),
        )
        built = model.__dict__.setdefault("_pymc_dp_oracles", {})
        oracle = built.get(key)
        if oracle is not None:
            try:
                oracle.check_data_unchanged()
            except DataChangedError:
                oracle = None
        if oracle is None:
            oracle = cls(model, vars, row_data=row_data, backend=backend)
            built.clear()  # one oracle per model: an older one is for data or graphs now gone
            built[key] = oracle
        oracle.check_deterministics()
        return oracle

    # ------------------------------------------------------------------ model inspection

    def _check_observed(self) -> list[_RowInput]:
        model = self.model
        if not model.observed_RVs:
            raise ModelNotSupportedError(
                "The model has no observed variables, so there is no private data to protect. "
                "Give the likelihood with `observed=...`; for a prior-only model use pm.sample."
            )
        observed = []
        for rv in model.observed_RVs:
            value = model.rvs_to_values[rv]
            if not is_data_leaf(value):
                raise ModelNotSupportedError(
                    f"Observed variable {rv.name!r} is observed through a computed expression; "
                    "pass a NumPy array or pm.Data container as `observed`."
                )
            data = leaf_value(value)
            if data.ndim == 0:
                raise ModelNotSupportedError(
                    f"Observed variable {rv.name!r} is a scalar; rows are the leading axis of "
                    "observed data, so give it shape (n, ...) with one entry per individual."
                )
            if np.issubdtype(data.dtype, np.floating) and not np.all(np.isfinite(data)):
                raise ModelNotSupportedError(
                    f"Observed variable {rv.name!r} contains NaN or infinite values. Drop or "
                    "impute those rows before building the model (imputing inside the model "
                    "would turn private data into free variables)."
                )
            observed.append(_RowInput(rv.name, value, data, observed=True))
        lengths = {o.name: o.data.shape[0] for o in observed}
        if len(set(lengths.values())) > 1:
            raise ModelNotSupportedError(
                f"Observed variables have different numbers of rows {lengths}. Every observed "
                "variable must have one entry per individual along its leading axis."
            )
        return observed

    def _split_logp(self) -> tuple[list[Variable], list[tuple[str, Variable]]]:
        """Per-row likelihood terms (one (n,) vector per observed variable) and prior terms."""
        model = self.model
        lik_terms = []
        prior, elementwise = prior_and_observed_terms(model)
        for rv, term in zip(model.observed_RVs, elementwise, strict=True):
            if term.ndim == 0:
                raise CoupledRowsError(
                    f"Observed variable {rv.name!r} is a single multivariate draw over all rows "
                    f"(its log-density is one number, not one per row). Each row must be its own "
                    "draw: e.g. MvNormal with observed of shape (n, k) is fine, one MvNormal of "
                    "length n across individuals is not."
                )
            if term.ndim > 1:
                term = term.sum(axis=tuple(range(1, term.ndim)))
            lik_terms.append(term)
        return lik_terms, prior

    def _find_row_inputs(
        self, lik_terms: list[Variable], row_data: Sequence[Any] | None
    ) -> list[_RowInput]:
        n = self.n_rows
        rows = list(self._observed)
        observed_vars = {r.variable for r in rows}
        if row_data is None:
            for leaf in ancestors(lik_terms):
                if leaf in observed_vars or not is_data_leaf(leaf) or leaf.type.ndim == 0:
                    continue
                data = leaf_value(leaf)
                if data.shape[0] == n:
                    rows.append(_RowInput(_row_name(leaf), leaf, data, observed=False))
        else:
            if isinstance(row_data, str | Variable):
                row_data = [row_data]
            for item in row_data:
                var = self.model.named_vars.get(item) if isinstance(item, str) else item
                if var is None or not is_data_leaf(var):
                    raise InvalidParameterError(
                        f"row_data: {item!r} is not a pm.Data container or constant of this "
                        f"model. Data containers: {[v.name for v in self.model.data_vars]}."
                    )
                data = leaf_value(var)
                if data.ndim == 0 or data.shape[0] != n:
                    raise InvalidParameterError(
                        f"row_data: {describe_leaf(var)} has shape {data.shape}, but rows are "
                        f"its leading axis and the observed data has {n} rows."
                    )
                if var not in observed_vars:
                    rows.append(_RowInput(_row_name(var), var, data, observed=False))
        for r in rows:
            if not r.observed and np.issubdtype(r.data.dtype, np.floating):
                if not np.all(np.isfinite(r.data)):
                    raise ModelNotSupportedError(
                        f"Row data {r.name!r} contains NaN or infinite values. Drop or impute "
                        "those rows before building the model."
                    )
        return rows

    def _check_no_leaks(self, prior_terms: list[tuple[str, Variable]]) -> None:
        """Refuse priors, potentials and deterministics that read row data (``_leaks``).

        Runs before anything is compiled, so a refusal comes in seconds, not after the build.
        """
        potentials = {p.name for p in self.model.potentials}
        terms = [
            ("pm.Potential" if name in potentials else "The prior of", name, term)
            for name, term in prior_terms
        ]
        check_terms(terms, **self._row_evidence())
        self.check_deterministics()

    def _row_evidence(self) -> dict[str, Any]:
        return dict(
            n_rows=self.n_rows,
            row_vars={r.variable for r in self._rows},
            row_arrays=[r.data for r in self._rows],
        )

    def check_deterministics(self, model: pm.Model | None = None) -> None:
        """Refuse the model's ``pm.Deterministic``s that read row data (``pm.sample`` stores them).

        Run when the oracle is built and again before sampling, since deterministics can be
        added to the model afterwards. ``model``: another model on the same data (the one a
        step publishes draws of, when it samples centred coordinates; default: the oracle's).
        Raises :class:`~pymc_dp.errors.PrivacyLeakError`.
        """
        model = self.model if model is None else model
        if model is not None:
            check_deterministics(model, **self._row_evidence())

    # ------------------------------------------------------------------ graph construction

    def _row_placeholders(self, batch_shape: tuple[int | None, ...]) -> list[Variable]:
        return [
            pt.tensor(
                name=f"row_input_{k}", dtype=r.data.dtype, shape=batch_shape + r.data.shape[1:]
            )
            for k, r in enumerate(self._rows)
        ]

    def _canonical_lik_terms(self) -> tuple[list[Variable], list[Variable]]:
        """Likelihood terms with row inputs replaced by fixed-length placeholders, rewritten.

        Row inputs are replaced *before* rewriting so that no data is constant-folded into the
        graph, and with placeholders of the true static length so that the rewrite can drop the
        shape operations in which PyMC bakes in the number of rows. Shape assertions
        (``SpecifyShape``, e.g. of a mixture's components against ``n`` in PyMC 6) are dropped
        too: they only assert shapes, and the validation compares the values with PyMC's.
        """
        fixed = self._row_placeholders((self.n_rows,))
        terms = clone_replace(
            self._lik_terms, {r.variable: p for r, p in zip(self._rows, fixed, strict=True)}
        )
        # stabilised as PyMC does before it differentiates (model.dlogp): log σ(η) becomes
        # −softplus(−η) here, before the per-row vectorisation puts a reshape between the log
        # and the sigmoid where the compiler's own stabilisation no longer finds them (a
        # logistic row's log-likelihood was −∞ from |η| ≈ 37 on, its gradient NaN on PyTensor 2)
        terms = rewrite_graph(terms, include=("canonicalize", "stabilize"))
        terms = rewrite_graph(
            terms,
            include=(),
            custom_rewrite=in2out(
                _drop_specify_shape,
                _inline_op_from_graph,
                _log1p_neg_sigmoid,
                _softplus_of_negation,
                _sigmoid_range_check,
            ),
        )
        return terms, fixed

    def _resize_rows(
        self, terms: list[Variable], fixed: list[Variable], new: list[Variable]
    ) -> dict[Variable, Variable]:
        """Replacements from the ``n``-row placeholders to ``new`` ones (of ``m`` rows).

        The canonical graph may hold the row positions ``0 … n−1`` as a constant (folded from
        ``arange(n)``, e.g. ``p[arange(n), y]`` in an ordinal likelihood); it becomes
        ``arange(m)`` of the new rows, in the same layout; likewise an array the likelihood
        makes with ``n`` rows from public values (``pt.zeros((X.shape[0], 1))``, folded to
        ``Alloc(0, n, 1)``) is made with ``m`` (:func:`_resized_rows_shape`).
        A constant that was not the row count is caught by the validation, which compares the
        values with PyMC's.
        """
        replacements: dict[Variable, Variable] = dict(zip(fixed, new, strict=True))
        n, m = self.n_rows, new[0].shape[0]
        if n < 2:
            return replacements
        positions = np.arange(n)
        for var in ancestors(terms):
            if var.owner is None:
                if not isinstance(var, pt.TensorConstant):
                    continue
                data = var.data
                if data.dtype.kind not in "iu" or data.ndim == 0 or data.shape[0] != n:
                    continue
                if data.size == n and np.array_equal(data.ravel(), positions):
                    rows = pt.arange(m, dtype=data.dtype)
                    replacements[var] = pt.shape_padright(rows, data.ndim - 1)
                continue
            resized = _resized_rows_shape(var, n, m, fixed)
            if resized is not None:
                replacements[var] = resized
        return replacements

    def _lik_value_vars(self, ell: Variable) -> list[Variable]:
        used = set(ancestors([ell]))
        return [v for v, _, _ in self.space.slices if v in used]

    def _build_likelihood(self, method: str) -> None:
        terms, fixed = self._canonical_lik_terms()
        if method == "vectorize":
            one = self._row_placeholders((1,))
            one_terms = clone_replace(
                terms, self._resize_rows(terms, fixed, one), rebuild_strict=False
            )
            ell_one = lift_gathers(pt.add(*[t.sum() for t in one_terms]))
            lik_vars = self._lik_value_vars(ell_one)
            gathers = row_gathers(ell_one, lik_vars, one)
            dense_vars = [v for v in lik_vars if v not in gathers]
            # A gathered variable's per-row gradient is the gradient with respect to the one
            # entry the row reads, placed at the row's index: differentiate by that entry.
            wrt = dense_vars + [gathered for gathered, _ in gathers.values()]
            grads_one = pytensor.grad(ell_one, wrt) if wrt else []
            indices_one = [index for _, index in gathers.values()]
            inputs = self._row_placeholders((None, 1))
            outs = vectorize_graph(
                [ell_one, *grads_one, *indices_one], dict(zip(one, inputs, strict=True))
            )
            outs = unbatch_blockwise(outs)
            # The gradients without the one row's length-one axis wherever an operation allows
            # it, so that the loops computing a row's gradient fuse with those clipping and
            # summing it (PyMC 6, n = 10⁵: the Normal model's clipped sum 0.20 → 0.10 ms). The
            # log-likelihood keeps it: without it, the group models' per-row log-likelihood
            # was twice as fast, but the negative binomial's and the censored Weibull's 12–24 %
            # slower (the validation zoo, one run)
            outs = [outs[0], *drop_row_axis(outs[1:])]
            ell = outs[0]
            grads = outs[1 : 1 + len(dense_vars)]
            m = ell.shape[0]
            sparse = {
                v: (g.reshape((m, -1)), index.reshape((m,)))
                for v, g, index in zip(
                    gathers,
                    outs[1 + len(dense_vars) : 1 + len(wrt)],
                    outs[1 + len(wrt) :],
                    strict=True,
                )
            }
            lik_vars = dense_vars
            self.gathered_vars = [v.name for v in gathers]
            self._gather_groups = shared_index_groups(gathers)
            self._single_row_axis = True
        else:
            inputs = self._row_placeholders((None,))
            var_terms = clone_replace(
                terms, self._resize_rows(terms, fixed, inputs), rebuild_strict=False
            )
            ell = pt.add(*var_terms)
            lik_vars = self._lik_value_vars(ell)
            weights = pt.vector("row_weights", dtype=ell.dtype)
            weighted = (weights * ell).sum()
            grads = []
            for v in lik_vars:
                g = pytensor.grad(weighted, v)
                jac = pytensor.gradient.jacobian(g.ravel(), weights, vectorize=True)
                grads.append(jac.T)
            grads = clone_replace(grads, {weights: pt.ones_like(ell)})
            sparse = {}
            self.gathered_vars = []
            self._gather_groups = {}
            self._single_row_axis = False
        m = ell.shape[0]
        blocks = {v: g.reshape((m, -1)) for v, g in zip(lik_vars, grads, strict=True)}
        self._compile_likelihood(ell, blocks, sparse, inputs)

    def _compile_likelihood(
        self,
        ell: Variable,
        blocks: dict[Variable, Variable],
        sparse: dict[Variable, tuple[Variable, Variable]],
        inputs: list[Variable],
    ) -> None:
        """Compile the per-row functions from the per-row log-likelihood and gradient blocks.

        ``blocks`` maps a value variable to its dense per-row gradient, ``(m, size)``.
        ``sparse`` maps a row-gathered variable ``v`` (the likelihood reads ``v[idx_i]`` only)
        to ``(g, idx)``: row ``i``'s gradient is ``g_i`` (``(m, size/len(v))``) placed at entry
        ``idx_i`` of ``v``, zero elsewhere.
        """
        floatX = pytensor.config.floatX
        # the coordinates of θ the likelihood reads (public: the model's graph); along the
        # others every row's log-likelihood, and so its gradient, is constant
        self.likelihood_coordinates = np.zeros(self.space.ndim, dtype=bool)
        for v, sl, _ in self.space.slices:
            if v in blocks or v in sparse:
                self.likelihood_coordinates[sl] = True
        self.fisher_pattern = fisher_pattern(
            self.space.slices, self.likelihood_coordinates, self._gather_groups
        )
        # each gathered variable's place in θ: (first coordinate, groups, coordinates per group)
        self.gathered_blocks = [
            (sl.start, shape[0], (sl.stop - sl.start) // shape[0])
            for v, sl, shape in self.space.slices
            if v in self._gather_groups
        ]
        self.row_blocks = row_blocks(
            self.likelihood_coordinates, self.gathered_blocks, set(self._gather_groups.values())
        )
        sparse_vars = list(sparse)
        flat = [ell, *blocks.values(), *[part for v in sparse_vars for part in sparse[v]]]
        ell_theta, *flat_theta = self.space.to_theta(flat)
        blocks_theta = dict(zip(blocks, flat_theta[: len(blocks)], strict=True))
        rest = flat_theta[len(blocks) :]
        sparse_theta = {v: (rest[2 * k], rest[2 * k + 1]) for k, v in enumerate(sparse_vars)}
        loglik_graph = ([self.space.theta, *inputs], ell_theta)
        sizes = {v: sl.stop - sl.start for v, sl, _ in self.space.slices}
        shapes = {v: shape for v, _, shape in self.space.slices}
        # columns of a row's gradient: all of a dense block, one entry's worth of a gathered v
        widths = {v: sizes[v] for v in blocks} | {v: sizes[v] // shapes[v][0] for v in sparse}
        if self._auto_chunk:
            width = max(sum(widths.values()), 1)
            self.chunk_size = max(_MIN_CHUNK, self._chunk_bytes // (8 * width))

        # Clipped gradient sum, theory §2: Σ_i g_i · min(1, b / ‖g_i‖), per value-variable block,
        # joined into the raveled vector only at the end. Measured choices (benchmarks/oracle.py):
        # - the reductions over rows of a block of several columns are matrix products
        #   (‖g_i‖² = (g_i²)·1, Σ_i s_i g_i = sᵀG): a CAReduce sum is several times slower;
        # - the scale is s_i = 1/√max(‖g_i‖²/b², 1), with the maximum written branch-free
        #   (PyTensor's NaN-checking `maximum` mispredicts when many rows are clipped) and 1/b²
        #   computed once, so b = ∞ (no clipping) gives s = 1;
        # - the count of clipped rows is in a second function, used only when asked for: in the
        #   same loop it more than doubles the cost, and it is a non-private diagnostic.
        # - a scalar parameter's column is summed as Σ_i s_i g_i on PyTensor 3 (Numba), which
        #   fuses it into the loop computing the rows' gradients, where the column's gradient is
        #   elementary arithmetic; with special functions in it (digamma, erf, …) a product
        #   sᵀg is faster there, and on PyTensor 2's C backend always (:func:`_fused_column`).
        # Every entry goes through :func:`bounded_entries` before anything else reads it: NaN
        # (an undefined gradient on an extreme row) becomes 0 and anything beyond ±L (an
        # overflow to ±∞) ±L, so every row's term is a finite function of that row alone, at
        # most b long, whatever the compiler does with the expression (theory §2).
        bound = pt.scalar("grad_clip", dtype=floatX)
        # the norm is taken of D g_i, D = diag(precond) (public; ones for the plain clip)
        precond = pt.vector("grad_precond", dtype=floatX)
        m = ell_theta.shape[0]
        slices = {v: sl for v, sl, _ in self.space.slices}

        branchy = _compile.c_backend(self.backend)

        def bounded(g: Variable, width: int) -> Variable:
            # one column as a vector, its entries bounded
            g = g.reshape((m,)) if width == 1 else g.reshape((m, width))
            return bounded_entries(g, c_backend=branchy)

        columns = {v: bounded(g, widths[v]) for v, g in blocks_theta.items()}
        # a row-gathered variable: row i's gradient entries, all at index idx_i of v
        entries = {v: (bounded(g, widths[v]), index) for v, (g, index) in sparse_theta.items()}
        sq_norm = pt.zeros((m,), dtype=floatX)
        for v, g in columns.items():
            weight = pt.sqr(precond[slices[v]])
            if g.ndim == 1:
                sq_norm = sq_norm + pt.sqr(g) * weight[0]
            else:
                sq_norm = sq_norm + pt.dot(pt.sqr(g), weight)
        for v, (g, index) in entries.items():
            if g.ndim == 1:
                # one entry per group: the weights gathered as a vector, which PyTensor 3 reads
                # inside the fused per-row loop; gathered as rows of a (groups, 1) matrix and
                # reshaped, they were a separate pass (PyMC 6, n = 10⁵: the 50-group
                # hierarchy's clipped sum 0.71 → 0.57 ms, the varying slopes' 1.04 → 0.77;
                # unchanged on PyMC 5)
                sq_norm = sq_norm + pt.sqr(g) * pt.sqr(precond[slices[v]])[index]
            else:
                weight = pt.sqr(precond[slices[v]]).reshape((shapes[v][0], -1))[index]
                sq_norm = sq_norm + pt.sum(pt.sqr(g) * weight, axis=1)
        x = sq_norm * pt.reciprocal(pt.sqr(bound))  # ‖g_i‖²/b²
        scale = pt.reciprocal(pt.sqrt(0.5 * (x + 1.0 + pt.abs(x - 1.0))))  # 1/√max(x, 1)
        pieces = []
        for v, _, shape in self.space.slices:
            if v in entries:  # Σ_i s_i g_i placed at idx_i: a scatter-add over the rows
                g, index = entries[v]
                if g.ndim == 1:
                    acc = pt.zeros((shape[0],), dtype=floatX)
                    pieces.append(pt.inc_subtensor(acc[index], scale * g))
                else:  # flat: a row scatter of (m, w) values fails on a 1-row chunk (PyTensor 2)
                    width = widths[v]
                    at = (index[:, None] * width + pt.arange(width)).reshape((-1,))
                    acc = pt.zeros((sizes[v],), dtype=floatX)
                    pieces.append(pt.inc_subtensor(acc[at], (scale[:, None] * g).reshape((-1,))))
            elif v not in columns:  # the likelihood does not depend on v: zero gradient
                pieces.append(pt.zeros((sizes[v],), dtype=floatX))
            elif sizes[v] == 1 and not branchy and _fused_column(blocks_theta[v]):
                pieces.append(pt.sum(scale * columns[v]).reshape((1,)))
            elif sizes[v] == 1:
                pieces.append(pt.dot(scale, columns[v]).reshape((1,)))
            else:
                pieces.append(pt.dot(scale, columns[v]))
        total = pt.concatenate(pieces) if pieces else pt.zeros((0,), dtype=floatX)
        grad_graph = ([self.space.theta, *inputs, bound, precond], total)
        n_clipped = pt.sum(sq_norm > pt.sqr(bound))  # NOT private: diagnostics only
        # with the count, for non-private diagnostics only: compiled on first use
        self._grad_and_count = ([self.space.theta, *inputs, bound, precond], [total, n_clipped])
        self._f_grad_and_count = None

        # Clipped log-likelihood-ratio sum, theory §2: Σ_i clip(ℓ_i(θ') − ℓ_i(θ), −B, B).
        theta_new = pt.vector("theta_new", dtype=floatX)
        (ell_new,) = clone_replace([ell_theta], {self.space.theta: theta_new})
        llr_bound = pt.scalar("llr_clip", dtype=floatX)
        ratio = ell_new - ell_theta
        # on a subset of rows only (minibatch steps): compiled on first use
        self._llr_graph = (
            [self.space.theta, theta_new, *inputs, llr_bound],
            [clip_ratio_graph(ratio, llr_bound).sum(), count_clipped_graph(ratio, llr_bound)],
        )
        self._f_llr = None
        # Per-row gradients in compact form: each row's possibly non-zero entries only, an
        # (m, K) matrix, and the index of each gathered group. Column k of row i is coordinate
        # `first_k + stride_k · index_{group_k, i}` of θ (stride 0: the same for every row).
        # The centring's reads and the centred releases work on it: for a hierarchy K is a few
        # columns where d is the number of groups (theory §4.3). Compiled on first use.
        compact, first, stride, group_of = [], [], [], []
        # one index per (index computation, number of groups): variables read at the same
        # index but of different lengths wrap a negative index differently
        group_index: dict[tuple[int, int], Variable] = {}
        for v, sl, _ in self.space.slices:
            if v in blocks_theta:  # as computed: the callers decide what a non-finite entry is
                compact.append(blocks_theta[v].reshape((m, widths[v])))
                first.extend(range(sl.start, sl.stop))
                stride.extend([0] * widths[v])
                group_of.extend([-1] * widths[v])
            elif v in sparse_theta:
                g, index = sparse_theta[v]
                number = (self._gather_groups[v], shapes[v][0])
                group_index.setdefault(number, index)
                position = list(group_index).index(number)
                compact.append(g.reshape((m, widths[v])))
                first.extend(range(sl.start, sl.start + widths[v]))
                stride.extend([widths[v]] * widths[v])
                group_of.extend([position] * widths[v])
        values = pt.concatenate(compact, axis=1) if compact else pt.zeros((m, 0), dtype=floatX)
        indices = [pt.cast(index, "int64") for index in group_index.values()]
        self._compact_graph = ([self.space.theta, *inputs], [values, *indices])
        self._compact_layout = _CompactLayout(
            first=np.array(first, dtype=np.int64),
            stride=np.array(stride, dtype=np.int64),
            group=np.array(group_of, dtype=np.int64),
            groups=np.array([size for _, size in group_index], dtype=np.int64),
        )
        self._f_compact = None
        self._flat: np.ndarray | None = None  # likelihood_flat_directions, on first use
        self._kinked: bool | None = None  # likelihood_has_kinks, on first use
        layout = self._compact_layout
        shared_first = layout.first[layout.shared]

        # The centred ratio in the same pass (theory §4.1, the default step's hot path): with
        # the rows' clipped centre gradients ĝ_i on the shared columns (an (m, |S|) input),
        # the rest of ĝ_i·(θ − θ_c) (`extra`: the gathered columns', from NumPy; zeros without
        # gathered variables) and c_i(θ) = ℓ_i(θ) − ĝ_i·(θ − θ_c), it returns c(θ') and
        # Σ_i clip(c_i(θ') − c_i(θ), ±B) = the clipped centred ratio sum. Compiled when a
        # centred release is built.
        centre_shared = pt.matrix("centre_shared", dtype=floatX)
        centre_theta = pt.vector("centre_theta", dtype=floatX)
        extra = pt.vector("centre_extra", dtype=floatX)
        current = pt.vector("current_centred", dtype=floatX)
        ratio_bound = pt.scalar("ratio_bound", dtype=floatX)
        offset = (self.space.theta - centre_theta)[shared_first]
        centred = ell_theta - pt.dot(centre_shared, offset) - extra
        self._centred_graph = (
            [self.space.theta, *inputs, centre_shared, centre_theta, extra, current, ratio_bound],
            [centred, clip_ratio_graph(centred - current, ratio_bound).sum()],
        )
        self._f_centred = None
        # The centred gradient sum (theory §4.3, DPHMC's hot path) without gathered variables:
        # Σ_i clip_B(Mᵀ(g_i − ĝ_i)) with g_i the K columns of row i's gradient (non-finite
        # entries 0), ĝ_i its clipped gradient at the centre (an (m, K) input) and M (K × r)
        # the public metric on those columns; the mapped entries bounded (bounded_entries:
        # an overflow in the difference or the product is ±L, NaN 0), so that every row's
        # squared norm is finite (at most r L²) and its term finite and within B, in one
        # compiled pass with no fallback; the scale as in the clipped gradient sum. (A chunk
        # whose total was not finite used to be summed again in NumPy, whose norms are
        # rescaled: a row that added 0 here added B there, so a chunk-mate decided what a
        # row added, by up to 4.9 B under substitution; found in review.) With gathered
        # variables, or on PyTensor's C backend (_compile.c_backend), the sum is formed in
        # NumPy from the compact rows (_RowMap).
        self._centred_grad_graph = None
        if not group_index and not _compile.c_backend(self.backend):
            centre_values = pt.matrix("centre_values", dtype=floatX)
            mapping = pt.matrix("centred_map", dtype=floatX)
            centred_clip = pt.scalar("centred_clip", dtype=floatX)
            difference = pt.switch(pt.abs(values) < np.inf, values, 0.0) - centre_values
            mapped = bounded_entries(pt.dot(difference, mapping))
            sq = pt.dot(pt.sqr(mapped), pt.ones_like(mapping[0]))
            x = sq * pt.reciprocal(pt.sqr(centred_clip))
            scale = pt.reciprocal(pt.sqrt(0.5 * (x + 1.0 + pt.abs(x - 1.0))))
            self._centred_grad_graph = (
                [self.space.theta, *inputs, centre_values, mapping, centred_clip],
                pt.dot(scale, mapped),
            )
        self._f_centred_grad = None

        # The per-row functions share the per-row log-likelihood or its gradient: the algebra
        # of those that compute the same one is rewritten once for all of them
        # (_compile.RewriteGroup): the values (log-likelihood, centred ratio) and the
        # gradients (clipped sum, compact rows, centred gradient sum). Two families, as
        # rewrites choose another form for a subexpression both kinds use (a logistic
        # regression's sigmoid: its per-row gradient 1.3x slower when rewritten with the
        # log-likelihood); the count of clipped rows, which another fusion of the squared
        # norms then serves, and the minibatch ratio (a second copy of the likelihood, at θ')
        # are compiled on their own, on first use. Measured per pass against separate
        # compilations: the same within noise on the benchmark models, except PyTensor 3's
        # censored Normal (gradients 1.1x slower) and the gathered models' compact rows
        # (PyTensor 2: 1.7x faster).
        graphs = {
            "loglik": loglik_graph,
            "centred": self._centred_graph,
            "grad": grad_graph,
            "compact": self._compact_graph,
            "grad_and_count": self._grad_and_count,
        }
        if self._centred_grad_graph is not None:
            graphs["centred_grad"] = self._centred_grad_graph
        self._graphs = graphs
        self._rewrite_groups: dict[str, RewriteGroup] = {}
        if self.backend is None:
            gradients = ("grad", "compact", "centred_grad")
            for names in (("loglik", "centred"), tuple(g for g in gradients if g in graphs)):
                group = RewriteGroup(
                    {name: graphs[name] for name in names}, check_bounds=self._check_bounds
                )
                self._rewrite_groups.update(dict.fromkeys(names, group))
        self._f_loglik = self._compile_graph("loglik")
        self._f_grad = self._compile_graph("grad")

    # ------------------------------------------------------------------ validation

    def _reference_values(self) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
        """PyMC's per-row log-likelihood, logp and dlogp at a random point θ (for checks).

        The graphs are PyMC's own (``model.logp``'s terms, as ``model.dlogp`` differentiates
        them), on the model's value variables and data; the oracle's functions are built from
        the same terms with the rows made inputs, so a mistake there shows as a difference.
        Compiled with few rewrites (:data:`_REFERENCE_MODE`): the function runs once.
        """
        model = self.model
        check_rng = np.random.default_rng(20240917)  # public: nothing here is released
        space = self.space
        theta = space.ravel(self._initial_point) + check_rng.normal(0.0, 0.3, self.ndim)
        point = {**self._initial_point, **space.unravel(theta), **space.fixed_values}
        # the model's log-density: every free, observed and potential term, as model.logp()
        total = pt.add(*[t.sum() for t in self._lik_terms], *[t.sum() for _, t in self._prior])
        # PyMC's pre-gradient rewrites (model.dlogp), on a copy: they rewrite a graph in place,
        # and these terms are the ones the oracle's own functions are built from. The values
        # too: PyMC's compiled logp is stabilised (log σ(η) as −softplus(−η)), and so are the
        # oracle's rows, where this light mode alone would overflow (−∞ for |η| ≳ 37)
        copies = clone_replace([total, pt.add(*self._lik_terms)], {})  # same inputs and data
        pregrad, rows = rewrite_graph(
            copies,
            include=("canonicalize", "stabilize"),
            custom_rewrite=in2out(_log1p_neg_sigmoid),  # as in the oracle's own terms
        )
        grads = pm.pytensorf.gradient(pregrad, self.value_vars)
        outputs = [rows, pregrad, grads]
        reference = _compile_once(model.value_vars, outputs)
        expected, logp, dlogp = self._private_call(
            reference, *[np.asarray(point[v.name], dtype=v.dtype) for v in model.value_vars]
        )
        return theta, np.asarray(expected), float(logp), np.asarray(dlogp)

    def _validate(
        self, reference: tuple[np.ndarray, np.ndarray, float, np.ndarray]
    ) -> tuple[str | None, bool]:
        """Compare with PyMC at a random point. Returns (problem or None, is_coupling)."""
        theta, expected, logp, dlogp = reference
        check_rng = np.random.default_rng(20240918)
        try:
            full = self.loglik_rows(theta, _count=False)
            subsets = [check_rng.choice(self.n_rows, size=k, replace=False) for k in (1, 1, 5)]
            sub_values = [self.loglik_rows(theta, rows=idx, _count=False) for idx in subsets]
        except BackendNotSupportedError:  # the caller tries the other gradient method
            raise
        except Exception as err:
            return f"evaluation on a subset of rows failed ({type(err).__name__})", False
        if full.shape != (self.n_rows,):
            return f"per-row values have shape {full.shape}, expected ({self.n_rows},)", True
        tol = dict(rtol=1e-8, atol=1e-10)
        if not np.allclose(full, expected, equal_nan=True, **tol):
            return "a row's log-likelihood computed alone differs from PyMC's value", True
        for idx, values in zip(subsets, sub_values, strict=True):
            if not np.allclose(values, expected[idx], equal_nan=True, **tol):
                return "a row's log-likelihood computed on a subset of rows differs", True
        # Sums are compared with the floating-point summation bound: the tolerance scales with
        # the sum of absolute terms, since PyMC adds the same terms in another order.
        prior, prior_grad = self.space.logprior_and_grad(theta)
        ours = float(np.sum(full)) + prior
        if abs(ours - logp) > 1e-9 * (np.sum(np.abs(full)) + abs(prior)) + 1e-10:
            return "the summed log-density differs from PyMC's logp", True
        grad = self.grad_sum(theta, _count=False) + prior_grad
        if not np.all(np.isfinite(dlogp)):
            return None, False  # PyMC's own gradient overflows here: nothing to compare with
        if not np.allclose(grad, dlogp, rtol=1e-7, atol=1e-10):
            scale = np.abs(prior_grad)
            for chunk in self._chunks(None, False):
                rows = self._grad_rows_chunk(theta, chunk)
                scale = scale + np.abs(rows).sum(axis=0)
            if np.any(np.abs(grad - dlogp) > 1e-7 * scale + 1e-10):
                return "the gradient differs from PyMC's dlogp", False
        return None, False

    def __getstate__(self) -> dict[str, Any]:
        # The compiled functions, the data and the layout are all a copy needs; the model and
        # its symbolic graphs stay behind (they do not pickle reliably, and are not needed).
        # pm.sample pickles the step for its worker processes in the parent, where the model is
        # still at hand: a deterministic added since the build is refused here, before any
        # worker starts (the workers have no model to check).
        self.check_deterministics()
        state = self.__dict__.copy()
        for key in ("model", "_lik_terms", "_prior", "_gather_groups"):
            state[key] = None
        state["_loglik_cache"] = []
        state["_centre_cache"] = None  # recomputed on first use (one gradient pass)
        state["_centred_cache"] = []
        state["_resident"] = None  # device memory: a copy makes its own on first use
        return state

    @property
    def row_variables(self) -> list[Variable]:
        """The graph inputs that hold row data (observed values and row-aligned data)."""
        return [r.variable for r in self._rows]

    def set_fixed_values(self, point: dict[str, Any]) -> None:
        """Set the free variables held fixed (not in ``vars``); forgets cached per-row values."""
        self.space.set_fixed_values(point)
        self.clear_cache()  # per-row values depend on the fixed values
        self._flat = None  # and which directions are flat may too (s·a + b at s = 1)
        self._kinked = None

    def clear_cache(self) -> None:
        """Forget the per-row log-likelihoods kept for the ratio (call when public data change)."""
        self._loglik_cache = []
        self._centre_cache = None
        self._centred_cache = []

    # ------------------------------------------------------------------ support and start

    def _support_checks(self, lik_terms: list[Variable]) -> list[tuple[str, Variable]]:
        """The likelihood's parameter checks that read no row data (for the public space).

        A failed check (``sigma > 0`` where ``sigma = exp(θ)`` underflowed) makes the model's
        log-density −∞ whatever the data: such a proposal is rejected without reading data
        (:meth:`ParameterSpace.in_support`). Checks that involve row data stay inside the
        per-row terms (−∞ there, clipped).
        """
        from pymc.logprob.utils import CheckParameterValue

        row_vars = {r.variable for r in self._rows}
        moved = set(self.value_vars)
        checks: list[tuple[str, Variable]] = []
        if not self._check_bounds:
            return checks
        for var in ancestors(lik_terms):
            node = var.owner
            if node is None or not isinstance(node.op, CheckParameterValue):
                continue
            if not node.op.can_be_replaced_by_ninf:
                continue
            for cond in node.inputs[1:]:
                above = set(ancestors([cond]))
                if moved.intersection(above) and not row_vars.intersection(above):
                    checks.append((str(node.op.msg), pt.all(cond)))
        return checks

    def _check_row_indices(self, lik_terms: list[Variable]) -> None:
        """Refuse index columns (``a[group]``) with values outside the indexed axis.

        PyTensor 3's gather does not check bounds (it reads past the array), and PyTensor 2
        raises an error that would name the offending value. Checked once at build time on the
        data (like finiteness: whether a model is accepted is not a DP release); the message
        names the indexed variable and its public size, never a data value.
        """
        row_vars = {r.variable for r in self._rows}
        checks = []
        for var in ancestors(lik_terms):
            node = var.owner
            indices = None if node is None else leading_axis_indices(node)
            for axis, index in enumerate(indices or []):
                if index.type.dtype not in integer_dtypes or not row_vars & set(ancestors([index])):
                    continue
                size = node.inputs[0].shape[axis]
                name = node.inputs[0].name or "a parameter"
                checks.append((name, pt.all((index >= -size) & (index < size))))
        if not checks:
            return
        model = self.model
        check = _compile_once(model.value_vars, [ok for _, ok in checks])
        point = self._initial_point
        results = self._private_call(check, *[point[v.name] for v in model.value_vars])
        bad = sorted({name for (name, _), ok in zip(checks, results, strict=True) if not ok})
        if bad:
            raise ModelNotSupportedError(
                f"An index column used to read {bad} (e.g. a group index) has values outside "
                "the range of the variable it indexes, for some rows. Fix the data, or size the "
                "variable from public metadata (the number of groups) so that every index fits."
            )

    def _snapshot_public_data(self, graphs: list[Variable]) -> list[tuple[Any, np.ndarray]]:
        """Copies of the data containers the compiled functions read live (not row inputs)."""
        rows = {r.variable for r in self._rows}
        return [
            (var, np.array(var.get_value(borrow=True), copy=True))
            for var in ancestors(graphs)
            if isinstance(var, SharedVariable)
            and isinstance(var.type, pt.TensorType)
            and var not in rows
        ]

    def check_data_unchanged(self) -> None:
        """Refuse to run when data changed since the build (``pm.set_data``).

        The oracle was built, validated and leak-checked on the data it holds; row data set
        afterwards would either be ignored or mix with the old rows, and a public container
        (read live by the log-prior, say) could be given private values that no check saw.
        Raises :class:`DataChangedError` (no data value appears in the message).
        """
        for var, value in self._public_data:
            current = np.asarray(var.get_value(borrow=True))
            if current.shape != value.shape or not np.array_equal(current, value):
                raise DataChangedError(
                    f"The data container {describe_leaf(var)} changed after this step was built "
                    "(pm.set_data?). A DP step is checked for leaks and validated on the data it "
                    "was built with. Build a new step after pm.set_data, with the same "
                    "PrivacyBudget: its ledger counts both analyses."
                )
        for r in self._rows:
            if not isinstance(r.variable, SharedVariable):
                continue
            current = r.variable.get_value(borrow=True)
            if current is r.data:
                continue
            current = np.asarray(current)
            if current.shape == r.data.shape and np.array_equal(current, r.data):
                continue
            raise DataChangedError(
                f"The data of {r.name!r} changed after this step was built (pm.set_data?). A DP "
                "step is built for, validated on and accounted against the rows it was given. "
                "Build a new step after pm.set_data, with the same PrivacyBudget: its ledger "
                "counts both analyses."
            )

    def _private_call(self, fn: Any, *args: Any) -> Any:
        """Call a compiled function on private data; an error comes back without its text.

        PyTensor's error messages list the input values of the failing node (here: rows of
        the data, or per-row log-likelihoods). The error is re-raised as
        :class:`PrivateEvaluationError` outside the ``except`` block, so it carries neither the
        message nor a cause or context.
        """
        try:
            return fn(*args)
        except PyMCDPError:  # the package's own messages hold no data (a forked JAX worker)
            raise
        except Exception as err:
            kind = type(err).__name__
        raise self._evaluation_error(kind)

    def _evaluation_error(self, kind: str) -> PrivateEvaluationError:
        """The error for a failed evaluation on the private data, without its message."""
        observed = ", ".join(repr(r.name) for r in self._rows if r.observed)
        hint = (
            "An index column (such as a group index) may hold values outside the range of the "
            "parameter it indexes; check it against public metadata (the number of groups)."
            if kind == "IndexError"
            else "Check that the likelihood is defined for every row at every parameter value."
        )
        return PrivateEvaluationError(
            f"Evaluating the likelihood of {observed} on the private data failed ({kind}). The "
            f"original message is withheld because it may contain private values. {hint} To "
            "see the full error, evaluate the model on public synthetic data of the same shape."
        )

    # ------------------------------------------------------------------ private (reads data)

    def loglik_rows(
        self, theta: np.ndarray, rows: np.ndarray | slice | None = None, *, _count: bool = True
    ) -> np.ndarray:
        """Per-row log-likelihood ``ℓ_i(θ)`` for all rows, or for ``rows`` only. Not private."""
        theta = self.space.as_theta(theta)
        chunks = self._chunks(rows, _count, values_only=True)
        parts = [self._private_call(self._f_loglik, theta, *c) for c in chunks]
        return _joined(parts, (0,))

    def clipped_grad_sum(
        self,
        theta: np.ndarray,
        grad_clip: float,
        rows: np.ndarray | slice | None = None,
        *,
        count_clipped: bool = False,
        precond: np.ndarray | None = None,
    ) -> ClippedSum:
        """``Σ_i clip_b(∇_θ ℓ_i(θ))`` with ``b = grad_clip`` (theory §2), over all rows or ``rows``.

        Sensitivity under substitution of one row: ``2 · grad_clip``. With
        ``count_clipped=True`` also count the rows with ``‖∇ℓ_i‖ > b`` (NOT private; counting
        in the same loop makes a call about twice as slow), else ``n_clipped`` is ``None``.
        With ``precond`` (a public positive vector ``D``) each row is scaled by
        ``min(1, b / ‖D ∇ℓ_i‖)`` instead: then ``D · Σ`` has sensitivity ``2b``.
        """
        bound = self._check_norm_bound(grad_clip, "grad_clip")
        weights = self._precond(precond)
        theta = self.space.as_theta(theta)
        total = np.zeros(self.ndim)
        clipped = 0 if count_clipped else None
        if count_clipped and self._f_grad_and_count is None:
            self._f_grad_and_count = self._compile_graph("grad_and_count")
        for chunk in self._chunks(rows, True):
            if count_clipped:
                value, count = self._private_call(
                    self._f_grad_and_count, theta, *chunk, bound, weights
                )
                total += value
                clipped += int(count)
            else:
                total += self._private_call(self._f_grad, theta, *chunk, bound, weights)
        return ClippedSum(total, clipped)

    def clipped_llr_sum(
        self,
        theta: np.ndarray,
        theta_new: np.ndarray,
        llr_clip: float,
        rows: np.ndarray | slice | None = None,
        *,
        count_clipped: bool = False,
    ) -> ClippedSum:
        """``Σ_i clip(ℓ_i(θ') − ℓ_i(θ), −B, B)`` with ``B = llr_clip`` (theory §2).

        ``B`` is the absolute bound; the mechanisms pass ``b_l · ‖θ' − θ‖₂``.
        Sensitivity under substitution of one row: ``2B``. With ``count_clipped=True`` also
        count the rows with ``|ℓ_i(θ') − ℓ_i(θ)| > B`` (NOT private), else ``n_clipped`` is
        ``None``.
        """
        bound = self._check_bound(llr_clip, "llr_clip")
        theta, theta_new = self.space.as_theta(theta), self.space.as_theta(theta_new)
        if rows is None:
            # Over all rows, a Metropolis chain asks for the ratio from the current state, which
            # was the previous proposal or its origin: keep the last two per-row vectors, so an
            # iteration evaluates the likelihood once instead of twice.
            current = self._cached_loglik(theta)
            ratio = self._cached_loglik(theta_new) - current
            over = releases.count_clipped(ratio, bound) if count_clipped else None
            return ClippedSum(releases.clipped_ratio_sum(ratio, bound, overwrite=True), over)
        total = 0.0
        clipped = 0
        if self._f_llr is None:
            self._f_llr = self._compile(*self._llr_graph)
        for chunk in self._chunks(rows, True, values_only=True):
            value, count = self._private_call(self._f_llr, theta, theta_new, *chunk, bound)
            total += float(value)
            clipped += int(count)
        return ClippedSum(total, clipped if count_clipped else None)

    def clipped_centred_llr_sum(
        self,
        theta: np.ndarray,
        theta_new: np.ndarray,
        centre: releases.Centre,
        bound: float,
        *,
        count_clipped: bool = False,
    ) -> ClippedSum:
        """``Σ_i clip(ℓ_i(θ') − ℓ_i(θ) − ĝ_i·(θ' − θ), −B, B)``: the centred ratio (theory §4.1).

        ``ĝ_i`` is row ``i``'s clipped gradient at the :class:`Centre` (:meth:`centre_rows`).
        Each row's term depends on that row only, so the sensitivity under substitution of one
        row is ``2B``, as for :meth:`clipped_llr_sum`. Over all rows; per-row values cached.
        """
        bound = self._check_bound(bound, "bound")
        theta, theta_new = self.space.as_theta(theta), self.space.as_theta(theta_new)
        self._centre_compact(centre)  # ĝ_i, computed once per centre
        stamp = self._centre_cache[0]
        if self._centred_cache[:1] != [stamp]:
            self._centred_cache = [stamp]  # c(θ) depends on the centre
        known = dict(self._centred_cache[1:])
        # the chain's current state first: it is kept while proposals come and go
        key, key_new = theta.tobytes(), theta_new.tobytes()
        if key not in known:
            known[key], _ = self._centred_pass(theta, centre, None, bound)
        current = known[key]
        if key_new in known:  # a state evaluated before (θ' = θ never reaches here)
            ratio = known[key_new] - current
            total = releases.clipped_ratio_sum(ratio, float(bound))
        else:
            known[key_new], total = self._centred_pass(theta_new, centre, current, bound)
            ratio = known[key_new] - current if count_clipped else None
        self._centred_cache = [stamp, (key, current), (key_new, known[key_new])]
        over = releases.count_clipped(ratio, float(bound)) if count_clipped else None
        return ClippedSum(float(total), over)

    def clipped_centred_grad_sum(
        self,
        theta: np.ndarray,
        centre: releases.Centre,
        metric: np.ndarray,
        coordinates: np.ndarray,
        bound: float,
        *,
        count_clipped: bool = False,
    ) -> ClippedSum:
        """``Σ_i clip_B(W_Lᵀ (∇_L ℓ_i(θ) − ĝ_{i,L}))``: the centred gradient sum (theory §4.3).

        ``ĝ_i`` is row ``i``'s clipped gradient at the :class:`Centre` (:meth:`centre_rows`),
        ``L`` the boolean mask ``coordinates`` and ``W_L`` (``metric``, ``|L| × |L|``) the
        public metric the differences are measured and summed in; each row's term is scaled by
        ``min(1, B / ‖·‖)``. Each term depends on that row only, so the sensitivity under
        substitution of one row is ``2B``. A non-finite gradient entry counts as zero. Where
        the sum is compiled (no gathered variable, PyTensor 3 or JAX) the entries of each
        row's mapped difference are bounded as :func:`bounded_entries` bounds them; in NumPy a
        difference that overflows is the largest double of its sign, and a row is scaled to
        ``B`` along its direction (where even its rescaled norm overflows, it adds 0). Either
        way every row's term is finite and within ``B`` whatever the other rows: in NumPy the
        terms are summed before they are mapped, which stays finite while
        ``n B max(cond(W_L), 1/σ_min(W_L)) ≤ 10³⁰⁰`` (checked: public).
        Returns the sum in the metric's coordinates.
        """
        bound = float(self._check_norm_bound(bound, "bound"))
        theta = self.space.as_theta(theta)
        kept = np.asarray(coordinates, dtype=bool)
        matrix = np.asarray(metric, dtype=float)
        key = matrix.tobytes() + kept.tobytes() + str(matrix.shape).encode()
        if self._metric_map is None or self._metric_map[0] != key:  # one per release's metric
            # W_Lᵀ v_L as a map of the whole v: A = W_Lᵀ on the coordinates L, zero elsewhere
            embedded = np.zeros((matrix.shape[1], self.ndim))
            embedded[:, kept] = matrix.T
            singular = np.linalg.svd(matrix, compute_uv=False) if matrix.size else np.ones(1)
            # the summed terms reach n B / σ_min before the map, n B cond(W) after it
            condition = max(singular.max(), 1.0) / singular.min() if singular.min() > 0 else np.inf
            self._metric_map = (key, _RowMap(embedded, self._compact_layout), condition)
        mapped, condition = self._metric_map[1], self._metric_map[2]
        if not self.n_rows * min(bound, NORM_BOUND_RANGE[1]) * condition <= 1e300:
            raise InvalidParameterError(
                f"metric is too ill-conditioned or too small for a clipped sum (largest singular "
                f"value, at least 1, over the smallest {condition:.3g} with bound {bound:g} over "
                f"{self.n_rows} rows): rescale the model's parameters."
            )
        centre_values, index = self._centre_compact(centre)  # ĝ_i, computed once per centre
        total = np.zeros(matrix.shape[1])
        clipped = 0
        start = 0
        compiled = self._centred_grad_graph is not None and not count_clipped  # one pass
        if compiled:
            self.compile_centred_grad()
            floatX = pytensor.config.floatX
            mapping = np.ascontiguousarray(mapped.columns.T, dtype=floatX)
            clip = np.asarray(bound, dtype=floatX)
        for chunk in self._chunks(None, True):
            stop = start + chunk[0].shape[0]
            ours = centre_values[start:stop]
            start = stop
            if compiled:
                part = self._private_call(
                    self._f_centred_grad,
                    theta,
                    *chunk,
                    ours.astype(floatX, copy=False),
                    mapping,
                    clip,
                )
                total += part  # each row's term finite and within B (_compile_likelihood)
                continue
            grads, index = self._compact_chunk(theta, chunk)  # read-only with JAX
            grads = np.where(np.abs(grads) < np.inf, grads, 0.0) - ours  # the row's coordinates
            largest = np.finfo(np.float64).max  # an overflow of the difference: finite rows
            grads = np.clip(grads, -largest, largest)
            norms = mapped.norms(grads, index)
            total += mapped.weighted_sum(bound / np.maximum(norms, bound), grads, index)
            if count_clipped:
                clipped += int(np.count_nonzero(norms > bound))
        return ClippedSum(total, clipped if count_clipped else None)

    def _centred_pass(
        self,
        theta: np.ndarray,
        centre: releases.Centre,
        current: np.ndarray | None,
        bound: np.ndarray,
    ) -> tuple[np.ndarray, float]:
        """One pass over the rows: ``c(θ)`` and ``Σ_i clip(c_i(θ) − current_i, ±B)``."""
        self.compile_centred()
        floatX = pytensor.config.floatX
        shared, extra = self._centre_shared(centre, np.asarray(theta, dtype=float))
        centre_theta = np.asarray(centre.theta, dtype=floatX)
        if current is None:
            current = np.zeros(self.n_rows, dtype=floatX)
        parts, total, start = [], 0.0, 0
        for chunk in self._chunks(None, True, values_only=True):
            stop = start + chunk[0].shape[0]
            value, clipped = self._private_call(
                self._f_centred,
                theta,
                *chunk,
                shared[start:stop],
                centre_theta,
                extra[start:stop],
                current[start:stop],
                bound,
            )
            parts.append(value)
            total += float(clipped)
            start = stop
        return _joined(parts, (0,)), total

    def compile_centred_grad(self) -> None:
        """Compile the centred gradient pass now (else on its first call; build time only,
        reads no data). Only for a likelihood without gathered variables: with them the
        pass is formed from the compact rows."""
        if self._f_centred_grad is None and self._centred_grad_graph is not None:
            self._f_centred_grad = self._compile_graph("centred_grad")

    def compile_centred(self) -> None:
        """Compile the centred-ratio pass now (else on its first call): a step whose every
        iteration makes that pass compiles it before its chain starts, so that the first
        iteration does not pay the compilation (build time only; reads no data)."""
        if self._f_centred is None:
            self._f_centred = self._compile_graph("centred")

    def centred_ratio_rows(
        self, theta: np.ndarray, theta_new: np.ndarray, centre: releases.Centre
    ) -> np.ndarray:
        """Per-row ``ℓ_i(θ') − ℓ_i(θ) − ĝ_i·(θ' − θ)`` over all rows. Not private."""
        theta, theta_new = self.space.as_theta(theta), self.space.as_theta(theta_new)
        step = np.asarray(theta_new, dtype=float) - np.asarray(theta, dtype=float)
        # θ first: a chain's current state is kept (and reused) while proposals come and go.
        # Asking for θ' first evicted θ whenever θ was the older entry, i.e. after every
        # accepted proposal: one extra pass over the data per acceptance.
        current = self._cached_loglik(theta)
        ratio = self._cached_loglik(theta_new) - current
        return ratio - self._centre_dot(centre, step)

    def centre_rows(self, centre: releases.Centre) -> np.ndarray:
        """The ``(n, d)`` matrix of clipped per-row gradients ``ĝ_i`` at ``centre``. Not private.

        Non-finite entries are zero, as in the clipped gradient sum, so ``Σ_i ĝ_i`` is what a
        :class:`GradientRelease` with the centre's clip and whitening releases with noise. For
        tests and diagnostics: the steps use the compact form (:meth:`centre_grad_sum`).
        """
        values, index = self._centre_compact(centre)
        return self._compact_layout.dense(values, index, self.ndim)

    def centre_grad_sum(self, centre: releases.Centre) -> np.ndarray:
        """``Σ_i ĝ_i``: the rows' clipped gradients at ``centre``, summed. Not private."""
        return self._compact_layout.total(*self._centre_compact(centre), self.ndim)

    def _centre_dot(self, centre: releases.Centre, step: np.ndarray) -> np.ndarray:
        """Per row ``ĝ_i · step`` (``step``: a ``d``-vector). Not private."""
        values, index = self._centre_compact(centre)
        return self._compact_layout.dot(values, index, np.asarray(step, dtype=float))

    def _centre_shared(
        self, centre: releases.Centre, theta: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The centred pass's inputs: ``ĝ_i`` on the shared columns (``(n, |S|)``, floatX) and
        the gathered columns' part of ``ĝ_i·(θ − θ_c)`` (zeros without gathered variables)."""
        values, index = self._centre_compact(centre)
        shared, zeros = self._centre_cache[2]  # computed with the values
        if index is None:
            return shared, zeros
        layout = self._compact_layout
        step = theta - np.asarray(centre.theta, dtype=float)
        extra = np.zeros(values.shape[0])
        for k in layout.gathered:
            extra += values[:, k] * step[layout.entries(k)][index[:, layout.group[k]]]
        return shared, extra.astype(pytensor.config.floatX, copy=False)

    def _centre_compact(self, centre: releases.Centre) -> tuple[np.ndarray, np.ndarray | None]:
        """``ĝ_i`` at ``centre`` in compact form (:meth:`_compact_chunk`), kept per centre.

        Row ``i``'s gradient at the centre, scaled by ``min(1, b / ‖P ∇ℓ_i‖)`` (``b``, ``P``:
        the centre's clip and whitening); one gradient pass, computed once per centre.
        """
        theta = np.asarray(self.space.as_theta(centre.theta), dtype=float)
        raw = np.asarray(centre.whitening, dtype=float)
        key = theta.tobytes() + np.float64(centre.grad_clip).tobytes() + raw.tobytes()
        if self._centre_cache is not None and self._centre_cache[0] == key:
            return self._centre_cache[1]  # checked when it was computed (every iteration asks)
        whitening = _RowMap(self._whitening(raw), self._compact_layout)
        bound = float(self._check_bound(centre.grad_clip, "grad_clip"))
        parts, indices = [], []
        for chunk in self._chunks(None, True):
            values, index = self._compact_chunk(theta, chunk)
            values = np.where(np.abs(values) < np.inf, values, 0.0)
            norms = whitening.norms(values, index)
            parts.append(values * (bound / np.maximum(norms, bound))[:, None])
            indices.append(index)
        layout = self._compact_layout
        values = _joined(parts, (0, layout.first.size))
        index = None if not layout.groups.size else _joined(indices, (0, layout.groups.size))
        floatX = pytensor.config.floatX
        shared = np.ascontiguousarray(values[:, layout.shared], dtype=floatX)
        zeros = np.zeros(values.shape[0], dtype=floatX) if index is None else None
        self._centre_cache = (key, (values, index), (shared, zeros))
        return values, index

    def clipped_fisher(
        self, theta: np.ndarray, grad_clip: float, whitening: np.ndarray
    ) -> np.ndarray:
        """``Σ_i v_i v_iᵀ`` with ``v_i = P ∇ℓ_i(θ) · min(1, b / ‖P ∇ℓ_i(θ)‖)``. Not private.

        The empirical Fisher information of the rows in the coordinates of a public invertible
        ``whitening`` matrix ``P`` (a diagonal one scales each coordinate), each row clipped to
        ``‖v_i‖ ≤ b``; a non-finite entry counts as zero (the row's other entries are kept). Only
        :class:`pymc_dp.mechanisms.FisherRelease` releases it, with noise. Chunked.
        """
        theta = self.space.as_theta(theta)
        matrix = self._whitening(whitening)
        bound = float(self._check_bound(grad_clip, "grad_clip"))
        layout = self._compact_layout
        mapped = _RowMap(matrix, layout)
        total = np.zeros((self.ndim, self.ndim))
        for chunk in self._chunks(None, True):
            values, index = self._compact_chunk(theta, chunk)
            values = np.where(np.abs(values) < np.inf, values, 0.0)
            values *= (bound / np.maximum(mapped.norms(values, index), bound))[:, None]
            total += layout.outer_total(values, index, self.ndim)
        return matrix @ total @ matrix.T  # Σ_i (P g_i)(P g_i)ᵀ = P (Σ_i g_i g_iᵀ) Pᵀ

    def clipped_curvature(
        self, theta: np.ndarray, curvature_clip: float, whitening: np.ndarray
    ) -> np.ndarray:
        """``Σ_i M_i min(1, c / ‖M_i‖_F)``, symmetrised, with ``M_i = −P ∇²ℓ_i(θ) Pᵀ``. Not
        private.

        Each row's observed information (the negative Hessian of its log-likelihood) in the
        coordinates of a public invertible ``whitening`` ``P``, clipped to Frobenius norm
        ``c``; a row with a non-finite entry counts as zero (:meth:`_curvature_columns`). The
        sum of the clipped rows is symmetrised, an orthogonal projection, which moves no two
        sums further apart. The log likelihood's curvature, unlike :meth:`clipped_fisher`'s
        empirical Fisher information, is the posterior's whether or not the likelihood
        describes the rows' variance (the Fisher is ``φ`` times it for counts with ``φ``
        times the Poisson variance). Only :class:`pymc_dp.mechanisms.CurvatureRelease`
        releases it, with noise.
        """
        bound = float(self._check_bound(curvature_clip, "curvature_clip"))
        matrix = self._whitening(whitening)
        theta = self.space.as_theta(theta)
        total = np.zeros((self.ndim, self.ndim))
        for chunk in self._chunks(None, True):
            # the norms, then the columns they scale, from two evaluations of the same
            # deterministic functions at the same points: the same numbers, so each row's
            # clipped matrix has norm at most c (the release's sensitivity)
            norms = self._curvature_norms(theta, matrix, chunk)
            scale = np.where(np.isfinite(norms), bound / np.maximum(norms, bound), 0.0)
            for k, column in self._curvature_columns(theta, matrix, chunk):
                column = np.where(np.isfinite(column), column, 0.0)
                total[:, k] += scale @ column
        return 0.5 * (total + total.T)

    def curvature_norm_counts(
        self, theta: np.ndarray, edges: np.ndarray, whitening: np.ndarray
    ) -> np.ndarray:
        """Rows whose observed information's Frobenius norm ``‖P ∇²ℓ_i(θ) Pᵀ‖_F`` falls in
        each bin of ``edges`` (as :meth:`grad_norm_counts`; a row with a non-finite entry in
        the last bin). Exact counts, so NOT private: only
        :class:`pymc_dp.mechanisms.CurvatureNormHistogram` releases them, with noise."""
        edges = np.asarray(edges, dtype=float)
        matrix = self._whitening(whitening)
        theta = self.space.as_theta(theta)
        counts = np.zeros(edges.size + 1, dtype=np.int64)
        for chunk in self._chunks(None, True):
            norms = self._curvature_norms(theta, matrix, chunk)
            bins = np.searchsorted(edges, np.where(np.isfinite(norms), norms, np.inf))
            counts += np.bincount(bins, minlength=edges.size + 1)
        return counts

    def _curvature_columns(self, theta: np.ndarray, matrix: np.ndarray, chunk: list[np.ndarray]):
        """Yield ``(k, C_k)`` for each column ``k``: ``C_k[i] = −P ∇²ℓ_i(θ) w_k``, the ``k``-th
        column of row ``i``'s ``M_i``, ``w_k = Pᵀe_k`` (an ``m × d`` array). Not private.

        The central difference of the rows' gradients at ``θ ± s_k w_k``, with ``s_k`` the
        largest step that moves no coordinate by more than ``10⁻⁵ max(1, |θ_j|)`` (public:
        from ``θ`` and ``P``); on the zoo's regressions the
        sum matches the summed log likelihood's Hessian to ``10⁻¹⁰``. Two gradient passes over
        the chunk per column: ``2d`` in all, with one ``m × d`` array held at a time.
        """
        # each coordinate moves by at most 10⁻⁵ of max(1, |θ_j|): an intercept in the
        # thousands does not set the step of a slope near 1
        room = 1e-5 * np.maximum(1.0, np.abs(theta))
        with np.errstate(divide="ignore"):
            steps = np.min(room / np.abs(matrix), axis=1)  # along each row of P
        for k in range(self.ndim):
            shift = steps[k] * matrix[k]
            up = self._grad_rows_chunk(theta + shift, chunk)
            down = self._grad_rows_chunk(theta - shift, chunk)
            with np.errstate(invalid="ignore", over="ignore"):  # non-finite rows: callers
                yield k, ((down - up) / (2.0 * steps[k])) @ matrix.T

    def _curvature_norms(
        self, theta: np.ndarray, matrix: np.ndarray, chunk: list[np.ndarray]
    ) -> np.ndarray:
        """``‖M_i‖_F`` for the chunk's rows (``inf`` for a row with a non-finite entry), from
        its columns (:meth:`_curvature_columns`). Not private."""
        squares = None
        for _, column in self._curvature_columns(theta, matrix, chunk):
            with np.errstate(invalid="ignore", over="ignore"):
                part = np.einsum("ma,ma->m", column, column)
            part = np.where(np.all(np.isfinite(column), axis=1), part, np.inf)
            squares = part if squares is None else squares + part
        return np.sqrt(squares)

    def centred_ratio_counts(
        self,
        pairs: np.ndarray,
        centre: releases.Centre,
        scales: np.ndarray,
        edges: np.ndarray,
    ) -> np.ndarray:
        """Counts of ``|centred ratio_i(θ_k, θ'_k)| / s_k`` over the bins of ``edges``.

        ``pairs`` is ``(m, 2, d)`` (public points ``θ_k``, ``θ'_k``), ``scales`` the ``m``
        positive normalisers ``s_k``: ``m n`` values, binned as in :meth:`grad_norm_counts`
        (non-finite values in the last bin). Exact counts, so NOT private: only
        :class:`pymc_dp.mechanisms.CentredRatioHistogram` releases them, with noise.
        """
        edges = np.asarray(edges, dtype=float)
        counts = np.zeros(edges.size + 1, dtype=np.int64)
        for (a, b), s in zip(np.asarray(pairs, dtype=float), np.asarray(scales), strict=True):
            values = np.abs(self.centred_ratio_rows(a, b, centre)) / float(s)
            values = np.where(np.isfinite(values), values, np.inf)
            counts += np.bincount(
                np.searchsorted(edges, values, side="left"), minlength=edges.size + 1
            )
        return counts

    def _cached_loglik(self, theta: np.ndarray) -> np.ndarray:
        """``loglik_rows(θ)`` over all rows, remembering the two θ used last (never released)."""
        key = theta.tobytes()
        hits = [entry for entry in self._loglik_cache if entry[0] == key]
        entry = hits[0] if hits else (key, self.loglik_rows(theta))
        others = [e for e in self._loglik_cache if e[0] != key]
        self._loglik_cache = [*others[-1:], entry]
        return entry[1]

    def grad_sum(
        self, theta: np.ndarray, rows: np.ndarray | slice | None = None, *, _count: bool = True
    ) -> np.ndarray:
        """Unclipped ``Σ_i ∇_θ ℓ_i(θ)``. Not private; for tests and diagnostics."""
        theta = self.space.as_theta(theta)
        total = np.zeros(self.ndim)
        for chunk in self._chunks(rows, _count):
            total += self._private_call(
                self._f_grad, theta, *chunk, self._check_bound(np.inf, "grad_clip"), self._precond()
            )
        return total

    def grad_rows(self, theta: np.ndarray, rows: np.ndarray | slice | None = None) -> np.ndarray:
        """Per-row gradients as an ``(m, d)`` matrix. Not private; for tests and diagnostics."""
        theta = self.space.as_theta(theta)
        parts = [self._grad_rows_chunk(theta, chunk) for chunk in self._chunks(rows, True)]
        return _joined(parts, (0, self.ndim))

    @property
    def likelihood_flat_directions(self) -> np.ndarray:
        """``d × k`` orthonormal directions of ``θ`` along which no row's log-likelihood
        changes, for any data: an intercept beside free group offsets (``a + b[g]``) along
        ``a + c, b − c``. Public: found from the graph (:meth:`_flat_directions`), computed
        once."""
        if self._flat is None:
            self._flat = self._flat_directions()
        return self._flat

    def _flat_directions(self) -> np.ndarray:
        """Two columns of the compact per-row gradient that are the same function of ``θ`` and
        the row (the gradients by ``a`` and by ``b[g_i]`` of ``ℓ(a + b[g_i], …)``) make every
        row's gradient orthogonal to the difference of the coordinates they sit at: ``e_a −
        Σ_j e_{b_j}`` (two shared columns: ``e_k − e_l``; two gathered at one index: one
        direction per group; at two indices: ``Σ_j e_{b_j} − Σ_j e_{c_j}``).

        The columns are compared on **made-up rows** (no data is read): floats, in each row,
        uniform in ``(0.1, 0.9)`` or of either sign and a magnitude from ``10⁻²`` to ``10²``
        (half each); integers ``0`` or ``1`` (only ``0`` when a group-indexed variable has
        one group: an index must stay in range, since PyTensor's Numba backend does not check
        it); at two random points near PyMC's initial point. Two columns are paired where they
        agree to ``10⁻¹⁰`` relative on every made-up row on which the gradient is finite (at
        least 32). Nothing is found when a column is zero on all of them (the made-up rows do
        not exercise the model, e.g. a branch ``switch(age >= 18, a, b)`` on small integers),
        so a pair is one expression of the rows the model sees; a branch whose other side
        only rescales columns (``switch(k >= 2, a + 2b, a + b)``) is not caught. A wrong pair
        gives ``Σ̂`` the prior's width along that direction and drops the gradient releases'
        part there (post-processing: never what is released or spent). Only for PyTensor's
        default backend (``(d, 0)`` otherwise, and when nothing is found).
        """
        d = self.ndim
        none = np.zeros((d, 0))
        layout = self._compact_layout
        columns = layout.first.size
        if self.backend is not None or columns < 2:
            return none
        rng = np.random.default_rng(20240919)  # public
        rows = self._made_up_rows(rng, 256)
        start = self.space.ravel(self._initial_point)
        found = []
        try:
            fn = self._compact_fn()
            for _ in range(2):
                with np.errstate(all="ignore"):
                    values, *indices = fn(start + rng.normal(0.0, 0.1, d), *rows)
                for index, groups in zip(indices, layout.groups, strict=True):
                    index = np.asarray(index)
                    if index.size and (index.min() < -groups or index.max() >= groups):
                        return none
                found.append(np.asarray(values, dtype=float))
        except Exception:  # made-up rows this model cannot evaluate: nothing found
            return none
        both = np.concatenate(found, axis=0)
        both = both[np.all(np.isfinite(both), axis=1)]
        if both.shape[0] < 32 or np.any(np.all(both == 0.0, axis=0)):
            return none
        # candidate pairs by the columns' values to 8 digits, then checked to 10⁻¹⁰
        signature: dict[bytes, list[int]] = {}
        for k in range(columns):
            signature.setdefault(np.round(both[:, k], 8).tobytes(), []).append(k)
        directions = []
        for same in signature.values():
            for i, k in enumerate(same):
                for j in same[i + 1 :]:
                    a, b = both[:, k], both[:, j]
                    if np.all(np.abs(a - b) <= 1e-10 * np.maximum(np.abs(a), np.abs(b))):
                        directions.extend(self._flat_pair(k, j))
        if not directions:
            return none
        basis, sizes, _ = np.linalg.svd(np.array(directions).T, full_matrices=False)
        return basis[:, sizes > 1e-10 * sizes[0]]

    def _made_up_rows(self, rng: np.random.Generator, m: int) -> list[np.ndarray]:
        """``m`` made-up rows, shaped as the compiled per-row functions take them: floats
        uniform in ``(0.1, 0.9)`` or of either sign and a magnitude from ``10⁻²`` to ``10²``
        (half each); booleans; integers ``0`` or ``1`` (only ``0`` when a group-indexed
        variable has one group: an index must stay in range). Only the data's shapes and
        types are read, no value."""
        high = (
            2
            if self._compact_layout.groups.size == 0
            else int(min(2, self._compact_layout.groups.min()))
        )
        rows = []
        for r in self._rows:
            shape = (m, 1, *r.data.shape[1:]) if self._single_row_axis else (m, *r.data.shape[1:])
            dtype = r.data.dtype
            if dtype.kind == "f":
                wide = rng.choice([-1.0, 1.0], shape) * 10.0 ** rng.uniform(-2.0, 2.0, shape)
                narrow = rng.uniform(0.1, 0.9, shape)
                rows.append(np.where(rng.random(shape) < 0.5, narrow, wide).astype(dtype))
            elif dtype.kind == "b":
                rows.append(rng.random(shape) < 0.5)
            else:
                rows.append(rng.integers(0, max(high, 1), shape).astype(dtype))
        return rows

    @property
    def likelihood_has_kinks(self) -> bool:
        """Whether a row's log-likelihood is not smooth in ``θ``: a kink or a jump where an
        expression of the parameters and the row changes sign (Laplace or AsymmetricLaplace
        errors, an absolute value, a max or a branch of the parameters and the row).

        The centred ratio bounds each row's remainder at second order in the move (theory
        §4.1); a row whose kink lies between two states has a first-order remainder. Public:
        found on made-up rows (:meth:`_find_kinks`), computed once."""
        if self._kinked is None:
            self._kinked = self._find_kinks()
        return self._kinked

    def _find_kinks(self) -> bool:
        """Second differences of made-up rows' log-likelihoods (:meth:`_made_up_rows`) along
        random lines through points near PyMC's initial point, at the spacings ``h`` and
        ``h/8`` (``h = 10⁻³``) on a grid of spacing ``h/8``: where a row's log-likelihood is
        smooth they shrink 64 times from one to the other (as ``h²``), across a kink 8 to 16
        times (as ``h``), across a jump not at all. A row counts as kinked when its largest
        second difference at ``h`` is above rounding (``10⁻⁹`` of its values), less than 32
        times its largest at ``h/8``, and that largest is a spike, over 1000 times the row's
        median at ``h/8`` (the slope jumps by more than the curvature changes it over a move
        of ``10⁻¹``) whose jump of the slope is over 1 % of the row's steepest slope on the
        line. So a kink of a formula's numerics (PyMC's ``normal_lcdf`` switches between two
        expressions of one function at ``z = −1``, whose slopes differ by about ``10⁻⁴`` of
        the slope: ``pm.OrderedProbit``, ``pm.ExGaussian``), the noise of cancelling terms and
        a jump of the curvature alone (a Huber loss, whose remainders stay of second order)
        do not count. Only on PyTensor's default backend (False
        otherwise), and False when the made-up rows cannot be evaluated."""
        if self.backend is not None:
            return False
        rng = np.random.default_rng(20241127)  # public
        rows = self._made_up_rows(rng, 256)
        start = self.space.ravel(self._initial_point)
        d, fine, steps, half = self.ndim, 1.25e-4, 8, 400  # grid spacing, h = 8 · spacing
        offsets = fine * np.arange(-half, half + 1)
        try:
            for _ in range(3):
                direction = rng.normal(size=d)
                direction /= np.sqrt(direction @ direction)
                centre = start + rng.normal(0.0, 0.1, d)
                with np.errstate(all="ignore"):
                    values = np.stack(
                        [
                            np.asarray(
                                self._f_loglik(self.space.as_theta(centre + t * direction), *rows),
                                dtype=float,
                            )
                            for t in offsets
                        ]
                    )
                values = values[:, np.all(np.isfinite(values), axis=0)]
                if values.shape[1] == 0:
                    continue
                inner = slice(steps, values.shape[0] - steps)
                at_h = np.abs(values[2 * steps :] - 2 * values[inner] + values[: -2 * steps])
                at_fine = np.abs(
                    values[inner.start + 1 : inner.stop + 1]
                    - 2 * values[inner]
                    + values[inner.start - 1 : inner.stop - 1]
                )
                largest_h, largest_fine = at_h.max(axis=0), at_fine.max(axis=0)
                above_rounding = largest_h > 1e-9 * (1.0 + np.abs(values).max(axis=0))
                first_order = largest_h < 32.0 * largest_fine
                typical = np.median(at_fine, axis=0)
                spike = largest_fine > 1e3 * typical
                # the slope's jump across the spike, against the row's steepest slope
                jump = (largest_fine - typical) / fine
                slope = np.abs(np.diff(values, axis=0)).max(axis=0) / fine
                material = jump > 1e-2 * slope
                if np.any(above_rounding & first_order & spike & material):
                    return True
        except Exception:  # made-up rows this model cannot evaluate: nothing found
            return False
        return False

    def _flat_pair(self, k: int, j: int) -> list[np.ndarray]:
        """The directions two identical compact columns ``k``, ``j`` make flat."""
        layout, d = self._compact_layout, self.ndim
        gk, gj = layout.group[k], layout.group[j]
        # one index: the rows of each group read both at that group, one direction per group
        pairs = (
            zip(layout.entries(k), layout.entries(j), strict=True)
            if gk >= 0 and gk == gj
            else [(layout.places(k), layout.places(j))]
        )
        directions = []
        for a, b in pairs:
            direction = np.zeros(d)
            direction[a], direction[b] = 1.0, -1.0
            directions.append(direction)
        return directions

    def grad_norm_counts(
        self,
        theta: np.ndarray,
        edges: np.ndarray,
        directions: np.ndarray | None = None,
        precond: np.ndarray | None = None,
        whitening: np.ndarray | None = None,
    ) -> np.ndarray:
        """Rows whose log-likelihood gradient norm ``‖∇_θ ℓ_i(θ)‖₂`` falls in each bin.

        Bin ``0`` is ``≤ edges[0]``, bin ``k`` is ``(edges[k-1], edges[k]]``, the last bin is
        ``> edges[-1]`` (non-finite norms included). With ``directions`` (an ``(m, d)`` array of
        unit vectors) the values counted are the ``m`` directional derivatives
        ``|∇_θ ℓ_i(θ) · u_k|`` of every row instead (``m n`` values). Exact counts, so NOT
        private: only :class:`pymc_dp.mechanisms.GradNormHistogram` releases them, with noise.
        With ``precond`` (``D``) the norms are those of ``D ∇ℓ_i``, with ``whitening`` (a
        ``d × d`` matrix ``P``, instead) those of ``P ∇ℓ_i``. Chunked: the ``(n, d)`` gradient
        matrix is never held at once.
        """
        theta = self.space.as_theta(theta)
        weights = self._precond(precond)
        if whitening is not None:
            if precond is not None:
                raise InvalidParameterError("give precond or whitening, not both.")
            matrix = self._whitening(whitening)
        edges = np.asarray(edges, dtype=float)
        counts = np.zeros(edges.size + 1, dtype=np.int64)
        layout = self._compact_layout
        weights = np.asarray(weights, dtype=float)
        mapped = None if whitening is None else _RowMap(matrix, layout)
        if directions is not None:  # (P g)·u = g·(Pᵀu), (D g)·u = g·(D u)
            directions = np.asarray(directions, dtype=float)
            directions = directions * weights if whitening is None else directions @ matrix
        for chunk in self._chunks(None, True):
            values, index = self._compact_chunk(theta, chunk)
            if directions is None and mapped is None:  # each entry times D at its coordinate
                at = layout.first if index is None else layout.coordinates(index)
                norms = np.linalg.norm(values * weights[at], axis=1)
            elif directions is None:
                norms = mapped.norms(values, index)
            else:
                norms = np.abs(
                    np.stack([layout.dot(values, index, u) for u in directions], axis=1)
                ).ravel()
            norms = np.where(np.isfinite(norms), norms, np.inf)
            bins = np.searchsorted(edges, norms, side="left")
            counts += np.bincount(bins, minlength=edges.size + 1)
        return counts

    # ------------------------------------------------------------------ helpers

    def _compile(self, inputs: list[Variable], outputs: Any) -> Any:
        """Compile a per-row function for this oracle's backend (build time or first use)."""
        return compile_function(
            inputs, outputs, check_bounds=self._check_bounds, backend=self.backend
        )

    def _compile_graph(self, name: str) -> Any:
        """Compile one of the per-row functions (build time or first use): on PyTensor's
        default backend through the oracle's :class:`~pymc_dp._compile.RewriteGroup`."""
        if name in self._rewrite_groups:
            return self._rewrite_groups[name].compile(name)
        return self._compile(*self._graphs[name])

    def _compact_fn(self) -> pytensor.compile.function.types.Function:
        """Compiled compact per-row gradients and gathered indices (compiled on first use)."""
        if self._f_compact is None:
            self._f_compact = self._compile_graph("compact")
        return self._f_compact

    def _compact_chunk(
        self, theta: np.ndarray, chunk: list[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """One chunk's per-row gradients in compact form. Not private.

        Returns ``(values, index)``: ``values`` is ``(m, K)`` as the model computes it
        (non-finite entries kept), ``index`` the ``(m, G)`` entries each row reads of the
        gathered variables of each index group (``None`` without gathered variables); the
        coordinates of ``θ`` they make are :class:`_CompactLayout`'s.
        """
        values, *indices = self._private_call(self._compact_fn(), theta, *chunk)
        values = np.asarray(values, dtype=float)
        if not indices:
            return values, None
        wrapped = np.empty((values.shape[0], len(indices)), dtype=np.int64)
        for j, (index, groups) in enumerate(zip(indices, self._compact_layout.groups, strict=True)):
            index = np.asarray(index, dtype=np.int64).reshape(-1)
            if index.size and (index.min() < -groups or index.max() >= groups):
                raise self._evaluation_error("IndexError")  # as the likelihood's gather would
            wrapped[:, j] = index % groups  # a negative index counts from the end, as in PyMC
        return values, wrapped

    def _grad_rows_chunk(self, theta: np.ndarray, chunk: list[np.ndarray]) -> np.ndarray:
        """One chunk's per-row gradients as an ``(m, d)`` matrix. Not private."""
        return self._compact_layout.dense(*self._compact_chunk(theta, chunk), self.ndim)

    def _precond(self, precond: np.ndarray | None = None) -> np.ndarray:
        """The clip's preconditioner ``D`` as the compiled functions take it (ones: none)."""
        if precond is None:
            return np.ones(self.ndim, dtype=pytensor.config.floatX)
        weights = np.asarray(precond, dtype=pytensor.config.floatX)
        low, high = NORM_BOUND_RANGE
        if weights.shape != (self.ndim,) or not np.all((weights >= low) & (weights <= high)):
            raise InvalidParameterError(
                f"precond must be {self.ndim} numbers between {low:g} and {high:g}, got "
                f"shape {weights.shape}."
            )
        return weights

    def _whitening(self, whitening: np.ndarray) -> np.ndarray:
        """A clip's whitening matrix ``P``: ``d × d``, finite and invertible (public)."""
        matrix = np.asarray(whitening, dtype=float)
        d = self.ndim
        if matrix.shape != (d, d) or not np.all(np.isfinite(matrix)):
            raise InvalidParameterError(
                f"whitening must be a finite ({d}, {d}) matrix, got shape {matrix.shape}."
            )
        if np.linalg.cond(matrix) > 1e12:
            raise InvalidParameterError("whitening must be an invertible matrix.")
        return matrix

    @staticmethod
    def _check_bound(value: float, name: str) -> np.ndarray:
        value = float(value)
        if not value > 0:  # also rejects NaN
            raise InvalidParameterError(f"{name} must be positive, got {value}.")
        return np.asarray(value, dtype=pytensor.config.floatX)

    @classmethod
    def _check_norm_bound(cls, value: float, name: str) -> np.ndarray:
        """A bound on the rows' norms as the compiled sums take it: in ``[10⁻⁵⁰, 10⁵⁰]``, or
        ``∞`` (no clipping: non-private sums only).

        The range keeps every product of public factors in a row's scaled squared norm
        (``p²/b²``, with a preconditioner's entries ``p`` in the same range) finite, so that
        whatever order a compiler multiplies them in, a row's scaled norm is finite or ``∞``,
        never ``0 · ∞``: a NaN there would make a release depend on more than one row.
        """
        bound = cls._check_bound(value, name)
        low, high = NORM_BOUND_RANGE
        if not (low <= float(bound) <= high or float(bound) == np.inf):
            raise InvalidParameterError(
                f"{name} must be between {low:g} and {high:g} (or infinite: no clipping), got "
                f"{float(bound):g}: rescale the model's parameters."
            )
        return bound

    def _chunks(self, rows: np.ndarray | slice | None, count: bool, *, values_only: bool = False):
        """Yield the row inputs of each chunk, shaped for the compiled functions.

        A pass that forms no per-row gradient (``values_only``: the log-likelihood, the ratio,
        the centred ratio) keeps only a few per-row vectors, so its chunks hold as many rows
        as one such vector fits in the chunk's bytes (10⁵ rows: one call instead of two at
        d = 2, where a call's fixed cost is a tenth of the pass).
        """
        if rows is None:
            arrays = [r.data for r in self._rows]
            if self._device == "accelerator":
                # a forked worker must stop with the package's error before touching JAX
                _compile._check_not_forked(self.backend)
                if self._resident is None:
                    self._resident = [_on_device(a) for a in arrays]
                arrays = self._resident
        else:
            if not isinstance(rows, slice):
                rows = np.asarray(rows)
                if rows.dtype == bool or not np.issubdtype(rows.dtype, np.integer):
                    raise InvalidParameterError("rows must be a slice or an array of row indices.")
            arrays = [r.data[rows] for r in self._rows]
        m = arrays[0].shape[0]
        if count:
            self.calls += 1
            self.rows_read += m
        size = max(self.chunk_size, self._chunk_bytes // 8) if values_only else self.chunk_size
        for start in range(0, m, size):
            stop = min(start + size, m)
            if self._single_row_axis:  # vectorized single-row graph: (m, 1, ...) inputs
                yield [a[start:stop, None] for a in arrays]
            else:
                yield [a[start:stop] for a in arrays]

    def __repr__(self) -> str:
        names = [v.name for v in self.value_vars]
        return (
            f"RowLikelihood(n_rows={self.n_rows}, ndim={self.ndim}, vars={names}, "
            f"row_data={[r.name for r in self._rows]}, gradient_method={self.gradient_method!r})"
        )
