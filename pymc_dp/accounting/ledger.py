"""The privacy ledger: an SQLite file that makes reservations atomic across processes.

Enforcement, not advice: before a chain reads private data it *reserves* its iterations. A
reservation runs in one ``BEGIN IMMEDIATE`` transaction — SQLite's write lock is taken before
anything is read, so concurrent reservers (chains in worker processes, separate analyses
over days) serialise — which

1. reads every earlier reservation on the dataset,
2. composes them with the new one (:func:`~pymc_dp.accounting.costs.composition_fits`), and
3. either inserts the new row and commits, or rolls back and raises
   :class:`~pymc_dp.errors.BudgetExceededError` saying how many iterations still fit.

A reservation counts in full from the moment it is committed (reserve first, then spend): a
crash after reserving leaves it counted. Progress recorded with
:meth:`Reservation.spend` is for reporting only.

Tamper evidence
---------------
Every dataset registration and every reservation is a link of one hash chain: its row stores
``seq`` (its place in the ledger's history) and ``hash = SHA-256(previous hash ‖ the row's
canonical record)``; ``meta`` stores the chain's length and head. The chain is checked when the
ledger is opened and inside every write transaction, so a deleted, edited or truncated history
(``DELETE FROM reservations``, ``UPDATE datasets SET epsilon = 1000``, dropping the last rows)
raises :class:`~pymc_dp.errors.LedgerTamperedError` before anything more is reserved or read.
``meta``'s head is a hash of the last link and the length, not a copy of a row's hash, so
truncating the history also needs a hash computed. Progress counts (``spent``) are reporting
only and not part of the chain. Checks read in one transaction (one snapshot), so a
reservation committed by another process meanwhile is never mistaken for tampering.

This is tamper *evidence* against edits that do not rebuild the chain. Someone who rewrites the
rows and recomputes every hash, or deletes the file (a fresh ledger looks like any new one),
is not detected from the file alone. The remedy is a copy kept elsewhere:
:meth:`Ledger.export` appends the chain to a JSON-lines file (append-only; keep it on another
machine or in version control), :meth:`Ledger.verify` checks that the ledger still extends
that copy, and every release's privacy metadata carry the head it was made under
(``dp_ledger_head``), which :meth:`Ledger.verify` also accepts.

Tables
------
``meta(key, value)``
    schema version; ``chain_length`` and ``chain_head``.
``datasets(name, epsilon, delta, created, seq, hash)``
    the (ε, δ) budget of each dataset, stored on first use; a budget with a different (ε, δ)
    for the same dataset is refused.
``reservations(id, dataset, created, mechanism, chain, chains, iterations, cost, mu,
epsilon_total, method, spent, pid, host, seq, hash)``
    one row per reservation; ``cost`` is the JSON of the per-iteration cost, ``mu`` the total
    PLD parameter of the reservation when it is Gaussian, ``epsilon_total`` the ε (at the
    dataset's δ) of all reservations up to and including this one, ``method`` how it was
    composed (``gaussian``, ``pld`` or ``rdp``; see :mod:`.costs`).

A ledger of schema version 1 (before the chain) is upgraded in place when opened: its rows as
found become the start of the chain.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import math
import os
import socket
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

from pymc_dp.accounting._checks import check_int
from pymc_dp.accounting.costs import (
    PrivacyCost,
    compose_epsilon,
    composition_fits,
    cost_from_record,
    max_iterations,
)
from pymc_dp.errors import (
    BudgetExceededError,
    InvalidParameterError,
    LedgerError,
    LedgerTamperedError,
)

__all__ = ["Ledger", "LedgerEntry", "Reservation"]

SCHEMA_VERSION = "2"
#: the hash before the first link of a chain
GENESIS = "0" * 64

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS datasets (
    name TEXT PRIMARY KEY,
    epsilon REAL NOT NULL,
    delta REAL NOT NULL,
    created TEXT NOT NULL,
    seq INTEGER,
    hash TEXT
);
CREATE TABLE IF NOT EXISTS reservations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    dataset TEXT NOT NULL REFERENCES datasets(name),
    created TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    chain INTEGER,
    chains INTEGER NOT NULL,
    iterations INTEGER NOT NULL,
    cost TEXT NOT NULL,
    mu REAL,
    epsilon_total REAL NOT NULL,
    method TEXT NOT NULL,
    spent INTEGER NOT NULL DEFAULT 0,
    pid INTEGER,
    host TEXT,
    seq INTEGER,
    hash TEXT
);
CREATE INDEX IF NOT EXISTS reservations_dataset ON reservations(dataset, id);
"""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")


# -- the hash chain ------------------------------------------------------------------------------
_DATASET_FIELDS = "name, epsilon, delta, created"
_RESERVATION_FIELDS = (
    "id, dataset, created, mechanism, chain, chains, iterations, cost, mu, epsilon_total, "
    "method, pid, host"
)


def _record(kind: str, values: tuple[Any, ...], seq: int) -> str:
    """A row's canonical record: floats by ``repr`` (exact), everything else as stored."""
    plain = [repr(v) if isinstance(v, float) else v for v in values]
    return json.dumps([kind, seq, *plain], separators=(",", ":"))


def _link(previous: str, record: str) -> str:
    return hashlib.sha256(f"{previous}\n{record}".encode()).hexdigest()


def _head_digest(length: int, last: str) -> str:
    """What ``meta`` stores as the head: not any row's hash, so rewinding the head to an
    earlier row (truncating the history) needs a hash computed, not one copied."""
    return hashlib.sha256(f"head\n{length}\n{last}".encode()).hexdigest()


def _chain_rows(conn: sqlite3.Connection) -> list[tuple[int | None, str | None, str, str]]:
    """Every link as ``(seq, stored hash, record, what)``, in the order of ``seq``."""
    rows = []
    for values in conn.execute(f"SELECT {_DATASET_FIELDS}, seq, hash FROM datasets"):
        *fields, seq, digest = values
        rows.append((seq, digest, _record("dataset", tuple(fields), seq), f"dataset {fields[0]!r}"))
    for values in conn.execute(f"SELECT {_RESERVATION_FIELDS}, seq, hash FROM reservations"):
        *fields, seq, digest = values
        what = f"reservation {fields[0]} ({fields[3]} on dataset {fields[1]!r})"
        rows.append((seq, digest, _record("reservation", tuple(fields), seq), what))
    rows.sort(key=lambda r: (r[0] is None, r[0] or 0))
    return rows


def _meta(conn: sqlite3.Connection, key: str) -> str | None:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def _set_meta(conn: sqlite3.Connection, key: str, value: str) -> None:
    conn.execute(
        "INSERT INTO meta(key, value) VALUES (?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


def _chain_prefix(conn: sqlite3.Connection, path: str) -> list[str]:
    """Check the whole chain; return the hash after each link (``[i]`` after link ``i + 1``).

    Raises
    ------
    LedgerTamperedError
        A link is missing, edited or out of order, or the chain is shorter or longer than
        the head recorded in ``meta``.
    """
    remedy = (
        " The ledger can no longer enforce its budgets: restore it from a backup (or rebuild "
        "it from your export, Ledger.export) before reading the data again."
    )
    rows = _chain_rows(conn)
    length, head = _meta(conn, "chain_length"), _meta(conn, "chain_head")
    if (length is None or head is None) and rows:
        raise LedgerTamperedError(
            f"privacy ledger {path!r}: its chain head was removed from the meta table while "
            f"{len(rows)} entries remain." + remedy
        )
    recorded = 0 if length is None else int(length)
    hashes: list[str] = []
    previous = GENESIS
    for expected_seq, (seq, digest, record, what) in enumerate(rows, start=1):
        if seq != expected_seq:
            missing = "an entry is missing" if seq is None or seq > expected_seq else "repeated"
            raise LedgerTamperedError(
                f"privacy ledger {path!r}: entry {expected_seq} of its history is {missing} "
                f"(found {what} at position {seq}): entries were deleted or inserted." + remedy
            )
        previous = _link(previous, record)
        if digest != previous:
            raise LedgerTamperedError(
                f"privacy ledger {path!r}: {what} was edited after it was recorded (its hash "
                "does not match its contents and the entries before it)." + remedy
            )
        hashes.append(previous)
    if len(rows) != recorded:
        raise LedgerTamperedError(
            f"privacy ledger {path!r} records a history of {recorded} entries but holds "
            f"{len(rows)}: entries were deleted (or the history truncated)." + remedy
        )
    if rows and _head_digest(len(rows), hashes[-1]) != head:
        raise LedgerTamperedError(
            f"privacy ledger {path!r}: its recorded chain head does not match its last entry."
            + remedy
        )
    return hashes


def _append_link(conn: sqlite3.Connection, table: str, key: str, key_value: Any) -> None:
    """Make the row ``table.key = key_value`` (just inserted) the chain's next link."""
    seq = int(_meta(conn, "chain_length") or 0) + 1
    last = conn.execute(
        "SELECT hash FROM (SELECT seq, hash FROM datasets UNION ALL "
        "SELECT seq, hash FROM reservations) WHERE seq = ?",
        (seq - 1,),
    ).fetchone()
    head = GENESIS if seq == 1 else str(last[0])
    fields = _DATASET_FIELDS if table == "datasets" else _RESERVATION_FIELDS
    values = conn.execute(f"SELECT {fields} FROM {table} WHERE {key} = ?", (key_value,)).fetchone()
    kind = "dataset" if table == "datasets" else "reservation"
    digest = _link(head, _record(kind, tuple(values), seq))
    conn.execute(f"UPDATE {table} SET seq = ?, hash = ? WHERE {key} = ?", (seq, digest, key_value))
    _set_meta(conn, "chain_length", str(seq))
    _set_meta(conn, "chain_head", _head_digest(seq, digest))


def _upgrade_from_version_1(conn: sqlite3.Connection) -> None:
    """Add the chain to a version-1 ledger: its rows as found become the chain's start."""
    for table in ("datasets", "reservations"):
        conn.execute(f"ALTER TABLE {table} ADD COLUMN seq INTEGER")
        conn.execute(f"ALTER TABLE {table} ADD COLUMN hash TEXT")
    for (name,) in conn.execute("SELECT name FROM datasets ORDER BY rowid").fetchall():
        _append_link(conn, "datasets", "name", name)
    for (id_,) in conn.execute("SELECT id FROM reservations ORDER BY id").fetchall():
        _append_link(conn, "reservations", "id", id_)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (SCHEMA_VERSION,))


@dataclasses.dataclass(frozen=True)
class LedgerEntry:
    """One reservation as recorded in the ledger (read-only view)."""

    id: int
    dataset: str
    created: str
    mechanism: str
    chain: int | None
    chains: int
    iterations: int
    cost: PrivacyCost
    mu: float | None
    epsilon_total: float
    method: str
    spent: int
    pid: int | None
    host: str | None


class Ledger:
    """An SQLite privacy ledger file (see the module docstring).

    Parameters
    ----------
    path : str or os.PathLike
        Ledger file; created (with its tables) if missing. Its directory must exist.
    timeout : float
        Seconds to wait for a busy ledger (another process holding the write lock) before
        raising :class:`~pymc_dp.errors.LedgerError`.
    create : bool
        If false, a missing file is an error instead of being created.

    Notes
    -----
    The object holds only the path: connections are opened per operation, so it is safe to
    pickle and to use after ``fork``.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 60.0, create: bool = True):
        self._path = os.fspath(path)
        if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
            raise InvalidParameterError(
                f"timeout must be a positive number of seconds; got {timeout!r}."
            )
        self._timeout = float(timeout)
        if not create and not os.path.exists(self._path):
            raise LedgerError(f"no privacy ledger at {self._path!r}: the file does not exist.")
        parent = os.path.dirname(os.path.abspath(self._path))
        if not os.path.isdir(parent):
            raise LedgerError(
                f"cannot create the privacy ledger {self._path!r}: directory {parent!r} does not "
                "exist."
            )
        self._initialise()

    @property
    def path(self) -> str:
        """Path of the ledger file."""
        return self._path

    @property
    def timeout(self) -> float:
        """Seconds to wait for the write lock."""
        return self._timeout

    def __repr__(self) -> str:
        return f"Ledger({self._path!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_open_ledger, (self._path, self._timeout))

    # -- low level -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            conn = sqlite3.connect(self._path, timeout=self._timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open the privacy ledger {self._path!r}: {exc}") from exc
        try:
            yield conn
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise LedgerError(
                    f"the privacy ledger {self._path!r} stayed locked by another process for "
                    f"more than {self._timeout:g} s; try again or raise `timeout`."
                ) from exc
            raise LedgerError(f"privacy ledger {self._path!r}: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            raise LedgerError(
                f"{self._path!r} is not a readable pymc_dp privacy ledger ({exc})."
            ) from exc
        finally:
            conn.close()

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every query sees one snapshot (no write commits in between)."""
        with self._connect() as conn:
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on error."""
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _schema_version(self, conn: sqlite3.Connection) -> str | None:
        has_meta = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()
        if not has_meta:
            return None
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        return None if row is None else str(row[0])

    def _initialise(self) -> None:
        with self._connect() as conn:
            version = self._schema_version(conn)
        if version is None:
            with self._write() as conn:
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        conn.execute(stmt)
                if self._schema_version(conn) is None:
                    conn.execute(
                        "INSERT INTO meta(key, value) VALUES ('schema', ?)", (SCHEMA_VERSION,)
                    )
                version = self._schema_version(conn)
        if version == "1":
            with self._write() as conn:
                if self._schema_version(conn) == "1":  # another process may have upgraded it
                    _upgrade_from_version_1(conn)
                version = self._schema_version(conn)
        if version != SCHEMA_VERSION:
            raise LedgerError(
                f"privacy ledger {self._path!r} has schema version {version}; this pymc_dp "
                f"reads version {SCHEMA_VERSION}."
            )
        self.verify()

    # -- tamper evidence -------------------------------------------------------------------
    def head(self) -> str:
        """The chain's head as ``"<length>:<sha256>"`` (``"0:<64 zeros>"`` when empty).

        Every release's privacy metadata carry it (``dp_ledger_head``); keep it to check later
        that this ledger still extends the history it was made under (:meth:`verify`).
        """
        with self._read() as conn:
            hashes = _chain_prefix(conn, self._path)
        return f"{len(hashes)}:{hashes[-1] if hashes else GENESIS}"

    def verify(
        self, *, export: str | os.PathLike[str] | None = None, head: str | None = None
    ) -> str:
        """Check the hash chain, and that it extends an export or an earlier head.

        Parameters
        ----------
        export : path, optional
            A file written by :meth:`export`: every link in it must be in the ledger, unchanged.
        head : str, optional
            A head from :meth:`head` or a release's ``dp_ledger_head``: the ledger's chain must
            pass through it.

        Returns
        -------
        str
            The current head.

        Raises
        ------
        LedgerTamperedError
            The chain is broken, or it no longer extends the export or the head.
        """
        with self._read() as conn:
            hashes = _chain_prefix(conn, self._path)
        if head is not None:
            self._check_extends(hashes, head, "the head given")
        if export is not None:
            self._check_extends(
                hashes, _export_head(_read_export(export)), f"the export {export!r}"
            )
        return f"{len(hashes)}:{hashes[-1] if hashes else GENESIS}"

    def _check_extends(self, hashes: list[str], point: str, source: str) -> None:
        """Raise unless the chain (``hashes`` after each link) passes through ``point``."""
        length, _, digest = str(point).partition(":")
        if not (length.isdigit() and len(digest) == 64):
            raise InvalidParameterError(
                f"{point!r} is not a ledger head: expected '<length>:<64 hex digits>' as "
                "returned by Ledger.head() or stored in dp_ledger_head."
            )
        k = int(length)
        if k > len(hashes) or (k and hashes[k - 1] != digest):
            raise LedgerTamperedError(
                f"privacy ledger {self._path!r} does not extend {source}: that history had "
                f"{k} entries ending in {digest[:12]}…, this ledger has {len(hashes)} and "
                "a different chain. It was rewritten, truncated or replaced (a deleted and "
                "recreated ledger looks new). Restore it before reading the data again."
            )

    def export(self, path: str | os.PathLike[str]) -> int:
        """Append the chain's new links to a JSON-lines file (created if missing).

        Keep the file somewhere the ledger's users cannot rewrite (another machine, version
        control): it is the evidence that a deleted or rebuilt ledger cannot fake. The file
        is checked against the ledger first (as :meth:`verify` does), then only the links
        after its last one are appended. Returns the number of links appended.
        """
        links = _read_export(path) if os.path.exists(path) else []
        with self._read() as conn:
            hashes = _chain_prefix(conn, self._path)
            rows = _chain_rows(conn)
        self._check_extends(hashes, _export_head(links), f"the export {os.fspath(path)!r}")
        new = [
            {"seq": seq, "hash": digest, "record": json.loads(record)}
            for seq, digest, record, _ in rows[len(links) :]
        ]
        with open(path, "a", encoding="utf-8") as out:
            for link in new:
                out.write(json.dumps(link, separators=(",", ":")) + "\n")
        return len(new)

    # -- datasets --------------------------------------------------------------------------
    def register_dataset(self, name: str, epsilon: float, delta: float) -> None:
        """Record the (ε, δ) budget of ``name``; refuse a different budget for a known name."""
        with self._write() as conn:
            _chain_prefix(conn, self._path)
            row = conn.execute(
                "SELECT epsilon, delta FROM datasets WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO datasets(name, epsilon, delta, created) VALUES (?, ?, ?, ?)",
                    (name, float(epsilon), float(delta), _now()),
                )
                _append_link(conn, "datasets", "name", name)
                return
        rec_eps, rec_delta = row
        if not (
            math.isclose(rec_eps, epsilon, rel_tol=1e-12)
            and math.isclose(rec_delta, delta, rel_tol=1e-12)
        ):
            raise InvalidParameterError(
                f"dataset {name!r} is recorded in the privacy ledger {self._path!r} with budget "
                f"epsilon={rec_eps!r}, delta={rec_delta!r}; this budget asks for "
                f"epsilon={epsilon!r}, delta={delta!r}. A dataset has one budget for its "
                f"lifetime: use PrivacyBudget.from_ledger({self._path!r}, {name!r}) to draw "
                "from the recorded one, or a different dataset name for different data."
            )

    def dataset_budget(self, name: str) -> tuple[float, float] | None:
        """The recorded ``(epsilon, delta)`` of ``name``, or ``None`` if it is unknown."""
        with self._connect() as conn:
            row = conn.execute(
                "SELECT epsilon, delta FROM datasets WHERE name = ?", (name,)
            ).fetchone()
        return None if row is None else (float(row[0]), float(row[1]))

    def datasets(self) -> list[str]:
        """Names of the datasets recorded in the ledger."""
        with self._connect() as conn:
            return [r[0] for r in conn.execute("SELECT name FROM datasets ORDER BY name")]

    # -- reservations ----------------------------------------------------------------------
    @staticmethod
    def _row_to_entry(row: tuple[Any, ...]) -> LedgerEntry:
        (id_, dataset, created, mechanism, chain, chains, iterations, cost, mu, eps_total,
         method, spent, pid, host) = row  # fmt: skip
        try:
            cost_obj = cost_from_record(json.loads(cost))
        except (ValueError, TypeError) as exc:
            raise LedgerError(f"reservation {id_} has an unreadable cost record {cost!r}.") from exc
        return LedgerEntry(
            id=int(id_),
            dataset=dataset,
            created=created,
            mechanism=mechanism,
            chain=None if chain is None else int(chain),
            chains=int(chains),
            iterations=int(iterations),
            cost=cost_obj,
            mu=None if mu is None else float(mu),
            epsilon_total=float(eps_total),
            method=method,
            spent=int(spent),
            pid=None if pid is None else int(pid),
            host=host,
        )

    _COLUMNS = (
        "id, dataset, created, mechanism, chain, chains, iterations, cost, mu, epsilon_total, "
        "method, spent, pid, host"
    )

    def _entries(self, conn: sqlite3.Connection, dataset: str) -> list[LedgerEntry]:
        rows = conn.execute(
            f"SELECT {self._COLUMNS} FROM reservations WHERE dataset = ? ORDER BY id", (dataset,)
        ).fetchall()
        return [self._row_to_entry(r) for r in rows]

    def entries(self, dataset: str) -> list[LedgerEntry]:
        """All reservations on ``dataset``, oldest first."""
        with self._connect() as conn:
            return self._entries(conn, dataset)

    def reserve(
        self,
        dataset: str,
        cost: PrivacyCost,
        iterations: int,
        *,
        mechanism: str,
        chain: int | None,
        chains: int,
    ) -> LedgerEntry:
        """Atomically check the budget of ``dataset`` and record a reservation.

        Raises
        ------
        BudgetExceededError
            If the reservation would exceed the dataset's budget; nothing is recorded.
        """
        return self.reserve_parts(
            dataset, [(cost, iterations)], mechanism=mechanism, chain=chain, chains=chains
        )[0]

    def reserve_parts(
        self,
        dataset: str,
        parts: list[tuple[PrivacyCost, int]],
        *,
        mechanism: str,
        chain: int | None,
        chains: int,
    ) -> list[LedgerEntry]:
        """Atomically check and record several reservations: all of them, or none.

        One row per ``(cost, iterations)`` part, in order (a chain whose cost changes along
        the way, e.g. a decreasing step-size schedule, reserves one part per stage). Every row
        of the group stores the ε of all reservations up to and including the whole group.

        Raises
        ------
        BudgetExceededError
            If the parts would exceed the dataset's budget; nothing is recorded.
        """
        if not parts:
            raise InvalidParameterError("reserve_parts needs at least one (cost, iterations).")
        parts = [(cost, check_int(k, "iterations", minimum=1)) for cost, k in parts]
        refused: list[tuple[PrivacyCost, int]] | None = None
        entries: list[LedgerEntry] = []
        with self._write() as conn:
            _chain_prefix(conn, self._path)
            row = conn.execute(
                "SELECT epsilon, delta FROM datasets WHERE name = ?", (dataset,)
            ).fetchone()
            if row is None:
                raise LedgerError(
                    f"dataset {dataset!r} is not registered in the privacy ledger {self._path!r}."
                )
            epsilon, delta = float(row[0]), float(row[1])
            existing = [(e.cost, e.iterations) for e in self._entries(conn, dataset)]
            spending = [*existing, *parts]
            if not composition_fits(spending, epsilon, delta):
                refused = existing  # nothing is written; the lock is released before reporting
            else:
                eps_total, method = compose_epsilon(spending, delta)
                for cost, k in parts:
                    mu = cost.gaussian_mu()
                    cur = conn.execute(
                        "INSERT INTO reservations(dataset, created, mechanism, chain, chains, "
                        "iterations, cost, mu, epsilon_total, method, spent, pid, host) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?)",
                        (
                            dataset,
                            _now(),
                            mechanism,
                            chain,
                            chains,
                            k,
                            json.dumps(cost.to_record(), sort_keys=True),
                            None if mu is None else k * mu,
                            eps_total,
                            method,
                            os.getpid(),
                            socket.gethostname(),
                        ),
                    )
                    _append_link(conn, "reservations", "id", cur.lastrowid)
                    entries.append(
                        self._row_to_entry(
                            conn.execute(
                                f"SELECT {self._COLUMNS} FROM reservations WHERE id = ?",
                                (cur.lastrowid,),
                            ).fetchone()
                        )
                    )
        if refused is not None:
            spent = compose_epsilon(refused, delta)[0] if refused else 0.0
            if len(parts) == 1:
                cost, k = parts[0]
                still = max_iterations(refused, cost, epsilon, delta)
                left = (
                    f"only {still} iterations of this cost still fit"
                    if still
                    else "nothing more fits: not one iteration of this cost"
                )
                what = f"{k} iterations of {cost.describe()}"
            else:
                total = sum(k for _, k in parts)
                what = f"{total} iterations in {len(parts)} stages of decreasing cost"
                left = "the stages together do not fit"
            raise BudgetExceededError(
                f"reserving {what} for {mechanism} on dataset "
                f"{dataset!r} would exceed its budget (epsilon={epsilon:g}, delta={delta:g}), "
                f"of which epsilon={spent:.4g} is already reserved; {left}. Nothing was read "
                "and nothing was recorded: run fewer iterations (or chains), add more noise, "
                "or start from a larger budget."
            )
        return entries

    def record_progress(self, reservation_id: int, spent: int) -> None:
        """Store how many iterations of a reservation have run (reporting only)."""
        with self._write() as conn:
            conn.execute(
                "UPDATE reservations SET spent = MAX(spent, ?) WHERE id = ?",
                (int(spent), int(reservation_id)),
            )


def _export_head(links: list[dict[str, Any]]) -> str:
    """The head an export ends at, as :meth:`Ledger.head` writes it (``0:…`` when empty)."""
    return f"{links[-1]['seq']}:{links[-1]['hash']}" if links else f"0:{GENESIS}"


def _read_export(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The links of an export file, checked to be a chain of their own."""
    links = []
    previous = GENESIS
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            try:
                link = json.loads(line)
                record = json.dumps(link["record"], separators=(",", ":"))
                ok = link["seq"] == number and _link(previous, record) == link["hash"]
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                raise LedgerTamperedError(
                    f"ledger export {os.fspath(path)!r}: line {number} is not the next link of "
                    "its chain (the export itself was edited)."
                )
            previous = link["hash"]
            links.append(link)
    return links


def _open_ledger(path: str, timeout: float) -> Ledger:
    return Ledger(path, timeout=timeout)


def _entry_field(name: str, doc: str) -> property:
    """A read-only property reading ``name`` from the reservation's :class:`LedgerEntry`."""

    def get(self: Reservation) -> Any:
        return getattr(self.entry, name)

    return property(get, doc=doc)


@dataclasses.dataclass
class Reservation:
    """Iterations reserved on a ledger, returned by :meth:`PrivacyBudget.reserve`.

    The budget counts all ``iterations`` from the moment the reservation exists;
    :meth:`spend` only records progress for reporting. Pickles (it holds the ledger path and
    the recorded :class:`LedgerEntry`).

    Attributes
    ----------
    entry : LedgerEntry
        The reservation as recorded in the ledger; ``id``, ``dataset``, ``mechanism``,
        ``chain``, ``chains``, ``iterations``, ``cost``, ``epsilon_total``, ``method`` and
        ``created`` read from it.
    ledger_path : str
        Ledger file.
    spent : int
        Iterations recorded as run so far (in this process).
    timeout : float
        Seconds to wait for the ledger's write lock when recording progress.
    """

    entry: LedgerEntry
    ledger_path: str
    spent: int = 0
    timeout: float = 60.0
    _last_flush: float = dataclasses.field(default=0.0, repr=False, compare=False)
    _flushed: int = dataclasses.field(default=0, repr=False, compare=False)

    id = _entry_field("id", "Row id in the ledger.")
    dataset = _entry_field("dataset", "Dataset name in the ledger.")
    mechanism = _entry_field("mechanism", "Name of the step method that reserved.")
    chain = _entry_field("chain", "Chain id, when one chain reserved for itself.")
    chains = _entry_field("chains", "Number of chains the reservation covers.")
    iterations = _entry_field("iterations", "Iterations reserved.")
    cost = _entry_field("cost", "Per-iteration cost.")
    epsilon_total = _entry_field(
        "epsilon_total",
        "ε (at the dataset's δ) of all reservations on the dataset up to and including this one.",
    )
    method = _entry_field("method", "How the reservations were composed (gaussian, pld, rdp).")
    created = _entry_field("created", "Time of the reservation (UTC, ISO 8601).")

    @property
    def remaining(self) -> int:
        """Reserved iterations not yet recorded as spent."""
        return self.iterations - self.spent

    def spend(self, iterations: int = 1, *, flush: bool = False) -> None:
        """Record that ``iterations`` more iterations have run.

        The count is written to the ledger at most once a second (and always when the
        reservation is used up or ``flush=True``), so it is cheap to call every iteration.

        Raises
        ------
        BudgetExceededError
            If the total would exceed the reservation: reserve more before reading more data.
        """
        if type(iterations) is int and iterations >= 0:  # every iteration of a chain: 1
            k = iterations
        else:
            k = check_int(iterations, "iterations", minimum=0)
        if self.spent + k > self.iterations:
            raise BudgetExceededError(
                f"reservation {self.id} ({self.mechanism}) covers {self.iterations} iterations "
                f"and {self.spent} have run; {k} more would exceed it. Reserve more iterations "
                "before reading more data."
            )
        self.spent += k
        now = time.monotonic()
        if flush or self.spent == self.iterations or now - self._last_flush >= 1.0:
            self.flush()

    def flush(self) -> None:
        """Write the progress count to the ledger now."""
        if self.spent != self._flushed:
            Ledger(self.ledger_path, timeout=self.timeout, create=False).record_progress(
                self.id, self.spent
            )
            self._flushed = self.spent
        self._last_flush = time.monotonic()

    @classmethod
    def _from_entry(cls, entry: LedgerEntry, ledger: Ledger) -> Reservation:
        return cls(entry=entry, ledger_path=ledger.path, timeout=ledger.timeout)
