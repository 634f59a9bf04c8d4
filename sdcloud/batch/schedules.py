"""Cron schedules for batch jobs, and the scheduler tick that submits them.

Rules (docs/batch.md):
- A schedule fires for a cron time at most once: a fire row keyed by (schedule, local wall-clock
  time) is inserted before the job is submitted, and the job id is derived from that key, so a
  scheduler killed between the two steps resubmits the same job id, which the bucket refuses twice.
- Missed times (the scheduler was down, or the previous job still ran) give exactly one catch-up
  fire: for the newest missed time, never one per missed time.
- A schedule does not overlap itself: while its last job is active, its due time waits.
- Daylight saving: cron times are wall-clock times in the schedule's zone (croniter). A time that
  does not exist (spring forward) fires at the first instant after the gap; a time that occurs twice
  (fall back) fires once, since both instants share one wall-clock key.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .. import config
from ..errors import UserError
from ..runs.records.run_state import ACTIVE_RUN_STATES

SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_schedules (
    id TEXT PRIMARY KEY,
    cron TEXT NOT NULL,
    tz TEXT NOT NULL,
    options TEXT NOT NULL,          -- JSON: the submit options (never secrets)
    paused INTEGER NOT NULL DEFAULT 0,
    after REAL NOT NULL,            -- epoch seconds: fires only for cron times after this
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS batch_fires (
    schedule_id TEXT NOT NULL,
    wall TEXT NOT NULL,             -- the cron time as local wall-clock ISO text: the once-only key
    at REAL NOT NULL,               -- the cron time, epoch seconds
    job_id TEXT NOT NULL,
    submitted INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    PRIMARY KEY (schedule_id, wall)
);
"""
ACTIVE = ACTIVE_RUN_STATES


def check_cron(expr: str, tz: str) -> ZoneInfo:
    from croniter import croniter

    if not croniter.is_valid(expr) or len(expr.split()) != 5:
        raise UserError(f"bad cron expression {expr!r}: five fields, e.g. \"0 2 * * *\"")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise UserError(f"unknown time zone {tz!r}: use an IANA name such as Europe/Berlin or UTC") from None


def wall_key(due: datetime) -> str:
    """A cron time's once-only key: its local wall-clock time to the minute (both passes of a
    fall-back hour share it)."""
    return due.replace(tzinfo=None).isoformat(timespec="minutes")


def fire_job_id(sid: str, wall: str) -> str:
    """The job id of a schedule's fire at `wall`: the same on every machine and every retry, so the
    bucket's create-only job.json refuses a second job for one cron time (docs/batch.md)."""
    return "b-" + hashlib.sha256(f"{sid}|{wall}".encode()).hexdigest()[:8]


def invoked_cron_time(at: datetime, tz: str) -> datetime:
    """The cron time a cloud scheduler's invocation at `at` stands for: `at` in the schedule's zone, to
    the minute. Both clouds invoke at the cron time itself (EventBridge Scheduler's scheduled time;
    an SCF timer's `Time`), so no cron arithmetic is needed, nor croniter in the function's package."""
    return at.astimezone(ZoneInfo(tz)).replace(second=0, microsecond=0)


class Schedules:
    def __init__(self, path: Path | str | None = None, clock: Callable[[], float] = time.time):
        self.path = Path(path or config.home() / "schedules.db")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.exists()
        self.db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        self.db.row_factory = sqlite3.Row
        if fresh:
            os.chmod(self.path, 0o600)
        self.db.executescript(SCHEMA)
        self.clock = clock

    def add(self, cron: str, tz: str, options: dict[str, Any]) -> str:
        check_cron(cron, tz)
        sid = "s-" + hashlib.sha256(f"{cron}{tz}{json.dumps(options, sort_keys=True)}{self.clock()}".encode()).hexdigest()[:8]
        now = self.clock()
        self.db.execute("INSERT INTO batch_schedules (id, cron, tz, options, after, created) VALUES (?,?,?,?,?,?)",
                        (sid, cron, tz, json.dumps(options, sort_keys=True), now, now))
        return sid

    def get(self, sid: str) -> dict[str, Any]:
        row = self.db.execute("SELECT * FROM batch_schedules WHERE id = ?", (sid,)).fetchone()
        if row is None:
            raise UserError(f"no schedule {sid!r}; see: sdcloud batch schedule list")
        return {**dict(row), "options": json.loads(row["options"])}

    def list(self) -> list[dict[str, Any]]:
        out = []
        for row in self.db.execute("SELECT * FROM batch_schedules ORDER BY created").fetchall():
            s = {**dict(row), "options": json.loads(row["options"])}
            s["next"] = None if s["paused"] else self.next_time(s).isoformat()
            last = self.db.execute("SELECT wall, job_id FROM batch_fires WHERE schedule_id = ? ORDER BY at DESC LIMIT 1",
                                   (s["id"],)).fetchone()
            s["last_fire"], s["last_job"] = (last["wall"], last["job_id"]) if last else (None, None)
            out.append(s)
        return out

    def remove(self, sid: str) -> None:
        self.get(sid)
        self.db.execute("DELETE FROM batch_schedules WHERE id = ?", (sid,))

    def set_paused(self, sid: str, paused: bool) -> None:
        self.get(sid)
        # Resuming does not catch up on the paused stretch: times before now are skipped.
        if paused:
            self.db.execute("UPDATE batch_schedules SET paused = 1 WHERE id = ?", (sid,))
        else:
            self.db.execute("UPDATE batch_schedules SET paused = 0, after = ? WHERE id = ?", (self.clock(), sid))

    # -- when -----------------------------------------------------------------------------------

    def _after(self, s: dict[str, Any]) -> float:
        last = self.db.execute("SELECT MAX(at) FROM batch_fires WHERE schedule_id = ?", (s["id"],)).fetchone()[0]
        return max(s["after"], last or 0)

    def next_time(self, s: dict[str, Any]) -> datetime:
        from croniter import croniter

        tz = ZoneInfo(s["tz"])
        return croniter(s["cron"], datetime.fromtimestamp(self._after(s), tz)).get_next(datetime)

    def due_time(self, s: dict[str, Any], now: float) -> datetime | None:
        """The newest cron time in (after, now], or None: one catch-up however many were missed."""
        from croniter import croniter

        tz = ZoneInfo(s["tz"])
        after = self._after(s)
        latest = croniter(s["cron"], datetime.fromtimestamp(now, tz)).get_prev(datetime)
        # get_prev from an exact cron instant skips that instant; take it when now is on it.
        exact = croniter(s["cron"], datetime.fromtimestamp(now - 1, tz)).get_next(datetime)
        if exact.timestamp() <= now:
            latest = exact
        return latest if latest.timestamp() > after else None

    # -- the tick ---------------------------------------------------------------------------------

    def tick(self, submit: Callable[[str, dict[str, Any]], None], job_state: Callable[[str], str | None],
             now: float | None = None) -> list[str]:
        """Submit every due schedule once. `submit(job_id, options)` must be idempotent on job_id."""
        now = self.clock() if now is None else now
        fired = []
        # First finish fires a killed scheduler recorded but did not submit (same job id).
        for row in self.db.execute("SELECT * FROM batch_fires WHERE submitted = 0").fetchall():
            try:
                s = self.get(row["schedule_id"])
            except UserError:
                continue
            self._submit(row["schedule_id"], row["wall"], row["job_id"], s["options"], submit)
            fired.append(row["job_id"])
        for s in self.list():
            if s["paused"]:
                continue
            if s["last_job"] and job_state(s["last_job"]) in ACTIVE:
                continue  # no overlap: the due time waits for the running job
            due = self.due_time(s, now)
            if due is None:
                continue
            wall = wall_key(due)
            job_id = fire_job_id(s["id"], wall)
            try:
                self.db.execute("INSERT INTO batch_fires (schedule_id, wall, at, job_id, created) VALUES (?,?,?,?,?)",
                                (s["id"], wall, due.timestamp(), job_id, now))
            except sqlite3.IntegrityError:
                # This wall-clock time already fired (the second pass of a fall-back hour): move past it.
                self.db.execute("UPDATE batch_fires SET at = MAX(at, ?) WHERE schedule_id = ? AND wall = ?",
                                (due.timestamp(), s["id"], wall))
                continue
            self._submit(s["id"], wall, job_id, s["options"], submit)
            fired.append(job_id)
        return fired

    def _submit(self, sid: str, wall: str, job_id: str, options: dict[str, Any],
                submit: Callable[[str, dict[str, Any]], None]) -> None:
        submit(job_id, options)
        self.db.execute("UPDATE batch_fires SET submitted = 1 WHERE schedule_id = ? AND wall = ?", (sid, wall))

    def fires(self, sid: str) -> list[dict[str, Any]]:
        return [dict(r) for r in self.db.execute("SELECT * FROM batch_fires WHERE schedule_id = ? ORDER BY at", (sid,))]


def systemd_units(sdcloud_bin: str) -> dict[str, str]:
    """A user service + timer that runs one scheduler tick a minute and survives reboots."""
    service = ("[Unit]\nDescription=sdcloud batch scheduler (one tick)\n\n[Service]\nType=oneshot\n"
               f"ExecStart={sdcloud_bin} scheduler run --once\n")
    timer = ("[Unit]\nDescription=sdcloud batch scheduler every minute\n\n[Timer]\nOnCalendar=*-*-* *:*:00\n"
             "Persistent=true\n\n[Install]\nWantedBy=timers.target\n")
    return {"sdcloud-scheduler.service": service, "sdcloud-scheduler.timer": timer}


def crontab_line(sdcloud_bin: str) -> str:
    return f"* * * * * {sdcloud_bin} scheduler run --once >> $HOME/.sdcloud/scheduler.log 2>&1"


def utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()
