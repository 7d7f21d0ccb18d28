"""A tampered ledger is detected: every edit an attacker with SQL access makes without rebuilding
the hash chain, and, with an export kept elsewhere, a rebuilt or replaced ledger too."""

from __future__ import annotations

import json
import sqlite3

import pytest

import pymc_dp
from pymc_dp.accounting import GaussianCost
from pymc_dp.accounting.ledger import GENESIS, Ledger
from pymc_dp.errors import LedgerTamperedError

COST = GaussianCost.from_noise_multiplier(10.0)  # mu = 0.005 per iteration


def used_ledger(tmp_path, reservations: int = 3) -> str:
    path = str(tmp_path / "ledger.sqlite")
    budget = pymc_dp.PrivacyBudget(epsilon=5.0, delta=1e-6, ledger=path, dataset="survey")
    for chain in range(reservations):
        budget.reserve(COST, 10, mechanism="DPPenalty", chain=chain, chains=reservations)
    return path


def sql(path: str, statement: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(statement)
    conn.close()


TAMPERING = {
    "delete one reservation": ("DELETE FROM reservations WHERE id = 2", "deleted"),
    "delete every reservation": ("DELETE FROM reservations", "deleted"),
    "truncate the history": (
        "DELETE FROM reservations WHERE id = (SELECT MAX(id) FROM reservations)",
        "deleted",
    ),
    "raise the budget": ("UPDATE datasets SET epsilon = 1000", "dataset 'survey' was edited"),
    "shrink a reservation": ("UPDATE reservations SET iterations = 1 WHERE id = 1", "edited"),
    "rewrite a cost": (
        "UPDATE reservations SET cost = replace(cost, '0.005', '0.0005') WHERE id = 3",
        "edited",
    ),
    "lower the recorded total": ("UPDATE reservations SET epsilon_total = 0", "edited"),
    "drop the chain head": ("DELETE FROM meta WHERE key = 'chain_head'", "head was removed"),
    "insert an unchained row": (
        "INSERT INTO reservations(dataset, created, mechanism, chains, iterations, cost, "
        "epsilon_total, method) SELECT dataset, created, mechanism, chains, iterations, cost, "
        "epsilon_total, method FROM reservations WHERE id = 1",
        "missing",
    ),
}


@pytest.mark.parametrize("attack", list(TAMPERING))
def test_tampering_is_detected_on_open_and_before_anything_is_reserved(tmp_path, attack):
    path = used_ledger(tmp_path)
    statement, says = TAMPERING[attack]
    sql(path, statement)
    with pytest.raises(LedgerTamperedError, match=says):
        Ledger(path)
    with pytest.raises(LedgerTamperedError):
        pymc_dp.PrivacyBudget.from_ledger(path, "survey")
    # a LedgerError, so code that handles an unreadable ledger handles this one too
    assert issubclass(LedgerTamperedError, pymc_dp.LedgerError)


def test_tampering_while_a_budget_is_open_is_caught_by_its_next_reservation(tmp_path):
    path = str(tmp_path / "ledger.sqlite")
    budget = pymc_dp.PrivacyBudget(epsilon=2.0, delta=1e-6, ledger=path, dataset="survey")
    budget.reserve(COST, 15, mechanism="DPPenalty")
    assert not budget.fits(COST, 15)
    sql(path, "DELETE FROM reservations")  # would make room for another 15 ...
    with pytest.raises(LedgerTamperedError, match="deleted"):
        budget.reserve(COST, 15, mechanism="DPPenalty")  # ... but is caught


def test_honest_use_keeps_the_chain_valid(tmp_path):
    path = used_ledger(tmp_path)
    ledger = Ledger(path)
    reservation = pymc_dp.PrivacyBudget.from_ledger(path, "survey").reserve(
        COST, 5, mechanism="DPHMC"
    )
    reservation.spend(5, flush=True)  # progress counts are not part of the chain
    ledger.register_dataset("other", 1.0, 1e-6)
    length, _, digest = ledger.verify().partition(":")
    assert int(length) == 1 + 3 + 1 + 1 and len(digest) == 64
    assert ledger.head() == f"{length}:{digest}"
    # each row's hash is SHA-256 of the previous hash and its record: recompute by hand
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT seq, hash FROM reservations ORDER BY seq").fetchall()
    assert [s for s, _ in rows] == [2, 3, 4, 5]
    assert all(len(h) == 64 and h != GENESIS for _, h in rows)


def test_a_rebuilt_chain_or_a_replaced_file_is_caught_by_the_export(tmp_path):
    path = used_ledger(tmp_path)
    export = str(tmp_path / "elsewhere" / "ledger.jsonl")
    (tmp_path / "elsewhere").mkdir()
    assert Ledger(path).export(export) == 4
    assert Ledger(path).export(export) == 0  # append-only: nothing new
    head = Ledger(path).head()

    # an attacker who deletes the file starts a fresh ledger: it looks new on its own ...
    import os

    os.remove(path)
    fresh = pymc_dp.PrivacyBudget(epsilon=5.0, delta=1e-6, ledger=path, dataset="survey")
    assert fresh.report().reservations == 0
    # ... but does not extend the export, nor the head a release's metadata carries
    with pytest.raises(LedgerTamperedError, match="does not extend"):
        Ledger(path).verify(export=export)
    with pytest.raises(LedgerTamperedError, match="does not extend"):
        Ledger(path).verify(head=head)


def test_an_edited_export_is_refused(tmp_path):
    path = used_ledger(tmp_path)
    export = tmp_path / "ledger.jsonl"
    Ledger(path).export(export)
    lines = export.read_text().splitlines()
    link = json.loads(lines[1])
    link["record"][4] = "1000.0"  # the dataset budget, as stored in the copy
    lines[1] = json.dumps(link, separators=(",", ":"))
    export.write_text("\n".join(lines) + "\n")
    with pytest.raises(LedgerTamperedError, match="line 2"):
        Ledger(path).verify(export=export)


def test_a_release_carries_the_ledger_head_it_was_made_under(tmp_path):
    import numpy as np
    import pymc as pm

    path = str(tmp_path / "ledger.sqlite")
    budget = pymc_dp.PrivacyBudget(epsilon=50.0, delta=1e-5, ledger=path, dataset="d")
    with pm.Model():
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1, observed=np.random.default_rng(0).normal(size=100))
        step = pymc_dp.DPPenalty(budget=budget, llr_clip=5.0, noise_multiplier=2.0)
        idata = pymc_dp.sample(
            step, chains=2, tune=5, draws=5, cores=1, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    head = pymc_dp.privacy_report(idata, show=False)["dp_ledger_head"]
    assert head == Ledger(path).verify(head=head)
    assert head.startswith("3:")  # the dataset and one reservation per chain


def test_a_version_1_ledger_is_upgraded_in_place(tmp_path):
    path = str(tmp_path / "old.sqlite")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE datasets (name TEXT PRIMARY KEY, epsilon REAL NOT NULL,
            delta REAL NOT NULL, created TEXT NOT NULL);
        CREATE TABLE reservations (id INTEGER PRIMARY KEY AUTOINCREMENT, dataset TEXT NOT NULL,
            created TEXT NOT NULL, mechanism TEXT NOT NULL, chain INTEGER,
            chains INTEGER NOT NULL, iterations INTEGER NOT NULL, cost TEXT NOT NULL, mu REAL,
            epsilon_total REAL NOT NULL, method TEXT NOT NULL, spent INTEGER NOT NULL DEFAULT 0,
            pid INTEGER, host TEXT);
        INSERT INTO meta VALUES ('schema', '1');
        """
    )
    conn.execute("INSERT INTO datasets VALUES ('d', 1.0, 1e-6, '2026-01-01T00:00:00')")
    conn.execute(
        "INSERT INTO reservations(dataset, created, mechanism, chains, iterations, cost, mu, "
        "epsilon_total, method) VALUES ('d', '2026-01-01T00:00:01', 'DPPenalty', 1, 10, ?, "
        "?, 0.5, 'gaussian')",
        (json.dumps(COST.to_record(), sort_keys=True), 10 * COST.gaussian_mu()),
    )
    conn.close()
    budget = pymc_dp.PrivacyBudget.from_ledger(path, "d")
    assert budget.report().reserved_iterations == 10
    assert Ledger(path).head().startswith("2:")
    sql(path, "UPDATE datasets SET epsilon = 9")
    with pytest.raises(LedgerTamperedError):
        Ledger(path)


def test_rewinding_the_head_to_an_earlier_row_is_detected(tmp_path):
    # truncation by copying: drop the last reservation and point meta at the new last row
    path = used_ledger(tmp_path)
    conn = sqlite3.connect(path, isolation_level=None)
    last = conn.execute("SELECT MAX(seq) FROM reservations").fetchone()[0]
    kept = conn.execute("SELECT hash FROM reservations WHERE seq = ?", (last - 1,)).fetchone()[0]
    conn.execute("DELETE FROM reservations WHERE seq = ?", (last,))
    conn.execute("UPDATE meta SET value = ? WHERE key = 'chain_length'", (str(last - 1),))
    conn.execute("UPDATE meta SET value = ? WHERE key = 'chain_head'", (kept,))
    conn.close()
    with pytest.raises(LedgerTamperedError, match="head"):
        Ledger(path)


def test_a_check_reads_one_snapshot_while_another_process_reserves(tmp_path, monkeypatch):
    # a reservation that commits between the check's queries would look like tampering; the
    # check holds a read transaction, so the writer waits (here: gives up) until it is done
    import pymc_dp.accounting.ledger as ledger_module

    path = used_ledger(tmp_path)
    original = ledger_module._chain_rows
    attempts = []

    def rows_then_a_racing_reservation(conn):
        rows = original(conn)
        if not attempts:
            attempts.append("racing")
            racer = Ledger(path, timeout=0.2)  # opens (and checks) in its own snapshot
            try:
                racer.reserve("survey", COST, 1, mechanism="DPPenalty", chain=None, chains=1)
                attempts.append("committed")
            except pymc_dp.LedgerError:
                attempts.append("waited")
        return rows

    monkeypatch.setattr(ledger_module, "_chain_rows", rows_then_a_racing_reservation)
    Ledger(path).verify()  # no false alarm
    monkeypatch.undo()
    assert attempts == ["racing", "waited"]
    assert Ledger(path).head().startswith("4:")  # and nothing half-written
