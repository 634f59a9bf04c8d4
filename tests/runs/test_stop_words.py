"""Stop messages say what happened and end with the command that continues the run (issue 39):
`down` and `status` of a run stopped by the user, interrupted, at its budget, ended by its host
after the grace, or failed; and the host line after `down` or Ctrl-C does not call the host's save
on that stop "ended itself (saved after a reclaim notice, unattended)". Fast: rows, no training."""

from __future__ import annotations

import json

import pytest

from sdcloud.cli import main

REASONS = [
    ("stopped", "stopped by sdcloud down", "stopped by you (sdcloud down)", ""),
    ("stopped", "interrupted (Ctrl-C); checkpoint kept", "interrupted (Ctrl-C)", ""),
    ("stopped", "budget $0.5 reached; checkpoint kept in the bucket", "stopped at its budget", " --budget USD"),
    ("stopped", "its host ended itself (saved after a reclaim notice)",
     "its host ended itself after the grace, with nobody driving the run", ""),
    ("failed", "the host agent failed", "failed (the host agent failed)", ""),
]


def _run(state, rid: str, st: str, reason: str, step: int = 12) -> None:
    state.create_run(rid, "sd15-lora", {"tier": "sd15-lora", "provider": "local", "model": "tiny"}, 40, name=None)
    state.update_run(rid, state=st, reason=reason, step=step)


@pytest.mark.parametrize("st,reason,words,extra", REASONS, ids=[r[2].split()[0] + "-" + r[1][:9] for r in REASONS])
def test_status_says_what_stopped_the_run_and_how_to_continue(capsys, sdcloud_home, st, reason, words, extra):
    from sdcloud.runs.records.state import StateStore

    _run(StateStore(), "r-5700aaaa", st, reason)
    assert main(["status", "r-5700aaaa"]) == 0
    lines = capsys.readouterr().out.splitlines()
    said = [ln for ln in lines if ln.startswith("run r-5700aaaa: ")]
    assert said == [f"run r-5700aaaa: {words}; checkpoint kept at step 12; "
                    f"continue it with: sdcloud resume r-5700aaaa{extra}"], lines


def test_down_of_an_ended_run_says_what_ended_it(capsys, sdcloud_home):
    from sdcloud.runs.records.state import StateStore

    _run(StateStore(), "r-5700bbbb", "stopped", "interrupted (Ctrl-C); checkpoint kept")
    assert main(["down", "r-5700bbbb"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("run r-5700bbbb had already ended: interrupted (Ctrl-C)") and out.endswith("sdcloud resume r-5700bbbb")


def test_the_host_line_after_a_stop_does_not_say_it_ended_itself(capsys, sdcloud_home, tmp_path):
    from sdcloud.runs.records.state import StateStore
    from sdcloud_agent.store import open_store

    state = StateStore()
    bucket = (tmp_path / "bucket").resolve().as_uri()
    state.create_run("r-5700cccc", "sd15-lora", {"tier": "sd15-lora", "provider": "local", "store": bucket}, 40)
    # What the host writes after saving on the stop the user asked for: its agent cannot tell it from a notice.
    doc = {"attempt": 1, "phase": "stopped", "self_end": {"reason": "saved after a reclaim notice", "unattended": True}}
    open_store({"url": bucket}).put("runs/r-5700cccc/status.json", json.dumps(doc).encode())
    for reason in ("stopped by sdcloud down", "interrupted (Ctrl-C); checkpoint kept"):
        state.update_run("r-5700cccc", state="stopped", reason=reason, step=8)
        assert main(["status", "r-5700cccc"]) == 0
        out = capsys.readouterr().out
        assert "ended itself" not in out and "reclaim notice" not in out, out
        assert "continue it with: sdcloud resume r-5700cccc" in out
    # Where the host did end itself with nobody driving, it says so.
    state.update_run("r-5700cccc", state="stopped", reason="its host ended itself (saved after a reclaim notice)")
    assert main(["status", "r-5700cccc"]) == 0
    assert "host: ended itself (saved after a reclaim notice, unattended)" in capsys.readouterr().out


TRACEBACK = ("trainer exited with code 1; last output:\nstarting\nTraceback (most recent call last):\n"
             '  File "/srv/train.py", line 5, in load\n    raise ValueError("no images at 64 px")\n'
             "ValueError: no images at 64 px; resume with: sdcloud resume r-5700dddd")


def test_a_failed_run_gives_its_reason_in_one_line_and_the_resume_command_once(capsys, sdcloud_home):
    """status (and watch and up, which print the same summary) of a run whose trainer raised: the
    error in one line, no traceback, the resume command once; -v adds the trainer's whole output."""
    from sdcloud.runs.records.state import StateStore

    _run(StateStore(), "r-5700dddd", "failed", TRACEBACK)
    assert main(["status", "r-5700dddd"]) == 0
    out = capsys.readouterr().out
    assert "Traceback" not in out and 'File "/srv/train.py"' not in out, out
    assert out.count("sdcloud resume r-5700dddd") == 1, out
    said = [ln for ln in out.splitlines() if ln.startswith("run r-5700dddd: ")]
    assert said == ["run r-5700dddd: failed (trainer exited with code 1: ValueError: no images at 64 px); "
                    "checkpoint kept at step 12; continue it with: sdcloud resume r-5700dddd"], out
    assert main(["status", "r-5700dddd", "-v"]) == 0
    verbose = capsys.readouterr().out
    assert "Traceback (most recent call last):" in verbose and '    raise ValueError("no images at 64 px")' in verbose
    assert main(["down", "r-5700dddd"]) == 0
    down = capsys.readouterr().out
    assert len(down.strip().splitlines()) == 1 and "ValueError: no images at 64 px" in down and "Traceback" not in down


def test_a_stopped_runs_title_does_not_repeat_its_reason(capsys, sdcloud_home):
    from sdcloud.runs.records.state import StateStore

    _run(StateStore(), "r-5700eeee", "stopped", "stopped by sdcloud down; resume with: sdcloud resume r-5700eeee")
    assert main(["status", "r-5700eeee"]) == 0
    out = capsys.readouterr().out
    assert out.count("sdcloud resume r-5700eeee") == 1 and out.count("stopped by") == 1, out


@pytest.mark.parametrize("reason, line", [
    ("the host agent failed", "the host agent failed"),
    ("stopped by sdcloud down; resume with: sdcloud resume cats", "stopped by sdcloud down"),
    (TRACEBACK, "trainer exited with code 1: ValueError: no images at 64 px"),
    ("boot phase model failed; last lines of the bootstrap log:\nfetching\nerror: 403 Forbidden", "boot phase model failed: "
     "error: 403 Forbidden"),
    ("trainer exited with code 9; last output:\nKilled", "trainer exited with code 9"),
    ("", ""),
])
def test_one_line_of_a_reason(reason, line):
    from sdcloud.events import one_line

    assert one_line(reason) == line
