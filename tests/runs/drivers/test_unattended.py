"""The cloud driver (sdcloud.driver.unattended) carries a run whose laptop went away.

The laptop's controller is SIGKILLed mid-run and its host is lost with it (a reclaim while nobody
drives). The function's handler is then called in this process exactly as the platforms call it
(SCF's timer event and dict context; Lambda's scheduler input and context object), from a fresh
$SDCLOUD_HOME that knows nothing but the bucket: it rebuilds the run from its journal, takes the
driver lease, relaunches, and finishes the run. A third machine then sees the whole history.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.server_seaweed import agent_processes, wait_until
from sdcloud_agent.store import LocalStore

SCF_TIMER = {"Type": "Timer", "TriggerName": "sdcloud-driver", "Time": "2026-12-02T01:30:00Z", "Message": ""}
SCHEDULER_INPUT = {"sdcloud": "drive"}


class LambdaContext:
    """The two members of Lambda's context object the handler reads."""

    def __init__(self, seconds: float):
        self._end = time.monotonic() + seconds
        self.function_name = "sdcloud-driver"

    def get_remaining_time_in_millis(self) -> int:
        return int(max(0.0, self._end - time.monotonic()) * 1000)


def test_handlers_recognise_each_platforms_event():
    from sdcloud.driver import unattended

    assert unattended._driver_name(SCF_TIMER) == "tencent-scf"
    assert unattended._driver_name(SCHEDULER_INPUT) == "aws-lambda"
    left = unattended._time_left({"time_limit_in_ms": 5000}, time.monotonic())
    assert 4.0 < left() <= 5.0
    assert 9.0 < unattended._time_left(LambdaContext(10), 0.0)() <= 10.0


def test_nothing_live_means_nothing_done(tmp_path, monkeypatch):
    from sdcloud.driver import unattended

    monkeypatch.setenv("SDCLOUD_STORE", (tmp_path / "bucket").as_uri())
    (tmp_path / "bucket").mkdir()
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "fn"))
    report = unattended.handler(SCHEDULER_INPUT, LambdaContext(60))
    assert report["driver"] == "aws-lambda" and report["runs"] == {}
    assert report["invocation"].startswith("aws-lambda:"), "each invocation drives under a name of its own"


@pytest.mark.slow
def test_a_run_whose_laptop_went_away_is_finished_by_the_cloud_driver(tmp_path, monkeypatch, sdcloud_home):
    from sdcloud.driver import unattended

    bucket = tmp_path / "bucket"
    bucket.mkdir()
    url = bucket.as_uri()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SDCLOUD_HOME": str(sdcloud_home)}
    up = subprocess.run([sys.executable, "-m", "sdcloud.cli", "up", "--provider", "local", "--tier", "sd15-lora",
                         "--model", "tiny", "--steps", "16", "--checkpoint-every", "4", "--store", url, "--detach",
                         "--yes", "--json"], capture_output=True, text=True, timeout=300, env=env)
    assert up.returncode == 0, up.stderr
    rid = json.loads(up.stdout)["run"]
    store = LocalStore(bucket)

    def step() -> int:
        try:
            return int(json.loads(store.get(f"runs/{rid}/status.json")).get("step") or 0)
        except Exception:  # noqa: BLE001 - not written yet
            return 0

    wait_until(lambda: step() >= 5, timeout=600, every=0.5)
    from sdcloud.runs.records.state import StateStore

    laptop = StateStore(sdcloud_home / "state.db")
    os.kill(laptop.get_run(rid)["controller_pid"], signal.SIGKILL)
    for pid in agent_processes(f"SDCLOUD_HOME={sdcloud_home}"):  # the host goes with it: a reclaim
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_until(lambda: not agent_processes(f"SDCLOUD_HOME={sdcloud_home}"), timeout=30)

    # The function, from a home that never saw the run.
    monkeypatch.setenv("SDCLOUD_STORE", url)
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "function-tmp"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("SDCLOUD_DRIVER", raising=False)
    # While the SCF function holds the run, another cloud's driver (or a laptop) leaves it alone.
    first = unattended.handler(SCF_TIMER, {"time_limit_in_ms": 45_000})
    assert first["runs"][rid]["steps"] >= 1
    other = unattended.handler(SCHEDULER_INPUT, LambdaContext(60))
    assert other["runs"][rid]["skipped"].startswith("driven by tencent-scf:"), other
    reports = [first, other]
    for _ in range(12):  # the timer's next invocations take their own lease over and carry on
        reports.append(unattended.handler(SCF_TIMER, {"time_limit_in_ms": 120_000}))
        if not store.list("drivers/active/"):
            break
    assert not store.list("drivers/active/"), f"the run is still live after {len(reports)} invocations: {reports}"

    # A third machine sees the whole history.
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "third"))
    seen = subprocess.run([sys.executable, "-m", "sdcloud.cli", "status", rid, "--store", url, "--json"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SDCLOUD_HOME": str(tmp_path / "third")})
    assert seen.returncode == 0, seen.stderr
    st = json.loads(seen.stdout)
    assert st["state"] == "succeeded" and st["step"] == 16
    assert len(st["attempts"]) >= 2 and st["attempts"][-1]["end_reason"] == "succeeded"
    assert st["attempts"][0]["end_reason"] != "succeeded"
    logs = subprocess.run([sys.executable, "-m", "sdcloud.cli", "logs", rid, "--json"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "SDCLOUD_HOME": str(tmp_path / "third")})
    kinds = [json.loads(ln)["kind"] for ln in logs.stdout.splitlines() if ln.strip()]
    assert "driver-took-over" in kinds


def test_drivers_racing_for_one_run_launch_once_per_decision(tmp_path, monkeypatch):
    """The laptop, a second laptop and the cloud driver take steps on one run for many rounds, in a
    seeded interleaving at step granularity, on a controlled clock; drivers fall asleep (a closed lid)
    and wake. Each has its own state.db (a cache rebuilt from the journal when it takes the lease).
    At most one instance is ever live, and every launch is made by the lease's holder."""
    import random

    from sdcloud.fleet.lifecycle import Timing
    from sdcloud.runs.driving.controller import Controller
    from sdcloud.runs.records.lease import DriverLease, LEASE_ITEM
    from sdcloud.runs.records.journal import Journal, restore
    from sdcloud.runs.records.state import StateStore
    from tests.fleet.test_fleet import CloudDouble

    bucket = tmp_path / "bucket"
    spec = {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1", "model": "tiny", "steps": 100,
            "market": "spot", "store": bucket.as_uri()}
    first = StateStore(tmp_path / "laptop-a.db")
    first.create_run("r-race0001", "sd15-lora", spec, 100)
    store = LocalStore(bucket)
    Journal(first, store, "r-race0001").flush()
    now = [1_000_000.0]
    monkeypatch.setattr("sdcloud.runs.driving.controller.time.time", lambda: now[0])
    cloud = CloudDouble()
    acting: list[str] = []
    launches: list[tuple[str, str]] = []
    real_launch = cloud.launch

    def launch(offer, spec_, market, max_price, events=None):
        held = DriverLease(store, "r-race0001", 5.0, "observer").holder()
        assert held and held["worker"] == acting[-1] and not held["released"], "a launch without the lease"
        assert held["expires_at"] > now[0], "a launch on a lapsed lease"
        inst = real_launch(offer, spec_, market, max_price, events)
        launches.append((acting[-1], inst.id))
        return inst

    cloud.launch = launch
    drivers = {}
    for name in ("laptop-a", "laptop-b", "aws-lambda"):
        state = first if name == "laptop-a" else StateStore(tmp_path / f"{name}.db")
        if name != "laptop-a":
            restore(state, store, "r-race0001")
        ctl = Controller(state, "r-race0001", provider=cloud, timing=Timing(5.0, 10_000, 10_000), driver=name)
        ctl.lease = DriverLease(ctl.store, "r-race0001", 5.0, name, clock=lambda: now[0])
        drivers[name] = ctl
    rng = random.Random(2026)
    asleep = {name: 0 for name in drivers}
    for _ in range(400):
        name = rng.choice(list(drivers))
        ctl = drivers[name]
        if asleep[name] > 0:
            asleep[name] -= 1
            continue
        if rng.random() < 0.03:
            asleep[name] = rng.randint(5, 40)  # the lid closes: no renewal for a while
        now[0] += rng.uniform(1.0, 8.0)
        acting.append(name)
        if not ctl.lease.held:
            if not ctl.lease.acquire():
                continue
            restore(ctl.state, ctl.store, "r-race0001")  # the bucket's history, newer than this cache
        ctl.step()
        live = cloud.live()
        assert len(live) <= 1, f"{len(live)} instances live at once: {[i.id for i in live]}"
        if live and rng.random() < 0.05:
            cloud.reclaim(live[0].id)  # a spot reclaim: the holder's next step relaunches
    assert len({driver for driver, _ in launches}) >= 2, "the run changed hands at least once"
    holder = DriverLease(store, "r-race0001", 5.0, "observer").holder()
    assert holder["worker"] in drivers and LEASE_ITEM == "driver"


def test_up_unattended_is_refused_where_no_cloud_driver_exists(tmp_path, capsys, sdcloud_home):
    """The local provider has no cloud driver: `up --unattended` (or [defaults] unattended) would hand
    the run to nobody, so it is refused before anything is recorded (tests/runs/drivers/test_handover_inputs.py
    hands a run over where a driver exists)."""
    from sdcloud.cli import main
    from sdcloud.runs.records.state import StateStore

    bucket = tmp_path / "bucket"
    args = ["up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "4",
            "--store", bucket.as_uri(), "--yes"]
    assert main([*args, "--unattended", "--json"]) == 2
    err = capsys.readouterr().err
    assert "has no cloud driver" in err and len(err.strip().splitlines()) == 1
    (sdcloud_home / "config.toml").write_text("[defaults]\nunattended = true\n")
    assert main(args) == 2 and "has no cloud driver" in capsys.readouterr().err
    assert main([*args, "--detach"]) == 2 and "choose one" in capsys.readouterr().err
    assert StateStore().list_runs() == [] and not bucket.exists()
    assert not agent_processes(f"SDCLOUD_HOME={sdcloud_home}")


@pytest.mark.slow
def test_watch_drive_takes_the_run_back_from_the_cloud_driver(tmp_path, capsys, sdcloud_home, monkeypatch):
    from sdcloud.cli import main
    from sdcloud.runs.records.lease import DriverLease

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from sdcloud.runs.driving.controller import Controller
    from sdcloud.runs.records.state import StateStore

    bucket = tmp_path / "bucket"
    rid = "r-back0001"  # handed over as `up --unattended` hands a run over where a cloud driver exists
    StateStore().create_run(rid, "sd15-lora", {"tier": "sd15-lora", "provider": "local", "model": "tiny", "steps": 4,
                                               "store": bucket.as_uri()}, 4)
    Controller(StateStore(), rid).hand_over()
    store = LocalStore(bucket)
    cloud = DriverLease(store, rid, 5.0, "aws-lambda")
    assert cloud.acquire()
    assert main(["resume", rid]) == 2, "a plain resume does not race the cloud driver"
    assert "driven by the cloud function aws-lambda" in capsys.readouterr().err
    assert main(["watch", rid, "--drive"]) == 0
    assert not cloud.renew(), "the cloud driver lost the run to the user's explicit ask"
    capsys.readouterr()
    rc = main(["status", rid, "--json"])
    st = json.loads(capsys.readouterr().out)
    assert rc == 0 and st["state"] == "succeeded" and st["step"] == 4
    assert store.head(f"drivers/active/{rid}") is None


@pytest.mark.slow
def test_on_aws_the_cloud_driver_carries_a_reclaim_after_the_laptop_is_gone(moto_server, monkeypatch, tmp_path):
    """The acceptance on the AWS provider against moto over HTTP, the real agent behind each
    instance (tests/support/harness_host_emulator.py): the laptop drives a few steps and then is gone without a word
    (its lease simply stops being renewed, as after SIGKILL), the first instance is reclaimed, and
    the Lambda handler, called as EventBridge Scheduler calls it, relaunches and finishes the run
    with a complete cost ledger; a fresh machine then sees the whole history."""
    import boto3

    from tests.support.harness_host_emulator import HostEmulator
    from sdcloud.fleet.lifecycle import Timing
    from sdcloud.providers import get_provider
    from sdcloud.runs.records import lease as driver_mod
    from sdcloud.driver import unattended
    from sdcloud.runs.driving.controller import Controller, new_run_id
    from sdcloud.runs.records.state import StateStore

    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": moto_server}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # The lease lapses after two polls here (a minute in production), so the test need not wait.
    monkeypatch.setattr(driver_mod, "MIN_LEASE_SECONDS", 2.0)
    monkeypatch.setattr(driver_mod, "LEASE_POLLS", 2)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="sdcloud-unattended")
    ec2 = boto3.client("ec2")
    provider = get_provider("aws", image_id="ami-12c6146b", region="us-east-1", regions=["us-east-1"])
    # The function builds its provider from the run's spec and the stack's outputs; here, moto's.
    monkeypatch.setattr("sdcloud.runs.driving.controller.get_provider", lambda name, **kw: provider)

    def listing():
        for res in ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": ["sdcloud:run"]}])["Reservations"]:
            for inst in res["Instances"]:
                running = inst["State"]["Name"] == "running"
                ud = (ec2.describe_instance_attribute(InstanceId=inst["InstanceId"], Attribute="userData")["UserData"]
                      .get("Value", "") if running else "")
                yield inst["InstanceId"], running, ud

    hosts = HostEmulator(listing, tmp_path / "hosts", env).start()
    url = "s3://sdcloud-unattended/sd"
    try:
        steps = 60
        spec = {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1", "model": "tiny", "steps": steps,
                "checkpoint_every": 5, "store": url, "market": "spot", "trainer_args": ["--min-step-seconds", "0.3"]}
        laptop = StateStore()
        rid = new_run_id()
        laptop.create_run(rid, "sd15-lora", spec, steps)
        ctl = Controller(laptop, rid, provider=provider, driver="laptop",
                         timing=Timing(poll_seconds=0.5, boot_timeout=240, heartbeat_timeout=120))
        ctl.lease.acquire_or_refuse()
        ctl.reconcile()

        def trained() -> int:
            st = ctl.host.read_status()
            return int(st.get("step") or 0) if st and st.get("attempt") == 1 else 0

        until = time.time() + 600
        while trained() < 8 and time.time() < until:
            ctl.step()
            time.sleep(0.5)
        assert trained() >= 8, "the first host never trained"
        first = laptop.attempts(rid)[0]
        # The laptop is gone (no more steps, no goodbye); the first host is reclaimed.
        ec2.terminate_instances(InstanceIds=[first.instance_id])
        monkeypatch.setenv("SDCLOUD_STORE", url)
        monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "lambda-tmp"))
        reports = []
        from sdcloud.runs.records.journal import restore
        from sdcloud.runs.records.store import open_run_store

        def journaled() -> StateStore:  # the function's state.db is its invocation's own: the bucket says
            seen = StateStore(tmp_path / f"seen-{len(reports)}.db")
            restore(seen, open_run_store({"url": url}), rid)
            return seen

        for _ in range(15):
            reports.append(unattended.handler({"sdcloud": "drive"}, LambdaContext(90)))
            if journaled().get_run(rid)["state"] == "succeeded":
                break
            time.sleep(1)
        fn_state = journaled()
        assert fn_state.get_run(rid)["state"] == "succeeded", reports
        ends = [a.end_reason for a in fn_state.attempts(rid)]
        assert ends[0] == "preempted" and ends[-1] == "succeeded", ends
        live = [i for r in ec2.describe_instances(Filters=[{"Name": "instance-state-name",
                                                            "Values": ["pending", "running"]}])["Reservations"]
                for i in r["Instances"]]
        assert live == []
        from sdcloud.costs.ledger import run_cost

        cost = run_cost(fn_state, fn_state.get_run(rid))
        assert all({"compute", "disk"} <= set(a["items"]) for a in cost["attempts"]), cost["attempts"]
        assert cost["reclaims"] == 1
    finally:
        hosts.stop()
    third = tmp_path / "third"
    seen = subprocess.run([sys.executable, "-m", "sdcloud.cli", "status", rid, "--store", url, "--json"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "SDCLOUD_HOME": str(third)})
    assert seen.returncode == 0, seen.stderr
    st = json.loads(seen.stdout)
    assert st["state"] == "succeeded" and [a["end_reason"] for a in st["attempts"]][-1] == "succeeded"


def test_every_live_run_gets_its_steps_in_one_invocation(tmp_path, monkeypatch):
    """Two live runs: the function takes a step of each in turn, not the whole invocation on the first."""
    from sdcloud.driver import unattended
    from sdcloud.runs.records.journal import Journal
    from sdcloud.runs.records.state import StateStore
    from tests.fleet.test_fleet import CloudDouble

    bucket = tmp_path / "bucket"
    laptop = StateStore(tmp_path / "laptop.db")
    store = LocalStore(bucket)
    for rid in ("r-aaaa0001", "r-bbbb0002"):
        laptop.create_run(rid, "sd15-lora", {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1",
                                             "model": "tiny", "steps": 100, "market": "spot",
                                             "store": bucket.as_uri()}, 100)
        Journal(laptop, store, rid).flush()
    cloud = CloudDouble()
    monkeypatch.setattr("sdcloud.runs.driving.controller.get_provider", lambda name, **kw: cloud)
    monkeypatch.setenv("SDCLOUD_STORE", bucket.as_uri())
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "fn"))
    monkeypatch.setenv("SDCLOUD_DRIVER_SECONDS", "12")
    report = unattended.drive_lapsed(unattended._store_conf(), "aws-lambda", lambda: 60.0, sleep=lambda s: None)
    steps = {rid: r["steps"] for rid, r in report["runs"].items()}
    assert set(steps) == {"r-aaaa0001", "r-bbbb0002"} and min(steps.values()) >= 1, report
    assert abs(steps["r-aaaa0001"] - steps["r-bbbb0002"]) <= 1, "the runs take turns"
    assert len(cloud.live()) == 2, "each run launched its own host, once"


def test_with_no_laptop_a_run_without_spot_capacity_meets_its_deadline_on_demand(tmp_path, monkeypatch):
    """Spot capacity vanishes in every zone while only the cloud driver drives the run. On a simulated
    clock, the function's steps wait while the slack allows and then launch on-demand in time for the
    job to finish before its deadline."""
    from sdcloud.providers.base import CapacityError
    from sdcloud.driver import unattended
    from sdcloud.runs.records.journal import Journal
    from sdcloud.runs.records.state import StateStore
    from tests.fleet.test_fleet import CloudDouble

    class NoSpot(CloudDouble):
        spot_tries = 0

        def launch(self, offer, spec, market, max_price, events=None):
            if market == "spot":
                NoSpot.spot_tries += 1
                raise CapacityError(f"no spot capacity for {offer.row.instance_type} in {offer.row.zone}")
            return super().launch(offer, spec, market, max_price, events)

    now = [1_800_000_000.0]
    for mod in ("sdcloud.runs.driving.controller", "sdcloud.fleet.lifecycle", "sdcloud.runs.records.journal"):
        monkeypatch.setattr(f"{mod}.time.time", lambda: now[0])
    bucket = tmp_path / "bucket"
    laptop = StateStore(tmp_path / "laptop.db")
    deadline_h = 6.0
    laptop.create_run("r-dead0001", "sd15-lora", {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1",
                                                  "model": "tiny", "steps": 1500, "market": "spot",
                                                  "deadline_hours": deadline_h, "store": bucket.as_uri()}, 1500)
    laptop.update_run("r-dead0001", created=now[0])
    Journal(laptop, LocalStore(bucket), "r-dead0001").flush()
    cloud = NoSpot()
    monkeypatch.setattr("sdcloud.runs.driving.controller.get_provider", lambda name, **kw: cloud)
    monkeypatch.setenv("SDCLOUD_STORE", bucket.as_uri())
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "fn"))

    def tick(seconds: float) -> None:
        now[0] += 60.0  # a minute of simulated time per poll

    invocations = 0
    while not cloud.live() and invocations < 200:
        invocations += 1
        budget = [40]  # steps per invocation
        unattended.drive_lapsed(unattended._store_conf(), "aws-lambda",
                                lambda: 1000.0 if (budget.__setitem__(0, budget[0] - 1) or budget[0] > 0)
                                and not cloud.live() else 0.0, sleep=tick)
        now[0] += 300.0  # the schedule's next tick
    live = cloud.live()
    from sdcloud.runs.records.journal import restore

    fn = StateStore(tmp_path / "seen.db")  # the function's state.db is its invocation's own: the bucket says
    restore(fn, LocalStore(bucket), "r-dead0001")
    assert live and live[0].market == "on-demand", (fn.get_run("r-dead0001"),
                                                    [(e["kind"], e["data"]) for e in fn.events("r-dead0001")][-8:])
    assert NoSpot.spot_tries >= 1, "spot was tried first"
    from sdcloud.runs.driving.controller import Controller

    ctl = Controller(fn, "r-dead0001", provider=cloud)
    elapsed_h = (now[0] - fn.get_run("r-dead0001")["created"]) / 3600
    assert elapsed_h + ctl.progress().job_hours <= deadline_h, (elapsed_h, ctl.progress().job_hours)
