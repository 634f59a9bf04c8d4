"""A run's controller as a background process (`sdcloud up --detach`), and whether one is alive."""

from __future__ import annotations

import os
import subprocess
import sys

from ... import config


def controller_alive(run: dict) -> bool:
    """Whether the run's recorded controller process is alive here (and is sdcloud, not a reused pid)."""
    pid = run.get("controller_pid")
    if not pid or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
        with open(f"/proc/{pid}/stat") as f:
            zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        return not zombie and (b"sdcloud" in cmd)
    except OSError:
        return False


def detach(run_id: str) -> int:
    """Start the controller for `run_id` in the background; its log goes to $SDCLOUD_HOME/runs/<id>.log."""
    log_dir = config.home() / "runs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"{run_id}.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "sdcloud.runs.driving.controller", run_id], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    return proc.pid
