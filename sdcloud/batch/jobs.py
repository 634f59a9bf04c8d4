"""Batch jobs on the control plane: submit, run K workers, status, cancel, pull, verify.

A job is a row in the runs table (kind "batch" in its spec; the job id owns its workers' attempts)
and a prefix `batch/<job>/` in the bucket that holds everything the workers need (sdcloud_agent.batch).
This module is the jobs' front: it ends them (cancel, end_hosts) and drives them (run_job, detach,
`python -m sdcloud.batch.jobs run JOB`); the rest lives where its name says: submit.py, status.py,
local_pool.py (this machine's workers), pull.py, controller.py (the fleet's hosts).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from typing import Any

from .. import config
from ..events import Kind
from ..runs.records.run_state import RunState
from .local_pool import run_local, worker_attempts_ended
from .pull import pull
from .status import find_job, job_over, job_store, list_jobs, on_this_machine, progress, state_store, verify_job
from .submit import (BATCH_TIERS, SubmitOptions, job_prefix, lora_identity, store_conf, submit, validate)

# The names callers and tests import from here, wherever they live now.
__all__ = ["BATCH_TIERS", "SubmitOptions", "cancel", "detach", "end_hosts", "find_job", "job_over", "job_prefix",
           "job_store", "list_jobs", "lora_identity", "open_hosts", "progress", "pull", "run_job", "run_local", "store_conf",
           "submit", "validate", "verify_job"]


def cancel(job_id: str, reason: str = "cancelled by sdcloud batch cancel") -> dict[str, Any]:
    """End a job for good: the state first (so that no driver starts another worker), then the bucket's
    cancel marker (workers stop claiming), then this machine's worker processes.

    `job_id` may be the job's name; every write uses the id found (a write by name matched no row and
    left the job `running` while its pool kept relaunching workers).
    """
    from ..runs.records.state import ACTIVE_RUN_STATES
    from ..runs.records.store import StoreError

    job = find_job(job_id)
    jid = job["id"]
    state = state_store()
    if job["state"] in ACTIVE_RUN_STATES:  # an ended job keeps its end (a cancel changes nothing there)
        state.update_run(jid, state="cancelled", reason=reason)
        state.event(jid, Kind.BATCH_CANCELLED, {"reason": reason})
    try:
        job_store(job).put(f"{job['spec']['prefix']}/cancel", b"cancelled\n")
    except (StoreError, OSError) as exc:
        # The state already says cancelled, which every driver obeys; workers then stop at their lease's end.
        state.event(jid, Kind.BATCH_CANCEL_MARKER_FAILED, {"error": str(exc)[:200]})
    for pid in job["spec"].get("worker_pids", []):
        try:
            os.kill(int(pid), 15)
        except (ProcessLookupError, PermissionError):
            pass
    return {"job": jid, "state": state.get_run(jid)["state"]}


# How long a cancel waits for a live driver to end its own hosts before it stops the driver and ends
# them itself (a driver sees the cancel within one poll: 0.5 s locally, the provider's poll on a cloud).
DRIVER_STOP_SECONDS = 30.0


def open_hosts(job_id: str) -> set[int]:
    """The job's hosts (attempt numbers) not ended yet, as this machine's state has them."""
    return {a.n for a in state_store().attempts(find_job(job_id)["id"]) if a.state != "ended"}


def end_hosts(job_id: str, wait_s: float | None = None, open_before: set[int] | None = None) -> int:
    """After a cancel: give a live driver `wait_s` to stop, then SIGTERM it; end whatever hosts are
    still open here (local worker processes, cloud instances through the fleet). Returns how many of
    the hosts open before (`open_before`: before the cancel, else now) are ended now, whoever ended
    them: a live driver ends its own workers on the cancel, and those count too (a count of only the
    ones left for this function said "0 hosts ended" for a job with two live workers)."""
    import signal

    from ..runs.driving.background import controller_alive

    state = state_store()
    before = set(open_before or ()) | {a.n for a in state.attempts(job_id) if a.state != "ended"}
    row = state.get_run(job_id)
    if controller_alive(row):
        until = time.time() + (DRIVER_STOP_SECONDS if wait_s is None else wait_s)
        while time.time() < until and controller_alive(state.get_run(job_id)):
            time.sleep(0.2)
        row = state.get_run(job_id)
        if controller_alive(row):
            try:
                os.kill(int(row["controller_pid"]), signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            until = time.time() + 10
            while time.time() < until and controller_alive(state.get_run(job_id)):
                time.sleep(0.2)
    open_ = [a for a in state.attempts(job_id) if a.state != "ended"]
    if not open_:
        return _ended_of(state, job_id, before)
    # What ended the hosts, as the cost report's "ended by" says it.
    reason = "cancelled" if row["state"] == RunState.CANCELLED else "stopped"
    if on_this_machine(row["spec"].get("provider", "local")):
        for a in open_:
            pid = a.instance_id.removeprefix("pid-") if a.instance_id else ""
            if pid.isdigit():
                try:
                    os.kill(int(pid), signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
        worker_attempts_ended(state, job_id, reason)
    else:
        from .controller import BatchController

        ctl = BatchController(state, job_id)
        for cur in ctl.fleet.open_attempts():
            ctl.fleet.end(cur, reason)
    return _ended_of(state, job_id, before)


def _ended_of(state: Any, job_id: str, hosts: set[int]) -> int:
    return sum(1 for a in state.attempts(job_id) if a.n in hosts and a.state == "ended")



def run_job(job_id: str, on_progress=None) -> dict[str, Any]:
    """Run a job to its end: K worker processes here (local), or K hosts through the fleet (clouds, SSH)."""
    job = find_job(job_id)
    with _sigterm_exits():
        if on_this_machine(job["spec"]["provider"]):
            return run_local(job["id"], on_progress=on_progress)
        from .controller import BatchController

        res = BatchController(state_store(), job["id"]).run()
        return {**progress(job["id"]), **res}


@contextlib.contextmanager
def _sigterm_exits():
    """A driver that is told to stop (down, batch cancel) unwinds, so that its pool's `finally` ends its
    workers; Python's default SIGTERM would end it without running any."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def detach(job_id: str) -> int:
    """Run the job's controller in a background process that outlives this command; its pid."""
    logs = config.home() / "batch" / job_id
    logs.mkdir(parents=True, exist_ok=True)
    log = open(logs / "controller.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "sdcloud.batch.jobs", "run", job_id], stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    # Recorded now, not when the driver gets going: in between, `status` would call the job unattended
    # and `down` would not know whom to stop.
    state_store().update_run(job_id, controller_pid=proc.pid)
    return proc.pid


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "run":
        print(json.dumps(run_job(args[1])), flush=True)
        return 0
    print("usage: python -m sdcloud.batch.jobs run JOB", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
