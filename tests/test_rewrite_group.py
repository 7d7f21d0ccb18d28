"""The oracle's per-row functions compiled through a RewriteGroup (the algebra rewritten once
per family) compute what separately compiled functions compute."""

from __future__ import annotations

import pickle

import numpy as np
import pytensor
import pytest

from pymc_dp import _compile
from pymc_dp.experiments.zoo import ZOO
from pymc_dp.oracle import RowLikelihood


def _arguments(oracle: RowLikelihood, name: str, rng: np.random.Generator) -> list[np.ndarray]:
    theta = rng.normal(0.0, 0.3, oracle.ndim)
    rows = next(oracle._chunks(None, False))
    m = rows[0].shape[0]
    layout = oracle._compact_layout
    width, shared = len(layout.first), len(layout.shared)
    extra = {
        "loglik": [],
        "grad": [np.asarray(0.7), rng.uniform(0.5, 2.0, oracle.ndim)],
        "compact": [],
        "centred": [
            rng.normal(size=(m, shared)),
            rng.normal(0.0, 0.3, oracle.ndim),
            rng.normal(size=m),
            rng.normal(size=m),
            np.asarray(1.5),
        ],
        "centred_grad": [
            rng.normal(size=(m, width)),
            rng.normal(size=(width, width)),
            np.asarray(0.8),
        ],
    }[name]
    return [theta, *rows, *extra]


@pytest.mark.parametrize("model_name", ["logistic", "hierarchical", "ordinal_no_p", "mixture"])
def test_a_group_compiles_what_separate_compilations_compute(model_name):
    oracle = RowLikelihood(ZOO[model_name].model(300, seed=2)[1])
    assert oracle._rewrite_groups  # the default backend
    rng = np.random.default_rng(7)
    for name, group in oracle._rewrite_groups.items():
        args = _arguments(oracle, name, rng)
        _compile._cache.clear()  # neither may hand out the other's function
        alone = oracle._compile(*oracle._graphs[name])(*args)
        _compile._cache.clear()
        grouped = group.compile(name)(*args)
        alone = alone if isinstance(alone, list) else [alone]
        grouped = grouped if isinstance(grouped, list) else [grouped]
        assert len(alone) == len(grouped)
        for a, b in zip(alone, grouped, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12, err_msg=name)


def test_each_family_is_rewritten_once(monkeypatch):
    calls = []
    rewrite = _compile.RewriteGroup._rewrite

    def spy(self):
        calls.append(tuple(self.graphs))
        return rewrite(self)

    monkeypatch.setattr(_compile.RewriteGroup, "_rewrite", spy)
    _compile._cache.clear()
    oracle = RowLikelihood(ZOO["logistic"].model(200, seed=3)[1])
    oracle._compact_fn()
    oracle.compile_centred()
    oracle.compile_centred_grad()
    # the values (log-likelihood, centred ratio) and the gradients: one rewrite each
    assert sorted(calls) == sorted({tuple(g.graphs) for g in oracle._rewrite_groups.values()})
    assert len(calls) == 2


def test_the_late_mode_pickles_as_the_modules_own():
    # a compiled function carries its mode to pm.sample's worker processes
    mode = _compile._late_mode(True)
    assert pickle.loads(pickle.dumps(mode)) is mode
    assert mode.excluding("fusion") is not None  # inner graphs get the full mode's rewrites


def test_an_inner_graph_is_rewritten_with_the_whole_pipeline():
    # PyTensor 3 rewrites an OpFromGraph's inner graph with the mode recorded on the graph:
    # with the late rewrites alone, log(1 + exp(x)) stays unstabilised and overflows at 1000
    import pytensor.tensor as pt
    from pytensor.compile.builders import OpFromGraph

    inner = pt.vector("inner")
    softplus = OpFromGraph([inner], [pt.log(1 + pt.exp(inner))], inline=False)
    x = pt.vector("x")
    graph = ([x], softplus(x) * 2.0)
    values = np.array([1000.0, 1.0])
    _compile._cache.clear()
    alone = _compile.compile_function(*graph)(values)
    _compile._cache.clear()
    grouped = _compile.RewriteGroup({"f": graph}, check_bounds=True).compile("f")(values)
    np.testing.assert_array_equal(grouped, alone)
    if hasattr(pytensor.compile.mode, "_ActiveModeGraphRewriter"):  # PyTensor 3 stabilises it
        assert np.isfinite(grouped).all()
