"""Batch schedules: each cron time fires once (across restarts), one catch-up for missed times, no overlap, DST."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from sdcloud.batch.schedules import Schedules, crontab_line, systemd_units
from sdcloud.errors import UserError

BERLIN = ZoneInfo("Europe/Berlin")


def at(y, mo, d, h, mi, tz=BERLIN) -> float:
    return datetime(y, mo, d, h, mi, tzinfo=tz).timestamp()


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Jobs:
    """Records submissions; idempotent on job id like the real submit (the bucket refuses a second job.json)."""

    def __init__(self):
        self.submitted: list[str] = []
        self.states: dict[str, str] = {}

    def submit(self, job_id, options):
        if job_id not in self.states:
            self.submitted.append(job_id)
            self.states[job_id] = "running"

    def state(self, job_id):
        return self.states.get(job_id)

    def finish_all(self):
        self.states = {k: "succeeded" for k in self.states}


def _walk(s: Schedules, clock: Clock, jobs: Jobs, until: float, step: float = 60.0, finish: bool = True) -> list[str]:
    fired = []
    while clock.t < until:
        clock.t += step
        fired += s.tick(jobs.submit, jobs.state)
        if finish:
            jobs.finish_all()
    return fired


def test_fires_once_per_cron_time_and_survives_a_restart(tmp_path):
    clock = Clock(at(2026, 6, 1, 0, 0))
    db = tmp_path / "s.db"
    s = Schedules(db, clock)
    sid = s.add("0 2 * * *", "Europe/Berlin", {"tier": "batch-sd15"})
    jobs = Jobs()
    assert _walk(s, clock, jobs, at(2026, 6, 1, 1, 59)) == []
    fired = _walk(s, clock, jobs, at(2026, 6, 1, 3, 0))
    assert len(fired) == 1
    # A scheduler restart (a new process, same database) at 02:30 does not fire 02:00 again.
    s2 = Schedules(db, clock)
    assert _walk(s2, clock, jobs, at(2026, 6, 2, 1, 0)) == []
    assert len(_walk(s2, clock, jobs, at(2026, 6, 2, 2, 5))) == 1
    assert [f["wall"] for f in s2.fires(sid)] == ["2026-06-01T02:00", "2026-06-02T02:00"]


def test_a_missed_window_gives_exactly_one_catch_up(tmp_path):
    clock = Clock(at(2026, 6, 1, 0, 0))
    s = Schedules(tmp_path / "s.db", clock)
    sid = s.add("0 * * * *", "UTC", {})
    jobs = Jobs()
    clock.t = at(2026, 6, 1, 7, 30)  # the scheduler was down for seven hourly times
    assert len(s.tick(jobs.submit, jobs.state)) == 1
    jobs.finish_all()
    assert s.tick(jobs.submit, jobs.state) == []
    assert [f["wall"] for f in s.fires(sid)] == ["2026-06-01T05:00"], "the newest missed time, once"


def test_no_overlap_the_due_time_waits_for_the_running_job(tmp_path):
    clock = Clock(at(2026, 6, 1, 0, 0))
    s = Schedules(tmp_path / "s.db", clock)
    s.add("*/10 * * * *", "UTC", {})
    jobs = Jobs()
    fired = _walk(s, clock, jobs, at(2026, 6, 1, 3, 0), finish=False)  # the first job never ends
    assert len(fired) == 1
    jobs.finish_all()
    clock.t += 60
    assert len(s.tick(jobs.submit, jobs.state)) == 1, "one catch-up once the running job ended"


def test_a_fire_recorded_but_not_submitted_is_submitted_once_after_a_crash(tmp_path):
    clock = Clock(at(2026, 6, 1, 1, 59))
    db = tmp_path / "s.db"
    s = Schedules(db, clock)
    s.add("0 2 * * *", "UTC", {})
    clock.t = at(2026, 6, 1, 2, 0, ZoneInfo("UTC"))

    def crash(job_id, options):
        raise KeyboardInterrupt  # the scheduler dies between recording the fire and submitting
    with pytest.raises(KeyboardInterrupt):
        s.tick(crash, lambda j: None)
    jobs = Jobs()
    s2 = Schedules(db, clock)
    first = s2.tick(jobs.submit, jobs.state)
    assert len(first) == 1 and s2.tick(jobs.submit, jobs.state) == [] and len(jobs.submitted) == 1


def test_daylight_saving_spring_forward_and_fall_back(tmp_path):
    clock = Clock(at(2026, 3, 28, 12, 0))
    s = Schedules(tmp_path / "s.db", clock)
    sid = s.add("30 2 * * *", "Europe/Berlin", {})
    jobs = Jobs()
    # 29 March 2026: 02:00-03:00 does not exist in Berlin; the 02:30 run happens once, at 03:00.
    _walk(s, clock, jobs, at(2026, 3, 30, 12, 0), step=300)
    walls = [f["wall"] for f in s.fires(sid)]
    assert walls == ["2026-03-29T03:00", "2026-03-30T02:30"]
    # 25 October 2026: 02:30 happens twice (CEST, then CET); the schedule runs once.
    clock.t = at(2026, 10, 24, 12, 0)
    s.set_paused(sid, True)
    s.set_paused(sid, False)  # resume: no catch-up for the paused months
    assert s.tick(jobs.submit, jobs.state) == []
    _walk(s, clock, jobs, at(2026, 10, 26, 12, 0), step=300)
    walls = [f["wall"] for f in s.fires(sid)][2:]
    assert walls == ["2026-10-25T02:30", "2026-10-26T02:30"]


def test_paused_schedule_does_not_fire_and_bad_input_is_refused(tmp_path):
    clock = Clock(at(2026, 6, 1, 0, 0))
    s = Schedules(tmp_path / "s.db", clock)
    sid = s.add("0 * * * *", "UTC", {})
    s.set_paused(sid, True)
    jobs = Jobs()
    assert _walk(s, clock, jobs, at(2026, 6, 1, 5, 0)) == []
    with pytest.raises(UserError, match="bad cron"):
        s.add("0 25 * * *", "UTC", {})
    with pytest.raises(UserError, match="unknown time zone"):
        s.add("0 2 * * *", "Nowhere/Else", {})
    s.remove(sid)
    assert s.list() == []
    assert (tmp_path / "s.db").stat().st_mode & 0o777 == 0o600


def test_install_units_and_crontab_line():
    units = systemd_units("/usr/bin/sdcloud")
    assert "ExecStart=/usr/bin/sdcloud scheduler run --once" in units["sdcloud-scheduler.service"]
    assert "Persistent=true" in units["sdcloud-scheduler.timer"]
    assert crontab_line("/usr/bin/sdcloud").startswith("* * * * * /usr/bin/sdcloud scheduler run --once")
