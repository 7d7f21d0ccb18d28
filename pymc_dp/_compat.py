"""Every difference between the supported stacks, in one place.

pymc_dp runs on PyMC 5.25+ / PyTensor 2.x / ArviZ 0.2x (Python ≥ 3.11) and on PyMC 6 /
PyTensor 3 / ArviZ 1 (Python ≥ 3.12). Nothing outside this module asks which version is
installed.

**PyTensor: gathers.** PyTensor 2 has ``AdvancedSubtensor1`` for ``x[idx]`` with one integer
vector, and ``AdvancedSubtensor`` takes slices as inputs; PyTensor 3 has only
``AdvancedSubtensor``, whose ``idx_list`` says which input indexes which axis.
:func:`leading_axis_indices` reads both. PyTensor 3 also builds ``logsumexp`` and friends as
``OpFromGraph`` ops with fixed output types; :func:`inline_ofg_node` (in another module in each
version) expands them so that a graph can be rebuilt for one row.

**ArviZ: the release container.** ``pm.sample`` returns an ``arviz.InferenceData`` on ArviZ 0.2x
(``groups()`` is a method; each group is an ``xarray.Dataset``) and an ``xarray.DataTree`` on
ArviZ 1 (where ``arviz.InferenceData`` is ``DataTree``; groups are child nodes). Both index a
group by name, delete one with ``del``, and give it ``data_vars``, ``sizes`` and ``attrs``;
:func:`group_names` lists the groups of either and :func:`add_group` adds one. ArviZ 1 moved the
plots to ``arviz_plots`` (``plot_trace_dist``, ``plot_dist``), which return a plot collection:
:func:`trace_figure` and :func:`posterior_figure` give a matplotlib figure on either.

**PyMC: chain setup.** PyMC 6 calls ``step.setup_chain(rng, tune, draws)`` at the start of each
chain. PyMC 5 only calls ``step.set_rng(rng)``, from ``pymc.sampling.mcmc._iter_sample``
(sequential chains; its ``draws`` already includes ``tune``) or from
``pymc.sampling.parallel._Process._start_loop`` (worker processes; ``_draws`` excludes
``_tune``). In both, a step that is one of several is called through the ``CompoundStep``.
:func:`chain_setup_from_caller` reads those frames, so that a chain reserves exactly the
iterations it will run and knows whether it runs beside another step. If PyMC's internals
change so that nothing is found, the fields are ``None`` and the caller falls back to what it
was told explicitly (``pymc_dp.sample``, ``step.sampling_kwargs``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import numpy as np
import pytensor.tensor.special as _special
import pytensor.tensor.subtensor as _subtensor

try:  # PyTensor 3
    from pytensor.compile.rewriting import inline_ofg_node
except ImportError:  # PyTensor 2
    from pytensor.tensor.rewriting.ofg import inline_ofg_node

__all__ = [
    "ARVIZ_1",
    "GATHER_OPS",
    "SOFTMAX_GRAD_OPS",
    "ChainSetup",
    "add_group",
    "chain_setup_from_caller",
    "group_names",
    "indexes_leading_axes",
    "inline_ofg_node",
    "leading_axis_indices",
    "posterior_figure",
    "trace_figure",
]

#: ArviZ 1 (DataTree results, plots in arviz_plots) rather than ArviZ 0.2x (InferenceData).
ARVIZ_1 = int(version("arviz").split(".")[0]) >= 1

#: The ops of ``x[idx]`` with integer index arrays.
GATHER_OPS: tuple[type, ...] = tuple(
    op
    for op in (
        getattr(_subtensor, "AdvancedSubtensor", None),
        getattr(_subtensor, "AdvancedSubtensor1", None),  # PyTensor 2 only
    )
    if op is not None
)


#: The op of a softmax's gradient (PyTensor 2); PyTensor 3 writes that gradient out as a graph.
SOFTMAX_GRAD_OPS: tuple[type, ...] = tuple(
    op for op in (getattr(_special, "SoftmaxGrad", None),) if op is not None
)


def group_names(idata: Any) -> list[str]:
    """The groups of an ``InferenceData`` (ArviZ 0.2x) or of a ``DataTree`` (ArviZ 1)."""
    groups = idata.groups
    if callable(groups):
        return list(groups())
    return list(idata.children)


def group_dataset(idata: Any, name: str) -> Any:
    """Group ``name`` of an ``InferenceData`` or ``DataTree`` as a dataset (``None`` if absent)."""
    try:
        group = idata[name]
    except (KeyError, TypeError):
        return None
    return getattr(group, "ds", group)  # DataTree node (ArviZ 1) or Dataset


def add_group(idata: Any, name: str, dataset: Any) -> None:
    """Add ``dataset`` (an ``xarray.Dataset``) as group ``name``."""
    if ARVIZ_1:
        import xarray as xr

        idata[name] = xr.DataTree(dataset)
    else:
        idata.add_groups({name: dataset})


def trace_figure(idata: Any, var_names: list[str] | None = None) -> Any:
    """A matplotlib figure of the trace plot (ArviZ's ``plot_trace`` / ``plot_trace_dist``)."""
    if ARVIZ_1:
        import arviz_plots as azp

        plots = azp.plot_trace_dist(idata, var_names=var_names, backend="matplotlib")
        return plots.viz["figure"].item()
    import arviz as az

    axes = az.plot_trace(idata, var_names=var_names, compact=True)
    return np.ravel(axes)[0].figure


def posterior_figure(idata: Any, var_names: list[str] | None = None) -> Any:
    """A matplotlib figure of the marginal posteriors (``plot_posterior`` / ``plot_dist``)."""
    if ARVIZ_1:
        import arviz_plots as azp

        plots = azp.plot_dist(idata, var_names=var_names, backend="matplotlib")
        return plots.viz["figure"].item()
    import arviz as az

    axes = az.plot_posterior(idata, var_names=var_names)
    return np.ravel(axes)[0].figure


def indexes_leading_axes(op: Any, n_indices: int) -> bool:
    """Whether a gather op's ``n_indices`` index inputs index axes ``0 … n−1``, in order.

    PyTensor 3 records the layout in ``op.idx_list`` (an int is the position of an index input,
    a slice a literal slice; trailing full slices are allowed). PyTensor 2 passes slices as
    inputs of a non-tensor type, which the callers refuse by type, so any layout is positional.
    """
    idx_list = getattr(op, "idx_list", None)
    if idx_list is None:
        return True
    if tuple(idx_list[:n_indices]) != tuple(range(n_indices)):
        return False
    return all(entry == slice(None) for entry in idx_list[n_indices:])


def leading_axis_indices(node: Any) -> list[Any] | None:
    """The index inputs of a gather node that indexes leading axes only, else ``None``."""
    if not isinstance(node.op, GATHER_OPS):
        return None
    indices = list(node.inputs[1:])
    if not indices or not indexes_leading_axes(node.op, len(indices)):
        return None
    return indices


_MAX_FRAMES = 6


@dataclass(frozen=True)
class ChainSetup:
    """``iterations`` (tune + draws) and ``tune`` of the chain, and the compound step around it."""

    iterations: int | None = None
    tune: int | None = None
    compound: Any = None


def _as_count(value: Any) -> int | None:
    try:
        count = int(value)
    except (TypeError, ValueError):
        return None
    return count if count >= 0 else None


def chain_setup_from_caller(depth: int = 2) -> ChainSetup:
    """Inspect the frames above the caller (``set_rng``) for PyMC 5's chain setup."""
    from pymc.step_methods.compound import CompoundStep

    try:
        frame = sys._getframe(depth)
    except ValueError:
        return ChainSetup()
    compound = None
    for _ in range(_MAX_FRAMES):
        if frame is None:
            break
        name = frame.f_code.co_name
        owner = frame.f_locals.get("self")
        if isinstance(owner, CompoundStep):
            compound = owner
        elif name == "_iter_sample":
            iterations = _as_count(frame.f_locals.get("draws"))
            tune = _as_count(frame.f_locals.get("tune"))
            return ChainSetup(iterations, tune, compound)
        elif name == "_start_loop" and owner is not None:
            draws = _as_count(getattr(owner, "_draws", None))
            tune = _as_count(getattr(owner, "_tune", None))
            if draws is not None and tune is not None:
                return ChainSetup(draws + tune, tune, compound)
            return ChainSetup(None, None, compound)
        frame = frame.f_back
    return ChainSetup(None, None, compound)
