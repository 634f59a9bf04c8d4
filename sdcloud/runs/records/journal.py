"""A run's history in its own bucket, so that `state.db` is a cache any machine can rebuild.

The controller writes, in the run's bucket:

```
runs/<id>/journal/run.json                   the run's row, attempts, cost inputs, ledger items, infra outputs
runs/<id>/journal/events/<ns>-<digest>.json  events not yet in the bucket, one object per write
drivers/active/<id>                          present while the run is active (the cloud driver's index)
```

`run.json` is rewritten when something in it changed, and at most once a minute otherwise, so a
run costs a few thousand small PUTs a day at most (S3 Standard: $0.005 per 1,000 PUTs).

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
            self._flush_events()
            self._flush_run()
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

    def _flush_run(self) -> None:
        snap = snapshot(self.state, self.run_id)
        snap["run"].pop("updated")  # changes on every write; compared without it
        body = json.dumps(snap, sort_keys=True, default=str).encode()
        now = self.clock()
        if body == self._last_body and now - self._last_write < REWRITE_SECONDS:
            return
        self.store.put(f"{prefix(self.run_id)}/run.json", body)
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


def restore(state: StateStore, store: Any, run_id: str) -> dict | None:
    """Rebuild the run's rows from its journal (None when the bucket has no journal for it).

    Rows already here are replaced by the bucket's (the bucket is the source of truth); each event
    is inserted once by its identity, however many of the bucket's objects hold a copy and whether
    or not it is here already. A kind an older sdcloud spelled otherwise (`launch_failed`, `budget`)
    is read back as today's (events.parse).
    """
    from .store import NotFound, StoreError

    try:
        snap = json.loads(store.get(f"{prefix(run_id)}/run.json"))
    except NotFound:
        return None
    except (StoreError, ValueError) as exc:
        from ...errors import UserError

        raise UserError(f"cannot read run {run_id}'s journal: {exc}") from None
    run = snap["run"]
    spec = run["spec"] or {}
    if snap.get("infra"):
        state.save_infra(spec.get("provider") or "", spec.get("region") or "", snap["infra"])
    events = [{**e, "kind": kinds.parse(e["kind"])} for e in bucket_events(store, run_id)]
    state.import_run(snap, events)
    _note(state, store, run["id"], (identity(e) for e in events))
    return state.get_run(run["id"])
