"""The cloud driver as a schedule calls it, many times (sdcloud.driver.unattended, runs/records/lease.py,
runs/records/journal.py): one driver per decision, one record per event.

A run is driven by the Lambda handler alone, called as EventBridge Scheduler calls it, tick after
tick, each invocation from an empty $SDCLOUD_HOME (a function's /tmp) and with its own request id;
after each spot reclaim three invocations race (threads). EC2 is moto's server over HTTP (the AWS
provider's own calls), the run's bucket a folder the function reaches as a bucket. The hosts are
played by a script that reports as the agent does (status.json: attempt, phase, step, resumed_from)
and keeps a checkpoint every 5 steps; a reclaim takes a host away between two checkpoints. Time is
a simulated clock (each poll of the handler moves it), so the test takes seconds, not hours.

Then, on a third machine: every event is in the journal once and in `logs` once, every attempt was
launched by one invocation and ended by one, never two hosts were up at once, each resume is
recorded once with the steps lost at that moment, and `cost report` counts the invocations that
took the run, not the copies of their records.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import Counter

import pytest

from sdcloud_agent.store import LocalStore

SCHEDULER_INPUT = {"sdcloud": "drive"}
TICKS = 50
STEPS = 420
STEP_SECONDS = 10.0  # a host's step, in simulated seconds
RECLAIM_EVERY = 8  # ticks


class Clock:
    """Simulated seconds: every poll the handler sleeps moves it; the hosts train by it."""

    def __init__(self):
        self.now = 1_800_000_000.0
        self.lock = threading.RLock()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


class Context:
    """Lambda's context as the handler reads it: a request id, and the time left (simulated)."""

    def __init__(self, clock: Clock, seconds: float):
        self.aws_request_id = str(uuid.uuid4())
        self._clock, self._end = clock, clock() + seconds

    def get_remaining_time_in_millis(self) -> int:
        return int(max(0.0, self._end - self._clock()) * 1000)


class Hosts:
    """The run's hosts, as moto lists its instances: each trains from the run's checkpoint at
    STEP_SECONDS a step, reports as the agent does, and keeps a checkpoint every 5 steps."""

    def __init__(self, ec2, store: LocalStore, rid: str, clock: Clock):
        self.ec2, self.store, self.rid, self.clock = ec2, store, rid, clock
        self.lock = threading.RLock()
        self.hosts: dict[str, dict] = {}
        self.checkpoint = 0
        self.most_up = 0
        self.reclaims: list[dict] = []  # attempt, the step it reached, the checkpoint it left

    def _running(self) -> list[tuple[str, int]]:
        out = []
        for res in self.ec2.describe_instances(Filters=[{"Name": "tag:sdcloud:run", "Values": [self.rid]},
                                                        {"Name": "instance-state-name",
                                                         "Values": ["pending", "running"]}])["Reservations"]:
            for inst in res["Instances"]:
                tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                out.append((inst["InstanceId"], int(tags["sdcloud:attempt"])))
        return out

    def _report(self, h: dict, phase: str) -> None:
        self.store.put(f"runs/{self.rid}/status.json", json.dumps({
            "attempt": h["n"], "phase": phase, "step": h["step"], "time": self.clock(), "it_per_s": 0.1,
            "resumed_from": h["from"] if h["n"] > 1 else None}).encode())

    def tick(self) -> None:
        with self.lock:
            running = self._running()
            self.most_up = max(self.most_up, len(running))
            for iid, n in running:
                h = self.hosts.setdefault(iid, {"n": n, "from": self.checkpoint, "t0": self.clock(), "step": 0})
                h["step"] = min(STEPS, h["from"] + int((self.clock() - h["t0"]) / STEP_SECONDS))
                self.checkpoint = max(self.checkpoint, h["step"] // 5 * 5)
                self._report(h, "succeeded" if h["step"] >= STEPS else "training")

    def reclaim(self) -> bool:
        """The cloud takes the running host back between two checkpoints (its last steps are lost)."""
        with self.lock:
            self.tick()
            for iid, _ in self._running():
                h = self.hosts[iid]
                if h["step"] >= STEPS or h["step"] % 5 == 0:
                    return False
                self._report(h, "preempted")
                self.reclaims.append({"attempt": h["n"], "step": h["step"], "checkpoint": self.checkpoint})
                self.ec2.terminate_instances(InstanceIds=[iid])
                return True
            return False


def _record_driver_calls(monkeypatch, host_client) -> list[tuple[str, str, dict]]:
    """(thread, operation, params) of every EC2 call a driver makes (the hosts' own calls left out)."""
    import botocore.client

    calls: list[tuple[str, str, dict]] = []
    original = botocore.client.BaseClient._make_api_call

    def recording(self, operation_name, api_params):
        if self is not host_client and operation_name in ("RunInstances", "TerminateInstances"):
            calls.append((threading.current_thread().name, operation_name, dict(api_params)))
        return original(self, operation_name, api_params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recording)
    return calls


@pytest.mark.slow
def test_fifty_invocations_record_each_event_once_and_act_once(moto_server, aws_env, monkeypatch, tmp_path, capsys):
    import boto3

    from sdcloud.cli import main
    from sdcloud.providers import get_provider
    from sdcloud.driver import unattended
    from sdcloud.runs.records.journal import Journal, bucket_events, events_prefix
    from sdcloud.runs.records.state import StateStore

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    clock = Clock()
    bucket = tmp_path / "bucket"
    store = LocalStore(bucket)
    rid = "r-sched050"
    laptop = StateStore(tmp_path / "laptop" / "state.db")
    laptop.create_run(rid, "sd15-lora", {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1",
                                         "model": "tiny", "steps": STEPS, "market": "spot",
                                         "store": bucket.as_uri()}, STEPS)
    laptop.update_run(rid, created=clock())
    Journal(laptop, store, rid).flush()  # the run is live in the bucket, and no laptop drives it

    ec2 = boto3.client("ec2", endpoint_url=moto_server, region_name="us-east-1")
    hosts = Hosts(ec2, store, rid, clock)
    calls = _record_driver_calls(monkeypatch, ec2)
    # The AWS provider the function builds from the run's spec, with moto's image (one for every
    # invocation: its clients are boto3's, which threads share; only a lease holder uses it).
    provider = get_provider("aws", image_id="ami-12c6146b", region="us-east-1", regions=["us-east-1"])
    monkeypatch.setattr("sdcloud.runs.driving.controller.get_provider", lambda name, **kw: provider)

    def poll(seconds: float) -> None:
        clock.advance(seconds)
        hosts.tick()

    monkeypatch.setattr(time, "time", clock)
    monkeypatch.setattr(time, "sleep", poll)
    monkeypatch.setenv("SDCLOUD_STORE", bucket.as_uri())

    reports: list[dict] = []

    def invoke() -> None:
        # The function's time: its safety margin and three polls of steps.
        reports.append(unattended.handler(SCHEDULER_INPUT, Context(clock, unattended.safety_seconds("aws-lambda") + 16)))

    ticks = 0
    while ticks < TICKS + 30 and store.head(f"drivers/active/{rid}") is not None:
        ticks += 1
        monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / f"fn-{ticks}"))  # an empty /tmp
        if ticks % RECLAIM_EVERY == 0 and hosts.reclaim():
            racers = [threading.Thread(target=invoke, name=f"tick{ticks}-{i}") for i in range(3)]
            for t in racers:
                t.start()
            for t in racers:
                t.join()
        else:
            threading.current_thread().name = f"tick{ticks}"
            invoke()
        # The schedule's next tick: mostly soon (the lease is parked, the next one continues), now
        # and then after the lease has lapsed.
        poll(300.0 if ticks % 5 == 0 else 15.0)
    threading.current_thread().name = "MainThread"
    monkeypatch.undo()  # the real clock for the third machine's commands

    took = [r for r in reports if "steps" in r["runs"].get(rid, {})]
    assert ticks >= TICKS, (f"the run ended after {ticks} ticks", reports[-2:])
    assert store.head(f"drivers/active/{rid}") is None, "the handler alone finished the run"
    assert len(hosts.reclaims) >= 3 and len(reports) == ticks + 2 * len(hosts.reclaims)
    assert not [r for r in reports if r["runs"].get(rid, {}).get("error")], reports

    # One driver per decision: each attempt launched once, each host ended once, never two up.
    launched = Counter(next(t["Value"] for spec in p["TagSpecifications"] for t in spec["Tags"]
                            if t["Key"] == "sdcloud:attempt") for _, op, p in calls if op == "RunInstances")
    ended = Counter(i for _, op, p in calls if op == "TerminateInstances" for i in p["InstanceIds"])
    assert launched and set(launched.values()) == {1}, launched
    assert len(ended) == len(launched) and set(ended.values()) == {1}, ended
    assert hosts.most_up == 1

    # One record per event: the journal's copies are the events, and a third machine sees each once.
    written = [e for o in store.list(events_prefix(rid)) for e in json.loads(store.get(o.key))]
    assert len(written) == len(bucket_events(store, rid)), "an event was written twice"
    third = tmp_path / "third"
    monkeypatch.setenv("SDCLOUD_HOME", str(third))
    capsys.readouterr()
    assert main(["status", rid, "--store", bucket.as_uri(), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["state"] == "succeeded" and st["step"] == STEPS
    assert len(st["attempts"]) == len(launched) == len(hosts.reclaims) + 1
    events = StateStore(third / "state.db").events(rid)
    assert len(events) == len(written)
    assert main(["logs", rid, "--json", "-v"]) == 0
    logged = Counter(r["kind"] for r in map(json.loads, capsys.readouterr().out.splitlines())
                     if r["source"] == "controller")
    assert logged == Counter(e["kind"] for e in written)
    assert logged["driver-took-over"] == len(took), "one record per invocation that took the run"
    assert logged["launching"] == len(launched)

    # Each resume once, with the steps lost at that moment (reached before the reclaim, less the checkpoint).
    resumed = {e["data"]["attempt"]: e["data"] for e in events if e["kind"] == "resumed"}
    assert len(resumed) == logged["resumed"] == len(hosts.reclaims)
    for r in hosts.reclaims:
        assert resumed[r["attempt"] + 1]["from_step"] == r["checkpoint"]
        assert resumed[r["attempt"] + 1]["lost_steps"] == r["step"] - r["checkpoint"] > 0

    # The cost report's driver line counts the invocations that drove the run.
    assert main(["cost", "report", rid]) == 0
    line = re.search(r"cloud driver (\d+) invocations", capsys.readouterr().out.replace("\n", " "))
    assert line and int(line.group(1)) == len(took) < len(reports)
    print(f"figures: {ticks} ticks, {len(reports)} invocations, {len(took)} took the run; "
          f"{len(written)} event records written for {len(events)} events; {len(launched)} launches, "
          f"{len(hosts.reclaims)} reclaims; lease objects {len(store.list(f'runs/{rid}/leases/'))}")
