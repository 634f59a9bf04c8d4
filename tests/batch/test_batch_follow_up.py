"""Following a batch job up as a user does (issue 39): `batch verify` says incomplete for a job that
has not finished and FAILED only for a finished job whose images are not each there once; `batch
watch` notices a dead driver as `watch` does; `resume JOB` keeps the worker its dead driver left
running instead of starting a second one beside it. Local provider, the fake generator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sdcloud.cli import main


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        rc = main(list(args))
    except SystemExit as exc:  # verify and watch end with their own exit codes
        rc = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return rc, out.out, out.err


def _submit(tmp_path, n: int = 4, workers: int = 1, delay: float = 0.0) -> str:
    from sdcloud.batch import jobs

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"a lighthouse at dusk, take {i}\n" for i in range(n)))
    return jobs.submit(jobs.SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(prompts), workers=workers,
                                          provider="local", generator="fake", fake_delay=delay))["job"]


def _wait(pred, timeout: float, what: str):
    until = time.time() + timeout
    while time.time() < until:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_verify_says_incomplete_until_the_job_has_finished(capsys, tmp_path, sdcloud_home):
    from sdcloud.batch import jobs

    job = _submit(tmp_path)
    rc, out, err = _cli(capsys, "batch", "verify", job)
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert "incomplete: 0/4 items" in err and "FAILED" not in err and f"sdcloud batch watch {job}" in err
    rc, out, _ = _cli(capsys, "batch", "verify", job, "--json")
    assert rc == 2 and json.loads(out)["verdict"] == "incomplete"

    jobs.run_local(job, ttl=5.0, poll=0.1)
    rc, out, err = _cli(capsys, "batch", "verify", job)
    assert rc == 0 and out.startswith("ok: 4/4 items"), (out, err)

    # A finished job whose image is gone: FAILED, exit 1.
    store = jobs.job_store(jobs.find_job(job))
    key = next(o.key for o in store.list(f"batch/{job}/images/"))
    store.delete(key)
    rc, out, _ = _cli(capsys, "batch", "verify", job)
    assert rc == 1 and out.startswith("FAILED: 4/4 items, 3/4 images")


def test_verify_of_a_cancelled_job_is_incomplete_not_failed(capsys, tmp_path, sdcloud_home):
    import threading

    from sdcloud.batch import jobs

    job = _submit(tmp_path, n=8, delay=0.3)
    pool = threading.Thread(target=jobs.run_local, args=(job,), kwargs={"ttl": 5.0, "poll": 0.1})
    pool.start()
    _wait(lambda: jobs.progress(job)["items_done"] >= 2, 60, "two items")
    rc, out, err = _cli(capsys, "batch", "cancel", job)
    pool.join(60)
    assert rc == 0 and out.startswith(f"{job}: cancelled (was running)") and "host" in out, out
    rc, out, err = _cli(capsys, "batch", "verify", job)
    assert rc == 2 and err.count("\n") == 1 and "incomplete:" in err and "cancelled before its last item" in err
    # The hosts were ended by the cancel, and the cost report says so.
    rc, out, _ = _cli(capsys, "cost", "report", job, "--format", "json")
    ends = {a["end_reason"] for a in json.loads(out)["runs"][0]["attempts"]}
    assert ends == {"cancelled"}, ends


def test_batch_watch_notices_a_dead_driver(capsys, tmp_path, sdcloud_home):
    from sdcloud.runs.records.state import StateStore

    job = _submit(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    StateStore().update_run(job, state="running", controller_pid=dead.pid)
    rc, out, err = _cli(capsys, "batch", "watch", job, "--interval", "0.05")
    assert rc == 4, err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln[0].isdigit()]
    assert len(lines) == 1 and lines[0].startswith("no controller") and f"sdcloud resume {job}" in lines[0], err


@pytest.mark.slow
def test_resume_keeps_the_worker_a_dead_driver_left_running(capsys, tmp_path, sdcloud_home):
    from sdcloud.batch import jobs
    from sdcloud.runs.records.state import StateStore

    job = _submit(tmp_path, n=6, workers=1, delay=0.4)
    driver = jobs.detach(job)
    state = StateStore()
    worker = _wait(lambda: next((int(a.instance_id.removeprefix("pid-")) for a in state.attempts(job)), None), 60,
                   "the first worker")
    os.kill(driver, signal.SIGKILL)  # the driver dies; its worker (a session of its own) carries on
    _wait(lambda: subprocess.run(["ps", "-o", "stat=", "-p", str(driver)], capture_output=True, text=True)
          .stdout.strip() in ("", "Z"), 10, "the driver to die")
    assert jobs.progress(job)["items_done"] < 6, "the job finished before its driver was killed: make it longer"
    rc, out, err = _cli(capsys, "resume", job)
    assert rc == 0, err
    events = [e for e in state.events(job)]
    adopted = [e for e in events if e["kind"] == "worker-adopted"]
    assert [e["data"]["pid"] for e in adopted] == [worker]
    # Never two hosts for the one worker slot: the job's attempts do not overlap in time.
    spans = sorted((a.start, a.end) for a in state.attempts(job))
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])), spans
    p = jobs.progress(job)
    assert p["state"] == "succeeded" and p["images_done"] == 6
    rc, out, _ = _cli(capsys, "batch", "verify", job)
    assert rc == 0 and out.startswith("ok: 6/6 items")
