"""A batch job submitted by a cloud schedule, with the laptop gone, finishes exactly once.

The laptop runs `sdcloud batch schedule add --provider aws` against moto over HTTP (EventBridge
Scheduler and S3), and is gone from then on. The cloud driver's handler is then called as the
schedule would call it: with the schedule's own target input (Scheduler's scheduled-time attribute
filled in), from an empty $SDCLOUD_HOME each time, a doubled fire racing itself, the regular drive
ticks after it, two of them racing after a reclaim. Behind each instance moto runs, the agent's own
batch Worker makes the images (its agent config read from the instance's user-data). Every image
is made exactly once, there is one job, and it ends succeeded with no instance left.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path

import pytest
from tests.support.fake_batch import FakeGenerator
from tests.batch.clouds.test_batch_cloud import agent_config_of

BUCKET = "sdcloud-batch-sched"
INFRA = {"bucket": BUCKET, "prefix": "sdcloud", "region": "us-east-1", "driver_function": "sdcloud-test-driver",
         "driver_function_arn": "arn:aws:lambda:us-east-1:123456789012:function:sdcloud-test-driver",
         "driver_scheduler_role_arn": "arn:aws:iam::123456789012:role/sdcloud-test-driver-scheduler"}


class LambdaContext:
    def __init__(self, seconds: float):
        self._end = time.monotonic() + seconds

    def get_remaining_time_in_millis(self) -> int:
        return int(max(0.0, self._end - time.monotonic()) * 1000)


class Hosts:
    """The agent's batch Worker behind each running instance of the job; it stops when its instance does."""

    def __init__(self, ec2, job: str):
        self.ec2, self.job = ec2, job
        self.workers: dict[str, tuple] = {}

    def sync(self) -> None:
        from sdcloud_agent.batch.worker import Worker
        from sdcloud_agent.store import open_store

        for res in self.ec2.describe_instances(Filters=[{"Name": "tag:sdcloud:run", "Values": [self.job]}])["Reservations"]:
            for inst in res["Instances"]:
                iid, running = inst["InstanceId"], inst["State"]["Name"] == "running"
                if running and iid not in self.workers:
                    ud = self.ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"]
                    cfg = agent_config_of(base64.b64decode(ud).decode())
                    b = cfg["batch"]
                    # The item lease is short here so that a reclaimed host's item is taken over within the test.
                    w = Worker(open_store(cfg["store"]), b["job"], FakeGenerator(delay=0.4), worker_id=b["worker_id"],
                               ttl=2.0, idle_wait=0.2)
                    t = threading.Thread(target=w.run, daemon=True)
                    t.start()
                    self.workers[iid] = (w, t)
                elif not running and iid in self.workers:
                    self.workers[iid][0].stop.set()  # the host is gone with its worker

    def stop(self) -> None:
        for w, t in self.workers.values():
            w.stop.set()
            t.join(10)


@pytest.fixture
def aws(moto_server, monkeypatch, sdcloud_home):
    import boto3

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": moto_server}.items():
        monkeypatch.setenv(k, v)
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    from sdcloud.runs.records.state import StateStore

    StateStore().save_infra("aws", "", INFRA)  # what `sdcloud infra up --provider aws` left on the laptop
    return boto3


def _prompts(tmp_path: Path, n: int) -> Path:
    p = tmp_path / "prompts.txt"
    p.write_text("".join(f"a lighthouse at dusk, take {i}\n" for i in range(n)))
    return p


def test_a_batch_job_submitted_by_a_cloud_schedule_finishes_exactly_once_with_the_laptop_gone(
        aws, tmp_path, monkeypatch, capsys, sdcloud_home):
    from sdcloud.cli import main
    from sdcloud.providers import get_provider
    from sdcloud.driver import unattended
    from sdcloud_agent.batch.verify import verify
    from sdcloud_agent.store import open_store

    assert main(["batch", "schedule", "add", "--provider", "aws", "--cron", "0 2 * * *", "--tz", "Europe/Berlin",
                 "--tier", "batch-sd15", "--model", "tiny", "--prompts", str(_prompts(tmp_path, 8)),
                 "--images-per-prompt", "2", "--workers", "2", "--generator", "fake"]) == 0
    out = capsys.readouterr()
    sid = out.out.strip()
    assert "EventBridge Scheduler schedule" in out.err
    scheduler = aws.client("scheduler")
    made = scheduler.get_schedule(Name=f"sdcloud-batch-{sid}")
    assert made["ScheduleExpression"] == "cron(0 2 * * ? *)" and made["ScheduleExpressionTimezone"] == "Europe/Berlin"
    assert made["Target"]["Arn"] == INFRA["driver_function_arn"]
    assert main(["batch", "schedule", "list", "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == [sid]

    # The laptop is gone. EventBridge Scheduler fills in the scheduled time (02:00 Berlin is 01:00 UTC).
    fire = json.loads(made["Target"]["Input"].replace("<aws.scheduler.scheduled-time>", "2026-12-02T01:00:00Z"))
    provider = get_provider("aws", image_id="ami-12c6146b", region="us-east-1", regions=["us-east-1"])
    monkeypatch.setattr("sdcloud.providers.get_provider", lambda name, **kw: provider)
    monkeypatch.setenv("SDCLOUD_STORE", f"s3://{BUCKET}/sdcloud")
    monkeypatch.setenv("SDCLOUD_STORE_REGION", "us-east-1")
    monkeypatch.setenv("SDCLOUD_DRIVER_SECONDS", "1")
    homes = iter(range(1000))

    def invoke(event: dict) -> dict:
        monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / f"function-{next(homes)}"))  # a fresh /tmp
        return unattended.handler(event, LambdaContext(120))

    def racing(event: dict, n: int = 2) -> list[dict]:
        got: list[dict] = []
        threads = [threading.Thread(target=lambda: got.append(invoke(event))) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        return got

    reports = racing(fire)  # a doubled delivery of one fire
    fired = [r["batch"]["fired"] for r in reports]
    job = fired[0]["job"]
    assert {f["job"] for f in fired} == {job}
    assert sum("submitted" in f for f in fired) == 1, fired
    store = open_store({"url": f"s3://{BUCKET}/sdcloud"})
    prefix = f"batch/{job}"
    ec2 = aws.client("ec2")
    hosts = Hosts(ec2, job)
    try:
        hosts.sync()
        assert len(hosts.workers) == 2, "the fire's invocation launched the job's two hosts"
        until = time.time() + 60
        while len(store.list(f"{prefix}/done/")) < 1 and time.time() < until:
            time.sleep(0.1)
        # A spot reclaim while nobody but the function drives the job; two ticks race after it.
        victim = next(iter(hosts.workers))
        assert hosts.workers[victim][1].is_alive(), "the host finished before it could be reclaimed"
        ec2.terminate_instances(InstanceIds=[victim])
        hosts.sync()
        reports += racing({"sdcloud": "drive"})
        for _ in range(40):
            hosts.sync()
            if not store.list("drivers/batch/"):
                break
            time.sleep(0.5)
            reports.append(invoke({"sdcloud": "drive"}))
        assert not store.list("drivers/batch/"), f"the job is still live: {reports[-3:]}"
    finally:
        hosts.stop()

    # A retried fire of the same time, after the job ended, submits nothing.
    again = invoke(fire)["batch"]["fired"]
    assert again["job"] == job and again.get("existing") is True
    jobs = [o.key for o in store.list("batch/") if o.key.endswith("/job.json")]
    assert jobs == [f"{prefix}/job.json"], "one job"
    v = verify(store, prefix)
    assert v.ok and v.images_present == v.images_expected == 16, v
    from sdcloud.batch import journal
    from sdcloud.runs.records.state import StateStore

    state = StateStore(tmp_path / "third" / "state.db")
    row = journal.restore(state, store, job)
    assert row["state"] == "succeeded" and row["step"] == 16
    kinds = [str(e["kind"]) for e in state.events(job)]
    assert kinds.count("batch-submitted") == 1 and kinds.count("batch-schedule-fired") == 1
    assert kinds.count("batch-succeeded") == 1, kinds
    ends = [a.end_reason for a in state.attempts(job)]
    assert "preempted" in ends and len(ends) >= 3, ends  # the reclaimed host was replaced
    live = [i for r in ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
            ["Reservations"] for i in r["Instances"]]
    assert live == []

    monkeypatch.setenv("SDCLOUD_HOME", str(sdcloud_home))  # the laptop is back: it sees the job the cloud made
    capsys.readouterr()
    assert main(["batch", "schedule", "list", "--json"]) == 0
    assert [r["last_job"] for r in json.loads(capsys.readouterr().out)] == [job]
    assert main(["batch", "status", job, "--json"]) == 0
    seen = json.loads(capsys.readouterr().out)
    assert seen["state"] == "succeeded" and seen["images_done"] == 16, seen
    assert main(["batch", "schedule", "remove", sid]) == 0
    assert f"EventBridge Scheduler schedule sdcloud-batch-{sid}" in capsys.readouterr().out
    assert scheduler.list_schedules(NamePrefix="sdcloud-batch-")["Schedules"] == []


def test_an_aws_schedule_pauses_and_resumes_on_the_scheduler_keeping_the_rest(aws, tmp_path, capsys):
    """Pause disables the EventBridge Scheduler schedule and resume enables it; UpdateSchedule replaces
    the whole schedule, so everything else (expression, zone, target input, retries) must survive."""
    from sdcloud.cli import main

    scheduler = aws.client("scheduler")
    assert main(["batch", "schedule", "add", "--provider", "aws", "--cron", "15 3 * * 1-5", "--tz", "Europe/Berlin",
                 "--tier", "batch-sd15", "--model", "tiny", "--prompts", str(_prompts(tmp_path, 2)),
                 "--generator", "fake"]) == 0
    sid = capsys.readouterr().out.strip()
    name = f"sdcloud-batch-{sid}"
    made = scheduler.get_schedule(Name=name)
    assert made["State"] == "ENABLED"

    assert main(["batch", "schedule", "pause", sid]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"paused {sid}") and f"EventBridge Scheduler schedule {name} on aws" in out, out
    assert f"sdcloud batch schedule resume {sid}" in out
    paused = scheduler.get_schedule(Name=name)
    assert paused["State"] == "DISABLED"
    kept = ("ScheduleExpression", "ScheduleExpressionTimezone", "Target", "FlexibleTimeWindow", "Description")
    assert {k: paused.get(k) for k in kept} == {k: made.get(k) for k in kept}
    assert main(["batch", "schedule", "list", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["id"] == sid and row["paused"] is True
    assert main(["batch", "schedule", "pause", sid]) == 0
    assert "was already paused; nothing changed" in capsys.readouterr().out

    assert main(["batch", "schedule", "resume", sid]) == 0
    assert capsys.readouterr().out.startswith(f"resumed {sid}")
    resumed = scheduler.get_schedule(Name=name)
    assert resumed["State"] == "ENABLED" and {k: resumed.get(k) for k in kept} == {k: made.get(k) for k in kept}
    assert main(["batch", "schedule", "pause", "s-nosuch1"]) == 2
    err = capsys.readouterr().err
    assert "no schedule 's-nosuch1'" in err and len(err.strip().splitlines()) == 1, err
    assert main(["batch", "schedule", "remove", sid]) == 0  # moto's scheduler is the worker's: leave it empty
    assert main(["batch", "schedule", "remove", sid]) == 2 and main(["batch", "schedule", "resume", sid]) == 2
    assert capsys.readouterr().err.count(f"no schedule {sid!r}") == 2


@pytest.mark.parametrize("cron,tz,why", [
    ("0 25 * * *", "UTC", "bad cron expression"),
    ("0 2 * *", "UTC", "bad cron expression"),
    ("0 2 1 * 1", "UTC", "both the day of month and the day of week"),
    ("0 2 * * *", "Mars/Olympus", "unknown time zone"),
])
def test_a_bad_cloud_schedule_is_refused_before_anything_is_made(aws, tmp_path, capsys, cron, tz, why):
    from sdcloud.cli import main

    rc = main(["batch", "schedule", "add", "--provider", "aws", "--cron", cron, "--tz", tz, "--tier", "batch-sd15",
               "--model", "tiny", "--prompts", str(_prompts(tmp_path, 2)), "--generator", "fake"])
    err = capsys.readouterr().err
    assert rc == 2 and why in err and len(err.strip().splitlines()) == 1, err
    assert aws.client("scheduler").list_schedules()["Schedules"] == []
    assert aws.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="sdcloud/batch/schedules/").get("KeyCount") == 0
