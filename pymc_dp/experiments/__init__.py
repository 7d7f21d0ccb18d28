"""The seeds' evaluation (SPEC §5): models, step settings, single runs and the reproduction runner.

``python -m pymc_dp.experiments --help`` runs the comparison; :func:`run` is one run.
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
    "run",
]
