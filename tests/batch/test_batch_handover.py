"""A cloud batch job whose laptop went away is finished by the cloud driver.

The laptop submits and drives a job on a cloud (the fleet test's in-process cloud), holding the
job's driver lease and writing its rows to the bucket each step; then it is gone without a word
(no release: as after SIGKILL or a closed lid). While its lease lasts the function leaves the job
alone; after it lapses, the handler, from an empty home, relaunches the reclaimed host, ends the
hosts once the items are done and finishes the job, which one record in the bucket then shows.
A job whose one step raises is reported and does not stop another job's step."""

from __future__ import annotations

import json
import time


from sdcloud.batch.controller import BatchController
from sdcloud.batch.journal import Carried
from sdcloud.fleet.lifecycle import Timing
from sdcloud.runs.records.state import StateStore

from tests.batch.clouds.test_batch_cloud import RecordingCloud, _submit
from tests.batch.test_batch_controller import _finish


def test_the_cloud_driver_finishes_a_job_whose_laptop_went_away(tmp_path, monkeypatch):
    from sdcloud.runs.records import lease as driver_mod
    from sdcloud.driver import unattended

    monkeypatch.setattr(driver_mod, "MIN_LEASE_SECONDS", 1.0)  # a minute in production
    job, store = _submit(tmp_path, "aws", prompts=6, workers=2)
    cloud = RecordingCloud("aws")
    laptop = BatchController(StateStore(), job, provider=cloud, timing=Timing(0.1, 60, 60))
    carried = Carried.of(laptop)
    carried.take()
    laptop.state.update_run(job, state="running")
    laptop.step()
    carried.save()
    assert len(cloud.live()) == 2 and store.list("drivers/batch/") != []
    del laptop, carried  # gone, its lease not handed back

    monkeypatch.setattr("sdcloud.providers.get_provider", lambda name, **kw: cloud)
    monkeypatch.setenv("SDCLOUD_STORE", store.url)
    monkeypatch.setenv("SDCLOUD_DRIVER_SECONDS", "1")
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "fn-0"))
    first = unattended.handler({"sdcloud": "drive"})["batch"]["jobs"][job]
    assert first["skipped"].startswith("driven by "), first  # the laptop's lease still runs
    time.sleep(1.2)
    cloud.reclaim(cloud.live()[0].id)
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "fn-1"))
    second = unattended.handler({"sdcloud": "drive"})["batch"]["jobs"][job]
    assert second["state"] == "running" and len(cloud.live()) == 2, second  # the reclaimed host replaced
    _finish(store, job, 6)
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "fn-2"))
    third = unattended.handler({"sdcloud": "drive"})["batch"]["jobs"][job]
    assert third["state"] == "succeeded" and cloud.live() == [] and store.list("drivers/batch/") == []
    snap = json.loads(store.get(f"batch/{job}/journal.json"))
    kinds = [e["kind"] for e in snap["events"]]
    assert kinds.count("batch-succeeded") == 1 and kinds.count("driver-took-over") == 2, kinds
    assert [a["end_reason"] for a in snap["attempts"]].count("preempted") == 1


def test_one_jobs_failing_step_is_reported_and_the_others_go_on(tmp_path, monkeypatch):
    from sdcloud.batch import journal
    from sdcloud.driver import batch_jobs as batch_unattended
    from sdcloud.driver import unattended

    good, store = _submit(tmp_path, "aws", prompts=2, workers=1)
    bad, _ = _submit(tmp_path, "aws", prompts=2, workers=1)
    state = StateStore()
    for job in (good, bad):
        journal.save(state, store, job)
    real = batch_unattended.step_job

    def step(store_, job_id, *a, **kw):
        if job_id == bad:
            raise RuntimeError("a provider's API answered nonsense")
        return real(store_, job_id, *a, **kw)

    monkeypatch.setattr(batch_unattended, "step_job", step)
    monkeypatch.setattr("sdcloud.providers.get_provider", lambda name, **kw: RecordingCloud("aws"))
    monkeypatch.setenv("SDCLOUD_STORE", store.url)
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "fn"))
    jobs = unattended.handler({"sdcloud": "drive"})["batch"]["jobs"]
    assert "a provider's API answered nonsense" in jobs[bad]["error"]
    assert jobs[good]["state"] == "running" and jobs[good]["hosts"] == 1
