"""Ctrl-C exits 130 wherever it lands (docs/runs.md), and a second one during `watch --drive`'s
hand-back finishes the hand-back without a traceback."""

from __future__ import annotations

import json
import os
import signal

import pytest


def test_an_early_ctrl_c_in_up_exits_130_in_one_line(monkeypatch, capsys, sdcloud_home):
    """Before `up`'s own handler (while the run's inputs are being checked) click turns the interrupt
    into an Abort: it is still an interrupt, not an `aborted` exit 1."""
    from sdcloud.cli import main

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr("sdcloud.commands.run._new_run", interrupted)
    code = main(["up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "5", "--yes"])
    err = capsys.readouterr().err
    assert code == 130, err
    assert err.strip() == "interrupted" and "Traceback" not in err, err


def _prompted(monkeypatch, answer) -> None:
    """`up` asks before it launches; the user's answer to that prompt is `answer` (a callable)."""
    import click

    monkeypatch.setattr("click.termui.visible_prompt_func", answer)
    monkeypatch.setattr("sdcloud.commands.run._new_run",
                        lambda *a, **k: click.confirm("Launch?", abort=True, err=True))


def test_a_ctrl_c_at_a_confirmation_prompt_exits_130(monkeypatch, capsys, sdcloud_home):
    from sdcloud.cli import main

    def ctrl_c(_prompt):
        raise KeyboardInterrupt

    _prompted(monkeypatch, ctrl_c)
    code = main(["up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "5", "--yes"])
    assert code == 130, capsys.readouterr().err


def test_a_no_at_a_confirmation_prompt_is_aborted_not_interrupted(monkeypatch, capsys, sdcloud_home):
    from sdcloud.cli import main

    _prompted(monkeypatch, lambda _prompt: "n")
    code = main(["up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "5", "--yes"])
    assert code == 1 and "aborted" in capsys.readouterr().err


def test_an_interrupt_after_commit_leaves_no_rollback_error(tmp_path):
    """A Ctrl-C that lands once COMMIT has ended the transaction: the interrupt goes on, not
    `cannot rollback - no transaction is active`."""
    from sdcloud.runs.records import journal
    from sdcloud.runs.records.state import StateStore

    state = StateStore(tmp_path / "state.db")
    with pytest.raises(KeyboardInterrupt):
        with state.tx() as db:
            db.execute("INSERT INTO journal_seen VALUES ('r-1', 1, '', 0)")
            db.execute("COMMIT")  # what the real COMMIT did just before the signal arrived
            raise KeyboardInterrupt
    assert journal.seen(state, "r-1")["seq"] == 1
    with pytest.raises(KeyboardInterrupt):  # and an interrupt inside an open one rolls it back
        with state.tx() as db:
            db.execute("INSERT INTO journal_seen VALUES ('r-2', 1, '', 0)")
            raise KeyboardInterrupt
    assert journal.seen(state, "r-2") is None


def test_a_second_ctrl_c_during_the_hand_back_finishes_it(tmp_path, monkeypatch, capsys, sdcloud_home):
    from sdcloud.cli import main
    from sdcloud.commands.common import EXIT_INTERRUPTED
    from sdcloud.runs.driving.controller import Controller
    from sdcloud.runs.records.lease import DriverLease
    from sdcloud.runs.records.state import StateStore
    from sdcloud.verbs import handover
    from sdcloud_agent.store import LocalStore
    from tests.fleet.test_fleet import CloudDouble

    bucket = tmp_path / "bucket"
    cloud = CloudDouble()
    monkeypatch.setattr("sdcloud.runs.driving.controller.get_provider", lambda name, **kw: cloud)
    state = StateStore()
    rid = "r-bac0c002"
    state.create_run(rid, "sd15-lora", {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1", "model": "tiny",
                                        "steps": 100, "market": "spot", "store": bucket.as_uri()}, 100)
    Controller(state, rid, provider=cloud).hand_over()
    real_step, steps = Controller.guarded_step, []

    def step_then_ctrl_c(self):
        if steps:
            raise KeyboardInterrupt
        steps.append(1)
        return real_step(self)

    real_hand_over = Controller.hand_over

    def second_ctrl_c(self, stage=True):  # the user presses Ctrl-C again while the run is handed back
        os.kill(os.getpid(), signal.SIGINT)
        return real_hand_over(self, stage)

    monkeypatch.setattr(Controller, "guarded_step", step_then_ctrl_c)
    monkeypatch.setattr(Controller, "hand_over", second_ctrl_c)
    monkeypatch.setattr("sdcloud.runs.driving.controller.time.sleep", lambda s: None)
    assert handover.hand_back  # the hand-back under test
    with pytest.raises(SystemExit) as ended:
        main(["watch", rid, "--drive"])
    assert ended.value.code == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert "Traceback" not in err and "still handing run" in err and "driven by the cloud driver" in err, err
    store = LocalStore(bucket)
    assert json.loads(store.get(f"runs/{rid}/journal/run.json"))["run"]["state"] == "running"
    assert DriverLease(store, rid, 5.0, "aws-lambda").acquire(), "handed back all the way: the lease is free"
