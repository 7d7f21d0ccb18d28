"""Native batched forms of ops that ``vectorize_graph`` can only wrap in a ``Blockwise``.

The oracle batches a single-row log-likelihood graph over rows. PyTensor vectorises most ops
natively, but wraps a few in ``Blockwise``, whose C implementation loops over the batch (rows) in
Python: 10⁵ rows then cost seconds. Two such ops appear in ordinary models:

* ``x[idx]`` with a row-aligned index and a parameter vector ``x`` (group intercepts indexed by a
  group column): ``Blockwise(AdvancedSubtensor)``;
* the gradient of ``concatenate`` (a ``Split`` of a per-row gradient).

Both have exact native equivalents, written here as graph rewrites. They are applied to the
vectorised graph only; each returns ``None`` (no change) outside the cases it proves equivalent.
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.rewriting.basic import in2out, node_rewriter
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.tensor.basic import Split
from pytensor.tensor.blockwise import Blockwise

from pymc_dp._compat import GATHER_OPS, indexes_leading_axes

__all__ = ["unbatch_blockwise"]


def _squeeze_batch(var: pt.TensorVariable, batch_ndim: int) -> pt.TensorVariable | None:
    """Drop ``batch_ndim`` leading broadcastable dimensions, or None if one is not."""
    if not all(var.type.broadcastable[:batch_ndim]):
        return None
    return var.squeeze(axis=tuple(range(batch_ndim))) if batch_ndim else var


@node_rewriter([Blockwise])
def _advanced_subtensor_with_batched_indices(fgraph, node):
    """``Blockwise(AdvancedSubtensor)(x, *idx)`` with unbatched ``x`` → ``x_core[idx′…]``.

    With integer index arrays only, the advanced indices select the leading axes of ``x_core``;
    NumPy broadcasts index arrays right-aligned, so each index is padded on the right to the
    largest core index rank, which keeps the batch dimensions aligned on the left.
    """
    op = node.op
    if not isinstance(op.core_op, GATHER_OPS):
        return None
    batch_ndim = op.batch_ndim(node)
    x, *idxs = node.inputs
    if not indexes_leading_axes(op.core_op, len(idxs)):
        return None
    x_core = _squeeze_batch(x, batch_ndim)
    if x_core is None or not idxs:
        return None
    if any(not isinstance(i.type, pt.TensorType) or i.type.dtype == "bool" for i in idxs):
        return None
    core_ndims = [i.type.ndim - batch_ndim for i in idxs]
    max_core = max(core_ndims)
    padded = [pt.shape_padright(i, max_core - k) for i, k in zip(idxs, core_ndims, strict=True)]
    out = x_core[tuple(padded)]
    [old] = node.outputs
    if out.type.ndim != old.type.ndim:
        return None
    return [pt.specify_broadcastable(out, *np.flatnonzero(old.type.broadcastable))]


@node_rewriter([Blockwise])
def _split_with_batched_input(fgraph, node):
    """``Blockwise(Split)(x, axis, sizes)`` with constant axis, unbatched sizes → ``Split``."""
    op = node.op
    if not isinstance(op.core_op, Split):
        return None
    batch_ndim = op.batch_ndim(node)
    x, axis, sizes = node.inputs
    sizes_core = _squeeze_batch(sizes, batch_ndim)
    axis_core = _squeeze_batch(axis, batch_ndim)
    if sizes_core is None or axis_core is None:
        return None
    try:
        axis_value = int(pt.get_underlying_scalar_constant_value(axis_core))
    except pt.NotScalarConstantError:
        return None
    core_ndim = x.type.ndim - batch_ndim
    if axis_value < 0:
        axis_value += core_ndim
    outs = Split(op.core_op.len_splits)(x, pt.constant(axis_value + batch_ndim), sizes_core)
    return list(outs) if isinstance(outs, list | tuple) else [outs]


def unbatch_blockwise(outputs: list[pt.TensorVariable]) -> list[pt.TensorVariable]:
    """Rewrite the ``Blockwise`` ops above into native batched ops, everywhere in ``outputs``."""
    rewriter = in2out(_advanced_subtensor_with_batched_indices, _split_with_batched_input)
    return rewrite_graph(outputs, include=(), custom_rewrite=rewriter)
