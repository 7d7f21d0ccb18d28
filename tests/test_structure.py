"""The privacy boundary as the import graph enforces it (issue: architecture).

* Kernels are NumPy-only: importing one in a fresh interpreter does not import PyMC/PyTensor.
* Only ``mechanisms`` (and the research harness, and the oracle's own package helpers) import
  the oracle: step methods, sampling, planning and reporting hold a parameter space and
  mechanisms, never the oracle.
* The clipping rule for ratios is written once in NumPy and once in PyTensor, and they agree.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import pymc_dp
from pymc_dp.oracle import clip_ratio_graph, count_clipped_graph
from pymc_dp.releases import clip_ratio, clipped_ratio_sum, count_clipped

PACKAGE = Path(pymc_dp.__file__).parent


@pytest.mark.parametrize(
    "module",
    [
        "pymc_dp.kernels.penalty",
        "pymc_dp.kernels.hmc",
        "pymc_dp.kernels.barker",
        "pymc_dp.releases",
        "pymc_dp.noise",
    ],
)
def test_kernels_import_no_pymc(module):
    code = (
        f"import sys, {module}; "
        "heavy = sorted(m for m in ('pymc', 'pytensor', 'arviz') if m in sys.modules); "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"{module} imports {out.stdout.strip()}"


def test_the_import_check_detects_pymc():  # negative control for the test above
    code = "import sys, pymc_dp.oracle; print('pymc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the file's package
                parts = path.relative_to(PACKAGE.parent).with_suffix("").parts[: -node.level]
                base = ".".join([*parts, base]) if base else ".".join(parts)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _modules(*relative: str) -> list[Path]:
    paths = []
    for item in relative:
        target = PACKAGE / item
        paths.extend(sorted(target.rglob("*.py")) if target.is_dir() else [target])
    return paths


@pytest.mark.parametrize(
    "path",
    _modules("step_methods", "sampling.py", "planning.py", "report.py", "kernels"),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_steps_and_sampling_do_not_import_the_oracle(path):
    bad = {name for name in _imports(path) if name.startswith("pymc_dp.oracle")}
    bad |= {name for name in _imports(path) if name.endswith("RowLikelihood")}
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_only_the_mechanisms_and_the_research_harness_import_the_oracle():
    importers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "oracle.py"
        and any(name.startswith("pymc_dp.oracle") for name in _imports(path))
    }
    allowed = {"mechanisms.py", "__init__.py"}  # the package's lazy export of RowLikelihood
    research = {p for p in importers if p.startswith("experiments/")}
    assert importers - research <= allowed, sorted(importers - research - allowed)


def test_kernels_import_only_numpy_and_release_types():
    for path in _modules("kernels"):
        # other kernels are pure too (numpy only)
        own = {
            n
            for n in _imports(path)
            if n.startswith("pymc_dp") and not n.startswith("pymc_dp.kernels")
        }
        assert own <= {
            "pymc_dp.releases",
            "pymc_dp.releases.Release",
            "pymc_dp.releases.BarkerDecision",
        }, (path.name, own)


def test_the_ratio_clipping_rule_is_the_same_in_numpy_and_pytensor():
    ratio = np.array([-np.inf, -5.0, -1.0, -0.25, 0.0, 0.3, 1.0, 7.5, np.inf, np.nan, np.nan])
    bound = 1.0
    r, b = pt.vector("r"), pt.scalar("b")
    f = pytensor.function([r, b], [clip_ratio_graph(r, b), count_clipped_graph(r, b)])
    clipped, count = f(ratio, bound)
    np.testing.assert_array_equal(clipped, clip_ratio(ratio, bound))
    assert int(count) == count_clipped(ratio, bound) == 6  # ±inf, −5, 7.5 and two NaN
    assert clip_ratio(np.array([np.nan]), 2.0)[0] == -2.0  # undefined: against the move
    # the hot path's in-place sum is the same rule (NaN → −B, ±∞ → ±B)
    assert clipped_ratio_sum(ratio, bound) == clip_ratio(ratio, bound).sum() == pytest.approx(-1.95)
    scratch = ratio.copy()
    assert clipped_ratio_sum(scratch, bound, overwrite=True) == pytest.approx(-1.95)
    np.testing.assert_array_equal(scratch, clip_ratio(ratio, bound))
