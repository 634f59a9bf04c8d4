"""Stopping a training run from a command (`sdcloud down`, Ctrl-C under `sdcloud up`), wherever it is driven.

A run driven by a live controller of this machine is asked to stop by SIGTERM, so that the one
process that holds its lease ends it. A run driven elsewhere (another machine, its daemon, the
cloud function) is asked through its bucket: `runs/<id>/stop.json`, which its driver reads at every
step (Controller.step) and then ends the host. Only a run that no driver holds is ended here, under
the lease taken here. Either way the host saves its checkpoint first and every instance is terminated.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..runs.records.stop_request import request

if TYPE_CHECKING:
    from ..runs.driving.controller import Controller

# How long `down` waits for a live controller of this machine to stop its run before it ends the run itself.
CONTROLLER_STOP_SECONDS = 120.0
# How long `down` waits for a driver elsewhere to act on its request: a few of its polls, and no
# more than this (a cloud function between two schedule ticks acts at its next one).
REQUEST_WAIT_POLLS = 4
MAX_REQUEST_WAIT_SECONDS = 60.0


@dataclass(frozen=True)
class Stopped:
    """What `down` did: the run's state after it, and who ends the host when it was a request."""
    state: str
    holder: str | None = None  # the driver asked through the bucket
    requested: bool = False


def stop_here(ctl: Controller, reason: str) -> None:
    """End the run from this process: the host saves, its instance is terminated, strays are swept."""
    ctl.finish_stop(reason)
    ctl.sweep_strays()


def stop_run(state: Any, run_id: str, reason: str = "stopped by sdcloud down") -> str:
    """Stop training run `run_id`, whoever drives it; its state afterwards."""
    return stop_anywhere(state, run_id, reason).state


def stop_anywhere(state: Any, run_id: str, reason: str = "stopped by sdcloud down",
                  sleep: Any = time.sleep) -> Stopped:
    """Stop training run `run_id` wherever it is driven (see the module's docstring)."""
    from ..runs.driving.background import controller_alive
    from ..runs.records.state import ACTIVE_RUN_STATES

    run = state.get_run(run_id)
    if controller_alive(run):
        os.kill(run["controller_pid"], signal.SIGTERM)
        deadline = time.time() + CONTROLLER_STOP_SECONDS
        # Until the controller has stopped the run, or is gone without doing so (then we finish it here).
        while (time.time() < deadline and state.get_run(run_id)["state"] in ACTIVE_RUN_STATES
               and controller_alive(state.get_run(run_id))):
            sleep(0.5)
    if state.get_run(run_id)["state"] not in ACTIVE_RUN_STATES:
        return Stopped(state.get_run(run_id)["state"])
    from ..runs.driving.controller import Controller

    ctl = Controller(state, run_id)
    try:
        if ctl.lease.acquire():  # no driver holds it: end it here, as its driver
            from ..runs.records.store_of import refresh

            refresh(state, ctl.store, run_id)  # the bucket's view, newer than this machine's
            if state.get_run(run_id)["state"] in ACTIVE_RUN_STATES:
                stop_here(ctl, reason)
            ctl.finish_driving()
            return Stopped(state.get_run(run_id)["state"])
        holder = str((ctl.lease.holder() or {}).get("worker") or "another driver")
        from ..runs.records.lease import this_driver

        request(ctl.store, run_id, this_driver(), reason)
        return Stopped(_wait_for_driver(state, ctl, run_id, sleep), holder, requested=True)
    finally:
        from ..providers.capabilities import Closable

        if isinstance(ctl.provider, Closable):
            ctl.provider.close()


def _wait_for_driver(state: Any, ctl: Controller, run_id: str, sleep: Any) -> str:
    """Follow the run's journal for a few of its driver's polls; the state it reached."""
    from ..runs.records.state import ACTIVE_RUN_STATES
    from ..runs.records.store_of import refresh

    limit = min(MAX_REQUEST_WAIT_SECONDS, REQUEST_WAIT_POLLS * ctl.timing.poll_seconds + 5.0)
    until = time.monotonic() + limit
    while True:
        refresh(state, ctl.store, run_id)
        now = state.get_run(run_id)["state"]
        if now not in ACTIVE_RUN_STATES or time.monotonic() >= until:
            return now
        sleep(min(1.0, ctl.timing.poll_seconds))
