"""A host ends itself when its work is over and nobody ended it (sdcloud_agent/selfend.py).

The fast tests drive the pieces with a controlled clock: the grace, `unattended`, the lifetime cap,
the Tencent TerminateInstances signed with a CVM role's keys (against the CVM fake, which judges
them by the stack's tag policy), the SSH and local providers that never power anything off.
The slow ones launch with the real controller on AWS (moto) and on Tencent (the CVM fake) and then
never run it again, as if it had been SIGKILLed: the real agent behind each instance
(tests/support/harness_host_emulator.py) trains, reaches its terminal phase, waits the grace (1 s here) and ends
its host; after that 0 instances run.
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import boto3
import pytest

from tests.support import SUPPORT
from tests.support.server_seaweed import wait_until
from tests.support.harness_stacks import stack_module
from tests.support.server_http import LoopbackServer



self_end_policy_document = stack_module("tencent", "host_policy").self_end_policy_document

STACK_TAG = ("sdcloud:stack", "e2e")


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def _file_store(tmp_path):
    from sdcloud_agent.store import open_store

    return open_store({"url": (tmp_path / "bucket").as_uri()})


# -- the lifetime cap ---------------------------------------------------------------------------------

def test_lifetime_cap_from_budget_deadline_or_estimate():
    from sdcloud_agent.selfend import SelfEnd, lifetime_cap

    # $3 left at $2/h: 1.5 h.
    cap, why = lifetime_cap(SelfEnd(provider="aws", price_per_hour=2.0, budget_left=3.0, launched_at=0))
    assert cap == pytest.approx(5400) and "budget" in why
    # A deadline 2 h after launch: 2 h plus the one-hour margin; the budget's 1.5 h comes first.
    cap, why = lifetime_cap(SelfEnd(provider="aws", deadline_at=7200, launched_at=0))
    assert cap == pytest.approx(3 * 3600) and "deadline" in why
    cap, _ = lifetime_cap(SelfEnd(provider="aws", deadline_at=7200, launched_at=0, price_per_hour=2.0, budget_left=3.0))
    assert cap == pytest.approx(5400)
    # Neither: twice the estimate plus two hours.
    cap, why = lifetime_cap(SelfEnd(provider="aws", estimate_hours=3.0))
    assert cap == pytest.approx(2 * 3 * 3600 + 7200) and "twice the estimate" in why


# -- the grace and `unattended` ------------------------------------------------------------------------

def _finish(tmp_path, controller_age: float | None, provider: str = "aws", grace: float = 600.0,
            alive: bool = False):
    from sdcloud_agent import selfend

    clock = Clock()
    store = _file_store(tmp_path)
    store.put("runs/r-1/status.json", json.dumps({"attempt": 1, "phase": "succeeded"}).encode())
    if controller_age is not None:
        store.put("runs/r-1/controller.json", json.dumps({"time": clock.t - controller_age}).encode())
    se = selfend.SelfEnd(provider=provider, grace_s=grace, unattended_after_s=20.0)
    att = selfend.Attendance(store, "runs/r-1", se.unattended_after_s, started=clock.t - 100, clock=clock)
    ended: list[str] = []

    def sleep(sec: float) -> None:
        clock.sleep(sec)
        if alive:  # a live controller keeps writing its heartbeat every poll
            store.put("runs/r-1/controller.json", json.dumps({"time": clock.t}).encode())

    doc = selfend.finish(se, store, "runs/r-1", 1, "succeeded", attendance=att, sleep=sleep, clock=clock,
                         end=lambda s: ended.append(s.provider) or "os-shutdown")
    return doc, ended, json.loads(store.get("runs/r-1/status.json"))


def test_an_attended_host_waits_the_grace_then_ends_itself(tmp_path):
    doc, ended, status = _finish(tmp_path, controller_age=2.0, alive=True)
    assert ended == ["aws"]
    assert doc["waited_s"] == pytest.approx(600, abs=1.5) and not doc["unattended"]
    assert status["phase"] == "succeeded" and status["self_end"]["reason"] == "succeeded"
    assert status["self_end"]["action"] == "os-shutdown" and status["unattended"] is False


def test_an_unattended_host_ends_at_once(tmp_path):
    # The controller's heartbeat is 60 s old, past the 20 s threshold: no grace.
    doc, ended, status = _finish(tmp_path, controller_age=60.0)
    assert ended == ["aws"] and doc["waited_s"] == 0 and doc["unattended"]
    assert status["unattended"] is True and status["self_end"]["unattended"] is True


def test_a_controller_that_dies_during_the_grace_cuts_it_short(tmp_path):
    # Fresh at the terminal phase (15 s old), stale 5 s later: the host ends well before 600 s.
    doc, ended, _ = _finish(tmp_path, controller_age=15.0)
    assert ended == ["aws"] and doc["unattended"] and doc["waited_s"] < 30


@pytest.mark.parametrize("provider", ["ssh", "local"])
def test_ssh_and_local_never_power_off(tmp_path, monkeypatch, provider):
    """The SSH provider's box is the user's own: the agent exits (the GPU is freed), nothing is shut down."""
    from sdcloud_agent import selfend

    rec = tmp_path / "shutdown.log"
    shim = tmp_path / "shutdown"
    shim.write_text(f"#!/bin/sh\necho \"$@\" >> {rec}\n")
    shim.chmod(0o755)
    monkeypatch.setenv("SDCLOUD_SHUTDOWN_COMMAND", str(shim))
    store = _file_store(tmp_path)
    doc = selfend.finish(selfend.SelfEnd(provider=provider, grace_s=600), store, "runs/r-1", 1, "succeeded")
    assert doc["action"] == "agent-exit" and doc["waited_s"] < 1  # no grace: nothing bills
    assert not rec.exists()
    assert json.loads(store.get("runs/r-1/status.json"))["self_end"]["reason"] == "succeeded"


def test_aws_self_end_runs_the_os_shutdown(tmp_path, monkeypatch):
    from sdcloud_agent import selfend

    rec = tmp_path / "shutdown.log"
    shim = tmp_path / "shutdown"
    shim.write_text(f"#!/bin/sh\necho \"shutdown $@\" >> {rec}\n")
    shim.chmod(0o755)
    monkeypatch.setenv("SDCLOUD_SHUTDOWN_COMMAND", f"{shim} -h now")
    assert selfend.end_machine(selfend.SelfEnd(provider="aws")) == "os-shutdown"
    assert rec.read_text().strip() == "shutdown -h now"
    monkeypatch.delenv("SDCLOUD_SHUTDOWN_COMMAND")
    from sdcloud_agent.clouds import aws

    assert aws.shutdown_command() == ["shutdown", "-h", "now"]


@pytest.mark.parametrize("market", ["spot", "on-demand"])
def test_aws_hosts_are_launched_to_terminate_on_an_os_shutdown(aws_env, market):
    """The self-end on AWS is the OS shutdown: it ends the instance only while every launch keeps
    InstanceInitiatedShutdownBehavior=terminate (with it `stop`, a shut-down host keeps its volume)."""
    from moto import mock_aws

    from sdcloud.offers.catalog import bundled_rows
    from sdcloud.offers.optimizer import Offer
    from sdcloud.providers import get_provider
    from sdcloud.providers.base import LaunchSpec

    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        prov = get_provider("aws", region="us-east-1", image_id=AMI, retry_base=0, retry_cap=0)
        row = next(r for r in bundled_rows("aws") if r.region == "us-east-1" and r.instance_type == "g5.xlarge")
        inst = prov.launch(Offer(row, market), LaunchSpec(run_id="r-shut", attempt=1, user_data="#!/bin/sh\n"),
                           market, max_price=5.0, events=lambda k, d: None)
        how = ec2.describe_instance_attribute(InstanceId=inst.id, Attribute="instanceInitiatedShutdownBehavior")
        assert how["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"


# -- Tencent: TerminateInstances with the role's keys, held to the stack's tag --------------------------

def _fake_instance(cvm, iid: str, tags: dict, zone: str = "ap-guangzhou-3"):
    import time

    from tests.support.fake_tencent_api import FakeInstance

    inst = FakeInstance(iid, "ap-guangzhou", zone, "GN7.2XLARGE32", "SPOTPAID", tags, time.time())
    inst.state = "RUNNING"
    cvm.instances[iid] = inst
    return inst


def test_tencent_terminate_is_signed_with_the_role_and_held_to_the_stack_tag():
    from tests.support.fake_tencent_api import FakeServer

    from sdcloud_agent.clouds.tencent import terminate as tencent_terminate

    with FakeServer() as srv:
        cvm = srv.cvm
        mine = _fake_instance(cvm, "ins-mine0001", {"sdcloud:stack": "e2e", "sdcloud:run": "r-1"})
        other = _fake_instance(cvm, "ins-other001", {"team": "web"})
        raw = cvm.add_role_keys("sdcloud-e2e-host", [self_end_policy_document(STACK_TAG)])
        keys = {"access_key": raw["TmpSecretId"], "secret_key": raw["TmpSecretKey"], "token": raw["Token"]}
        # Not the stack's instance: CAM refuses it.
        with pytest.raises(RuntimeError, match="UnauthorizedOperation"):
            tencent_terminate(other.id, "ap-guangzhou", keys, endpoint=srv.endpoint)
        assert other.state == "RUNNING"
        # The role's keys without their token: refused.
        with pytest.raises(RuntimeError, match="AuthFailure"):
            tencent_terminate(mine.id, "ap-guangzhou", {**keys, "token": "x"}, endpoint=srv.endpoint)
        tencent_terminate(mine.id, "ap-guangzhou", keys, endpoint=srv.endpoint)
        assert mine.state == "TERMINATING"
        [call] = [c for c in cvm.calls if c["action"] == "TerminateInstances"]
        assert call["caller"] == "role:sdcloud-e2e-host" and call["params"]["InstanceIds"] == [mine.id]


# -- the controller's side --------------------------------------------------------------------------------

def test_self_end_grace_flag_run_file_and_config(tmp_path, monkeypatch):
    from sdcloud.errors import UserError
    from sdcloud.runs.inputs.spec import RunSpec, parse_seconds

    assert parse_seconds("10m", "--self-end-grace") == 600 and parse_seconds("0", "--self-end-grace") == 0
    assert parse_seconds(90, "--self-end-grace") == 90
    with pytest.raises(UserError, match="--self-end-grace"):
        parse_seconds("soon", "--self-end-grace")
    with pytest.raises(UserError):
        parse_seconds("-5", "--self-end-grace")
    from sdcloud.runs.driving.controller import self_end_grace

    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path))
    assert self_end_grace(RunSpec(tier="sd15-lora")) == 600
    (tmp_path / "config.toml").write_text('[hosts]\nself_end_grace = "2m"\n')
    assert self_end_grace(RunSpec(tier="sd15-lora")) == 120
    assert self_end_grace(RunSpec(tier="sd15-lora", self_end_grace=5)) == 5


def test_up_refuses_a_bad_grace_with_one_line(tmp_path, monkeypatch, capsys):
    from sdcloud.cli import main
    from sdcloud.runs.records.state import StateStore

    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path))
    rc = main(["up", "--tier", "sd15-lora", "--self-end-grace", "soon", "--yes"])
    err = capsys.readouterr().err
    assert rc == 2 and "--self-end-grace" in err and len(err.strip().splitlines()) == 1, err
    assert StateStore().list_runs() == []  # nothing created


# -- the whole path: launch, the controller gone, the host ends itself ------------------------------------

AMI = "ami-12c6146b"


class SelfEndingHosts:
    """The host emulator with a per-instance environment (its shutdown shim, its metadata)."""

    def __init__(self, listing, workdir: Path, env: dict, env_for):
        from tests.support.harness_host_emulator import HostEmulator

        base = env
        outer = self

        class Hosts(HostEmulator):
            def _boot(self, instance_id, user_data):
                self.env = {**base, **env_for(instance_id)}
                super()._boot(instance_id, user_data)
                outer.booted.append(instance_id)

        self.booted: list[str] = []
        self.hosts = Hosts(listing, workdir, env)

    def __enter__(self):
        self.hosts.start()
        return self.hosts

    def __exit__(self, *exc):
        self.hosts.stop()


def _controller(spec: dict, provider, steps: int):
    from sdcloud.runs.driving.controller import Controller, Timing, new_run_id
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    run_id = new_run_id()
    state.create_run(run_id, spec["tier"], spec, steps)
    return Controller(state, run_id, provider=provider, timing=Timing(poll_seconds=0.5, boot_timeout=240,
                                                                       heartbeat_timeout=120)), state


def _aws_shim(tmp_path: Path, instance_id: str) -> Path:
    """`shutdown -h now` on an EC2 instance, as AWS documents it: the OS halts and the instance does
    what its InstanceInitiatedShutdownBehavior says (terminate, here). Recorded for the test."""
    shim = tmp_path / f"shutdown-{instance_id}"
    shim.write_text(f"""#!{sys.executable}
import sys, boto3
open({str(tmp_path / 'shutdowns.log')!r}, "a").write({instance_id!r} + " " + " ".join(sys.argv[1:]) + "\\n")
ec2 = boto3.client("ec2")
how = ec2.describe_instance_attribute(InstanceId={instance_id!r}, Attribute="instanceInitiatedShutdownBehavior")
if how["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate":
    ec2.terminate_instances(InstanceIds=[{instance_id!r}])
else:
    ec2.stop_instances(InstanceIds=[{instance_id!r}])
""")
    shim.chmod(0o755)
    return shim


@pytest.mark.slow
@pytest.mark.parametrize("outcome, killed_at", [("succeeded", "launch"), ("failed", "launch"), ("succeeded", "training")])
def test_aws_host_ends_itself_when_the_controller_is_gone(moto_server, monkeypatch, tmp_path, outcome, killed_at):
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": moto_server}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "home"))
    bucket = f"self-end-{outcome}-{killed_at}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    ec2 = boto3.client("ec2")
    from sdcloud.providers import get_provider

    provider = get_provider("aws", image_id=AMI, region="us-east-1", regions=["us-east-1"])

    def listing():
        for res in ec2.describe_instances(Filters=[{"Name": "tag:sdcloud:run", "Values": [ctl.run_id]}])["Reservations"]:
            for inst in res["Instances"]:
                running = inst["State"]["Name"] == "running"
                ud = (ec2.describe_instance_attribute(InstanceId=inst["InstanceId"], Attribute="userData")["UserData"]
                      .get("Value", "") if running else "")
                yield inst["InstanceId"], running, ud

    # A failure the trainer reports itself: an unknown flag to the builtin trainer.
    pace = "0.4" if killed_at == "training" else "0.05"  # long enough to be caught training
    steps = 12 if killed_at == "training" else 4
    args = ["--min-step-seconds", pace] + (["--fail-at-step", "2"] if outcome == "failed" else [])
    spec = {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1", "model": "tiny", "steps": steps,
            "checkpoint_every": 2, "store": f"s3://{bucket}/p", "market": "spot", "trainer_args": args,
            "self_end_grace": 1.0}
    ctl, state = _controller(spec, provider, steps)
    with SelfEndingHosts(listing, tmp_path / "hosts", env,
                         lambda iid: {"SDCLOUD_SHUTDOWN_COMMAND": f"{_aws_shim(tmp_path, iid)} -h now"}) as hosts:
        ctl.host.heartbeat()
        ctl._start_attempt()  # the controller launches ... and is never run again (SIGKILLed)
        [att] = state.attempts(ctl.run_id)
        assert ec2.describe_instance_attribute(InstanceId=att.instance_id, Attribute="instanceInitiatedShutdownBehavior")[
            "InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        if killed_at == "training":
            # The controller drives until the host trains, then is SIGKILLed (it simply takes no more steps).
            def training() -> bool:
                ctl.host.heartbeat()
                ctl._watch(state.attempts(ctl.run_id)[0])
                st = ctl.host.read_status() or {}
                return st.get("phase") == "training" and st.get("attempt") == 1
            wait_until(training, timeout=240, every=0.5)

        def live():
            flt = [{"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
                   {"Name": "tag:sdcloud:run", "Values": [ctl.run_id]}]
            return [i for r in ec2.describe_instances(Filters=flt)["Reservations"] for i in r["Instances"]]

        wait_until(lambda: (tmp_path / "shutdowns.log").exists(), timeout=240)
        wait_until(lambda: live() == [], timeout=30)
        assert (tmp_path / "shutdowns.log").read_text().split() == [att.instance_id, "-h", "now"]
        wait_until(lambda: hosts.alive() == [], timeout=30)
    status = ctl.host.read_status()
    assert status["phase"] == outcome, status
    se = status["self_end"]
    assert se["reason"] == outcome and se["action"] == "os-shutdown"
    # The heartbeat written at launch was stale by the terminal phase (4 polls of 0.5 s): unattended, no grace.
    assert se["unattended"] is True and se["waited_s"] < 1.5
    # The user comes back: the controller reconciles, records the self-end and closes the attempt at its second.
    from sdcloud.runs.driving.controller import Controller, Timing

    ctl2 = Controller(state, ctl.run_id, provider=provider, timing=Timing(poll_seconds=0.2, boot_timeout=240,
                                                                          heartbeat_timeout=120))
    ctl2.reconcile()
    ctl2._watch(state.attempts(ctl.run_id)[0])
    [ev] = [e for e in state.events(ctl.run_id) if e["kind"] == "self-ended"]
    assert ev["data"]["reason"] == outcome and ev["data"]["action"] == "os-shutdown"
    [att] = state.attempts(ctl.run_id)
    assert att.end == pytest.approx(se["at"], abs=0.01)
    assert state.get_run(ctl.run_id)["state"] == outcome


class TencentMetadata(LoopbackServer):
    """The CVM metadata service per instance, at /<instance-id>/latest/meta-data/...: the instance's
    id and region and its CAM role's temporary keys (from the CVM fake, judged by its policy)."""

    def __init__(self, keys: dict, role: str):
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                iid, _, path = self.path.lstrip("/").partition("/")
                body = {"latest/meta-data/instance-id": iid, "latest/meta-data/placement/region": "ap-guangzhou",
                        "latest/meta-data/cam/security-credentials/": role,
                        f"latest/meta-data/cam/security-credentials/{role}": json.dumps(fake.keys)}.get(path)
                self.send_response(200 if body is not None else 404)
                data = (body or "").encode()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.keys = keys
        self.bind(H)
        self.start()

    def url(self, iid: str) -> str:
        return f"{self.address()}/{iid}"
        self.httpd.server_close()


@pytest.mark.slow
def test_tencent_host_terminates_itself_with_its_role(monkeypatch, tmp_path, s3_env):
    from tests.support import fake_tencent_api
    from tests.support.fake_tencent_api import SECRET_ID, SECRET_KEY, FakeServer

    from sdcloud.providers import get_provider

    monkeypatch.setattr(fake_tencent_api, "PENDING_S", 0.2)
    monkeypatch.setattr(fake_tencent_api, "TERMINATING_S", 0.3)
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", SECRET_ID)
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", SECRET_KEY)
    monkeypatch.setenv("SDCLOUD_TENCENT_IMAGE_ID", "img-e2e")
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("sdcloud.providers.tencent.session.METADATA_URL", "http://127.0.0.1:9/")
    boto3.client("s3", endpoint_url=s3_env["endpoint_url"]).create_bucket(Bucket="selfend-1250000000")
    with FakeServer() as srv:
        monkeypatch.setenv("SDCLOUD_TENCENT_ENDPOINT", srv.endpoint)
        cvm = srv.cvm
        keys = cvm.add_role_keys("sdcloud-e2e-host", [self_end_policy_document(STACK_TAG)])
        meta = TencentMetadata(keys, "sdcloud-e2e-host")

        def listing():
            for inst in list(cvm.instances.values()):
                yield inst.id, inst.state == "RUNNING", inst.user_data

        agent_env = {k: s3_env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_CA_BUNDLE")}
        monkeypatch.setenv("SDCLOUD_STORE_ENDPOINT", s3_env["endpoint_url"])
        provider = get_provider("tencent", poll_interval=0.2, launch_timeout=30)
        spec = {"tier": "sd15-lora", "provider": "tencent", "region": "ap-guangzhou", "model": "tiny", "steps": 4,
                "checkpoint_every": 2, "store": "s3://selfend-1250000000/sdcloud", "market": "spot",
                "trainer_args": ["--min-step-seconds", "0.05"], "self_end_grace": 1.0}
        ctl, state = _controller(spec, provider, 4)
        # The stack's outputs: its tags go on every host (the role may end only those).
        state.save_infra("tencent", "ap-guangzhou", {"host_tags": dict([STACK_TAG])})
        ctl._infra = {"host_tags": dict([STACK_TAG])}
        try:
            with SelfEndingHosts(listing, tmp_path / "hosts", agent_env,
                                 lambda iid: {"SDCLOUD_TENCENT_METADATA_URL": meta.url(iid),
                                              "SDCLOUD_TENCENT_ENDPOINT": srv.endpoint}) as hosts:
                ctl.host.heartbeat()
                ctl._start_attempt()  # and never again: the controller is gone
                [att] = state.attempts(ctl.run_id)
                wait_until(lambda: any(c["action"] == "TerminateInstances" for c in cvm.calls), timeout=240)
                wait_until(lambda: [i for i in cvm.instances.values() if i.state in ("PENDING", "RUNNING")] == [],
                           timeout=30)
                wait_until(lambda: hosts.alive() == [], timeout=30)
        finally:
            meta.stop()
        [call] = [c for c in cvm.calls if c["action"] == "TerminateInstances"]
        assert call["caller"] == "role:sdcloud-e2e-host" and call["params"]["InstanceIds"] == [att.instance_id]
        status = ctl.host.read_status()
        assert status["phase"] == "succeeded" and status["self_end"]["action"] == "terminate-instances"
        assert "error" not in status["self_end"]


# -- the lifetime cap on a live host ---------------------------------------------------------------------

FAKE = str(SUPPORT / "fake_host.py")


@pytest.mark.slow
def test_the_lifetime_cap_saves_uploads_and_ends_the_host(tmp_path):
    """The cap is reached mid-training with nobody driving the run: the agent saves (the trainer's
    SIGTERM save), uploads the checkpoint, reports it and ends its host at once (no grace)."""
    import subprocess
    import time

    from sdcloud_agent import manifest as mf
    from sdcloud_agent.store import open_store

    store_conf = {"url": (tmp_path / "bucket").as_uri()}
    rec = tmp_path / "shutdown.log"
    shim = tmp_path / "shutdown"
    shim.write_text(f"#!/bin/sh\necho \"shutdown $@\" >> {rec}\n")
    shim.chmod(0o755)
    # The cap counts from the launch, and on a loaded machine the agent and its trainer take seconds
    # just to start: give the cap 6 s of training beyond what starting both took here, just now, so
    # the cap falls mid-training and not before the first step.
    began = time.time()
    subprocess.run([sys.executable, "-c", "import sdcloud_agent.agent"], check=True, timeout=120)
    startup = time.time() - began
    now = time.time()
    cfg = {"run_id": "cap", "attempt": 1, "trainer": "command", "trainer_args": [sys.executable, FAKE],
           "steps": 100000, "checkpoint_every": 100000, "store": store_conf, "metadata": {"kind": "none"},
           "workdir": str(tmp_path / "work"), "nvme": False, "require_gpu": False, "heartbeat_seconds": 0.5,
           "poll_seconds": 0.2,
           # A short cap (the figures' own cap is tested above): the notice comes 5 s before it.
           "self_end": {"provider": "aws", "cap_s": 6 + 2 * startup, "grace_s": 600, "launched_at": now,
                        "unattended_after_s": 2}}
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.run([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(path)],
                          env={**os.environ, "SDCLOUD_SHUTDOWN_COMMAND": f"{shim} -h now", "FAKE_STEP_SECONDS": "0.02"},
                          capture_output=True, text=True, timeout=120)
    took = time.time() - now
    assert proc.returncode == 3, proc.stderr[-3000:]
    store = open_store(store_conf)
    status = json.loads(store.get("runs/cap/status.json"))
    assert status["phase"] == "preempted" and status["ended_by"] == "lifetime-cap", status
    assert status["reason"].startswith("lifetime cap reached")
    durable = mf.complete_steps(store, "runs/cap")
    assert durable and durable[-1] == status["step"] > 0  # the save at the cap is in the bucket
    assert status["self_end"]["reason"].startswith("lifetime cap reached") and status["self_end"]["waited_s"] < 1
    assert rec.read_text().strip() == "shutdown -h now"
    assert took < 60


def test_a_capped_host_stops_the_run_and_is_not_relaunched(tmp_path, monkeypatch):
    """The controller (alive again) reads a host that stopped at its lifetime cap: the run is
    `stopped` with the cap in its reason (resume continues it), never relaunched as a reclaim; the
    self-end is one event and the attempt ends at the host's own second."""
    import time

    from sdcloud.runs.driving.controller import Controller, Timing, new_run_id
    from sdcloud.runs.records.state import StateStore

    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path))
    state = StateStore()
    run_id = new_run_id()
    state.create_run(run_id, "sd15-lora", {"tier": "sd15-lora", "provider": "local", "model": "tiny", "steps": 10}, 10)
    ctl = Controller(state, run_id, timing=Timing(poll_seconds=0.2, boot_timeout=60, heartbeat_timeout=60))
    start = time.time() - 100
    state.add_attempt(run_id, 1, "local", "tok-1", instance_id="local-gone", state="running", start=start,
                      market="spot", price=0.5, instance_type="local")
    at = start + 40
    ctl.store.put(f"runs/{run_id}/status.json", json.dumps({
        "attempt": 1, "phase": "preempted", "step": 6, "time": at, "ended_by": "lifetime-cap",
        "cap": "the budget left", "reason": "lifetime cap reached (the budget left): newest durable checkpoint is step 6",
        "self_end": {"reason": "lifetime cap reached (the budget left)", "action": "os-shutdown", "at": at,
                     "unattended": True}}).encode())
    ctl._watch(state.attempts(run_id)[0])
    run = state.get_run(run_id)
    assert run["state"] == "stopped" and "lifetime cap" in run["reason"] and "sdcloud resume" in run["reason"]
    [att] = state.attempts(run_id)
    assert att.end_reason == "lifetime-cap" and att.end == pytest.approx(at)
    kinds = [e["kind"] for e in state.events(run_id)]
    assert kinds.count("self-ended") == 1 and "launching" not in kinds
    ctl.host.heartbeat()
    assert json.loads(ctl.store.get(f"runs/{run_id}/controller.json"))["time"] == pytest.approx(time.time(), abs=5)


@pytest.mark.slow
def test_a_batch_worker_with_nothing_left_ends_its_host_after_the_grace(tmp_path):
    """A batch worker host whose driver is gone: once the queue is empty it waits the grace (1 s
    here) and ends its host with the OS shutdown."""
    import subprocess
    import time

    from sdcloud_agent.batch.worker import write_job
    from sdcloud_agent.store import open_store

    store_conf = {"url": (tmp_path / "bucket").as_uri()}
    items = [{"id": f"i{n}", "settings": {"model": "tiny-sd15", "prompt": f"thing {n}", "steps": 2, "width": 64,
                                          "height": 64}, "seeds": [0]} for n in range(2)]
    write_job(open_store(store_conf), "jobs/j", {}, items)
    rec = tmp_path / "shutdown.log"
    shim = tmp_path / "shutdown"
    shim.write_text(f"#!/bin/sh\necho \"shutdown $@\" >> {rec}\n")
    shim.chmod(0o755)
    cfg = {"run_id": "b-1", "attempt": 1, "store": store_conf, "metadata": {"kind": "none"},
           "batch": {"job": "jobs/j", "generator": "fake"}, "self_end": {"provider": "aws", "grace_s": 1}}
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(cfg))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(path)],
                          env={**os.environ, "SDCLOUD_SHUTDOWN_COMMAND": f"{shim} -h now"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rec.read_text().strip() == "shutdown -h now"
    assert "self-end: batch worker done" in proc.stderr and time.time() - t0 >= 1


def test_status_shows_an_unattended_host_and_a_self_end(tmp_path, monkeypatch, capsys):
    from sdcloud.cli import main
    from sdcloud.runs.records.state import StateStore
    from sdcloud_agent.store import open_store

    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path))
    state = StateStore()
    state.create_run("r-0000beef", "sd15-lora", {"tier": "sd15-lora", "provider": "local", "model": "tiny"}, 10)
    bucket = open_store({"url": (tmp_path / "bucket").resolve().as_uri()})
    doc = {"attempt": 1, "phase": "training", "step": 3, "unattended": True}
    bucket.put("runs/r-0000beef/status.json", json.dumps(doc).encode())
    assert main(["status", "r-0000beef"]) == 0
    assert "host: unattended" in capsys.readouterr().out
    doc.update(phase="succeeded", self_end={"reason": "succeeded", "unattended": True, "action": "os-shutdown"})
    bucket.put("runs/r-0000beef/status.json", json.dumps(doc).encode())
    assert main(["status", "r-0000beef", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["host"] == "ended itself (succeeded, unattended)"
