"""A run's history in its own bucket, so that `state.db` is a cache any machine can rebuild.

The controller writes, in the run's bucket:

```
runs/<id>/journal/run.json                   the run's row, attempts, cost inputs, ledger items, infra outputs
runs/<id>/journal/events/<ns>-<digest>.json  events not yet in the bucket, one object per write
drivers/active/<id>                          present while the run is active (the cloud driver's index)
```

`run.json` is rewritten when something in it changed, and at most once a minute otherwise, so a
run costs a few thousand small PUTs a day at most (S3 Standard: $0.005 per 1,000 PUTs), and as many
GETs (the record read before each rewrite, below; $0.0004 per 1,000).

An event's key is its identity (events.identity: its time, kind and fields, fixed when it
happened), not the writer's count: a writer sends only the events whose identity the bucket does
not hold yet, so a driver that rebuilt the run from the bucket (the cloud function, every
invocation) sends back none of what it read, and an event object's name is a digest of the
identities it holds, so writing the same events again writes the same object. `restore` inserts
each identity once, however many objects hold a copy (journals written before this rule held
copies). Before it, every new writer re-sent everything it had restored, and the journal doubled
with each invocation (docs/runs.md, "Who drives a run").

A driver that lost the run's lease writes nothing more (`lease`): what it saw after the loss is
the new holder's to record. Secrets are never in a row, so none are in the journal.

The record only moves forward. `run.json` carries a sequence number (`seq`) and who wrote it
(`written_by`); each state.db keeps the newest one it read or wrote (`seen`: state.db's journal_seen table). A
writer reads the bucket's record before it replaces it: a record newer than the one its view grew
from means that view is stale (another machine drove the run since), and the writer takes the
bucket's record instead of writing its own (`restore`). The replace itself is a compare-and-swap
where the store has one (S3's If-Match on the ETag read; a local folder's lock), so two writers that
read the same record cannot both replace it; COS has none, and there the sequence number checked
on read is the guard.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Callable, Iterable

from ... import events as kinds
from ...events import Kind
from .state import ACTIVE_RUN_STATES, StateStore

REWRITE_SECONDS = 60.0
ACTIVE_INDEX = "drivers/active"

# What this process knows a bucket holds, by (state.db, bucket, run): the identities of the events
# that `restore` read or a Journal wrote. A Journal of the same state.db does not send them again.
_IN_BUCKET: dict[tuple[str, str, str], set[str]] = {}


def prefix(run_id: str) -> str:
    return f"runs/{run_id}/journal"


def events_prefix(run_id: str) -> str:
    return f"{prefix(run_id)}/events/"


def snapshot(state: StateStore, run_id: str) -> dict[str, Any]:
    """The run's row and everything priced about it, as plain JSON (StateStore.export_run)."""
    rows = state.export_run(run_id)
    spec = rows["run"]["spec"] or {}
    return {
        "version": 1,
        **rows,
        # The stack's outputs the run was launched with (bucket, role, network names; never a secret),
        # so that a driver elsewhere reaches the same bucket and launches into the same network.
        "infra": state.infra(spec.get("provider") or "", spec.get("region") or ""),
    }


def identity(event: dict) -> str:
    return kinds.identity(event["time"], event["kind"], event.get("data"))


def _where(state: StateStore, store: Any, run_id: str) -> tuple[str, str, str]:
    # A wrapper of a store (a test's counting store) may not name its URL: then its class stands in.
    return str(state.path), str(getattr(store, "url", type(store).__name__)), run_id


def _known(state: StateStore, store: Any, run_id: str) -> set[str] | None:
    return _IN_BUCKET.get(_where(state, store, run_id))


def _note(state: StateStore, store: Any, run_id: str, keys: Iterable[str]) -> None:
    _IN_BUCKET.setdefault(_where(state, store, run_id), set()).update(keys)


def forget(state: StateStore) -> None:
    """Drop what this process noted for a state.db that is gone (a cloud invocation's own)."""
    for where in [w for w in _IN_BUCKET if w[0] == str(state.path)]:
        del _IN_BUCKET[where]


def bucket_events(store: Any, run_id: str) -> list[dict]:
    """Every event of the run's journal in its bucket, each once (by identity), oldest first."""
    seen: dict[str, dict] = {}
    for info in sorted(store.list(events_prefix(run_id)), key=lambda i: i.key):
        for e in json.loads(store.get(info.key)):
            seen.setdefault(identity(e), e)
    return sorted(seen.values(), key=lambda e: float(e["time"]))


class Journal:
    """Writes one run's history to its bucket after each controller step (`flush`)."""

    def __init__(self, state: StateStore, store: Any, run_id: str, clock: Callable[[], float] = time.time):
        self.state, self.store, self.run_id, self.clock = state, store, run_id, clock
        self._last_body: bytes | None = None
        self._last_write = 0.0
        self._event_id = 0
        self._indexed: bool | None = None
        # The driver lease this journal writes under (runs/records/lease.py DriverLease); once lost, nothing
        # more is written from here.
        self.lease: Any = None

    def flush(self) -> None:
        """Write what changed. Store faults are left to the next step: the journal is a copy of state.db."""
        from .store import StoreError

        if self.lease is not None and self.lease.lost:
            return
        try:
            pending = self._run_pending()
            current = None
            if pending is not None:
                # Read before anything is sent: a view older than the bucket's sends nothing.
                current = read_record(self.store, self.run_id)
                if current is not None and stale(self.state, pending[0], current[0]):
                    self._take_theirs(current[0])
                    return
            self._flush_events()
            if pending is not None:
                self._flush_run(*pending, current)
        except (StoreError, OSError) as exc:
            self.state.event(self.run_id, Kind.JOURNAL_DEFERRED, {"error": str(exc)[:200]})

    def _flush_events(self) -> None:
        events = self.state.events(self.run_id, after_id=self._event_id)
        events = [e for e in events if e["kind"] is not Kind.JOURNAL_DEFERRED]
        if not events:
            return
        known = _known(self.state, self.store, self.run_id)
        if known is None:
            # The first write of this state.db for the run: learn what the bucket already holds (a
            # machine that restored the run in another process, a controller started again).
            _note(self.state, self.store, self.run_id, (identity(e) for e in bucket_events(self.store, self.run_id)))
            known = _known(self.state, self.store, self.run_id) or set()
        new = [e for e in events if identity(e) not in known]
        if new:
            keys = [identity(e) for e in new]
            body = json.dumps([{"time": e["time"], "kind": e["kind"], "data": e["data"]} for e in new],
                              default=str).encode()
            digest = hashlib.sha256("".join(keys).encode()).hexdigest()[:16]
            self.store.put(f"{events_prefix(self.run_id)}{int(float(new[0]['time']) * 1e9):020d}-{digest}.json", body)
            _note(self.state, self.store, self.run_id, keys)
        self._event_id = events[-1]["id"]

    def _run_pending(self) -> tuple[dict, bytes, float] | None:
        """The run's snapshot when `run.json` is due a write (it changed, or a minute passed), else None."""
        snap = snapshot(self.state, self.run_id)
        snap["run"].pop("updated")  # changes on every write; compared without it
        body = json.dumps(snap, sort_keys=True, default=str).encode()
        now = self.clock()
        if body == self._last_body and now - self._last_write < REWRITE_SECONDS:
            return None
        return snap, body, now

    def _flush_run(self, snap: dict, body: bytes, now: float, current: tuple[dict, str | None] | None) -> None:
        key = f"{prefix(self.run_id)}/run.json"
        seq = max(int((seen(self.state, self.run_id) or {}).get("seq") or 0),
                  int(current[0].get("seq") or 0) if current else 0) + 1
        writer = writer_name()
        written = json.dumps({**snap, "seq": seq, "written_by": writer}, sort_keys=True, default=str).encode()
        if not self._replace(key, written, current):
            # Another writer replaced the record between our read and our write: theirs is the newer.
            again = read_record(self.store, self.run_id)
            if again is not None:
                self._take_theirs(again[0])
            return
        set_seen(self.state, self.run_id, seq, writer)
        # The index the cloud driver lists (one small object per live run, gone when it ends), so it
        # never lists a bucket full of checkpoints to find the runs it may have to drive.
        active = snap["run"]["state"] in ACTIVE_RUN_STATES
        if active != self._indexed:
            if active:
                self.store.put(f"{ACTIVE_INDEX}/{self.run_id}", b"")
            else:
                self.store.delete(f"{ACTIVE_INDEX}/{self.run_id}")
            self._indexed = active
        self._last_body, self._last_write = body, now

    def _replace(self, key: str, body: bytes, current: tuple[dict, str | None] | None) -> bool:
        """Write the record; where the store has compare-and-swap, only over the one just read."""
        etag = current[1] if current else None
        if etag is not None and getattr(self.store, "compare_and_swap", False) and hasattr(self.store, "put_if_match"):
            return self.store.put_if_match(key, body, etag) is not None
        if current is None and hasattr(self.store, "put_if_absent"):
            return self.store.put_if_absent(key, body) is not None
        self.store.put(key, body)
        return True

    def _take_theirs(self, doc: dict) -> None:
        """This view is older than the bucket's: the bucket's rows replace it here, and what this
        machine recorded from its stale view is not sent (its events stay in this state.db only)."""
        _import(self.state, self.store, doc)
        events = self.state.events(self.run_id)
        self._event_id = events[-1]["id"] if events else self._event_id
        self._last_body, self._indexed = None, None


def seen(state: StateStore, run_id: str) -> dict | None:
    """The newest record of the run this state.db read from or wrote to its bucket: {seq, written_by,
    time}, or None when it never met the run's bucket (its table: state.py's journal_seen)."""
    with state.tx() as db:
        row = db.execute("SELECT seq, written_by, time FROM journal_seen WHERE run_id = ?", (run_id,)).fetchone()
    return dict(row) if row else None


def set_seen(state: StateStore, run_id: str, seq: int, written_by: str) -> None:
    with state.tx() as db:
        db.execute("INSERT OR REPLACE INTO journal_seen VALUES (?,?,?,?)", (run_id, int(seq), written_by, time.time()))


def writer_name() -> str:
    """Who writes a record: the driver's name (machine and pid, or the function's invocation)."""
    from .lease import this_driver

    return this_driver()


def read_record(store: Any, run_id: str) -> tuple[dict, str | None] | None:
    """The bucket's `run.json` of the run and its ETag (None where the store gives none), or None."""
    key = f"{prefix(run_id)}/run.json"
    if hasattr(store, "get_versioned"):
        got = store.get_versioned(key)
        return None if got is None else (json.loads(got[0]), got[1])
    from .store import NotFound

    try:
        return json.loads(store.get(key)), None
    except NotFound:
        return None


def _progress(run: dict) -> tuple[int, int]:
    """How far a record's run has got, for records that carry no sequence number (an older sdcloud's):
    its step, then ended over active at the same step."""
    return int(run.get("step") or 0), 0 if run.get("state") in ACTIVE_RUN_STATES else 1


def stale(state: StateStore, mine: dict, theirs: dict) -> bool:
    """Whether this state.db's view of the run (`mine`, a snapshot) is older than the bucket's record
    (`theirs`): the bucket holds a record newer than the newest this state.db read or wrote, or, for a
    state.db that never saw the record, one that is further on."""
    last = seen(state, mine["run"]["id"])
    if last is not None:
        return int(theirs.get("seq") or 0) > int(last["seq"])
    return _progress(theirs["run"]) > _progress(mine["run"])


def _import(state: StateStore, store: Any, snap: dict) -> dict | None:
    run = snap["run"]
    spec = run["spec"] or {}
    if snap.get("infra"):
        state.save_infra(spec.get("provider") or "", spec.get("region") or "", snap["infra"])
    events = [{**e, "kind": kinds.parse(e["kind"])} for e in bucket_events(store, run["id"])]
    before = state.get_run(run["id"])
    state.import_run(snap, events)
    if before is not None and before.get("controller_pid") is not None:
        # The controller process is this machine's own field: another machine's pid names nothing here.
        state.update_run(run["id"], controller_pid=before["controller_pid"])
    set_seen(state, run["id"], int(snap.get("seq") or 0), str(snap.get("written_by") or ""))
    _note(state, store, run["id"], (identity(e) for e in events))
    return state.get_run(run["id"])


def restore(state: StateStore, store: Any, run_id: str) -> dict | None:
    """Rebuild the run's rows from its journal (None when the bucket has no journal for it).

    Rows already here are replaced by the bucket's (the bucket is the source of truth) when its
    record is newer than the newest this state.db read or wrote (`journal_seen`); one no newer leaves
    them (this machine's may hold what a step could not write yet). Each event is inserted once by
    its identity, however many of the bucket's objects hold a copy and whether or not it is here
    already. A kind an older sdcloud spelled otherwise (`launch_failed`, `budget`) is read back as
    today's (events.parse).
    """
    from .store import NotFound, StoreError

    try:
        snap = json.loads(store.get(f"{prefix(run_id)}/run.json"))
    except NotFound:
        return None
    except (StoreError, ValueError) as exc:
        from ...errors import UserError

        raise UserError(f"cannot read run {run_id}'s journal: {exc}") from None
    rid = snap["run"]["id"]
    last = seen(state, rid)
    if last is not None and state.get_run(rid) is not None and int(snap.get("seq") or 0) <= int(last["seq"]):
        return state.get_run(rid)
    return _import(state, store, snap)
