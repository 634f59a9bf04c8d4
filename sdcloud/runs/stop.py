"""Stopping a training run from a command (`sdcloud down`, Ctrl-C under `sdcloud up`).

A run driven by a live controller is asked to stop by SIGTERM, so that the one process that holds
its lease ends it; only a run that no controller drives (or one that did not stop in time) is
ended here. Either way the host saves its checkpoint first and every instance is terminated.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

# How long `down` waits for a live controller to stop its run before it ends the run itself.
CONTROLLER_STOP_SECONDS = 120.0


def stop_here(ctl: Any, reason: str) -> None:
    """End the run from this process: the host saves, its instance is terminated, strays are swept."""
    ctl.finish_stop(reason)
    ctl.sweep_strays()


def stop_run(state: Any, run_id: str, reason: str = "stopped by sdcloud down") -> str:
    """Stop training run `run_id`, whoever drives it; its state afterwards."""
    from .background import controller_alive
    from .controller import Controller
    from .state import ACTIVE_RUN_STATES

    run = state.get_run(run_id)
    if controller_alive(run):
        os.kill(run["controller_pid"], signal.SIGTERM)
        deadline = time.time() + CONTROLLER_STOP_SECONDS
        # Until the controller has stopped the run, or is gone without doing so (then we finish it here).
        while (time.time() < deadline and state.get_run(run_id)["state"] in ACTIVE_RUN_STATES
               and controller_alive(state.get_run(run_id))):
            time.sleep(0.5)
    if state.get_run(run_id)["state"] in ACTIVE_RUN_STATES:
        stop_here(Controller(state, run_id), reason)
    return state.get_run(run_id)["state"]
