"""The cloud driver: a scheduled function in the user's own account that takes controller steps for
every live run whose driver lease has lapsed (the laptop closed, the daemon died).

One entry point for both clouds, called as each calls a Python function:

- AWS Lambda, invoked by an EventBridge Scheduler schedule: `handler(event, context)` where the
  event is the schedule's input (the stack sets `{"sdcloud": "drive"}`; a classic EventBridge rule's
  `Scheduled Event` envelope is accepted too) and `context.get_remaining_time_in_millis()` bounds
  the invocation.
- Tencent SCF, invoked by a timer trigger: `main_handler(event, context)` with the timer's event
  `{"Type": "Timer", "TriggerName": ..., "Time": ..., "Message": ...}`; SCF's context is a dict
  whose `time_limit_in_ms` bounds the invocation.

It runs the control plane's own code (the Controller and its step), not a second implementation:
each invocation is a driver of its own (its function's name and the platform's request id), takes
a run's driver lease before it reads the run, rebuilds state.db in its own folder of /tmp from the
run's journal in the bucket, takes one step a poll until the invocation's time is nearly spent, and
the journal carries what it did back to the bucket. It then parks the lease: a laptop that comes
back does not race it, and the function's next invocation continues at once (`sdcloud watch RUN
--drive` takes a run back when asked). Invocations racing for one run (a schedule's tick and its
neighbours) are several drivers: one takes the lease, the others leave the run alone.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ..events import Kind
from ..providers import functions
from ..providers.traits import every

# At most this long driving per invocation (SDCLOUD_DRIVER_SECONDS overrides): a host saves on its
# own at a reclaim notice, so a step every schedule tick (5 minutes) loses no work, and a short
# invocation keeps a month of a live run inside the functions' free tiers (docs/runs.md).
DRIVE_SECONDS = 60.0


def safety_seconds(driver: str) -> float:
    """Stop taking steps this long before the function's time runs out: a step's launch or terminate
    call, the journal's writes and the lease's renewal must fit after the last one started. The
    function's own margin (its provider's traits); the widest of them for a driver that is none."""
    functions = [t.function for t in every() if t.function is not None]
    own = [f.safety_seconds for f in functions if f.name == driver]
    return own[0] if own else max(f.safety_seconds for f in functions)


def _driver_name(event: dict) -> str:
    """The function the event came to (its platform claims it: providers/functions.py)."""
    return functions.called(event).name


def _time_left(context: Any, started: float, event: Any = None) -> Callable[[], float]:
    """Seconds the invocation has left, from the context its platform passes."""
    return functions.time_left(event, context, started)


def _store_conf() -> dict:
    """The bucket the stack deployed the function for (environment set by the stack; no secrets:
    the function signs with its own role)."""
    url = os.environ.get("SDCLOUD_STORE")
    if not url:
        raise RuntimeError("SDCLOUD_STORE is not set: the stack sets it to the run bucket's URL")
    conf: dict = {"url": url}
    for env, key in (("SDCLOUD_STORE_ENDPOINT", "endpoint_url"), ("SDCLOUD_STORE_REGION", "region"),
                     ("SDCLOUD_STORE_ADDRESSING", "addressing_style")):
        if os.environ.get(env):
            conf[key] = os.environ[env]
    return conf


def live_runs(store: Any) -> list[str]:
    """Runs the journal lists as live (drivers/active/<id>), oldest first."""
    from ..runs.records.journal import ACTIVE_INDEX

    return [o.key.rsplit("/", 1)[-1] for o in sorted(store.list(f"{ACTIVE_INDEX}/"), key=lambda o: o.key)]


def _schedule_seconds(function: str) -> float:
    """The function's schedule period (its traits): a parked lease outlives the gap to the next tick."""
    periods = [t.function.schedule_seconds for t in every() if t.function is not None and t.function.name == function]
    return float(periods[0]) if periods else 0.0


def _poll_seconds(function: str) -> float:
    """The poll of the function's own provider: the lease's term is several of them (runs/records/lease.py)."""
    polls = [t.timing.poll_seconds for t in every() if t.function is not None and t.function.name == function]
    return polls[0] if polls else 5.0


def drive_lapsed(store_conf: dict, driver: str, time_left: Callable[[], float],
                 sleep: Callable[[float], None] | None = None, home: Path | None = None) -> dict:
    """Take steps for every live run no other driver holds, while time is left. Returns what it did.

    `driver` is this invocation's name (`aws-lambda:<request id>`, runs/driver.invocation_id); a bare
    function name gets a random id. Each run's lease is taken before the run is read, so what this
    invocation acts on is the bucket's view from after it took the run; its state.db is its own (a
    warm function's /tmp is shared by its invocations) and is removed when it returns.
    """
    from ..runs.driving.controller import Controller
    from ..runs.records.lease import DriverLease, LeaseLost, function_of, invocation_id
    from ..runs.records.journal import forget, restore
    from ..runs.records.state import FINAL_RUN_STATES, StateStore
    from ..runs.records.store import open_run_store

    if not os.environ.get("SDCLOUD_HOME"):
        # Lambda and SCF give a writable /tmp only; state.db is a cache rebuilt from the journal.
        os.environ["SDCLOUD_HOME"] = tempfile.mkdtemp(prefix="sdcloud-driver-")
    sleep = sleep or time.sleep  # looked up now: a test's simulated clock moves with the polls
    home = Path(home or os.environ["SDCLOUD_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    function = function_of(driver) or driver.split(":", 1)[0]
    invocation = driver if ":" in driver else invocation_id(driver)
    store = open_run_store(store_conf)
    workdir = Path(tempfile.mkdtemp(prefix="invocation-", dir=home))
    state = StateStore(workdir / "state.db")
    report: dict = {"driver": function, "invocation": invocation, "runs": {}}
    started = time.monotonic()
    spend = float(os.environ.get("SDCLOUD_DRIVER_SECONDS", DRIVE_SECONDS))
    safety = safety_seconds(function)
    poll = _poll_seconds(function)

    def room() -> float:
        """Seconds left for steps: within the platform's limit less the safety, and this driver's own cap."""
        return min(time_left() - safety, spend - (time.monotonic() - started))

    driving = []
    for run_id in live_runs(store):
        if room() <= 0:
            break
        lease = DriverLease(store, run_id, poll, invocation)
        ctl = None
        try:  # one run's fault is that run's report, never the end of the others' steps
            if not lease.acquire():  # the lease first: the run is read under it
                report["runs"][run_id] = {"skipped": f"driven by {(lease.holder() or {}).get('worker')}"}
                continue
            before = (lease.previous or {}).get("worker")
            if restore(state, store, run_id) is None:
                lease.release()
                continue
            # Every launch and terminate is conditional on still holding the lease (the controller guards them).
            ctl = Controller(state, run_id, driver=invocation, lease=lease)
            # One record per take-over, with the figures of its moment (who had the run, its step).
            ctl.event(Kind.DRIVER_TOOK_OVER, {"driver": function, "invocation": invocation, "from": before,
                                              "step": state.get_run(run_id)["step"]})
            ctl.reconcile()
        except LeaseLost:
            report["runs"][run_id] = {"lost": "another driver took the run"}
            continue
        except Exception as exc:  # noqa: BLE001 - reported per run; the lease is handed back
            report["runs"][run_id] = {"error": _one_line(exc)}
            lease.release()
            continue
        driving.append(ctl)
        report["runs"][run_id] = {"steps": 0}
    # Every run it holds gets a step in turn (one slow run does not starve the others), one round a poll.
    live = list(driving)
    while live and room() > min(c.timing.poll_seconds for c in live):
        for ctl in list(live):
            try:
                done = ctl.guarded_step()
                report["runs"][ctl.run_id]["steps"] += 1
                if done or state.get_run(ctl.run_id)["state"] in FINAL_RUN_STATES:
                    live.remove(ctl)
                    ctl.finish_driving()
            except LeaseLost:  # another driver has the run: it acts, this one writes nothing more
                report["runs"][ctl.run_id]["lost"] = "another driver took the run"
                if ctl in live:
                    live.remove(ctl)
            except Exception as exc:  # noqa: BLE001 - this run's fault: reported, its lease handed back
                report["runs"][ctl.run_id]["error"] = _one_line(exc)
                ctl.lease.release()
                if ctl in live:
                    live.remove(ctl)
        if live:
            sleep(min(c.timing.poll_seconds for c in live))
    for ctl in live:
        # Park the lease: live for every other driver (a laptop that wakes up does not race this one),
        # and this function's next invocation continues the run at once.
        state.update_run(ctl.run_id, controller_pid=None)
        ctl.journal.flush()
        ctl.lease.park(until_next=_schedule_seconds(function))
    for ctl in driving:
        report["runs"][ctl.run_id]["state"] = state.get_run(ctl.run_id)["state"]
    state.close()
    forget(state)
    shutil.rmtree(workdir, ignore_errors=True)
    return report


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: " + ((str(exc).strip().splitlines() or [""])[0])[:300]


def _request_id(context: Any, event: Any = None) -> str | None:
    """The platform's id of this invocation (each platform reads its own context)."""
    return functions.request_id(event, context)


def handler(event: dict, context: Any = None) -> dict:
    """AWS Lambda's entry point (EventBridge Scheduler)."""
    from ..runs.records.lease import invocation_id

    started = time.monotonic()
    # Batch jobs and their cloud schedules' fires first (each job guarded: never this invocation's end).
    # Imported here, inside the guard: a batch module that cannot load leaves the runs their steps.
    try:
        from .batch_jobs import drive_guarded as drive_batch

        batch = drive_batch(event, _store_conf, _driver_name(event), _time_left(context, started, event))
    except Exception as exc:  # noqa: BLE001 - even a batch module that cannot load leaves the runs their steps
        batch = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    report = drive_lapsed(_store_conf(), invocation_id(_driver_name(event), _request_id(context, event)),
                          _time_left(context, started, event))
    return {**report, "batch": batch} if batch else report


def main_handler(event: dict, context: Any = None) -> dict:
    """Tencent SCF's entry point (timer trigger); SCF names its Python entry `main_handler` by default."""
    return handler(event, context)


if __name__ == "__main__":  # a local dry run: python -m sdcloud.driver.unattended '{"Type": "Timer"}'
    import sys

    print(json.dumps(handler(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}), indent=2))
