"""Run state in SQLite ($SDCLOUD_HOME/state.db, mode 0600).

Every transition is written before its side effect (an attempt row before the launch call, an
"terminating" mark before the terminate call), so that a restarted controller can reconcile what
the clouds hold against what it meant to do.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from ... import config
from ...errors import UserError
from .db_lock import LOCK_WAIT_S
from ...events import identity as event_identity
from ...events import parse as parse_kind
from ...offers.kinds import RunKind

# The tables, created at every open: a data file beside this module (package data).
SCHEMA = (Path(__file__).parent / "schema.sql").read_text(encoding="utf-8")

# The states of a run (runs/records/run_state.py), imported from here by most callers.
from .run_state import ACTIVE_RUN_STATES, FINAL_RUN_STATES, RESUMABLE_RUN_STATES, RunState  # noqa: E402,F401

# The runs table is one honest union of two kinds: training runs and batch jobs (spec "kind": "batch").
# Every command that lists or acts on rows asks run_kind (offers.kinds.RunKind), never RunSpec(**spec)
# on a row of unknown kind.


# The run row's fields a snapshot carries (controller_pid is this machine's own business).
SNAPSHOT_RUN_FIELDS = ("id", "name", "tier", "state", "spec", "step", "total_steps", "reason", "created", "updated")


def _insert(db: sqlite3.Connection, table: str, row: dict[str, Any]) -> None:
    """One row by its column names (the table's column order is not the snapshot's business)."""
    cols = list(row)
    db.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", [row[c] for c in cols])


def run_kind(run: dict) -> RunKind:
    """A row's kind: its spec says (a row with no spec dict is a training run)."""
    spec = run.get("spec")
    return RunKind.of(spec if isinstance(spec, dict) else None)


@dataclass
class Attempt:
    run_id: str
    n: int
    provider: str
    region: str | None
    zone: str | None
    instance_type: str | None
    market: str | None
    price: float | None
    currency: str | None
    instance_id: str | None
    token: str
    state: str
    start: float | None
    end: float | None
    end_reason: str | None

    @property
    def hours(self) -> float:
        if self.start is None:
            return 0.0
        return max(0.0, ((self.end or time.time()) - self.start) / 3600.0)

    @property
    def cost(self) -> float:
        return (self.price or 0.0) * self.hours


class StateStore:
    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path else config.home() / "state.db"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():
                # Create it 0600 before SQLite opens it: run specs name buckets and hosts.
                fd = os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600)
                os.close(fd)
            os.chmod(self.path, 0o600)
            self._db = sqlite3.connect(self.path, timeout=LOCK_WAIT_S, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:  # SDCLOUD_HOME a file, state.db a folder...
            raise self._unusable(exc) from None
        self._db.row_factory = sqlite3.Row
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(SCHEMA)
        except sqlite3.DatabaseError as exc:  # a damaged or foreign file: said in one line, not a traceback
            self._db.close()
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise
            raise self._unusable(exc) from None
        for suffix in ("-wal", "-shm"):
            side = Path(str(self.path) + suffix)
            if side.exists():
                os.chmod(side, 0o600)

    def _unusable(self, exc: Exception) -> Exception:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return UserError(f"{self.path} is not a state store sdcloud can read ({why}): move it aside (or set "
                         "SDCLOUD_HOME to a folder) and sdcloud starts a new one; each run's record stays in its "
                         "bucket (sdcloud status RUN --store URL)")

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
            self._db.execute("COMMIT")
        except BaseException:
            # A Ctrl-C can land after COMMIT ended the transaction (or before BEGIN opened it): then
            # there is nothing to roll back, and the interrupt itself is what goes on.
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    # runs
    def create_run(self, run_id: str, tier: str, spec: dict, total_steps: int, name: str | None = None) -> None:
        now = time.time()
        with self.tx() as db:  # BEGIN IMMEDIATE: the name's check and claim are one step for every process
            # A batch job's name may repeat (a schedule's fires share theirs); a training run's may not.
            taken = name is not None and RunKind.of(spec) is not RunKind.BATCH and db.execute(
                f"SELECT id, state FROM runs WHERE name = ? AND state IN ({', '.join('?' * len(ACTIVE_RUN_STATES))}) "
                "ORDER BY created DESC LIMIT 1", (name, *ACTIVE_RUN_STATES)).fetchone()
            if taken:  # an unfinished run of that name: one at a time (two `up --name` at once make one)
                raise UserError(f"{name!r} is already the name of {taken['id']} ({taken['state']}): sdcloud status {taken['id']}")
            db.execute("INSERT INTO runs (id, name, tier, state, spec, total_steps, created, updated) VALUES (?,?,?,?,?,?,?,?)",
                       (run_id, name, tier, str(RunState.PENDING), json.dumps(spec), total_steps, now, now))

    def get_run(self, run_id: str) -> dict | None:
        row = self._db.execute("SELECT * FROM runs WHERE id = ? OR name = ? ORDER BY created DESC LIMIT 1",
                               (run_id, run_id)).fetchone()
        return self._run(row) if row else None

    def _run(self, row: sqlite3.Row) -> dict:
        run = dict(row)
        run["spec"] = json.loads(run["spec"])
        return run

    def list_runs(self, states: tuple[str, ...] | None = None) -> list[dict]:
        rows = self._db.execute("SELECT * FROM runs ORDER BY created").fetchall()
        runs = [self._run(r) for r in rows]
        return [r for r in runs if states is None or r["state"] in states]

    def update_run(self, run_id: str, **fields: Any) -> None:
        if not fields:
            return
        fields["updated"] = time.time()
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self.tx() as db:
            db.execute(f"UPDATE runs SET {cols} WHERE id = ?", (*fields.values(), run_id))

    def run_is_active(self, run_id: str) -> bool:
        row = self._db.execute("SELECT state FROM runs WHERE id = ?", (run_id,)).fetchone()
        return bool(row) and row["state"] in ACTIVE_RUN_STATES

    # attempts
    def add_attempt(self, run_id: str, n: int, provider: str, token: str, **fields: Any) -> None:
        cols = ["run_id", "n", "provider", "token", "state", *fields]
        vals = [run_id, n, provider, token, "launching", *fields.values()]
        with self.tx() as db:
            db.execute(f"INSERT INTO attempts ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", vals)

    def update_attempt(self, run_id: str, n: int, **fields: Any) -> None:
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self.tx() as db:
            db.execute(f"UPDATE attempts SET {cols} WHERE run_id = ? AND n = ?", (*fields.values(), run_id, n))

    def attempts(self, run_id: str) -> list[Attempt]:
        rows = self._db.execute("SELECT * FROM attempts WHERE run_id = ? ORDER BY n", (run_id,)).fetchall()
        return [Attempt(**dict(r)) for r in rows]

    def open_attempts(self) -> list[Attempt]:
        rows = self._db.execute("SELECT * FROM attempts WHERE state != 'ended' ORDER BY run_id, n").fetchall()
        return [Attempt(**dict(r)) for r in rows]

    # events
    def event(self, run_id: str | None, kind: str, data: dict | None = None) -> None:
        with self.tx() as db:
            db.execute("INSERT INTO events (run_id, time, kind, data) VALUES (?,?,?,?)",
                       (run_id, time.time(), kind, json.dumps(data or {}, default=str)))

    def events(self, run_id: str, after_id: int = 0) -> list[dict]:
        rows = self._db.execute("SELECT * FROM events WHERE run_id = ? AND id > ? ORDER BY id", (run_id, after_id)).fetchall()
        # Parsed here, once: every reader compares kinds with `is Kind.X` (an unknown kind, written
        # by a newer sdcloud, stays its string).
        return [{**dict(r), "kind": parse_kind(r["kind"]), "data": json.loads(r["data"])} for r in rows]

    # zone cooldowns: shared by every run, so that a restarted controller (or the next run) skips a
    # zone that was just reclaimed
    def set_zone_cooldown(self, key: str, until: float, reason: str, owner_id: str | None = None) -> None:
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO zone_cooldowns VALUES (?,?,?,?,?)",
                       (key, until, reason, owner_id, time.time()))

    def zone_cooldowns(self, now: float | None = None) -> dict[str, float]:
        """Zones cooling down now: key -> until."""
        rows = self._db.execute("SELECT key, until FROM zone_cooldowns WHERE until > ?",
                                (now if now is not None else time.time(),)).fetchall()
        return {r["key"]: r["until"] for r in rows}

    # price samples
    def add_price_sample(self, provider: str, region: str, zone: str, instance_type: str, market: str,
                         price: float, currency: str, at: float | None = None) -> None:
        with self.tx() as db:
            db.execute("INSERT INTO price_samples VALUES (?,?,?,?,?,?,?,?)",
                       (provider, region, zone, instance_type, market, at or time.time(), price, currency))

    def price_samples(self, provider: str, zone: str, instance_type: str, market: str,
                      start: float | None = None, end: float | None = None) -> list[tuple[float, float, str]]:
        """(time, price, currency) of one type in one zone, oldest first."""
        rows = self._db.execute(
            "SELECT time, price, currency FROM price_samples WHERE provider = ? AND zone = ? AND instance_type = ? AND market = ?"
            " AND time >= ? AND time <= ? ORDER BY time",
            (provider, zone, instance_type, market, start if start is not None else 0.0,
             end if end is not None else float("inf"))).fetchall()
        return [(r["time"], r["price"], r["currency"]) for r in rows]

    # cost ledger
    def set_attempt_costs(self, run_id: str, n: int, **fields: Any) -> None:
        with self.tx() as db:
            db.execute("INSERT OR IGNORE INTO attempt_costs (run_id, n) VALUES (?, ?)", (run_id, n))
            if fields:
                cols = ", ".join(f"{k} = ?" for k in fields)
                db.execute(f"UPDATE attempt_costs SET {cols} WHERE run_id = ? AND n = ?", (*fields.values(), run_id, n))

    def attempt_costs(self, run_id: str) -> dict[int, dict]:
        rows = self._db.execute("SELECT * FROM attempt_costs WHERE run_id = ?", (run_id,)).fetchall()
        return {r["n"]: dict(r) for r in rows}

    def put_ledger(self, run_id: str, n: int, items: list[dict]) -> None:
        """Replace the priced items of one attempt (pricing an attempt again gives the same rows)."""
        with self.tx() as db:
            db.execute("DELETE FROM ledger WHERE run_id = ? AND n = ?", (run_id, n))
            for it in items:
                db.execute("INSERT INTO ledger VALUES (?,?,?,?,?,?,?,?)",
                           (run_id, n, it["item"], it["amount"], it["currency"], it["usd"], it["source"],
                            json.dumps(it.get("detail") or {}, default=str)))

    def ledger(self, run_id: str) -> list[dict]:
        rows = self._db.execute("SELECT * FROM ledger WHERE run_id = ? ORDER BY n, item", (run_id,)).fetchall()
        return [{**dict(r), "detail": json.loads(r["detail"])} for r in rows]

    def set_billed(self, run_id: str, provider: str, amount: float, currency: str, usd: float, source: str) -> None:
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO billed VALUES (?,?,?,?,?,?,?)",
                       (run_id, provider, amount, currency, usd, source, time.time()))

    def billed(self, run_id: str) -> list[dict]:
        return [dict(r) for r in self._db.execute("SELECT * FROM billed WHERE run_id = ? ORDER BY provider", (run_id,))]

    # a run's rows as plain JSON: runs/records/journal.py copies them to the run's bucket and back
    def export_run(self, run_id: str) -> dict[str, Any]:
        """The run's row, its attempts and everything priced about it (no events: the journal writes
        those as they come). KeyError when there is no such run."""
        run = self.get_run(run_id)
        if run is None:
            raise KeyError(run_id)
        return {
            "run": {k: run[k] for k in SNAPSHOT_RUN_FIELDS},
            "attempts": [a.__dict__ for a in self.attempts(run["id"])],
            "attempt_costs": list(self.attempt_costs(run["id"]).values()),
            "ledger": self.ledger(run["id"]),
        }

    def import_run(self, snap: dict[str, Any], events: Iterable[dict] = ()) -> None:
        """Replace the run's rows with `snap` (export_run's form) and add the `events` (time, kind, data)
        not already here: each once, by its identity (events.identity: time, kind and fields)."""
        run = snap["run"]
        rid = run["id"]
        with self.tx() as db:
            db.execute("DELETE FROM runs WHERE id = ?", (rid,))
            # Restored now: `updated` is this machine's (the journal leaves it out, it changes on every write).
            _insert(db, "runs", {**{k: run[k] for k in SNAPSHOT_RUN_FIELDS if k != "updated"},
                                 "spec": json.dumps(run["spec"]), "updated": time.time()})
            db.execute("DELETE FROM attempts WHERE run_id = ?", (rid,))
            for a in snap["attempts"]:
                _insert(db, "attempts", a)
            db.execute("DELETE FROM attempt_costs WHERE run_id = ?", (rid,))
            for c in snap["attempt_costs"]:
                _insert(db, "attempt_costs", c)
            db.execute("DELETE FROM ledger WHERE run_id = ?", (rid,))
            for it in snap["ledger"]:
                _insert(db, "ledger", {"run_id": rid, **{k: it[k] for k in ("n", "item", "amount", "currency", "usd",
                                                                             "source")},
                                       "detail": json.dumps(it.get("detail") or {}, default=str)})
            have = {event_identity(r[0], r[1], json.loads(r[2])) for r in
                    db.execute("SELECT time, kind, data FROM events WHERE run_id = ?", (rid,)).fetchall()}
            for e in events:
                key = event_identity(e["time"], e["kind"], e["data"])
                if key in have:
                    continue
                have.add(key)
                _insert(db, "events", {"run_id": rid, "time": e["time"], "kind": str(e["kind"]),
                                       "data": json.dumps(e["data"], default=str)})

    # infra outputs cache
    def save_infra(self, provider: str, region: str, outputs: dict) -> None:
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO infra VALUES (?,?,?,?)", (provider, region, json.dumps(outputs), time.time()))

    def delete_infra(self, provider: str, region: str) -> None:
        with self.tx() as db:
            db.execute("DELETE FROM infra WHERE provider = ? AND region = ?", (provider, region))

    def infra(self, provider: str, region: str) -> dict | None:
        row = self._db.execute("SELECT outputs FROM infra WHERE provider = ? AND region = ?", (provider, region)).fetchone()
        return json.loads(row["outputs"]) if row else None
