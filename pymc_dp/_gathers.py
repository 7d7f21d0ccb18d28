"""Group-indexed parameters: value variables that each row reads at one entry, ``v[idx_i]``.

In a hierarchical model ``y_i ~ Normal(a[g_i], σ)`` row ``i``'s gradient with respect to the
group intercepts ``a`` is zero except at entry ``g_i``. Kept dense it is an ``(n, len(a))``
block (the hierarchical benchmark with 50 groups cost 17× PyMC's summed gradient); kept as the
gradient with respect to the entry read, ``∂ℓ_i/∂a[g_i]``, and the index ``g_i``, it costs one
column. :func:`row_gathers` finds such variables in the single-row log-likelihood graph, after
:func:`lift_gathers` has moved gathers of elementwise expressions down to the value variables
(``(μ + σ z)[g] = μ + σ z[g]``: the non-centred parametrisation).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Variable, equal_computations
from pytensor.graph.rewriting.basic import in2out, node_rewriter
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.graph.traversal import ancestors, applys_between
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.type import integer_dtypes

from pymc_dp._compat import GATHER_OPS, leading_axis_indices

__all__ = [
    "fisher_pattern",
    "lift_gathers",
    "row_blocks",
    "row_gathers",
    "shared_index_groups",
]


def _single_index(node: Any) -> Variable | None:
    """The index of a gather ``x[idx]`` along the leading axis with one integer array."""
    indices = leading_axis_indices(node)
    if indices is None or len(indices) != 1:
        return None
    [index] = indices
    if not isinstance(index.type, pt.TensorType) or index.type.dtype not in integer_dtypes:
        return None
    return index


@node_rewriter(list(GATHER_OPS))
def _gather_of_elemwise(fgraph, node):
    """``f(x, y, …)[idx]`` → ``f(x[idx], y[idx], …)``, inputs broadcast along axis 0 kept."""
    index = _single_index(node)
    source = node.inputs[0]
    if index is None or source.owner is None or not isinstance(source.owner.op, Elemwise):
        return None
    if len(source.owner.outputs) != 1 or source.type.ndim == 0:
        return None
    parts = [inp if inp.type.broadcastable[0] else inp[index] for inp in source.owner.inputs]
    if all(inp.type.broadcastable[0] for inp in source.owner.inputs):
        return None
    [old] = node.outputs
    new = source.owner.op(*parts)
    if new.type.ndim != old.type.ndim or new.dtype != old.dtype:
        return None
    return [new]


def lift_gathers(graph: Variable) -> Variable:
    """Move gathers along the leading axis through elementwise ops, down to their sources."""
    [out] = rewrite_graph([graph], include=(), custom_rewrite=in2out(_gather_of_elemwise))
    # the same gather reached twice becomes one node (a variable read once stays sparse)
    [out] = rewrite_graph([out], include=("merge",))
    return out


def row_gathers(
    ell_one: Variable, lik_vars: list[Variable], row_inputs: list[Variable]
) -> dict[Variable, tuple[Variable, Variable]]:
    """Value variables that a single row's log-likelihood reads only as one entry ``v[idx]``.

    ``idx`` must be computed from the row's data alone and select one entry along ``v``'s
    leading axis. Returns ``{v: (v[idx], idx)}``; every other variable keeps a dense per-row
    gradient.
    """
    uses: dict[Variable, list[tuple[Any, int]]] = {v: [] for v in lik_vars}
    for node in applys_between([*lik_vars, *row_inputs], [ell_one]):
        for position, inp in enumerate(node.inputs):
            if inp in uses:
                uses[inp].append((node, position))
    rows, params = set(row_inputs), set(lik_vars)
    found = {}
    for v, used in uses.items():
        if len(used) != 1 or v.type.ndim == 0:
            continue
        node, position = used[0]
        index = _single_index(node)
        if index is None or position != 0 or index.type.shape != (1,):
            continue
        sources = set(ancestors([index]))
        if sources & params or not sources & rows:
            continue
        found[v] = (node.outputs[0], index)
    return found


def shared_index_groups(gathers: dict[Variable, tuple[Variable, Variable]]) -> dict[Variable, int]:
    """Number the gathered variables by the index they read: ``v[idx]`` and ``w[idx]`` with the
    same ``idx`` (the same computation from the row's data) get the same number."""
    groups: dict[Variable, int] = {}
    indices: list[Variable] = []
    for v, (_, index) in gathers.items():
        for number, seen in enumerate(indices):
            if seen is index or equal_computations([seen], [index]):
                groups[v] = number
                break
        else:
            groups[v] = len(indices)
            indices.append(index)
    return groups


def fisher_pattern(
    slices: list[tuple[Variable, slice, tuple[int, ...]]],
    likelihood_coordinates: np.ndarray,
    gather_groups: dict[Variable, int],
) -> np.ndarray:
    """Which entries of ``Σ_i ∇ℓ_i ∇ℓ_iᵀ`` can be non-zero, for any data (public: the graph).

    A row's gradient is zero off the likelihood's coordinates; on a gathered variable ``v`` it is
    zero except at the entry ``v[idx_i]`` the row reads. So entry ``(j, k)`` can be non-zero only
    when both coordinates are the likelihood's and, where both belong to gathered variables,
    when one row can read both: the same entry along the leading axis of variables that share
    their index (``a[g_i]``, ``b[g_i]``), any entries of variables with different indices. A
    boolean ``d × d`` matrix, symmetric.
    """
    d = likelihood_coordinates.size
    pattern = np.outer(likelihood_coordinates, likelihood_coordinates)
    # the group entry (leading-axis position) of each gathered coordinate, and its index group
    entry = np.full(d, -1)
    group = np.full(d, -1)
    for v, sl, shape in slices:
        if v in gather_groups:
            size = sl.stop - sl.start
            entry[sl] = np.arange(size) // max(size // shape[0], 1)
            group[sl] = gather_groups[v]
    both = (group[:, None] >= 0) & (group[None, :] >= 0)
    same_index = group[:, None] == group[None, :]
    other_entry = entry[:, None] != entry[None, :]
    pattern &= ~(both & same_index & other_entry)
    return pattern


def row_blocks(
    likelihood_coordinates: np.ndarray,
    gathered: list[tuple[int, int, int]],
    index_groups: set[int],
) -> np.ndarray | None:
    """The coordinates of ``θ`` each group's rows read: a ``(groups, m)`` integer array.

    Row ``i`` of group ``j`` reads the likelihood's other coordinates and entry ``j`` of each
    gathered variable (``gathered``: ``(first coordinate, groups, coordinates per group)``).
    Defined when every gathered variable is read at one index with the same number of groups
    (the varying intercepts, and slopes, of one grouping); ``None`` otherwise (then a row may
    read any coordinate of the likelihood's).
    """
    if not gathered or len(index_groups) != 1 or len({g for _, g, _ in gathered}) != 1:
        return None
    groups = gathered[0][1]
    shared = np.array(likelihood_coordinates, dtype=bool)
    for first, count, width in gathered:
        shared[first : first + count * width] = False
    own = [
        np.concatenate(
            [np.arange(first + j * width, first + (j + 1) * width) for first, _, width in gathered]
        )
        for j in range(groups)
    ]
    return np.array([np.sort(np.r_[np.flatnonzero(shared), o]) for o in own], dtype=np.int64)
