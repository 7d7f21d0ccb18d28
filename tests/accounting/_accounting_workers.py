"""Functions run in child processes by the ledger tests (importable under ``spawn``)."""

from __future__ import annotations

import random
from typing import Any


def race_reserve(budget: Any, cost: Any, seed: int, start: Any, out: Any) -> None:
    """Reserve random chunks until even a single iteration is refused; report everything.

    Each attempt's outcome goes to ``out`` as ``("ok", size)`` or ``("refused", size, type,
    message)``; a final ``("done", seed)`` marks the end.
    """
    rng = random.Random(seed)
    start.wait(60)
    chunk = rng.randint(5, 60)
    try:
        while True:
            size = rng.randint(1, chunk)
            try:
                budget.reserve(cost, size, mechanism=f"racer{seed}", chain=seed)
            except Exception as exc:
                out.put(("refused", size, type(exc).__name__, str(exc)))
                if size == 1:
                    break
                chunk = max(1, size // 2)
            else:
                out.put(("ok", size))
    finally:
        out.put(("done", seed))


def reserve_once(budget: Any, cost: Any, iterations: int, out: Any) -> None:
    """Reserve once in a child and report the outcome and the ledger path the child used."""
    try:
        r = budget.reserve(cost, iterations, mechanism="child", chain=7)
        out.put(("ok", r.id, budget.ledger_path))
    except Exception as exc:
        out.put(("error", type(exc).__name__, str(exc)))
