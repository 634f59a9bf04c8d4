"""`batch cancel` counts the hosts the cancel ended, whoever ended them (issue 46): a live driver ends
its own workers as soon as it sees the cancel, and the count taken after it said "0 hosts ended" for
a job with two live workers."""

from __future__ import annotations

import time

from sdcloud.cli import main
from tests.batch.test_batch_follow_up import _submit


def _two_live_workers(job: str) -> None:
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    for n in (1, 2):
        state.add_attempt(job, n, "local", f"tok{n}", region="local", zone="local", instance_type="local")
        state.update_attempt(job, n, state="running", start=time.time(), instance_id=f"pid-99999{n}")
    state.update_run(job, state="running")


def _driver_ends_them(job: str) -> None:
    """What the job's live driver does on the cancel: it ends its workers itself."""
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    for a in state.attempts(job):
        state.update_attempt(job, a.n, state="ended", end=time.time(), end_reason="cancelled")


def test_hosts_its_driver_ended_on_the_cancel_are_counted(tmp_path, sdcloud_home):
    from sdcloud.batch import jobs

    job = _submit(tmp_path, workers=2)
    _two_live_workers(job)
    live = jobs.open_hosts(job)
    assert live == {1, 2}
    _driver_ends_them(job)
    assert jobs.end_hosts(job, wait_s=0, open_before=live) == 2


def test_batch_cancel_says_two_hosts_ended_for_two_live_workers(tmp_path, sdcloud_home, capsys, monkeypatch):
    from sdcloud.batch import jobs

    job = _submit(tmp_path, workers=2)
    _two_live_workers(job)
    real_cancel = jobs.cancel

    def cancel_seen_by_its_driver(job_id, **kw):
        out = real_cancel(job_id, **kw)
        _driver_ends_them(out["job"])
        return out

    monkeypatch.setattr(jobs, "cancel", cancel_seen_by_its_driver)
    capsys.readouterr()
    assert main(["batch", "cancel", job]) == 0
    out = capsys.readouterr().out
    assert f"{job}: cancelled (was running); 2 hosts ended" in out, out
