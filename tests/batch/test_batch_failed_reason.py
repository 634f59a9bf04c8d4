"""A failed batch job says why: `batch list` and `batch status` (text and --json) give its reason in
one line (a worker's traceback: the error it ended with), and a local pool whose workers keep dying
names what the last one said. Fast: a submitted job's rows and a log file; no worker runs."""

from __future__ import annotations

import json

from sdcloud.cli import main

REASON = ("workers keep exiting (rc 1): Traceback (most recent call last):\n  File \"worker.py\", line 3\n"
          "OSError: the model folder /m holds no weights file; see /home/batch/b-x")


def _failed_job(tmp_path) -> str:
    from sdcloud.batch import jobs
    from sdcloud.runs.records.state import StateStore

    prompts = tmp_path / "p.txt"
    prompts.write_text("one\ntwo\n")
    res = jobs.submit(jobs.SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(prompts), workers=1,
                                         provider="local", generator="fake"))
    StateStore().update_run(res["job"], state="failed", reason=REASON)
    return res["job"]


def test_list_and_status_give_a_failed_jobs_reason_in_one_line(tmp_path, sdcloud_home, capsys):
    job = _failed_job(tmp_path)
    one = "workers keep exiting (rc 1): Traceback (most recent call last):"
    capsys.readouterr()
    assert main(["batch", "list", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["state"] == "failed" and row["reason"].startswith("workers keep exiting (rc 1)")
    assert "\n" not in row["reason"] and "OSError: the model folder /m holds no weights file" in row["reason"]
    assert one not in row["reason"]
    assert main(["batch", "list"]) == 0
    text = capsys.readouterr().out
    assert f"{job} failed: workers keep exiting" in " ".join(text.split())
    assert main(["batch", "status", job, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reason"] == row["reason"]
    assert main(["batch", "status", job]) == 0
    assert "reason" in capsys.readouterr().out


def test_a_running_job_has_no_reason(tmp_path, sdcloud_home, capsys):
    from sdcloud.runs.records.state import StateStore

    job = _failed_job(tmp_path)
    StateStore().update_run(job, state="running", reason=None)
    capsys.readouterr()
    assert main(["batch", "list", "--json"]) == 0
    assert "reason" not in json.loads(capsys.readouterr().out)[0]


def test_a_dying_workers_last_words_are_its_error(tmp_path):
    from sdcloud.batch.local_pool import _last_words

    log = tmp_path / "worker-5.log"
    log.write_text("loading\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "OSError: the model folder /m holds no weights file\n")
    assert _last_words(log) == "OSError: the model folder /m holds no weights file"
    log.write_text("loading\nthe model folder /m holds no weights file (.safetensors, .bin)\n")
    assert _last_words(log) == "the model folder /m holds no weights file (.safetensors, .bin)"
    assert _last_words(tmp_path / "absent.log") == ""
