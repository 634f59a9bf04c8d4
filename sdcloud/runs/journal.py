"""A run's history in its own bucket, so that `state.db` is a cache any machine can rebuild.

The controller writes, in the run's bucket:

```
runs/<id>/journal/run.json                 the run's row, attempts, cost inputs, ledger items, infra outputs
runs/<id>/journal/events/<ns>-<host>.json  the events since the last write, one object per write
drivers/active/<id>                        present while the run is active (the cloud driver's index)
```

`run.json` is rewritten when something in it changed, and at most once a minute otherwise, so a
run costs a few thousand small PUTs a day at most (S3 Standard: $0.005 per 1,000 PUTs). Event
objects are never rewritten: their names sort by time and carry the writing machine, so two
machines that drove the run one after the other leave one history. `restore` reads both into a
state store on a machine that has never seen the run (`sdcloud status RUN --store URL`).
Secrets are never in a row, so none are in the journal.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any, Callable

from .. import events as kinds
from ..events import Kind
from .state import ACTIVE_RUN_STATES, StateStore

REWRITE_SECONDS = 60.0
ACTIVE_INDEX = "drivers/active"


def prefix(run_id: str) -> str:
    return f"runs/{run_id}/journal"


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


class Journal:
    """Writes one run's history to its bucket after each controller step (`flush`)."""

    def __init__(self, state: StateStore, store: Any, run_id: str, clock: Callable[[], float] = time.time):
        self.state, self.store, self.run_id, self.clock = state, store, run_id, clock
        self._last_body: bytes | None = None
        self._last_write = 0.0
        self._event_id = 0
        self._host = socket.gethostname().replace("/", "_")[:40] or "host"
        self._indexed: bool | None = None

    def flush(self) -> None:
        """Write what changed. Store faults are left to the next step: the journal is a copy of state.db."""
        from .store import StoreError

        try:
            self._flush_events()
            self._flush_run()
        except (StoreError, OSError) as exc:
            self.state.event(self.run_id, Kind.JOURNAL_DEFERRED, {"error": str(exc)[:200]})

    def _flush_events(self) -> None:
        events = self.state.events(self.run_id, after_id=self._event_id)
        events = [e for e in events if kinds.parse(e["kind"]) is not Kind.JOURNAL_DEFERRED]
        if not events:
            return
        body = json.dumps([{"time": e["time"], "kind": e["kind"], "data": e["data"]} for e in events],
                          default=str).encode()
        key = f"{prefix(self.run_id)}/events/{time.time_ns():020d}-{self._host}.json"
        self.store.put(key, body)
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

    Rows already here are replaced by the bucket's (the bucket is the source of truth); events
    already here (same time and kind) are not added twice. A kind an older sdcloud spelled otherwise
    (`launch_failed`, `budget`) is read back as today's (events.parse).
    """
    from .store import NotFound, StoreError

    try:
        snap = json.loads(store.get(f"{prefix(run_id)}/run.json"))
    except NotFound:
        return None
    except (StoreError, ValueError) as exc:
        from ..errors import UserError

        raise UserError(f"cannot read run {run_id}'s journal: {exc}") from None
    run = snap["run"]
    spec = run["spec"] or {}
    if snap.get("infra"):
        state.save_infra(spec.get("provider") or "", spec.get("region") or "", snap["infra"])
    events = [{**e, "kind": kinds.parse(e["kind"])}
              for info in sorted(store.list(f"{prefix(run_id)}/events/"), key=lambda i: i.key)
              for e in json.loads(store.get(info.key))]
    state.import_run(snap, events)
    return state.get_run(run["id"])
