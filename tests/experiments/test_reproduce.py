"""The reproduction runner's tables (no sampling: rows written by hand)."""

from __future__ import annotations

import csv

from pymc_dp.experiments.reproduce import write_comparison_table

_FIELDS = [
    "problem",
    "step",
    "recipe",
    "epsilon",
    "seed",
    "n",
    "iterations",
    "acceptance",
    "clipped_fraction",
    "score",
    "floor",
    "metric",
    "seconds",
]


def _row(seed: int, score: float, metric: str = "mmd", iterations: int = 100) -> dict:
    return {
        "problem": "flat_banana_2d",
        "step": "DPHMC",
        "recipe": "private",
        "epsilon": 1.0,
        "seed": seed,
        "n": 100_000,
        "iterations": iterations,
        "acceptance": 0.5,
        "clipped_fraction": "nan",
        "score": score,
        "floor": 0.1,
        "metric": metric,
        "seconds": 1.0,
    }


def test_a_run_refused_before_sampling_is_counted_not_scored(tmp_path):
    """A private run that stops before sampling (e.g. ``InsufficientDataError``) is a recorded
    outcome: the table counts it and takes the median over the runs that sampled."""
    path = tmp_path / "runs.csv"
    rows = [
        _row(0, 0.2),
        _row(1, 0.4),
        _row(2, float("nan"), "refused: InsufficientDataError", 0),
        _row(3, 0.3),
    ]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    out = tmp_path / "table.md"
    write_comparison_table(path, out)
    line = next(x for x in out.read_text().splitlines() if "| DPHMC |" in x)
    assert "0.300 (0.20–0.40); 100 it" in line, line
    assert "1 refused before sampling" in line, line
    assert "nan" not in line.split("|")[3], line  # the ε = 1 cell
