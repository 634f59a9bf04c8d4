"""What `batch schedule remove`, `pause` and `resume` changed, in one line each: which schedule and
where it is (this machine's timer, schedules.py, or a cloud's scheduler, cloud_schedules.py).
A module of its own because it needs both, and cloud_schedules already imports schedules."""

from __future__ import annotations

from ..errors import UserError
from . import cloud_schedules
from .schedules import Schedules


def remove_said(sid: str, local: Schedules | None = None) -> str:
    """Remove schedule `sid` from this machine's timer or from the cloud that has it; what was removed."""
    local = local or Schedules()
    if any(s["id"] == sid for s in local.list()):
        s = local.get(sid)
        local.remove(sid)
        return f"removed {sid} ({s['cron']} in {s['tz']}) from this machine's timer; it submits no more jobs"
    gone = cloud_schedules.remove(sid)
    if gone is None:
        raise UserError(f"no schedule {sid!r}; see: sdcloud batch schedule list")
    return f"removed {sid}: the {gone['kind']} {gone['name']} on {gone['provider']}; it submits no more jobs"


def set_paused_said(sid: str, paused: bool, local: Schedules | None = None) -> str:
    """Pause or resume schedule `sid`, on this machine's timer or on the cloud's scheduler that has it;
    which, where and what changed. Neither catches up on the times it was paused."""
    local = local or Schedules()
    if not any(s["id"] == sid for s in local.list()):
        return _cloud_paused_said(sid, paused)
    before = local.get(sid)
    where = f"{sid} ({before['cron']} in {before['tz']}) on this machine's timer"
    if bool(before["paused"]) == paused:
        return f"{where} was already {'paused' if paused else 'running'}; nothing changed"
    local.set_paused(sid, paused)
    if paused:
        return f"paused {where}; it submits no jobs until: sdcloud batch schedule resume {sid}"
    nxt = next((s["next"] for s in local.list() if s["id"] == sid), None)
    return f"resumed {where}; the times missed while paused are skipped, next at {nxt}"


def _cloud_paused_said(sid: str, paused: bool) -> str:
    changed = cloud_schedules.set_paused(sid, paused)
    if changed is None:
        raise UserError(f"no schedule {sid!r}; see: sdcloud batch schedule list")
    where = f"{sid} (the {changed['kind']} {changed['name']} on {changed['provider']})"
    if changed["was_paused"] == paused:
        return f"{where} was already {'paused' if paused else 'running'}; nothing changed"
    if paused:
        return f"paused {where}; the cloud submits no jobs until: sdcloud batch schedule resume {sid}"
    return f"resumed {where}; the times missed while paused are skipped, it fires at its next cron time"
