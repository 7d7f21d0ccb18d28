"""Which model terms outside the likelihood would read private row data (theory §1).

A row is one individual: position ``i`` along the leading axis of every observed variable and of
every row-aligned data container. Only the likelihood may read rows, and only through the
oracle's clipped, noised sums. A prior, a ``pm.Potential`` or a ``pm.Deterministic`` that reads
a row input would put the data into the output without clipping or noise: the log-density
(priors, potentials) or the stored draws (deterministics). The rule applied here:

    a data leaf (shared variable or constant, ``ndim ≥ 1``) reached from a non-likelihood term
    is **private** when it is one of the oracle's row inputs, when it holds at least ``n``
    numbers (one per individual: row data in any layout, ``X.T``, ``y.reshape(1, -1)``, a
    padded copy), or when its values equal a row input's (in any shape or dtype).

Such a term is refused with :class:`~pymc_dp.errors.PrivacyLeakError` naming the term and the
input. Reading a leaf only for its *shape* (``x.shape[0]``) is public and allowed: ``n`` is public.
Data-derived numbers computed outside the model (``y.mean()`` passed as a constant) cannot be
recognised by any check; ``docs/limitations.md`` says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.tensor.shape import Shape, Shape_i
from pytensor.tensor.variable import TensorConstant

from pymc_dp.errors import PrivacyLeakError

__all__ = [
    "check_deterministics",
    "check_terms",
    "data_leaves",
    "describe_leaf",
    "is_data_leaf",
    "leaf_value",
    "private_leaves",
]

# Ops whose output depends on their input's shape only: their inputs are not read as data.
_SHAPE_OPS = (Shape, Shape_i)


def leaf_value(var: Variable) -> np.ndarray:
    """The array held by a data leaf (shared variable or constant)."""
    if isinstance(var, SharedVariable):
        return np.asarray(var.get_value(borrow=True))
    return np.asarray(var.data)


def is_data_leaf(var: Variable) -> bool:
    return var.owner is None and isinstance(var, TensorConstant | SharedVariable)


def describe_leaf(var: Variable) -> str:
    """A name for messages: the variable's name, or what an unnamed constant is (never its data)."""
    if var.name:
        return repr(var.name)
    shape = "×".join(str(s) for s in leaf_value(var).shape) if is_data_leaf(var) else "?"
    return f"an unnamed array of shape ({shape})"


def data_leaves(graphs: Sequence[Variable]) -> list[Variable]:
    """Data leaves whose *values* the graphs read (inputs of shape-only ops are not followed)."""
    seen: set[Variable] = set()
    leaves: list[Variable] = []
    stack = list(graphs)
    while stack:
        var = stack.pop()
        if var in seen:
            continue
        seen.add(var)
        if var.owner is None:
            if is_data_leaf(var) and getattr(var.type, "ndim", 0) >= 1:
                leaves.append(var)
            continue
        if isinstance(var.owner.op, _SHAPE_OPS):
            continue
        stack.extend(var.owner.inputs)
    return leaves


def _equals_a_row_input(value: np.ndarray, row_arrays: Iterable[np.ndarray]) -> bool:
    for rows in row_arrays:
        if rows.size == value.size and rows.size > 0:
            if np.array_equal(rows.ravel().astype(value.dtype), value.ravel()):
                return True
    return False


def private_leaves(
    graphs: Sequence[Variable],
    *,
    n_rows: int,
    row_vars: set[Variable],
    row_arrays: Sequence[np.ndarray],
) -> list[Variable]:
    """The leaves of ``graphs`` that hold row data by the rule of this module."""
    found = []
    for leaf in data_leaves(graphs):
        if leaf in row_vars:
            found.append(leaf)
            continue
        value = leaf_value(leaf)
        if value.size >= n_rows or _equals_a_row_input(value, row_arrays):
            found.append(leaf)
    return found


def check_terms(
    terms: Sequence[tuple[str, str, Variable]],
    *,
    n_rows: int,
    row_vars: set[Variable],
    row_arrays: Sequence[np.ndarray],
) -> None:
    """Refuse non-likelihood log-density terms ``(kind, name, graph)`` that read row data."""
    for kind, name, graph in terms:
        leaves = private_leaves([graph], n_rows=n_rows, row_vars=row_vars, row_arrays=row_arrays)
        if leaves:
            raise PrivacyLeakError(
                f"{kind} {name!r} reads row data ({describe_leaf(leaves[0])}), an input with at "
                f"least one number per individual (n = {n_rows}) or a copy of the data. Only "
                "the likelihood may read rows, and it does so through clipped, noised sums; this "
                "term would put the data into the log-density without clipping or noise. Put "
                "per-row terms in an observed variable (e.g. pm.CustomDist(..., observed=data)) "
                "and keep priors and potentials free of data."
            )


def check_deterministics(
    model: Any,
    *,
    n_rows: int,
    row_vars: set[Variable],
    row_arrays: Sequence[np.ndarray],
) -> None:
    """Refuse ``pm.Deterministic``s that read row data: ``pm.sample`` stores them at every draw.

    PyMC recomputes every deterministic from the private data at each draw and stores it without
    noise. ``pm.OrderedLogistic``/``pm.OrderedProbit`` add such a deterministic (``<name>_probs``,
    one probability vector per row) unless given ``compute_p=False``.
    """
    observed_rvs = set(model.observed_RVs)
    for det in model.deterministics:
        leaves = private_leaves([det], n_rows=n_rows, row_vars=row_vars, row_arrays=row_arrays)
        reads_observed = observed_rvs.intersection(_random_ancestors(det))
        if not leaves and not reads_observed:
            continue
        what = describe_leaf(leaves[0]) if leaves else repr(next(iter(reads_observed)).name)
        fix = (
            "Remove the pm.Deterministic wrapper (keep the expression as a plain variable) and "
            "compute such quantities afterwards from the posterior and public inputs"
        )
        owner = det.name[: -len("_probs")] if det.name.endswith("_probs") else None
        if owner is not None and any(rv.name == owner for rv in observed_rvs):
            fix = (
                f"pm.OrderedLogistic/pm.OrderedProbit {owner!r} adds this per-row deterministic "
                f"by default: pass compute_p=False to {owner!r}"
            )
        raise PrivacyLeakError(
            f"pm.Deterministic {det.name!r} depends on row data ({what}); pm.sample would "
            "compute it from the private data at every draw and store it without noise. "
            f"{fix}."
        )


def _random_ancestors(var: Variable) -> list[Variable]:
    """Every variable above ``var`` (observed random variables included)."""
    seen: set[Variable] = set()
    stack = [var]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v.owner is not None and not isinstance(v.owner.op, _SHAPE_OPS):
            stack.extend(v.owner.inputs)
    return list(seen)
