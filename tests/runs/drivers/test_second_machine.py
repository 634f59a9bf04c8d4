"""A second machine is a first-class controller of a run it rebuilt with `sdcloud status RUN --store URL`.

Two sdcloud homes that share nothing but the run's bucket (SeaweedFS over HTTPS): the first starts
the run with a background controller; the second stops it with `down` (through the bucket: the
first machine's controller sees the request at its next step and ends the host) and then resumes
it, from the durable checkpoint in the run's own bucket, to the end. The local provider: real agent
processes, the builtin trainer on the tiny model. And every bad `--store` / `unattended` input is
one line, exit 2, nothing recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from tests.support.server_seaweed import agent_processes, wait_until


def sdcloud(home, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sdcloud.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "SDCLOUD_HOME": str(home), "HF_HUB_OFFLINE": "1"})


def _journal(store, rid: str) -> tuple[dict, list[dict]]:
    run = json.loads(store.get(f"runs/{rid}/journal/run.json"))
    events = [e for o in sorted(store.list(f"runs/{rid}/journal/events/"), key=lambda o: o.key)
              for e in json.loads(store.get(o.key))]
    return run, events


@pytest.mark.slow
def test_from_a_second_machine_down_stops_the_run_and_resume_continues_from_its_checkpoint(tmp_path, s3_env,
                                                                                         sdcloud_home):
    import boto3

    from sdcloud_agent import manifest
    from sdcloud_agent.store import open_store

    name = f"second-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_env["endpoint_url"]).create_bucket(Bucket=name)
    url = f"s3://{name}/sd"
    store = open_store({"url": url})
    first, second = sdcloud_home, tmp_path / "second-machine"
    up = sdcloud(first, "up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "400",
                 "--checkpoint-every", "4", "--trainer-arg", "min-step-seconds=0.2", "--store", url, "--detach",
                 "--yes", "--json")
    assert up.returncode == 0, up.stderr
    rid = json.loads(up.stdout)["run"]

    def durable() -> int:
        newest = manifest.newest_complete(store, f"runs/{rid}")
        return newest.step if newest else 0

    try:
        wait_until(lambda: durable() >= 8, timeout=300, every=0.5)
        seen = sdcloud(second, "status", rid, "--store", url, "--json")
        assert seen.returncode == 0, seen.stderr
        assert json.loads(seen.stdout)["state"] == "running"

        asked = time.time()
        down = sdcloud(second, "down", rid)
        assert down.returncode == 0, down.stderr
        assert rid in down.stdout and ("stopped" in down.stdout or "stop requested" in down.stdout), down.stdout
        wait_until(lambda: _journal(store, rid)[0]["run"]["state"] == "stopped", timeout=60, every=0.5)
        run, events = _journal(store, rid)
        seen_at = [e["time"] for e in events if e["kind"] == "stop-requested"]
        assert seen_at, "the first machine's controller recorded the request it acted on"
        poll = 1.0  # the local provider's poll
        assert seen_at[0] - asked <= 2 * poll + 3.0, f"acted {seen_at[0] - asked:.1f} s after the request"
        assert run["attempts"][-1]["end_reason"] == "stopped"
        wait_until(lambda: not agent_processes(f"SDCLOUD_HOME={first}"), timeout=60)
        assert store.head(f"runs/{rid}/stop.json") is None, "the request is gone once acted on"
    finally:
        sdcloud(first, "down", rid, timeout=120)
    kept = durable()
    assert kept >= 8

    # The second machine resumes it: its own bucket is never used, the checkpoint in the run's is.
    done = run["run"]["step"]
    res = sdcloud(second, "resume", rid, "--steps", str(done + 6), "--json", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    summ = json.loads(res.stdout)
    assert summ["state"] == "succeeded" and summ["step"] == done + 6
    _, events = _journal(store, rid)
    resumed = [e["data"] for e in events if e["kind"] == "resumed"]
    assert resumed and resumed[-1]["from_step"] >= kept, resumed
    assert not (second / "bucket" / "runs" / rid).exists(), "nothing of the run in the second machine's own bucket"
    assert len(summ["attempts"]) == 2 and summ["attempts"][0]["end_reason"] == "stopped"


def test_bad_store_and_unattended_inputs_are_one_line_and_record_nothing(tmp_path, capsys, sdcloud_home):
    """No credentials for the cloud of a --store URL, and an `unattended` default that is not a yes or
    a no: one line on stderr, exit 2, no run and no remembered bucket."""
    from sdcloud.cli import main
    from sdcloud.runs.records.state import StateStore

    for url in ("s3://sd-someone-elses/runs", "cos://sd-bucket-1250000000/runs"):
        assert main(["status", "r-0badc0de", "--store", url]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "cannot read" in err and "Traceback" not in err, err
    (sdcloud_home / "config.toml").write_text('[defaults]\nunattended = "maybe"\n')
    assert main(["up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "4",
                 "--store", (tmp_path / "bucket").as_uri(), "--yes"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unattended must be true or false" in err, err
    assert StateStore().list_runs() == [] and not (tmp_path / "bucket").exists()
    assert not (sdcloud_home / "stores.json").exists()


def test_a_cos_url_is_opened_with_the_tencent_keys(cos_env, tmp_path, monkeypatch, capsys, sdcloud_home):
    """A run made with `--store cos://...` writes its journal through COS with the user's Tencent keys
    (its hosts are told to sign with their CVM role); `status RUN --store cos://...` on a second
    machine reads it the same way, and reaches the run by that URL from then on."""
    from sdcloud.cli import main
    from sdcloud.providers.tencent import storage as cos
    from sdcloud.runs.driving.controller import Controller
    from sdcloud.runs.records.state import StateStore
    from sdcloud.runs.records.store_of import remembered
    from tests.fleet.test_fleet import CloudDouble

    bucket = f"sd-{uuid.uuid4().hex[:10]}-1250000000"
    cos.client("ap-guangzhou").create_bucket(Bucket=bucket)
    laptop = StateStore(tmp_path / "laptop.db")
    laptop.create_run("r-c05c0001", "sd15-lora", {"tier": "sd15-lora", "provider": "tencent", "region": "ap-guangzhou",
                                                  "model": "tiny", "steps": 10, "store": f"cos://{bucket}/sd"}, 10)
    ctl = Controller(laptop, "r-c05c0001", provider=CloudDouble())
    assert ctl.store_conf["credentials"] == "tencent-cvm-role" and ctl.store_conf["region"] == "ap-guangzhou"
    ctl.journal.flush()
    assert main(["status", "r-c05c0001", "--store", f"cos://{bucket}/sd", "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["run"] == "r-c05c0001"
    assert remembered("r-c05c0001")["url"] == f"cos://{bucket}/sd"


def test_a_run_whose_host_ended_itself_is_shown_as_it_is(tmp_path, capsys, sdcloud_home):
    """The controller died; the host saved and ended itself when nobody drove the run. `status` shows
    the run stopped, its attempt ended by the host, its cost closed at the host's end (not still
    rising), without a resume."""
    from sdcloud.cli import main
    from sdcloud.runs.records.state import StateStore
    from sdcloud_agent.store import open_store

    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text("[local]\nprice_per_hour = 1.0\n")
    state = StateStore()
    rid, t0 = "r-5e1fe0d1", time.time() - 3600
    state.create_run(rid, "sd15-lora", {"tier": "sd15-lora", "provider": "local", "model": "tiny"}, 40)
    state.update_run(rid, state="running", step=12, created=t0)
    state.add_attempt(rid, 1, "local", "tok-1", instance_id="local-gone-1", state="running", start=t0, price=1.0,
                      market="on-demand", instance_type="local")
    bucket = open_store({"url": (sdcloud_home / "bucket").resolve().as_uri()})
    bucket.put(f"runs/{rid}/status.json", json.dumps({
        "attempt": 1, "phase": "training", "step": 12, "unattended": True,
        "self_end": {"reason": "unattended", "unattended": True, "action": "exit", "at": t0 + 900}}).encode())
    assert main(["status", rid, "--json"]) == 0
    summ = json.loads(capsys.readouterr().out)
    assert summ["state"] == "stopped" and "ended itself" in summ["reason"], summ
    (att,) = summ["attempts"]
    assert att["end_reason"] == "self-ended" and att["hours"] == pytest.approx(0.25, abs=0.01)
    assert main(["status", rid, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cost"]["total"] == summ["cost"]["total"], "the cost is closed"


def test_ctrl_c_in_watch_drive_hands_the_run_back_to_the_cloud_driver(tmp_path, monkeypatch, capsys, sdcloud_home):
    """The user takes a handed-over run with `watch --drive`, then presses Ctrl-C: the run is not
    stopped, its host keeps training, and the cloud driver gets it back (lease released, journal live)."""
    from sdcloud.cli import main
    from sdcloud.commands.common import EXIT_INTERRUPTED
    from sdcloud.runs.driving.controller import Controller
    from sdcloud.runs.records.lease import DriverLease
    from sdcloud.runs.records.state import StateStore
    from sdcloud_agent.store import LocalStore
    from tests.fleet.test_fleet import CloudDouble

    bucket = tmp_path / "bucket"
    cloud = CloudDouble()
    monkeypatch.setattr("sdcloud.runs.driving.controller.get_provider", lambda name, **kw: cloud)
    state = StateStore()
    rid = "r-bac0c001"
    state.create_run(rid, "sd15-lora", {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1", "model": "tiny",
                                        "steps": 100, "market": "spot", "store": bucket.as_uri()}, 100)
    Controller(state, rid, provider=cloud).hand_over()
    real_step, steps = Controller.guarded_step, []

    def step_then_ctrl_c(self):
        if steps:
            raise KeyboardInterrupt
        steps.append(1)
        return real_step(self)

    monkeypatch.setattr(Controller, "guarded_step", step_then_ctrl_c)
    monkeypatch.setattr("sdcloud.runs.driving.controller.time.sleep", lambda s: None)
    with pytest.raises(SystemExit) as ended:
        main(["watch", rid, "--drive"])
    assert ended.value.code == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert "driven by the cloud driver" in err and "stopping" not in err, err
    assert len(cloud.live()) == 1, "the host launched under --drive keeps running"
    store = LocalStore(bucket)
    run = json.loads(store.get(f"runs/{rid}/journal/run.json"))["run"]
    assert run["state"] == "running" and store.head(f"drivers/active/{rid}") is not None
    assert DriverLease(store, rid, 5.0, "aws-lambda").acquire(), "the cloud driver can take it at once"


def test_the_cloud_driver_takes_only_what_it_can_reach():
    """`up --unattended` is refused where the run's provider has no cloud driver, where its stack was
    deployed without one, and where the run's bucket is not the stack's (the function reads that one)."""
    from sdcloud.errors import UserError
    from sdcloud.verbs.handover import check_cloud_driver
    from sdcloud.runs.inputs.spec import RunSpec

    stack = {"bucket": "sd-stack", "prefix": "sdcloud", "region": "us-east-1", "driver_function": "sdcloud-driver"}
    with pytest.raises(UserError, match="provider local has no cloud driver"):
        check_cloud_driver(RunSpec(tier="sd15-lora", provider="local"), None)
    with pytest.raises(UserError, match="no cloud driver deployed"):
        check_cloud_driver(RunSpec(tier="sd15-lora", provider="aws"), {k: v for k, v in stack.items() if k != "driver_function"})
    with pytest.raises(UserError, match="reads the stack's bucket"):
        check_cloud_driver(RunSpec(tier="sd15-lora", provider="aws", store="s3://elsewhere/runs"), stack)
    check_cloud_driver(RunSpec(tier="sd15-lora", provider="aws"), stack)
    check_cloud_driver(RunSpec(tier="sd15-lora", provider="aws", store="s3://sd-stack/sdcloud"), stack)


def test_a_second_machine_reaches_the_run_by_the_url_it_rebuilt_it_from(tmp_path, monkeypatch, capsys, sdcloud_home):
    """A local run keeps its bucket in the first machine's home; on a second machine, `status --store`
    with that bucket's URL makes every later command (resume, watch --drive, down, logs) use it, never
    the second machine's own bucket."""
    from sdcloud.cli import main
    from sdcloud.runs.driving.controller import Controller
    from sdcloud.runs.records.state import StateStore
    from sdcloud.runs.records.store_of import store_of

    first = StateStore()
    first.create_run("r-f1257001", "sd15-lora", {"tier": "sd15-lora", "provider": "local", "model": "tiny", "steps": 8}, 8)
    first.update_run("r-f1257001", controller_pid=os.getppid())  # the first machine's controller, as journaled
    Controller(first, "r-f1257001").journal.flush()
    url = (sdcloud_home / "bucket").resolve().as_uri()
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "second"))
    assert main(["status", "r-f1257001", "--store", url, "--json"]) == 0, capsys.readouterr().err
    second = StateStore()
    ctl = Controller(second, "r-f1257001")
    assert ctl.store_conf["url"] == url, "the run's own bucket, not this machine's"
    assert store_of(second.get_run("r-f1257001")).head("runs/r-f1257001/journal/run.json") is not None
    assert second.get_run("r-f1257001")["controller_pid"] is None, "a pid of another machine names nothing here"
