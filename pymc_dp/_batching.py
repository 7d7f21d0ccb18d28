"""Native batched forms of ops that ``vectorize_graph`` can only wrap in a ``Blockwise``.

The oracle batches a single-row log-likelihood graph over rows. PyTensor vectorises most ops
natively, but wraps a few in ``Blockwise``, whose C implementation loops over the batch (rows) in
Python: 10⁵ rows then cost seconds. Two such ops appear in ordinary models:

* ``x[idx]`` with a row-aligned index and a parameter vector ``x`` (group intercepts indexed by a
  group column), or with a per-row ``x`` (an ordinal likelihood's category probabilities
  ``p_i[y_i]``): ``Blockwise(AdvancedSubtensor)``;
* the gradient of ``concatenate`` (a ``Split`` of a per-row gradient);
* the gradient of a softmax over a row's own entries (a mixture's log-sum-exp over its
  components): ``Blockwise(SoftmaxGrad)`` (PyTensor 2).

Each has exact native equivalents, written here as graph rewrites. They are applied to the
vectorised graph only; each returns ``None`` (no change) outside the cases it proves equivalent.
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.rewriting.basic import in2out, node_rewriter
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.tensor.basic import Split
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.variable import TensorConstant

from pymc_dp._compat import GATHER_OPS, SOFTMAX_GRAD_OPS, indexes_leading_axes

__all__ = ["unbatch_blockwise", "unbatching_rewriters"]


def _squeeze_batch(var: pt.TensorVariable, batch_ndim: int) -> pt.TensorVariable | None:
    """Drop ``batch_ndim`` leading broadcastable dimensions, or None if one is not."""
    if not all(var.type.broadcastable[:batch_ndim]):
        return None
    if not batch_ndim:
        return var
    axes = tuple(range(batch_ndim))
    if isinstance(var, TensorConstant):  # folded here: constant folding has already run, and
        # a backend that needs concrete sizes (JAX's Split) cannot read them through a Squeeze
        return pt.constant(np.squeeze(var.data, axis=axes), dtype=var.type.dtype)
    return var.squeeze(axis=axes)


def _advanced_subtensor_node(fgraph, node):
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
    if not idxs:
        return None
    if any(not isinstance(i.type, pt.TensorType) or i.type.dtype == "bool" for i in idxs):
        return None
    core_ndims = [i.type.ndim - batch_ndim for i in idxs]
    max_core = max(core_ndims)
    padded = [pt.shape_padright(i, max_core - k) for i, k in zip(idxs, core_ndims, strict=True)]
    x_core = _squeeze_batch(x, batch_ndim)
    if x_core is not None:
        out = x_core[tuple(padded)]
    elif batch_ndim == 1:
        # x batched too (a per-row vector of probabilities p_i indexed by the row's own
        # category, p_i[y_i], as in an ordinal likelihood): the batch position is one more
        # advanced index, in front, broadcast against the others.
        rows = pt.arange(x.shape[0], dtype="int64")
        out = x[(pt.shape_padright(rows, max_core), *padded)]
    else:
        return None
    [old] = node.outputs
    if out.type.ndim != old.type.ndim:
        return None
    return [pt.specify_broadcastable(out, *np.flatnonzero(old.type.broadcastable))]


def _split_node(fgraph, node):
    """``Blockwise(Split)``, constant axis, unbatched sizes → ``Split`` (PyTensor 2 and 3)."""
    op = node.op
    if not isinstance(op.core_op, Split):
        return None
    batch_ndim = op.batch_ndim(node)
    core_axis = getattr(op.core_op, "axis", None)  # PyTensor 3: the axis is the op's
    if core_axis is None:  # PyTensor 2: Split(n)(x, axis, sizes)
        x, axis, sizes = node.inputs
        axis_core = _squeeze_batch(axis, batch_ndim)
        if axis_core is None:
            return None
        try:
            axis_value = int(pt.get_underlying_scalar_constant_value(axis_core))
        except pt.NotScalarConstantError:
            return None
    else:  # PyTensor 3: Split(n, axis)(x, sizes)
        x, sizes = node.inputs
        axis_value = int(core_axis)
    sizes_core = _squeeze_batch(sizes, batch_ndim)
    if sizes_core is None:
        return None
    core_ndim = x.type.ndim - batch_ndim
    if axis_value < 0:
        axis_value += core_ndim
    if core_axis is None:
        outs = Split(op.core_op.len_splits)(x, pt.constant(axis_value + batch_ndim), sizes_core)
    else:
        outs = Split(op.core_op.len_splits, axis_value + batch_ndim)(x, sizes_core)
    return list(outs) if isinstance(outs, list | tuple) else [outs]


def _softmax_grad_node(fgraph, node):
    """``Blockwise(SoftmaxGrad{axis})(dy, sm)`` → ``sm · (dy − Σ_axis dy·sm)`` on the batch.

    The softmax's gradient in closed form, on the batched arrays with the axis moved past the
    batch dimensions (a mixture likelihood's log-sum-exp over its components, per row).
    """
    op = node.op
    if not isinstance(op.core_op, SOFTMAX_GRAD_OPS):
        return None
    batch_ndim = op.batch_ndim(node)
    dy, sm = node.inputs
    core_ndim = node.outputs[0].type.ndim - batch_ndim
    axis = op.core_op.axis
    if axis is None or core_ndim < 1:
        return None
    axis = (axis + core_ndim if axis < 0 else axis) + batch_ndim
    product = dy * sm
    out = sm * (dy - product.sum(axis=axis, keepdims=True))
    [old] = node.outputs
    if out.type.ndim != old.type.ndim or out.type.dtype != old.type.dtype:
        return None
    return [pt.specify_broadcastable(out, *np.flatnonzero(old.type.broadcastable))]


# The decorated rewriters get names of their own: compiled functions (which pickle with their
# mode, where these run) then refer to the plain functions by the module attributes that hold
# them (as pymc_dp._compile does for its rewrite).
_advanced_subtensor_with_batched_indices = node_rewriter([Blockwise])(_advanced_subtensor_node)
_split_with_batched_input = node_rewriter([Blockwise])(_split_node)
_softmax_grad_with_batched_input = node_rewriter([Blockwise])(_softmax_grad_node)


def unbatching_rewriters() -> list:
    """The rewrites above as graph rewriters, one each (also part of the oracle's compile mode;
    one each, since a group of node rewriters holds a lambda, which does not pickle)."""
    return [
        in2out(_advanced_subtensor_with_batched_indices),
        in2out(_split_with_batched_input),
        in2out(_softmax_grad_with_batched_input),
    ]


def unbatch_blockwise(outputs: list[pt.TensorVariable]) -> list[pt.TensorVariable]:
    """Rewrite the ``Blockwise`` ops above into native batched ops, everywhere in ``outputs``."""
    rewriter = in2out(
        _advanced_subtensor_with_batched_indices,
        _split_with_batched_input,
        _softmax_grad_with_batched_input,
    )
    return rewrite_graph(outputs, include=(), custom_rewrite=rewriter)
