"""The privacy ledger: atomic reservations across processes (spawn and fork), persistence."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import sqlite3
from pathlib import Path
from typing import Any

import _accounting_workers as workers
import pytest

from pymc_dp.accounting import (
    BarkerCost,
    GaussianCost,
    Ledger,
    PrivacyBudget,
    gaussian_delta,
    gaussian_iterations,
)
from pymc_dp.errors import BudgetExceededError, InvalidParameterError, LedgerError

EPS, DELTA = 1.0, 1e-6
COST = GaussianCost.from_noise_multiplier(50.0)  # about 140 iterations fit


def _drain(queue: Any, n_done: int, timeout: float = 120.0) -> list:
    items, done = [], 0
    while done < n_done:
        item = queue.get(timeout=timeout)
        if item[0] == "done":
            done += 1
        else:
            items.append(item)
    return items


def test_concurrent_reservations_never_exceed_the_budget(tmp_path: Path) -> None:
    """8 spawned processes race to reserve from one ledger file."""
    path = tmp_path / "ledger.sqlite"
    budget = PrivacyBudget(EPS, DELTA, ledger=path, dataset="race")
    total_allowed = gaussian_iterations(EPS, DELTA, COST.mu)
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=workers.race_reserve, args=(budget, COST, seed, start, out))
        for seed in range(8)
    ]
    for p in procs:
        p.start()
    start.set()
    results = _drain(out, len(procs))
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    granted = [size for kind, size, *_ in results if kind == "ok"]
    refused = [r for r in results if r[0] == "refused"]
    # every refusal was a BudgetExceededError saying how many iterations still fit (or none)
    assert refused and all(r[2] == "BudgetExceededError" for r in refused)
    assert all("still fit" in r[3] or "nothing more fits" in r[3] for r in refused)
    # the ledger holds exactly the granted reservations ...
    history = budget.history()
    assert sorted(e.iterations for e in history) == sorted(granted)
    assert {e.mechanism for e in history} <= {f"racer{s}" for s in range(8)}
    # ... which never exceed the budget and, since every racer ended on a refused single
    # iteration, fill it exactly
    assert sum(granted) == total_allowed
    assert gaussian_delta(EPS, sum(granted) * COST.mu) <= DELTA
    assert budget.iterations(COST) == 0
    # epsilon_total of the last reservation is the budget's spent epsilon
    assert history[-1].epsilon_total == pytest.approx(budget.epsilon_spent())
    assert budget.epsilon_spent() <= EPS


def test_temporary_ledger_is_shared_with_spawned_children() -> None:
    budget = PrivacyBudget(EPS, DELTA)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=workers.reserve_once, args=(budget, COST, 40, out))
    p.start()
    kind, rid, path = out.get(timeout=120)
    p.join(60)
    assert kind == "ok" and path == budget.ledger_path
    (entry,) = budget.history()
    assert (entry.id, entry.iterations, entry.chain, entry.mechanism) == (rid, 40, 7, "child")
    assert entry.pid != os.getpid()
    assert budget.iterations(COST) == gaussian_iterations(EPS, DELTA, COST.mu) - 40


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork on this platform")
def test_forked_children_share_and_do_not_delete_the_temporary_ledger() -> None:
    budget = PrivacyBudget(EPS, DELTA)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=workers.reserve_once, args=(budget, COST, 30, out)) for _ in range(3)
    ]
    for p in procs:
        p.start()
    outcomes = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
    assert [o[0] for o in outcomes] == ["ok"] * 3
    assert os.path.exists(budget.ledger_path)  # children exiting did not remove it
    assert sum(e.iterations for e in budget.history()) == 90


def test_temporary_ledger_removed_with_its_budget() -> None:
    budget = PrivacyBudget(EPS, DELTA)
    path = budget.ledger_path
    copy_state = pickle.dumps(budget)
    assert os.path.exists(path)
    del budget
    import gc

    gc.collect()
    assert not os.path.exists(path)
    with pytest.raises(LedgerError, match="no longer exists"):
        pickle.loads(copy_state)


def test_user_ledger_persists_across_budgets(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite"
    first = PrivacyBudget(2.0, 1e-7, ledger=path, dataset="survey-2024")
    first.reserve(COST, 100, mechanism="DPPenalty", chain=0)
    del first
    # another analysis, another day: same file, same dataset
    again = PrivacyBudget.from_ledger(path, "survey-2024")
    assert (again.epsilon, again.delta) == (2.0, 1e-7)
    (entry,) = again.history()
    assert entry.iterations == 100 and entry.cost == COST and entry.chain == 0
    assert entry.mu == pytest.approx(100 * COST.mu)
    datetime.datetime.fromisoformat(entry.created)
    again.reserve(BarkerCost(500, 50_000), 10, mechanism="DPBarker")
    report = again.report()
    assert report.reservations == 2 and report.method == "rdp" and report.spent_mu is None
    # a second dataset in the same file has its own budget
    other = PrivacyBudget(1.0, 1e-6, ledger=path, dataset="other")
    assert other.history() == [] and Ledger(path).datasets() == ["other", "survey-2024"]


def test_dataset_budget_is_fixed_on_first_use(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    PrivacyBudget(1.0, 1e-6, ledger=path, dataset="d")
    PrivacyBudget(1.0, 1e-6, ledger=path, dataset="d")  # same budget: fine
    with pytest.raises(InvalidParameterError, match=r"recorded .* epsilon=1\.0, delta=1e-06"):
        PrivacyBudget(2.0, 1e-6, ledger=path, dataset="d")
    with pytest.raises(InvalidParameterError, match="from_ledger"):
        PrivacyBudget(1.0, 1e-5, ledger=path, dataset="d")


def test_ledger_errors(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="does not exist"):
        PrivacyBudget.from_ledger(tmp_path / "missing.sqlite", "d")
    path = tmp_path / "l.sqlite"
    PrivacyBudget(1.0, 1e-6, ledger=path, dataset="known")
    with pytest.raises(LedgerError, match=r"no dataset 'unknown'.*\['known'\]"):
        PrivacyBudget.from_ledger(path, "unknown")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(LedgerError, match="not a readable pymc_dp privacy ledger"):
        PrivacyBudget(1.0, 1e-6, ledger=junk, dataset="d")
    with pytest.raises(LedgerError, match=r"directory .* does not exist"):
        PrivacyBudget(1.0, 1e-6, ledger=tmp_path / "nope" / "l.sqlite", dataset="d")


def test_busy_ledger_times_out_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    budget = PrivacyBudget(1.0, 1e-6, ledger=path, dataset="d", timeout=0.2)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(LedgerError, match="stayed locked"):
            budget.reserve(COST, 1)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert budget.history() == []


def test_refused_reservation_records_nothing() -> None:
    budget = PrivacyBudget(EPS, DELTA)
    allowed = budget.iterations(COST)
    with pytest.raises(BudgetExceededError, match=f"only {allowed} iterations of this cost"):
        budget.reserve(COST, allowed + 1)
    assert budget.history() == []
    budget.reserve(COST, allowed)
    with pytest.raises(BudgetExceededError, match="nothing more fits"):
        budget.reserve(COST, 1)
    assert len(budget.history()) == 1
