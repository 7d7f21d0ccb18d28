"""Non-centred hierarchies sampled in their centred coordinates (a change of variables, no data).

PyMC's documentation often writes a hierarchy *non-centred*::

    z_a = pm.Normal("z_a", 0, 1, dims="group")
    a = pm.Deterministic("a", mu_a + z_a * sigma_a, dims="group")
    pm.Normal("y", a[group_idx] + b * x, sigma, observed=y)

With many rows per group the likelihood pins every ``a_j = μ_a + σ_a z_j``, and the posterior
of ``(μ_a, σ_a, z)`` lies along a thin, curved ridge that no Gaussian proposal follows (theory
§4, "Non-centred hierarchies"). The same posterior is a plain Gaussian-like blob in the
centred coordinates ``(μ_a, σ_a, a)``: the map ``z = (a − μ_a)/σ_a`` is a bijection for
``σ_a > 0`` with Jacobian ``|∂z/∂a| = σ_a^{−J}``, so

    p(μ_a, σ_a, a | y) = p(μ_a, σ_a, z(a) | y) · σ_a^{−J}
                       ∝ p(μ_a) p(σ_a) ∏_j N(a_j; μ_a, σ_a) · p(y | a, …),

which is the centred model. :func:`centred_coordinates` finds such variables in the model's
graph and builds that centred model (:class:`CentredCoordinates`); a DP step samples it and
reports every draw in the model's own variables (``z = (a − μ_a)/σ_a``), so ``pm.sample``
records exactly what it records for any other step. The change reads no data: it is a
function of the model's graph and of the parameters (post-processing of the released draws).

A variable ``z`` is centred when

* it is a free ``pm.Normal(…, mu=0, sigma=1)`` with no transform;
* it enters the model (possibly indexed first, ``z[group_idx]``) as ``loc + scale · z`` or
  ``scale · z``, the same pair at every such use, with ``scale`` one scalar free variable
  positive by its transform (``pm.HalfNormal``, ``pm.Exponential``, … have a log transform)
  or a positive constant, and ``loc`` a scalar free variable or constant, or (``z`` not
  indexed first) a graph of free variables, constants and group-level data with one value per
  entry of ``z`` and fewer numbers than rows: a group-level regression's mean
  ``g0 + g1 * u``. (The centred prior of ``a`` reads that data without noise, so it must
  never be the rows'; a mean the detector cannot place stays outside: only ``scale · z`` is
  centred.)

Any other use of ``z`` in the log-density reads ``(a − loc)/scale``, so the model is the same
model whatever else it does with ``z``. A ``z`` whose ``loc`` or ``scale`` depends on it, or is
itself centred, is left as it is; nothing is centred in a model with initial values set on its
variables (``initval=``).

Centring suits groups with many rows each, where the data pin every ``a_j``: the regime in
which a differentially private posterior is usable at all. With few rows per group the centred
posterior has a funnel in ``σ_a`` instead; ``centre_hierarchies=False`` on a step keeps the
model's own coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.logprob.transforms import LogTransform
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import ancestors, graph_inputs, io_toposort
from pytensor.tensor.basic import get_underlying_scalar_constant_value
from pytensor.tensor.elemwise import DimShuffle, Elemwise
from pytensor.tensor.exceptions import NotScalarConstantError
from pytensor.tensor.random.basic import NormalRV
from pytensor.tensor.subtensor import Subtensor
from pytensor.tensor.type_other import NoneTypeT

from pymc_dp._compat import GATHER_OPS
from pymc_dp._compile import compile_function

__all__ = ["CentredCoordinates", "NonCentred", "centred_coordinates", "find_non_centred"]

_GATHERS = (*GATHER_OPS, Subtensor)


@dataclass(frozen=True)
class NonCentred:
    """One non-centred variable ``z`` entering the model as ``loc + scale · z``.

    Attributes
    ----------
    z : Variable
        The standard Normal free variable.
    loc, scale : Variable or None
        The affine map's location (a scalar, or one value per entry of ``z``: see the module
        docstring; ``None`` for ``scale · z``) and its positive scalar scale.
    uses : tuple of (Variable, Variable)
        ``(top, gathered)``: ``top`` computes ``loc + scale · gathered``, where ``gathered`` is
        ``z`` or ``z`` indexed (``z[group_idx]``).
    name : str
        The centred variable's name (the ``pm.Deterministic`` the user gave the affine map, if
        any, else ``"<z>_centred"``).
    """

    z: Variable
    loc: Variable | None
    scale: Variable
    uses: tuple[tuple[Variable, Variable], ...]
    name: str


def _scalar_constant(var: Variable) -> float | None:
    try:
        return float(get_underlying_scalar_constant_value(var))
    except (NotScalarConstantError, TypeError, ValueError):
        return None


def _unbroadcast(var: Variable) -> Variable:
    """``var`` without the dimension-adding ``DimShuffle`` PyTensor puts on broadcast scalars."""
    while (
        var.owner is not None
        and isinstance(var.owner.op, DimShuffle)
        and var.owner.inputs[0].ndim == 0
    ):
        var = var.owner.inputs[0]
    return var


def _is_elemwise(node: Any, name: str) -> bool:
    return (
        isinstance(node.op, Elemwise)
        and type(node.op.scalar_op).__name__ == name
        and len(node.inputs) == 2
    )


def _clients(outputs: list[Variable]) -> dict[Variable, list[tuple[Any, int]]]:
    """Each variable's consumers ``(node, input position)`` in the graph of ``outputs``."""
    clients: dict[Variable, list[tuple[Any, int]]] = {}
    for node in io_toposort([], outputs):
        for i, inp in enumerate(node.inputs):
            clients.setdefault(inp, []).append((node, i))
    return clients


def _is_standard_normal(model: pm.Model, rv: Variable) -> bool:
    node = rv.owner
    if node is None or not isinstance(node.op, NormalRV) or rv.dtype not in ("float32", "float64"):
        return False
    if model.rvs_to_transforms.get(rv) is not None:
        return False
    loc, scale = node.op.dist_params(node)
    if _scalar_constant(loc) != 0.0 or _scalar_constant(scale) != 1.0:
        return False
    # the centred variable is drawn with z's size: given, or (when implied by the parameters)
    # z's static shape
    return not isinstance(node.op.size_param(node).type, NoneTypeT) or None not in rv.type.shape


def _size(z: Variable) -> Any:
    """``z``'s ``size`` argument, or its static shape when the parameters implied it."""
    size = z.owner.op.size_param(z.owner)
    if isinstance(size.type, NoneTypeT):
        return tuple(int(s) for s in z.type.shape) or None
    return size


def _valid_scale(model: pm.Model, var: Variable) -> bool:
    if var.ndim != 0:
        return False
    if isinstance(var, Constant):
        value = _scalar_constant(var)
        return value is not None and value > 0
    return var in model.free_RVs and isinstance(model.rvs_to_transforms.get(var), LogTransform)


def _valid_loc(model: pm.Model, var: Variable, z: Variable, gathered: bool) -> bool:
    """Whether ``var`` can be the centred variable's mean: a scalar free variable or constant;
    or, where ``z`` is not indexed first, a graph of free variables, constants and public
    group-level data with one value per entry of ``z`` (``g0 + g1 * u``, ``u`` one value per
    group: the mean of a group-level regression)."""
    if var.ndim == 0 and (var in model.free_RVs or _scalar_constant(var) is not None):
        return True
    if gathered or var.ndim > z.ndim:
        return False
    trailing = z.type.shape[z.ndim - var.ndim :]
    if any(b != 1 and zb == 1 for b, zb in zip(var.type.shape, trailing, strict=True)):
        return False  # the mean would widen z
    if set(model.observed_RVs) & set(ancestors([var])):
        return False
    rows = _row_count(model)
    for root in graph_inputs([var], blockers=model.free_RVs):
        if root in model.free_RVs:
            continue
        if isinstance(root, Constant):
            value = root.data
        elif root in model.data_vars:
            value = root.get_value(borrow=True)
        else:
            return False
        shape = np.shape(value)
        if shape == ():
            continue
        # one value per group, and fewer numbers than rows: never the rows' data (which the
        # centred model's prior would read without noise)
        if shape[0] != _leading_length(z) or rows is None or np.size(value) >= rows:
            return False
    return True


def _row_count(model: pm.Model) -> int | None:
    """The fewest rows of an observed variable (public: the data's shape, not its values)."""
    counts = []
    for rv in model.observed_RVs:
        value = model.rvs_to_values[rv]
        data = value.data if isinstance(value, Constant) else getattr(value, "get_value", None)
        data = data(borrow=True) if callable(data) else data
        if data is None or np.ndim(data) == 0:
            return None
        counts.append(np.shape(data)[0])
    return min(counts) if counts else None


def _leading_length(z: Variable) -> int | None:
    """The length of ``z``'s first axis (public: the model's dimensions)."""
    size = _size(z)
    if size is None:
        return None
    values = size if isinstance(size, tuple) else size.eval()
    return int(values[0]) if len(values) else None


def _affine_uses(
    model: pm.Model, z: Variable, clients: dict[Variable, list[tuple[Any, int]]]
) -> list[tuple[Variable, Variable, Variable | None, Variable]]:
    """``(top, gathered, loc, scale)`` for every use of ``z`` as ``loc + scale · z[…]``."""
    found = []
    gathered = [z]
    while gathered:
        var = gathered.pop()
        for node, position in clients.get(var, []):
            if isinstance(node.op, _GATHERS) and position == 0:
                gathered.append(node.outputs[0])
                continue
            if not _is_elemwise(node, "Mul"):
                continue
            scale = _unbroadcast(node.inputs[1 - position])
            if not _valid_scale(model, scale):
                continue
            product = node.outputs[0]
            sums = [
                (n, _unbroadcast(n.inputs[1 - p]))
                for n, p in clients.get(product, [])
                if _is_elemwise(n, "Add")
            ]
            sums = [(n, loc) for n, loc in sums if _valid_loc(model, loc, z, var is not z)]
            if sums:
                found += [(n.outputs[0], var, loc, scale) for n, loc in sums]
            else:
                found.append((product, var, None, scale))
    return found


def _deterministic_name(model: pm.Model, top: Variable) -> str | None:
    """The name of a ``pm.Deterministic`` that is exactly ``top`` (a view of it), if any."""
    for det in model.deterministics:
        inner = det.owner.inputs[0] if det.owner is not None and det.owner.inputs else None
        if det is top or inner is top:
            return det.name
    return None


def find_non_centred(model: pm.Model) -> list[NonCentred]:
    """The model's non-centred variables (see the module docstring for the pattern).

    Reads the model's graph only: the log-density's graph (free and observed variables,
    potentials); deterministics, which it never reads, only name a centred variable. A variable
    whose uses disagree on ``(loc, scale)``, whose ``loc`` or ``scale`` is itself non-centred,
    or whose ``loc``/``scale`` depends on it (through a prior) is left as it is.
    """
    outputs = list(model.free_RVs) + list(model.observed_RVs) + list(model.potentials)
    clients = _clients(outputs)
    candidates = {}
    for z in model.free_RVs:
        if not _is_standard_normal(model, z):
            continue
        # a potential that is the affine map itself keeps its own node: it reads (a − loc)/scale
        uses = [u for u in _affine_uses(model, z, clients) if u[0] not in model.potentials]
        pairs = {(loc, scale) for _, _, loc, scale in uses}
        if len(pairs) != 1:
            continue
        ((loc, scale),) = pairs
        candidates[z] = (loc, scale, tuple((top, g) for top, g, _, _ in uses))
    reserved = {v.name for v in model.value_vars} | set(model.coords)
    taken = set(model.named_vars) | reserved
    found = []
    for z, (loc, scale, uses) in candidates.items():
        hyper = [v for v in (loc, scale) if v is not None]
        if any(v in candidates for v in hyper) or set(candidates) & set(ancestors(hyper)):
            continue
        name = _deterministic_name(model, uses[0][0]) if len(uses) == 1 else None
        if name is None or name in reserved:
            name = f"{z.name}_centred"
            while name in taken:
                name += "_"
        taken.add(name)
        found.append(NonCentred(z=z, loc=loc, scale=scale, uses=uses, name=name))
    return found


class CentredCoordinates:
    """A model's centred twin and the maps between its coordinates and the model's own.

    Built by :func:`centred_coordinates`. ``centred_model`` is the centred model (free variables
    in the user's order, each centred ``a`` in its ``z``'s place; observed variables, potentials
    and data containers the same objects; no deterministics); ``published_model`` the user's
    model, whose variables the draws are reported in. Both are ``None`` in a pickled copy; the
    maps between them are compiled functions of the parameters only.
    """

    def __init__(self, published: pm.Model, centred: pm.Model, found: list[NonCentred]) -> None:
        self.centred_model: pm.Model | None = centred
        self.published_model: pm.Model | None = published
        self.found = tuple(found)
        self._description = "; ".join(
            f"{nc.z.name}: {nc.name} = "
            + ("" if nc.loc is None else f"{_label(nc.loc)} + ")
            + f"{_label(nc.scale)} * {nc.z.name}"
            for nc in found
        )
        self.names = {nc.z.name: nc.name for nc in found}  # model's z -> centred a
        values = published.rvs_to_values
        z_values = [values[nc.z] for nc in found]
        a_values = [centred.rvs_to_values[centred[nc.name]] for nc in found]
        locs, scales = [], []
        for nc in found:
            loc = pt.constant(0.0) if nc.loc is None else nc.loc
            loc, scale = published.replace_rvs_by_values([loc, nc.scale])
            locs.append(loc)
            scales.append(scale)
        to_a = [lo + s * z for lo, s, z in zip(locs, scales, z_values, strict=True)]
        to_z = [(a - lo) / s for lo, s, a in zip(locs, scales, a_values, strict=True)]
        read = set(graph_inputs(locs + scales))
        others = [v for v in published.value_vars if v not in z_values and v in read]
        self._inputs = [v.name for v in others]  # the hyperparameters the maps read
        self._to_centred = compile_function(others + z_values, to_a, check_bounds=False)
        self._to_published = compile_function(others + a_values, to_z, check_bounds=False)
        self._z_names = [nc.z.name for nc in found]
        self._dtypes = {v.name: v.dtype for v in published.value_vars}
        self._dtypes.update({a.name: a.dtype for a in a_values})
        self._last: tuple[tuple[bytes, ...], list[np.ndarray]] | None = None

    def _args(self, point: dict[str, Any], names: list[str]) -> list[np.ndarray]:
        return [np.asarray(point[name], dtype=self._dtypes[name]) for name in names]

    def fits(self, point: dict[str, Any]) -> bool:
        """Whether each centred variable has its ``z``'s shape at ``point`` (a public check of
        the model's dimensions, at PyMC's initial point)."""
        try:
            centred = self.to_centred(point)
        except Exception:  # the model's own error comes from the model, sampled as written
            return False
        finally:
            self._last = None
        return all(np.shape(centred[self.names[z]]) == np.shape(point[z]) for z in self._z_names)

    def _key(self, point: dict[str, Any]) -> tuple[bytes, ...]:
        return tuple(np.asarray(point[name]).tobytes() for name in self._z_names + self._inputs)

    def to_centred(self, point: dict[str, Any]) -> dict[str, np.ndarray]:
        """The centred model's point for a point of the model (``a = loc + scale · z``).

        A point this object just reported (:meth:`to_published`) maps back to the exact centred
        values it came from, not to a rounding of them: a chain's state stays bit for bit the
        same between iterations."""
        key = self._key(point)
        if self._last is not None and self._last[0] == key:
            a = self._last[1]
        else:
            a = self._to_centred(*self._args(point, self._inputs + self._z_names))
        out = {name: value for name, value in point.items() if name not in self.names}
        out.update({self.names[z]: np.asarray(v) for z, v in zip(self._z_names, a, strict=True)})
        return out

    def to_published(self, centred: dict[str, Any]) -> dict[str, np.ndarray]:
        """The model's point for a point of the centred model (``z = (a − loc)/scale``)."""
        a_names = [self.names[z] for z in self._z_names]
        z = self._to_published(*self._args(centred, self._inputs + a_names))
        out = {name: value for name, value in centred.items() if name not in a_names}
        out.update({name: np.asarray(v) for name, v in zip(self._z_names, z, strict=True)})
        self._last = (self._key(out), [np.array(centred[name], copy=True) for name in a_names])
        return out

    def describe(self) -> str:
        """Each centred variable, ``"; "``-separated: ``z_a: a = mu_a + sigma_a * z_a``."""
        return self._description

    def __getstate__(self) -> dict[str, Any]:
        # the compiled maps travel; the models and their graphs stay behind
        state = self.__dict__.copy()
        state.update(centred_model=None, published_model=None, found=(), _last=None)
        return state


def _label(var: Variable) -> str:
    if var.name:
        return var.name
    value = _scalar_constant(var)
    return "<unnamed expression>" if value is None else f"{value:g}"


def centred_coordinates(model: pm.Model) -> CentredCoordinates | None:
    """The centred twin of ``model`` (:class:`CentredCoordinates`); ``None``: nothing to centre.

    Built once per model and kept on it while its variables and initial values are those it
    was built from (a second step on the same model reuses it, and so its oracle).
    """
    key = (
        tuple((name, id(var)) for name, var in model.named_vars.items()),
        tuple((id(rv), id(value)) for rv, value in model.rvs_to_initial_values.items()),
        bool(getattr(model, "check_bounds", True)),
    )
    cache = model.__dict__.setdefault("_pymc_dp_centred_coordinates", {})
    if key in cache:
        return cache[key]
    cache.clear()
    if any(v is not None for v in model.rvs_to_initial_values.values()):
        found = []  # PyMC's initial values are per variable: not carried over to a centred one
    else:
        found = find_non_centred(model)
    coordinates = CentredCoordinates(model, _build_centred(model, found), found) if found else None
    if coordinates is not None and not coordinates.fits(model.initial_point()):
        coordinates = None  # a mean that does not broadcast to z: the model as written
    cache[key] = coordinates
    return coordinates


def _rebuild(outputs: list[Variable], replace: dict[Variable, Variable]) -> list[Variable]:
    """``outputs`` with ``replace`` applied, rebuilding only the nodes that read a replaced
    variable: every other variable (a hyperparameter's random variable, the data) stays the
    same object, so the centred model and the model share them. The replacements' own graphs
    are taken as they are (they read no replaced variable: :func:`find_non_centred`)."""
    memo = dict(replace)
    for node in io_toposort([], outputs):
        if all(out in replace for out in node.outputs):
            continue
        inputs = [memo.get(i, i) for i in node.inputs]
        if all(new is old for new, old in zip(inputs, node.inputs, strict=True)):
            continue
        new_node = node.clone_with_new_inputs(inputs, strict=False)
        for old, new in zip(node.outputs, new_node.outputs, strict=True):
            memo.setdefault(old, new)
    return [memo.get(out, out) for out in outputs]


def _build_centred(model: pm.Model, found: list[NonCentred]) -> pm.Model:
    """A new ``pm.Model`` of the centred coordinates (see :class:`CentredCoordinates`)."""
    tops: dict[Variable, Variable] = {}
    rest: dict[Variable, Variable] = {}
    centred_rvs: dict[Variable, Variable] = {}
    for nc in found:
        loc = 0.0 if nc.loc is None else nc.loc
        a = pm.Normal.dist(mu=loc, sigma=nc.scale, size=_size(nc.z))
        a.name = nc.name
        centred_rvs[nc.z] = a
        for top, gathered in nc.uses:
            tops[top] = _rebuild([gathered], {nc.z: a})[0]
        rest[nc.z] = (a - loc) / nc.scale
    outputs = [rv for rv in model.free_RVs if rv not in centred_rvs]
    outputs += list(model.observed_RVs) + list(model.potentials)
    rebuilt = _rebuild(outputs, tops | rest)
    old_to_new = dict(zip(outputs, rebuilt, strict=True)) | centred_rvs

    centred = pm.Model(model=None, check_bounds=bool(getattr(model, "check_bounds", True)))
    centred._coords = model._coords.copy()
    centred._dim_lengths = dict(model._dim_lengths)
    dims = model.named_vars_to_dims
    for data in model.data_vars:
        centred.data_vars.append(data)
        centred.add_named_variable(data, dims=dims.get(data.name))
    centred_names = {nc.z: nc.name for nc in found}
    for rv in model.free_RVs:
        new = old_to_new[rv]
        centred.free_RVs.append(new)
        if rv in centred_names:
            centred.create_value_var(new, transform=None, default_transform=None)
            centred.set_initval(new, None)
        else:
            new.name = rv.name
            centred.create_value_var(
                new,
                transform=model.rvs_to_transforms.get(rv),
                default_transform=None,
                value_var=model.rvs_to_values[rv],
            )
            centred.set_initval(new, model.rvs_to_initial_values.get(rv))
        centred.add_named_variable(new, dims=dims.get(rv.name))
    for rv in model.observed_RVs:
        new = old_to_new[rv]
        new.name = rv.name
        centred.observed_RVs.append(new)
        centred.create_value_var(
            new, transform=None, default_transform=None, value_var=model.rvs_to_values[rv]
        )
        centred.add_named_variable(new, dims=dims.get(rv.name))
    for pot in model.potentials:
        new = old_to_new[pot]
        new.name = pot.name
        centred.potentials.append(new)
        centred.add_named_variable(new, dims=dims.get(pot.name))
    return centred
