"""A run's controller as a background process (`sdcloud up --detach`), and whether one is alive."""

from __future__ import annotations

import subprocess
import sys

from ... import config
from ..records.alive import controller_alive  # noqa: F401 - the controller's names import it from here


def detach(run_id: str) -> int:
    """Start the controller for `run_id` in the background; its log goes to $SDCLOUD_HOME/runs/<id>.log."""
    log_dir = config.home() / "runs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"{run_id}.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "sdcloud.runs.driving.controller", run_id], stdout=log,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    return proc.pid
