"""A batch job's rows in its own bucket, so that the cloud driver, whose state.db is a cache in the
function's /tmp that lives one invocation, carries the job from one invocation to the next.

```
batch/<job>/journal.json       the job's row, its hosts (attempts), their costs, its events, the stack's outputs
drivers/batch/<job>             present while the job is live: the cloud driver's index of batch jobs
```

One object, rewritten whole by the driver that holds the job's lease (runs/records/lease.py), so a reader
sees one consistent job; events travel inside it and a restore inserts each once (StateStore.import_run
keys an event by its time and kind). The index is apart from the training runs' (`drivers/active/`), so
the runs' driver never mistakes a batch job for a run. Secrets are never in a row, so none are here.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from ..runs.records.state import ACTIVE_RUN_STATES, StateStore

INDEX = "drivers/batch"


def key(job_id: str) -> str:
    return f"batch/{job_id}/journal.json"  # in the job's prefix (submit.job_prefix)


def save(state: StateStore, store: Any, job_id: str) -> None:
    """Write the job's rows (and its place in the index) to the bucket."""
    snap = state.export_run(job_id)
    spec = snap["run"]["spec"] or {}
    snap["events"] = [{"time": e["time"], "kind": str(e["kind"]), "data": e["data"]} for e in state.events(job_id)]
    snap["infra"] = state.infra(spec.get("provider") or "", spec.get("region") or "")
    store.put(key(job_id), json.dumps(snap, sort_keys=True, default=str).encode())
    if snap["run"]["state"] in ACTIVE_RUN_STATES:
        store.put(f"{INDEX}/{job_id}", b"")
    else:
        store.delete(f"{INDEX}/{job_id}")


def restore(state: StateStore, store: Any, job_id: str) -> dict | None:
    """Rebuild the job's rows from the bucket; None when the bucket has no journal for it."""
    from ..runs.records.store import NotFound

    try:
        snap = json.loads(store.get(key(job_id)))
    except NotFound:
        return None
    spec = snap["run"]["spec"] or {}
    if snap.get("infra"):
        state.save_infra(spec.get("provider") or "", spec.get("region") or "", snap["infra"])
    state.import_run(snap, snap.get("events") or [])
    return state.get_run(job_id)


def fetch(state: StateStore, job_id: str) -> dict | None:
    """A job this machine never saw (a cloud schedule's, submitted by the function): its rows from
    the bucket of each stack this machine knows whose provider schedules jobs on its cloud; None if
    none has it. A bucket that cannot be read (no credentials here) is passed over."""
    from ..providers.traits import names
    from ..runs.records.store import open_run_store, store_config

    for provider in names(where=lambda t: t.schedules is not None):
        infra = state.infra(provider, "")
        if not infra or not infra.get("bucket"):
            continue
        try:
            row = restore(state, open_run_store(store_config(provider, None, None, infra)), job_id)
        except Exception:  # noqa: BLE001 - that cloud cannot be asked from here; the caller says "no job"
            continue
        if row is not None:
            return row
    return None


def live_jobs(store: Any) -> list[str]:
    """Jobs the index lists as live, oldest key first."""
    return [o.key.rsplit("/", 1)[-1] for o in sorted(store.list(f"{INDEX}/"), key=lambda o: o.key)]


class CarriedOwner(Protocol):
    """What a batch job's carried driving reads of its controller (batch/controller.py)."""

    store: Any
    job_id: str
    timing: Any
    provider_name: str
    state: StateStore


class Carried:
    """The laptop's driving of a job that the cloud driver can take over when the laptop goes: the
    job's driver lease (renewed each step; lost means another driver has the job) and its rows in
    the bucket after each step. None of it where the provider has no cloud driver."""

    def __init__(self, ctl: CarriedOwner):
        from ..runs.records.lease import DriverLease

        self.ctl = ctl
        self.lease = DriverLease(ctl.store, ctl.job_id, ctl.timing.poll_seconds)

    @classmethod
    def of(cls, ctl: CarriedOwner) -> "Carried | None":
        from ..providers.traits import traits

        return cls(ctl) if traits(ctl.provider_name).function is not None else None

    def take(self) -> None:
        from ..errors import UserError

        if not self.lease.acquire():
            holder = (self.lease.holder() or {}).get("worker", "another driver")
            raise UserError(f"batch job {self.ctl.job_id} is driven by {holder}; follow it with: "
                            f"sdcloud batch watch {self.ctl.job_id}")

    def held(self) -> bool:
        return self.lease.renew()

    def save(self) -> None:
        """The job's rows to the bucket; a store fault waits for the next step (the rows are a copy)."""
        from ..events import Kind
        from ..runs.records.store import StoreError

        try:
            save(self.ctl.state, self.ctl.store, self.ctl.job_id)
        except (StoreError, OSError) as exc:
            self.ctl.state.event(self.ctl.job_id, Kind.JOURNAL_DEFERRED, {"error": str(exc)[:200]})

    def release(self) -> None:
        self.lease.release()
