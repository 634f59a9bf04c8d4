"""Who holds sdcloud's database: one line for a `state.db` another sdcloud has held past the wait
(LOCK_WAIT_S), instead of sqlite's "database is locked" traceback (cli.main says it)."""

from __future__ import annotations

import os
from pathlib import Path

from ... import config

# How long a command waits for another sdcloud that holds the database (a write in progress) before it
# says so in one line instead of going on.
LOCK_WAIT_S = 30.0


def holders(path: Path) -> list[int]:
    """The other processes of this machine that have `path` (or its -wal/-shm) open: who holds a lock on
    it, as far as /proc tells (an empty list where there is no /proc, or nothing else has it open)."""
    names = {str(path), f"{path}-wal", f"{path}-shm"}
    found = []
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if any(os.readlink(fd) in names for fd in (entry / "fd").iterdir()):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def locked_message(path: Path | None = None) -> str:
    """One line for a database another sdcloud has held past LOCK_WAIT_S: which file, and who holds it."""
    path = path or config.home() / "state.db"
    pids = holders(path)
    who = f"another sdcloud (process {', '.join(map(str, pids))})" if pids else "another sdcloud process"
    return (f"{path} is locked: {who} has held it for over {LOCK_WAIT_S:g} s; wait for it to finish "
            "(sdcloud status shows the runs being driven) and try again")


