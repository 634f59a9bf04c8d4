"""What the bad-input ratchet (test_bad_inputs.py) cannot show with one command: a database another
sdcloud holds, two `up --name` at once, a speeds row written with text for a rate, a name with a
terminal escape already in an older state.db, secrets in errors, and the bounds of a recorded rate."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from sdcloud.cli import main
from sdcloud.config import redact
from sdcloud.names import check_name, strip_controls
from sdcloud.runs.records import state as state_mod
from sdcloud.runs.records.state import StateStore


def _one_line(capsys, code: int, needle: str) -> str:
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and needle in err, err
    assert "Traceback" not in err
    return err


def test_a_state_db_held_past_the_wait_is_one_line_naming_the_holder(sdcloud_home, capsys, monkeypatch):
    StateStore().close()  # the file exists, as on any machine that ran sdcloud once
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys, time\n"
         "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
         "db.execute('BEGIN EXCLUSIVE'); print('held', flush=True); time.sleep(60)", str(sdcloud_home / "state.db")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(state_mod, "LOCK_WAIT_S", 0.3)  # the 30 s wait, shortened
        started = time.monotonic()
        err = _one_line(capsys, main(["speeds", "add", "--gpu", "L40S", "--tier", "sd15-lora", "--rate", "3"]), "is locked")
        assert f"process {holder.pid}" in err and "another sdcloud" in err
        assert time.monotonic() - started < 10
    finally:
        holder.kill()
        holder.wait()


_CLAIM = """
import os, sys, time
from sdcloud.errors import UserError
from sdcloud.runs.records.state import StateStore
state = StateStore()
while time.time() < float(sys.argv[1]):
    time.sleep(0.001)
try:
    state.create_run(sys.argv[2], "sd15-lora", {}, 10, "same")
    print("created")
except UserError as exc:
    print("refused", exc)
"""


def test_two_runs_claiming_one_name_at_once_make_one_run(sdcloud_home):
    StateStore().close()
    at = time.time() + 2.0  # both processes past their imports, then released together
    procs = [subprocess.Popen([sys.executable, "-c", _CLAIM, str(at), f"r-0000000{i}"], stdout=subprocess.PIPE,
                              text=True, env=os.environ) for i in range(2)]
    outs = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert outs[0] == "created" and outs[1].startswith("refused") and "already the name of" in outs[1], outs
    assert [r["name"] for r in StateStore().list_runs()] == ["same"]


def test_a_finished_run_leaves_its_name_free(sdcloud_home):
    state = StateStore()
    state.create_run("r-00000001", "sd15-lora", {}, 10, "again")
    state.update_run("r-00000001", state="succeeded")
    state.create_run("r-00000002", "sd15-lora", {}, 10, "again")
    assert state.get_run("again")["id"] == "r-00000002"


def _speeds_row_with_text_rate(home) -> None:
    state = StateStore()
    state.close()
    db = sqlite3.connect(home / "state.db")
    db.execute("INSERT INTO speeds (origin, provider, instance_type, gpu, gpu_count, tier, trainer, recipe, rate, note, "
               "time, restart_s) VALUES ('recorded', '', '', 'L40S', 1, 'sd15-lora', '', '', 'fast', '', 1, 'soon')")
    db.commit()
    db.close()


@pytest.mark.parametrize("argv", [["speeds"], ["speeds", "--json"], ["speeds", "export"],
                                  ["offers", "--tier", "sd15-lora", "--spot", "--limit", "3"]])
def test_a_speeds_row_with_text_for_a_rate_is_survived(sdcloud_home, capsys, argv):
    _speeds_row_with_text_rate(sdcloud_home)
    code = main(argv)
    got = capsys.readouterr()
    assert code == 0 and "Traceback" not in got.err, got.err


def test_status_never_prints_an_escape_an_older_version_let_into_a_name(sdcloud_home, capsys):
    state = StateStore()
    state.create_run("r-0000abcd", "sd15-lora", {"tier": "sd15-lora", "provider": "local"}, 10)
    state.close()
    db = sqlite3.connect(sdcloud_home / "state.db")
    db.execute("UPDATE runs SET name = ? WHERE id = 'r-0000abcd'", ("\x1b[2J\x1b[31mevil\nname",))
    db.commit()
    db.close()
    for argv in (["status", "--wide"], ["status"]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "evil" in out and "\x1b" not in out and "\r" not in out, repr(out)


@pytest.mark.parametrize("rate, needle", [(40.0, "--force"), (0.2, "--force")])
def test_a_figure_10x_off_the_model_asks_for_force_and_says_why(capsys, rate, needle):
    args = ["speeds", "add", "--gpu", "L40S", "--tier", "sd15-lora", "--rate", str(rate)]
    err = _one_line(capsys, main(args), needle)
    assert "catalog's model figure" in err
    assert main([*args, "--force", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rate"] == rate


def test_a_plausible_figure_is_recorded_without_force(capsys):
    assert main(["speeds", "add", "--gpu", "L40S", "--tier", "sd15-lora", "--rate", "3.1"]) == 0
    assert "recorded 3.1/s" in capsys.readouterr().out


def test_a_tier_the_gpu_cannot_fit_names_the_gpus_that_can(capsys):
    err = _one_line(capsys, main(["speeds", "add", "--gpu", "T4", "--tier", "sdxl-dreambooth", "--rate", "0.1"]),
                    "cannot run it")
    assert "A100" in err


@pytest.mark.parametrize("text", ["hf_" + "Ab3dEf6hIj9kLm2nOp5q", "AKIA" + "ABCDEFGH12345678", "AKID" + "x9Yz8Wv7Ut6Sr5Qp4",
                                  "dGhpcyBpcyBhIHNlY3JldCBrZXkgMTIzNDU2Nzg5MEFCQ0RFRg=="])
def test_redact_masks_every_secret_shape_wherever_it_stands(text):
    out = redact(f"unknown provider {text!r}; did you mean aws?")
    assert text not in out and "unknown provider" in out and "…" in out


@pytest.mark.parametrize("text", ["/tmp/sdc-2d68ae160b7b87c92cca7dd10c546cb1/work", "sha256:" + "ab12" * 16,
                                  "s3://my-bucket/runs/r-1234abcd/checkpoints"])
def test_redact_leaves_paths_and_digests_alone(text):
    assert redact(text) == text


@pytest.mark.parametrize("name", ["a", "night-run.v2_1", "R2D2", "x" * 63])
def test_a_good_name_passes(name):
    assert check_name(name) == name


def test_strip_controls_removes_escapes_and_keeps_the_words():
    assert strip_controls("\x1b[2J\x1b[31mred\x1b[0m\tand\nblue\x07") == "red and blue"


@pytest.mark.parametrize("secret", ["AKID" + "q8Wm3Kx7Lp2Nz5Rt9Vb4Yc6Hd1Jf0Gs", "hf_" + "Xq7LmN2pR9sT4vW8yZ1bC3dF5gH6jK0",
                                    "c2VjcmV0LWtleS1tYXRlcmlhbC0xMjM0NTY3ODkwYWJjZGVmZ2hpams="])
def test_config_show_masks_a_secret_pasted_under_another_key(sdcloud_home, capsys, secret):
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text(f'[infra.extra]\nnote = "{secret}"\n')
    main(["config", "show"])
    got = capsys.readouterr()
    assert secret not in got.out + got.err and "…" + secret[-4:] in got.out, got.out


def test_speeds_export_and_forget_take_the_json_their_help_shows(capsys):
    assert main(["speeds", "add", "--gpu", "L40S", "--tier", "sd15-lora", "--rate", "3"]) == 0
    capsys.readouterr()
    assert main(["speeds", "export", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)
    assert main(["speeds", "forget", "--gpu", "L40S", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"forgotten": 1}


def test_a_batch_jobs_name_may_repeat_while_the_first_runs(sdcloud_home):
    # A schedule's fires share the schedule's job name: the claim of a name holds for training runs only.
    state = StateStore()
    for job in ("b-00000001", "b-00000002"):
        state.create_run(job, "batch-sd15", {"kind": "batch", "tier": "batch-sd15"}, 4, "nightly")
    assert [r["id"] for r in state.list_runs()] == ["b-00000001", "b-00000002"]
