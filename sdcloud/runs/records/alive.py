"""Whether a run's recorded controller process is alive on this machine (a detached `up`, a `watch
--drive`): status, down and the store's read-back ask it, the driver's background start records it."""

from __future__ import annotations

import os


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
