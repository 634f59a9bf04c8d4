"""The local pool: a batch job's K worker processes on this machine (the this-machine provider).

Each worker process is the pool's host: an attempt of the job, priced at config.toml [local]
price_per_hour, so that `batch status` and the cost report count it as they count a cloud host.
A worker that dies is replaced while items are left, up to MAX_WORKER_STARTS_PER_SLOT per slot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .. import config
from ..errors import UserError
from ..events import Kind
from ..providers.traits import traits
from .status import cancel_marked, find_job, job_over, on_this_machine, progress, state_store, verify_job

# A local pool gives up when this many workers per slot have died without finishing the job.
MAX_WORKER_STARTS_PER_SLOT = 5


def _worker_cmd(job: dict, n: int, ttl: float) -> list[str]:
    spec = job["spec"]
    return [sys.executable, "-m", "sdcloud_agent.batch", "--store", json.dumps(spec["store"]),
            "--job", spec["prefix"], "--worker-id", f"{job['id']}-w{n}", "--generator", spec.get("generator", "diffusers"),
            "--ttl", str(ttl), "--fake-delay", str(spec.get("fake_delay", 0.0))]


def _worker_attempt_started(state, job: dict, pid: int) -> None:
    """A local worker process is the pool's host: an attempt of the job at the [local] price_per_hour,
    as a local training run's host is one, so that `batch status` and the cost report count and price it."""
    n = max((a.n for a in state.attempts(job["id"])), default=0) + 1
    provider = traits(job["spec"]["provider"])
    price = config.numbers(provider.name, [s.key for s in provider.settings]).get("price_per_hour", 0.0)
    state.add_attempt(job["id"], n, job["spec"]["provider"], f"{job['id']}-w{n}", region="local", zone="local",
                      instance_type="this-machine", market=job["spec"].get("market") or "on-demand",
                      price=price, currency="USD", instance_id=f"pid-{pid}")
    # This machine costs the same on either market: its on-demand counterfactual is the same hours at
    # the same price (a job on it saves nothing, and loses nothing but what reclaims cost).
    state.set_attempt_costs(job["id"], n, currency="USD", quote_price=price, ondemand_price=price, disk_gb=0.0)
    state.update_attempt(job["id"], n, state="running", start=time.time())


def worker_attempts_ended(state, job_id: str, reason: str, pid: int | None = None) -> None:
    """Close the attempt of worker `pid`, or every open one (the pool is over)."""
    for a in state.attempts(job_id):
        if a.end is None and on_this_machine(a.provider) and (pid is None or a.instance_id == f"pid-{pid}"):
            state.update_attempt(job_id, a.n, state="ended", end=time.time(), end_reason=reason)


class _Adopted:
    """A worker process that outlived its driver (killed, or the machine's session ended): the new
    driver keeps it in its slot instead of starting a second worker beside it. It is not this
    process's child, so its exit status is unknown (None): its slot is filled again while items
    are left."""

    returncode: int | None = None

    def __init__(self, pid: int, worker_id: str):
        self.pid, self.worker_id = pid, worker_id

    def poll(self) -> int | None:
        return None if _worker_alive(self.pid, self.worker_id) else self.returncode

    def terminate(self) -> None:
        self._signal(15)

    def kill(self) -> None:
        self._signal(9)

    def _signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, timeout: float) -> None:
        until = time.monotonic() + timeout
        while _worker_alive(self.pid, self.worker_id):
            if time.monotonic() >= until:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.1)


def _worker_alive(pid: int, worker_id: str) -> bool:
    """Whether `pid` is still this worker (not a zombie, not another process that took its pid)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return worker_id.encode() in f.read()
    except (OSError, IndexError):
        return False


def adopt_orphans(state, job: dict, k: int) -> list[_Adopted]:
    """The job's workers whose driver died, still at work: up to K of them are adopted (their
    attempts stay open; each fills a slot), any beyond K are ended; the attempts of the ones that
    are gone are closed. So a resumed job never pays two hosts for one worker slot."""
    adopted: list[_Adopted] = []
    for a in state.attempts(job["id"]):
        if a.end is not None or not on_this_machine(a.provider):
            continue
        pid = (a.instance_id or "").removeprefix("pid-")
        alive = pid.isdigit() and _worker_alive(int(pid), a.token)
        if alive and len(adopted) < k:
            adopted.append(_Adopted(int(pid), a.token))
            state.event(job["id"], Kind.WORKER_ADOPTED, {"n": a.n, "pid": int(pid)})
            continue
        if alive:  # more live workers than slots: the extra one stops (its lease is released)
            proc = _Adopted(int(pid), a.token)
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        # Gone before the new driver looked: it exited (its status is unknown here), which is not a reclaim.
        state.update_attempt(job["id"], a.n, state="ended", end=time.time(),
                             end_reason="stopped" if alive else "exited")
    return adopted


def _last_words(log: Path) -> str:
    """What a worker that died said last: the error its traceback ended with, else its last line."""
    from ..events import error_line

    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()[-40:] if line.strip()]
    except OSError:
        return ""
    return (error_line(lines) or lines[-1]) if lines else ""


def run_local(job_id: str, ttl: float = 20.0, poll: float = 0.5, on_progress=None) -> dict[str, Any]:
    """Keep K worker processes on this machine until every item is done (the local provider).

    A worker that dies is replaced while items are left; workers exit by themselves when nothing
    is left to claim, which is how the pool scales down at the end of a job.
    """
    job = find_job(job_id)
    if not on_this_machine(job["spec"]["provider"]):
        raise UserError(f"job {job_id} runs on {job['spec']['provider']}: its hosts are started by the fleet")
    state = state_store()
    k = int(job["spec"]["workers"])
    logs = config.home() / "batch" / job_id
    logs.mkdir(parents=True, exist_ok=True)
    procs: dict[int, subprocess.Popen] = {}
    started = 0

    def start(slot: int) -> None:
        nonlocal started
        if job_over(job_id):  # a cancel between this pass's check and now: start nothing
            return
        started += 1
        log = open(logs / f"worker-{started}.log", "ab")
        procs[slot] = subprocess.Popen(_worker_cmd(job, started, ttl), stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        state.event(job_id, Kind.WORKER_STARTED, {"slot": slot, "n": started, "pid": procs[slot].pid})
        _worker_attempt_started(state, job, procs[slot].pid)

    if job_over(job_id):
        return {**progress(job_id), "workers_started": 0}
    state.update_run(job_id, state="running", controller_pid=os.getpid())
    for slot, orphan in enumerate(adopt_orphans(state, job, k)):  # a resumed job: its live workers first
        procs[slot] = orphan  # type: ignore[assignment]
    for slot in range(k):
        if slot not in procs:
            start(slot)
    try:
        while True:
            spec = dict(job["spec"], worker_pids=[p.pid for p in procs.values()])
            state.update_run(job_id, spec=json.dumps(spec))
            p = progress(job_id)
            state.update_run(job_id, step=p["images_done"])
            if on_progress:
                on_progress(p)
            if p["items_done"] >= p["items"]:
                break
            # A cancel (or `down`) is final: checked before any worker is started again.
            if job_over(job_id) or cancel_marked(job):
                break
            for slot, proc in list(procs.items()):
                if proc.poll() is not None:
                    state.event(job_id, Kind.WORKER_EXITED, {"slot": slot, "pid": proc.pid, "rc": proc.returncode})
                    worker_attempts_ended(state, job_id, "succeeded" if proc.returncode == 0 else "failed"
                                          if proc.returncode is not None else "exited", proc.pid)
                    del procs[slot]
                    # An adopted worker's status is unknown (None): its slot is filled while items are left.
                    if p["items_done"] < p["items"] and proc.returncode != 0:
                        if started >= MAX_WORKER_STARTS_PER_SLOT * k:
                            # Workers that keep dying (a model that does not load) are a failure, not a reclaim.
                            said = _last_words(logs / f"worker-{started}.log")
                            state.update_run(job_id, state="failed", reason=f"workers keep exiting (rc {proc.returncode})"
                                             + (f": {said}" if said else "") + f"; see {logs}")
                            return {**progress(job_id), "workers_started": started}
                        start(slot)  # died (killed, reclaimed): keep K alive
            if not procs:
                start(0)  # all exited cleanly while items remain (leases still live): look again
            time.sleep(poll)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        # Why the pool's last workers ended: the job was cancelled, its items were all done, or its
        # driver stopped (down, Ctrl-C).
        row = state.get_run(job_id)
        done = progress(job_id)
        worker_attempts_ended(state, job_id, "cancelled" if row and row["state"] == "cancelled" else
                              "succeeded" if done["items_done"] >= done["items"] else "stopped")
    final = progress(job_id)
    state.update_run(job_id, step=final["images_done"], controller_pid=None)
    if cancel_marked(job) and not job_over(job_id):
        state.update_run(job_id, state="cancelled", reason="cancelled (the bucket's cancel marker)")
    if not job_over(job_id):
        v = verify_job(job_id)
        state.update_run(job_id, state="succeeded" if v["ok"] else "failed",
                         reason=None if v["ok"] else "verify failed")
    return {**progress(job_id), "workers_started": started, "final_images": final["images_done"]}
