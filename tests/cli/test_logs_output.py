"""`sdcloud logs`: one time stamp a line, the trainer's protocol in plain words, libraries' warnings
only with -v (issue 23). Fast: the run's bucket is a folder written by the test."""

from __future__ import annotations

import json
import re
import time

from sdcloud.cli import main

STAMP = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}")


def _run_with_log(tmp_path) -> str:
    from sdcloud.runs.records.state import StateStore

    bucket = tmp_path / "bucket"
    StateStore().create_run("r-0000cafe", "sd15-lora", {"tier": "sd15-lora", "provider": "local",
                                                        "store": bucket.as_uri()}, 20)
    base = time.mktime((2026, 12, 1, 10, 0, 0, 0, 0, -1))

    def at(sec: int) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(base + sec)) + ",250"

    logs = bucket / "runs" / "r-0000cafe" / "logs"
    logs.mkdir(parents=True)
    (logs / "attempt-1.log").write_text("\n".join([
        f"{at(1)} INFO sdcloud_agent: starting trainer: python -m sdcloud_agent.trainers.builtin",
        f"{at(2)} INFO sdcloud_agent.trainer: /venv/lib/python3.11/site-packages/diffusers/utils/deprecation_utils.py:18: "
        "FutureWarning: `upcast_vae` is deprecated",
        f"{at(2)} INFO sdcloud_agent.trainer:   deprecate(\"upcast_vae\", \"1.0.0\", deprecation_message)",
        f"{at(2)} INFO sdcloud_agent.trainer: UserWarning: TypedStorage is deprecated",
        f'{at(3)} INFO sdcloud_agent.trainer: SDCLOUD_STEP {{"step": 10, "loss": 0.1234567}}',
        f'{at(3)} INFO sdcloud_agent.trainer: SDCLOUD_CHECKPOINT {{"step": 10, "path": "/w/ckpt/checkpoint-10"}}',
        f"{at(4)} WARNING sdcloud_agent: upload of checkpoint 10 retried",
        f'{at(5)} INFO sdcloud_agent.trainer: SDCLOUD_DONE {{"step": 20}}',
        "Traceback (most recent call last):",
    ]) + "\n")
    return "r-0000cafe"


def test_logs_print_one_stamp_a_line_protocol_in_words_and_no_library_warnings(capsys, monkeypatch, tmp_path):
    from sdcloud import render

    monkeypatch.setattr(render, "VERBOSITY", 0)
    run = _run_with_log(tmp_path)
    assert main(["logs", run]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines and all(len(STAMP.findall(line)) == 1 for line in lines), out
    assert "SDCLOUD_" not in out
    assert "checkpoint step 10 saved" in out and "trainer finished at step 20" in out
    assert "Warning" not in out and "deprecate(" not in out
    assert "upload of checkpoint 10 retried" in out  # sdcloud's own warnings stay
    assert "Traceback (most recent call last):" in out  # a line after a warning's source is not one
    # --steps adds the per-step lines, in words too.
    assert main(["logs", run, "--steps"]) == 0
    assert "step 10, loss 0.1235" in capsys.readouterr().out

    # -v: the host's lines as it wrote them (still one stamp), warnings included.
    assert main(["logs", run, "-v"]) == 0
    out = capsys.readouterr().out
    assert 'SDCLOUD_CHECKPOINT {"step": 10' in out and "FutureWarning: `upcast_vae`" in out and "deprecate(" in out
    assert all(len(STAMP.findall(line)) == 1 for line in out.splitlines())


def test_logs_json_keeps_the_raw_line_and_says_its_kind(capsys, monkeypatch, tmp_path):
    from sdcloud import render

    monkeypatch.setattr(render, "VERBOSITY", 0)
    run = _run_with_log(tmp_path)
    assert main(["logs", run, "--json", "--steps"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    kinds = {r["text"].split(": ", 1)[-1][:20]: r["kind"] for r in records if r["source"] == "attempt-1"}
    assert sorted(set(kinds.values())) == ["checkpoint", "done", "log", "step"]
    assert any(r["text"].startswith("SDCLOUD_CHECKPOINT", r["text"].index("trainer: ") + 9)
               for r in records if r["kind"] == "checkpoint")


def test_every_protocol_line_reads_in_words_and_library_notes_need_v(capsys, monkeypatch, tmp_path, sdcloud_home):
    """Issue 39: SDCLOUD_START and SDCLOUD_OOM in words, a tag without words and diffusers' float32
    note only under -v."""
    from sdcloud import render
    monkeypatch.setattr(render, "VERBOSITY", 0)
    run = _run_with_log(tmp_path)
    log = tmp_path / "bucket" / "runs" / run / "logs" / "attempt-2.log"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.mktime((2026, 12, 1, 10, 0, 9, 0, 0, -1))))
    log.write_text("\n".join([
        f"{stamp},100 INFO sdcloud_agent.trainer: There are modules in AutoencoderKL that should be kept in float32: []. "
        "Casting directly with `to()` can lead to inconsistent results",
        f'{stamp},200 INFO sdcloud_agent.trainer: SDCLOUD_START {{"step": 10, "total_steps": 20, '
        '"resumed_from": "/w/ckpt/checkpoint-10", "recipe": {"optimizer": "adamw"}}',
        f'{stamp},300 INFO sdcloud_agent.trainer: SDCLOUD_OOM {{"step": 12, "peak_gb": 21.5, "total_gb": 22.0, "error": "x"}}',
        f'{stamp},400 INFO sdcloud_agent.trainer: SDCLOUD_FUTURE {{"a": 1}}',
    ]) + "\n")
    assert main(["logs", run]) == 0
    out = capsys.readouterr().out
    assert "SDCLOUD_" not in out and "float32" not in out, out
    assert "trainer started at step 10 of 20 (resumed from its checkpoint)" in out
    assert "out of GPU memory at step 12 (peak 21.5 of 22.0 GB)" in out
    assert main(["logs", run, "-v"]) == 0
    out = capsys.readouterr().out
    assert "SDCLOUD_FUTURE" in out and "float32" in out and "SDCLOUD_START" in out
