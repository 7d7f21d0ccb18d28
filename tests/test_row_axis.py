"""The batched one-row graph loses its length-one row axis without changing a value."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.graph.traversal import ancestors

from pymc_dp._row_axis import _has_row_axis, drop_row_axis


def _computed_with_row_axis(outputs) -> list:
    """The computed (not input, not view) variables of shape (m, 1, …) in ``outputs``' graph."""
    from pytensor.tensor.elemwise import Elemwise

    return [
        v
        for v in ancestors(outputs)
        if v.owner is not None and isinstance(v.owner.op, Elemwise) and _has_row_axis(v)
    ]


def test_an_elementwise_chain_runs_without_the_row_axis_and_keeps_every_value():
    # As vectorize_graph leaves a one-row log-likelihood: rows (m, 1), a gathered group
    # parameter, a reduction over the one row and a squeeze of the row's gradient.
    y = pt.matrix("y", shape=(None, 1))
    idx = pt.matrix("idx", shape=(None, 1), dtype="int64")
    a = pt.vector("a")
    sigma = pt.scalar("sigma")
    residual = y - a[idx]
    ell = (-0.5 * pt.sqr(residual / sigma) - pt.log(sigma)).sum(axis=1)
    grad = (residual / pt.sqr(sigma)).squeeze(axis=1)
    both = pt.exp(residual).reshape((-1,)) + 1.0
    outputs = [ell, grad, both]
    dropped = drop_row_axis(outputs)

    assert [o.type for o in dropped] == [o.type for o in outputs]
    assert _computed_with_row_axis(outputs)  # the control: the batched graph has them
    assert not _computed_with_row_axis(dropped)
    rng = np.random.default_rng(0)
    values = {
        y: rng.normal(size=(50, 1)),
        idx: rng.integers(0, 4, size=(50, 1)),
        a: rng.normal(size=4),
        sigma: 1.3,
    }
    inputs = list(values)
    before = pytensor.function(inputs, outputs)(*values.values())
    after = pytensor.function(inputs, dropped)(*values.values())
    for b, c in zip(before, after, strict=True):
        np.testing.assert_allclose(b, c, rtol=1e-13)  # fused in another order


def test_an_operation_without_a_rule_keeps_its_row_axis():
    # a cumulative sum over the row axis has no rule: computed as before, on (m, 1, k) arrays
    x = pt.tensor3("x", shape=(None, 1, 3))
    out = [pt.cumsum(pt.exp(x), axis=2).sum(axis=(1, 2))]
    dropped = drop_row_axis(out)
    value = np.random.default_rng(1).normal(size=(7, 1, 3))
    np.testing.assert_allclose(
        pytensor.function([x], dropped)(value), pytensor.function([x], out)(value), rtol=1e-14
    )
