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

import pytensor.tensor as pt
from pytensor.graph.basic import Variable
from pytensor.graph.rewriting.basic import in2out, node_rewriter
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.graph.traversal import ancestors, applys_between
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.type import integer_dtypes

from pymc_dp._compat import GATHER_OPS, leading_axis_indices

__all__ = ["lift_gathers", "row_gathers"]


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
