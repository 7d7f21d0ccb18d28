"""Drop the length-one row axis that batching a one-row graph leaves behind.

The oracle builds a model's log-likelihood for one row, whose observed value is a length-one
vector, differentiates it, and batches the graph over rows (``vectorize_graph``). Every per-row
intermediate then has shape ``(m, 1, …)``: the batch axis, then the one row's own axis. The
outputs are reshaped to ``(m, …)`` at the end, and each reshape (a ``Squeeze``) sits between the
element-wise loops that produce a per-row gradient and those that clip and sum it; PyTensor's
fusion does not cross it, so the gradient is written to memory and read back in a second pass
over the rows (PyTensor 3: the 175-parameter varying-slopes model's clipped sum in three passes
where PyMC's own gradient makes one).

:func:`drop_row_axis` rebuilds the batched graph with that axis removed wherever the operation
allows it, exactly: an element-wise operation, a check, a reshape, a gather by row-aligned
indices and a reduction over that axis compute the same values on the ``(m, …)`` arrays, since
the axis has length one. Any other operation is rebuilt on its original ``(m, 1, …)`` inputs (a
``DimShuffle`` view restores the axis), so the result is always the same computation; the oracle's
validation compares its values with PyMC's in any case. Compiled, the two graphs are rewritten
and fused differently, so their results agree to rounding at ordinary values but may differ
where the arithmetic overflows (far out in the tails, a gradient entry can be a huge number in
one and ``±∞`` or NaN in the other), as with any rewrite; the clipped sums bound every entry
first (``pymc_dp.oracle.bounded_entries``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Variable
from pytensor.graph.traversal import io_toposort
from pytensor.raise_op import CheckAndRaise
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from pytensor.tensor.shape import Reshape, SpecifyShape
from pytensor.tensor.variable import TensorConstant

from pymc_dp._compat import leading_axis_indices

__all__ = ["drop_row_axis"]


def _has_row_axis(var: Variable) -> bool:
    """Whether ``var`` is a tensor with a static length-one axis 1 (the one row's own axis)."""
    broadcastable = getattr(var.type, "broadcastable", ())
    return len(broadcastable) >= 2 and bool(broadcastable[1])


def _from_graph_inputs(var: Variable) -> Variable:
    """``var`` without axis 1, for a variable that is not computed (an input or constant)."""
    if isinstance(var, TensorConstant):
        return pt.constant(np.squeeze(var.data, axis=1), dtype=var.type.dtype)
    return var.squeeze(axis=1)


class _RowAxisDropper:
    """One pass over a graph: ``flat[v]`` is ``v`` without axis 1, ``full[v]`` the same as ``v``."""

    def __init__(self) -> None:
        self.flat: dict[Variable, Variable] = {}
        self.full: dict[Variable, Variable] = {}

    # the two views of an already visited variable
    def flat_of(self, var: Variable) -> Variable:
        if var not in self.flat:
            if var.owner is None:
                self.flat[var] = _from_graph_inputs(var)
            else:  # visited, but not flattened (no rule): drop the axis as a view
                self.flat[var] = self.full_of(var).squeeze(axis=1)
        return self.flat[var]

    def full_of(self, var: Variable) -> Variable:
        if var not in self.full:
            if var in self.flat:  # computed without the axis: restore it as a view
                restored = pt.expand_dims(self.flat[var], 1)
                self.full[var] = pt.specify_broadcastable(
                    restored, *np.flatnonzero(var.type.broadcastable)
                )
            else:
                self.full[var] = var
        return self.full[var]

    def visit(self, node: Any) -> None:
        outputs = node.outputs
        flat = self._flat_rule(node) if all(_has_row_axis(o) for o in outputs) else None
        if flat is not None:
            for out, new in zip(outputs, flat, strict=True):
                if new.type.ndim != out.type.ndim - 1 or new.type.dtype != out.type.dtype:
                    break
            else:
                self.flat.update(zip(outputs, flat, strict=True))
                return
        full = self._full_rule(node) if len(outputs) == 1 else None
        if full is not None and (full.type.ndim, full.type.dtype) == (
            outputs[0].type.ndim,
            outputs[0].type.dtype,
        ):
            self.full[outputs[0]] = full
            return
        inputs = [self.full_of(i) for i in node.inputs]
        if all(new is old for new, old in zip(inputs, node.inputs, strict=True)):
            return  # untouched: full_of gives the variable itself
        rebuilt = node.op.make_node(*inputs).outputs
        self.full.update(zip(outputs, rebuilt, strict=True))

    def _flat_rule(self, node: Any) -> list[Variable] | None:
        """The node's outputs without axis 1, from its inputs without it, or None."""
        op, inputs = node.op, node.inputs
        if isinstance(op, Elemwise):
            # the output's axis 1 has static length one only if every input's has
            return list(op.make_node(*[self.flat_of(i) for i in inputs]).outputs)
        if isinstance(op, CheckAndRaise):
            value, *conditions = inputs
            return [op(self.flat_of(value), *[self.full_of(c) for c in conditions])]
        if isinstance(op, SpecifyShape):
            value, *shape = inputs
            shape = [self.full_of(s) for s in shape]
            return [pt.specify_shape(self.flat_of(value), [shape[0], *shape[2:]])]
        if isinstance(op, DimShuffle):
            (source,) = inputs
            order = list(op.new_order)
            if order[1] == "x":  # axis 1 is new here: leave it out
                rest = [order[0], *order[2:]]
                source = self.full_of(source)
                if rest == list(range(source.type.ndim)):
                    return [source]
                return [source.dimshuffle(rest)]
            if order[1] == 1 and _has_row_axis(source):  # axis 1 carried through: drop it on both
                rest = [o if o == "x" or o < 1 else o - 1 for o in [order[0], *order[2:]]]
                flat_source = self.flat_of(source)
                if rest == list(range(flat_source.type.ndim)):
                    return [flat_source]
                return [flat_source.dimshuffle(rest)]
            return None
        indices = leading_axis_indices(node)
        if indices is not None and not _has_row_axis(inputs[0]):
            # x[idx…] with row-aligned index arrays (m, 1, …): the same gather by (m, …) arrays
            if all(_has_row_axis(i) for i in indices):
                return [self.full_of(inputs[0])[tuple(self.flat_of(i) for i in indices)]]
        return None

    def _full_rule(self, node: Any) -> Variable | None:
        """An output without a row axis computed from inputs without it, or None."""
        op, inputs = node.op, node.inputs
        if isinstance(op, CAReduce) and _has_row_axis(inputs[0]):
            axes = op.axis if op.axis is not None else tuple(range(inputs[0].type.ndim))
            if 1 not in axes or node.outputs[0].type.dtype != inputs[0].type.dtype:
                return None
            # a reduction over a length-one axis leaves its one element
            rest = tuple(a - 1 if a > 1 else a for a in axes if a != 1)
            source = self.flat_of(inputs[0])
            if not rest:
                return source
            return op.clone(axis=rest).make_node(source).outputs[0]
        if isinstance(op, DimShuffle) and _has_row_axis(inputs[0]) and 1 not in op.new_order:
            # axis 1 dropped here (a Squeeze): the same order on the input without it
            order = [o if o == "x" or o < 1 else o - 1 for o in op.new_order]
            source = self.flat_of(inputs[0])
            if order == list(range(source.type.ndim)):
                return source
            return source.dimshuffle(order)
        if isinstance(op, Reshape) and _has_row_axis(inputs[0]):
            # a reshape reads the values in C order, which a length-one axis does not change
            source, shape = inputs
            return op.make_node(self.flat_of(source), self.full_of(shape)).outputs[0]
        return None


def drop_row_axis(outputs: list[Variable]) -> list[Variable]:
    """``outputs`` computed without the length-one axis 1 wherever an operation allows it.

    Parameters
    ----------
    outputs
        Batched per-row graphs (``vectorize_graph`` of a one-row graph over rows).

    Returns
    -------
    list of Variable
        The same values, of the same types, from a graph whose element-wise chains run on
        ``(m, …)`` arrays (module docstring).
    """
    dropper = _RowAxisDropper()
    for node in io_toposort([], outputs):
        dropper.visit(node)
    result = []
    for out in outputs:
        new = dropper.full_of(out)
        if new.type != out.type:  # the same values; keep the declared type
            new = pt.specify_broadcastable(new, *np.flatnonzero(out.type.broadcastable))
            if new.type != out.type and new.type.ndim == out.type.ndim:
                new = out.type.filter_variable(new, allow_convert=True)
        result.append(new)
    return result
