"""The seeds' evaluation (theory §5): models, step settings, runs and the reproduction runner.

``python -m pymc_dp.experiments --help`` runs the comparison; :func:`run` is one run. The figures
need matplotlib, an optional extra: ``pip install -e ".[experiments]"``.
"""

from pymc_dp.experiments.problems import PROBLEMS, Problem, get_problem
from pymc_dp.experiments.recipes import STEPS, applicable_steps, build_step
from pymc_dp.experiments.run import RunResult, prepare, run

__all__ = [
    "PROBLEMS",
    "STEPS",
    "Problem",
    "RunResult",
    "applicable_steps",
    "build_step",
    "get_problem",
    "prepare",
    "pyplot",
    "run",
]


def pyplot():
    """``matplotlib.pyplot`` with the non-interactive Agg backend, or a clear error."""
    try:
        import matplotlib
    except ImportError:  # pragma: no cover - depends on the install
        raise ImportError(
            "The gallery and reproduction figures need matplotlib, an optional extra of "
            'pymc_dp: pip install -e ".[experiments]" (or pip install matplotlib).'
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
