"""Batch jobs under the cloud driver: a schedule's fire submits the job, and every invocation takes
one step of each live job (relaunch reclaimed workers, end workers when the items are done, finish
the job), the same step `sdcloud batch submit` takes on the laptop (BatchController.drive_step).

Called from the function's handler (sdcloud/driver/unattended.py) with the invocation's event:

- a cloud schedule's invocation (batch/cloud_schedules.py) carries `{"sdcloud": "batch-fire",
  "schedule": SID, "time": ...}`: as EventBridge Scheduler's input (the time is its
  `<aws.scheduler.scheduled-time>`), or as an SCF timer's `Message` (the time is the timer's `Time`).
  The job id is the laptop scheduler's rule (schedules.fire_job_id of the schedule and the cron
  time's wall-clock key), so a retried or doubled invocation names the same job and the bucket's
  create-only job.json refuses a second one.
- any invocation steps the jobs in `drivers/batch/` (batch/journal.py).

Lease per job, as for runs (runs/records/lease.py): the job's driver lease is taken before its rows are
read, renewed before the step acts, and released when the invocation is done with it. The lease's
holder is this invocation (the driver's name and a random tail), not the function, so two
invocations racing never both act. Each job's step is guarded: one job's failure is reported in
the result and never stops another's.
"""

from __future__ import annotations

import json
import tempfile
import time
import traceback
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from ..batch import journal
from ..batch.schedule_keys import fire_of, last_job_key, prompts_key, schedule_key
from ..events import Kind
from ..runs.records.run_state import ACTIVE_RUN_STATES

# The cloud driver's period when its traits name none (a driver of a test).
DEFAULT_PERIOD_S = 300


def invocation_identity(driver: str) -> str:
    """This invocation's name in a lease: the driver's name and a random tail (two concurrent
    invocations of one function are two drivers)."""
    return f"{driver}:{uuid.uuid4().hex[:12]}"


def _fresh_state():
    """A state.db of this invocation's own: the function's /tmp may be shared by invocations that
    run at once in one instance, and the bucket is the record anyway."""
    from ..runs.records.state import StateStore

    return StateStore(Path(tempfile.mkdtemp(prefix="sdcloud-batch-")) / "state.db")


def _lease(store: Any, job_id: str, identity: str):
    """The job's driver lease (runs/<job>/leases/driver.json), at its shortest term: an invocation
    hands it back when it is done, so the term matters only after an invocation died holding it."""
    from ..runs.records.lease import DriverLease

    return DriverLease(store, job_id, 0.0, identity)


# -- a schedule's fire ------------------------------------------------------------------------------

def fire(store: Any, sid: str, when: str, identity: str) -> dict:
    """Submit the schedule's job for the cron time `when` stands for, once."""
    from ..runs.records.store import NotFound
    from ..batch.schedules import fire_job_id, invoked_cron_time, wall_key
    from ..batch.submit import SubmitOptions, submit

    try:
        sched = json.loads(store.get(schedule_key(sid)))
    except NotFound:
        return {"schedule": sid, "skipped": "no such schedule in the bucket (removed?)"}
    at = datetime.fromisoformat(when.replace("Z", "+00:00"))
    wall = wall_key(invoked_cron_time(at, sched["tz"]))
    job_id = fire_job_id(sid, wall)
    out = {"schedule": sid, "wall": wall, "job": job_id}
    opts = sched["options"]
    lease = _lease(store, job_id, identity)
    if not lease.acquire():
        return {**out, "skipped": f"driven by {(lease.holder() or {}).get('worker')}"}
    try:
        if store.head(journal.key(job_id)) is not None:
            return {**out, "existing": True}
        for other in journal.live_jobs(store):  # no overlap: the due time waits for the running job
            snap = json.loads(store.get(journal.key(other))) if store.head(journal.key(other)) else {}
            if (snap.get("run") or {}).get("spec", {}).get("schedule") == sid:
                return {**out, "skipped": f"job {other} of this schedule is still running"}
        state = _fresh_state()
        infra = sched.get("infra") or {}
        region = infra.get("region") or None  # its hosts launch where the stack's network is
        for where in {"", region or ""}:
            state.save_infra(opts["provider"], where, infra)
        prompts = Path(tempfile.mkdtemp(prefix="sdcloud-prompts-")) / sched.get("prompts_name", "prompts.txt")
        prompts.write_bytes(store.get(prompts_key(sid)))
        known = set(SubmitOptions.__dataclass_fields__)
        submitted = submit(SubmitOptions(**{**{k: v for k, v in opts.items() if k in known},
                                            "prompts": str(prompts), "schedule": sid, "region": region}),
                           job_id=job_id, state=state, conf=sched["store"], written_ok=True)
        state.event(job_id, Kind.BATCH_SCHEDULE_FIRED, {"schedule": sid, "wall": wall, "driver": identity})
        if lease.renew():  # still ours: the job's rows go to the bucket, and the index lists it
            journal.save(state, store, job_id)
            store.put(last_job_key(sid), job_id.encode())  # `batch schedule list` names it
        return {**out, "submitted": submitted.get("images")}
    finally:
        lease.release()


# -- a live job's step ------------------------------------------------------------------------------

def step_job(store: Any, job_id: str, identity: str, driver: str, provider: Any = None) -> dict:
    """One step of a live job under its lease; the job's rows back to the bucket."""
    from ..providers.traits import every
    from ..batch.controller import BatchController

    lease = _lease(store, job_id, identity)
    if not lease.acquire():
        return {"skipped": f"driven by {(lease.holder() or {}).get('worker')}"}
    try:
        state = _fresh_state()  # read under the lease: a view from before it may be a step old
        run = journal.restore(state, store, job_id)
        if run is None or run["state"] not in ACTIVE_RUN_STATES:
            if run is not None:
                journal.save(state, store, job_id)  # a finished job leaves the index
            return {"state": run["state"] if run else None}
        state.event(job_id, Kind.DRIVER_TOOK_OVER, {"driver": driver})
        ctl = BatchController(state, job_id, provider=provider)
        ctl.fleet.reconcile()
        if not lease.renew():
            return {"skipped": "lease lost"}
        # The function looks once a schedule period: the workers judge its heartbeat by that.
        periods = [t.function.schedule_seconds for t in every() if t.function and t.function.name == driver]
        ctl.heartbeat(driver, float(max(periods or [DEFAULT_PERIOD_S])))
        try:
            over = ctl.drive_step()
        finally:
            if lease.renew():  # what the step did (a host launched) is recorded even if it then failed
                journal.save(state, store, job_id)
        return {"state": state.get_run(job_id)["state"], "over": over,
                "hosts": len(ctl.fleet.open_attempts()), "images": state.get_run(job_id)["step"]}
    finally:
        lease.release()


def drive(event: Any, store_conf: dict, driver: str, room: Callable[[], float]) -> dict:
    """The batch part of one invocation: the schedule's fire if it is one, then a step of each live
    job while `room()` (seconds left for steps) is positive. Each is guarded; what happened is returned."""
    from ..runs.records.store import open_run_store

    store = open_run_store(store_conf)
    identity = invocation_identity(driver)
    report: dict = {}
    what = fire_of(event)
    if what is not None:
        report["fired"] = _guarded(lambda: fire(store, what["schedule"], what["time"], identity))
    jobs: dict = {}
    for job_id in _guarded_list(store, report):
        if room() <= 0:
            jobs[job_id] = {"skipped": "no time left in this invocation"}
            continue
        jobs[job_id] = _guarded(lambda job_id=job_id: step_job(store, job_id, identity, driver))
    if jobs:
        report["jobs"] = jobs
    return report


def _guarded(fn: Callable[[], dict]) -> dict:
    """One job's work: whatever it raises is its report, never the invocation's end."""
    started = time.monotonic()
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - reported per job; the other jobs still get their steps
        return {"error": f"{type(exc).__name__}: {exc}"[:300], "where": traceback.format_exc(limit=3)[-600:],
                "seconds": round(time.monotonic() - started, 2)}


def _guarded_list(store: Any, report: dict) -> list[str]:
    try:
        return journal.live_jobs(store)
    except Exception as exc:  # noqa: BLE001 - the bucket could not be listed: next invocation
        report["error"] = f"listing {journal.INDEX}/ failed: {exc}"[:300]
        return []


def drive_guarded(event: Any, store_conf: Callable[[], dict], driver: str, time_left: Callable[[], float]) -> dict:
    """The handler's call (driver/unattended.py): `drive` within the invocation's time less the
    function's safety margin, and nothing it raises reaches the training runs' steps."""
    import os

    from ..providers.traits import every

    if not os.environ.get("SDCLOUD_HOME"):
        # Lambda and SCF give a writable /tmp only (config.toml is read from the home; none there).
        os.environ["SDCLOUD_HOME"] = tempfile.mkdtemp(prefix="sdcloud-driver-")
    # The function's own margin before its timeout (its traits), as the runs' steps keep it.
    margins = [t.function.safety_seconds for t in every() if t.function is not None and t.function.name == driver]
    safety = margins[0] if margins else max(t.function.safety_seconds for t in every() if t.function is not None)
    try:
        return drive(event, store_conf(), driver, lambda: time_left() - safety)
    except Exception as exc:  # noqa: BLE001 - the bucket could not be opened: said, and the runs go on
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
