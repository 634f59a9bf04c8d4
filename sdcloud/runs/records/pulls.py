"""Where a run's or a batch job's files may be pulled: a new or empty folder, or one that an earlier
pull of the same run or job filled; anything else only with --force.

The earlier pulls are events in the state store (kind `Kind.PULLED`, with the folder's absolute path), not
a marker file in the folder, so that the folder holds the run's files and nothing else.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import UserError
from ...events import Kind

PULLED = Kind.PULLED


def _pulled_into(state, run_id: str) -> set[str]:
    return {str(ev["data"].get("dir")) for ev in state.events(run_id) if ev["kind"] is Kind.PULLED}


def check_destination(state, run_id: str, dest: Path, force: bool, what: str) -> None:
    """Refuse (exit 2, one line) a folder with files in it that is not an earlier pull of `run_id`.

    `what` names the thing in the message ("run r-..." or "batch job b-...").
    """
    if force or not dest.exists():
        return
    if not dest.is_dir():
        raise UserError(f"{dest} is a file, not a folder; name a new or empty folder")
    if not any(dest.iterdir()) or str(dest.resolve()) in _pulled_into(state, run_id):
        return
    raise UserError(f"{dest} is not empty and holds no earlier pull of {what}: name a new or empty folder, "
                    f"or pass --force to write into it (files of the same name are replaced)")


def record(state, run_id: str, dest: Path) -> None:
    """Remember the folder, so that the next pull of the same run may refresh it."""
    path = str(dest.resolve())
    if path not in _pulled_into(state, run_id):
        state.event(run_id, Kind.PULLED, {"dir": path})
