"""`up --unattended --provider aws` where no stack is deployed from this machine (issue 46): one line,
"run `sdcloud infra up --provider aws` first", exit 2, before anything is created (the stack that
`up` would otherwise create on first use, a run row, a bucket)."""

from __future__ import annotations

from sdcloud.cli import main


def test_up_unattended_without_a_stack_says_to_run_infra_up_first(capsys, sdcloud_home, monkeypatch):
    from sdcloud.runs.records.state import StateStore

    created: list[str] = []
    monkeypatch.setattr("sdcloud.infra.automation.up", lambda *a, **kw: created.append("stack") or {})
    monkeypatch.setattr("sdcloud.infra.automation._stack", lambda *a, **kw: created.append("pulumi") or None)
    rc = main(["up", "--provider", "aws", "--tier", "sd15-lora", "--model", "tiny-sd15", "--steps", "40",
               "--unattended", "--yes"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "run `sdcloud infra up --provider aws` first" in err
    assert created == [] and StateStore().list_runs() == []


def test_a_stack_without_its_cloud_driver_is_said_the_same_way(capsys, sdcloud_home, monkeypatch):
    from sdcloud.runs.records.state import StateStore

    StateStore().save_infra("aws", "us-east-1", {"bucket": "sd-stack", "prefix": "sdcloud", "region": "us-east-1"})
    monkeypatch.setattr("sdcloud.infra.automation.up", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("up")))
    rc = main(["up", "--provider", "aws", "--region", "us-east-1", "--tier", "sd15-lora", "--model", "tiny-sd15",
               "--steps", "40", "--unattended", "--yes"])
    err = capsys.readouterr().err
    assert rc == 2 and "no cloud driver deployed" in err and "infra up --provider aws` first" in err, err
    assert StateStore().list_runs() == []
