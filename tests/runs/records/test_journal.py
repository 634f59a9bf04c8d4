"""A run's history in its bucket (sdcloud.runs.records.journal): written after every controller step, read
back on a machine that never saw the run. The end-to-end case trains on the local provider against
SeaweedFS over HTTPS, then asks a fresh $SDCLOUD_HOME for the run's status, logs and cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from sdcloud.runs.records import journal
from sdcloud.runs.records.state import StateStore
from sdcloud_agent.store import LocalStore


class CountingStore(LocalStore):
    def __init__(self, root):
        super().__init__(root)
        self.puts: list[str] = []

    def put(self, key, data, metadata=None):
        self.puts.append(key)
        return super().put(key, data, metadata)

    def put_if_absent(self, key, data):  # the record's first write: create-only
        self.puts.append(key)
        return super().put_if_absent(key, data)

    def put_if_match(self, key, data, etag):  # the record's later writes: over the one read
        self.puts.append(key)
        return super().put_if_match(key, data, etag)


def _a_run(state: StateStore, run_id: str = "r-0000abcd") -> str:
    state.create_run(run_id, "sd15-lora", {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1"}, 100,
                     name="studio-shoot")
    state.add_attempt(run_id, 1, "aws", "tok1", region="us-east-1", zone="us-east-1a", instance_type="g5.xlarge",
                      market="spot", price=0.42, currency="USD", instance_id="i-1", start=1000.0)
    state.update_attempt(run_id, 1, state="ended", end=4600.0, end_reason="preempted")
    state.set_attempt_costs(run_id, 1, currency="USD", quote_price=0.42, ondemand_price=1.006, disk_gb=200)
    state.put_ledger(run_id, 1, [{"item": "compute", "amount": 0.42, "currency": "USD", "usd": 0.42,
                                  "source": "price-history", "detail": {"hours": 1.0}}])
    state.event(run_id, "launching", {"attempt": 1, "instance_type": "g5.xlarge"})
    state.event(run_id, "reclaim-notice", {"attempt": 1, "step": 40})
    state.update_run(run_id, state="recovering", step=40)
    return run_id


def test_a_fresh_machine_rebuilds_the_run_from_its_journal(tmp_path):
    here = StateStore(tmp_path / "a.db")
    store = CountingStore(tmp_path / "bucket")
    rid = _a_run(here)
    j = journal.Journal(here, store, rid, clock=lambda: 0.0)
    j.flush()
    there = StateStore(tmp_path / "b.db")
    assert there.get_run(rid) is None
    got = journal.restore(there, store, rid)
    assert got["state"] == "recovering" and got["step"] == 40 and got["name"] == "studio-shoot"
    assert got["spec"] == here.get_run(rid)["spec"]
    assert [a.__dict__ for a in there.attempts(rid)] == [a.__dict__ for a in here.attempts(rid)]
    assert there.attempt_costs(rid) == here.attempt_costs(rid)
    assert there.ledger(rid) == here.ledger(rid)
    assert [(e["kind"], e["data"]) for e in there.events(rid)] == [(e["kind"], e["data"]) for e in here.events(rid)]
    # Restoring again adds no event twice.
    journal.restore(there, store, rid)
    assert len(there.events(rid)) == len(here.events(rid))


def test_the_journal_writes_only_what_changed(tmp_path):
    state = StateStore(tmp_path / "a.db")
    store = CountingStore(tmp_path / "bucket")
    rid = _a_run(state)
    now = [0.0]
    j = journal.Journal(state, store, rid, clock=lambda: now[0])
    j.flush()
    first = len(store.puts)
    assert sorted(k.split("/")[-2] for k in store.puts) == ["active", "events", "journal"]  # events, run.json, index
    assert store.head(f"drivers/active/{rid}") is not None, "a live run is in the cloud driver's index"
    now[0] = 10.0
    j.flush()
    assert len(store.puts) == first, "nothing changed: nothing written"
    state.event(rid, "resumed", {"attempt": 2, "from_step": 40})
    j.flush()
    assert [k.rsplit("/", 2)[-2] for k in store.puts[first:]] == ["events"], "a new event is one object, not a rewrite"
    state.update_run(rid, step=41)
    j.flush()
    assert store.puts[-1].endswith("journal/run.json")
    now[0] = 10.0 + journal.REWRITE_SECONDS
    n = len(store.puts)
    j.flush()
    assert len(store.puts) == n + 1, "run.json is rewritten at least once a minute (its updated time)"
    state.update_run(rid, state="succeeded")
    j.flush()
    assert store.head(f"drivers/active/{rid}") is None, "an ended run leaves the index"


def test_status_of_an_unknown_run_in_a_bucket_without_it_is_one_line(capsys, tmp_path):
    from sdcloud.cli import main

    rc = main(["status", "r-00000000", "--store", (tmp_path / "empty").as_uri()])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "no run" in err
    rc = main(["status", "--store", "ftp://x/y"])
    assert rc == 2


@pytest.mark.slow
def test_a_second_machine_sees_the_whole_run(s3_env, tmp_path, sdcloud_home):
    import boto3

    bucket = f"jr-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_env["endpoint_url"]).create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/sd"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SDCLOUD_STORE_ENDPOINT": s3_env["endpoint_url"]}

    def sdcloud(home, *args):
        return subprocess.run([sys.executable, "-m", "sdcloud.cli", *args], capture_output=True, text=True,
                              timeout=900, env={**env, "SDCLOUD_HOME": str(home)})

    up = sdcloud(sdcloud_home, "up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "6",
                 "--store", url, "--yes", "--json")
    assert up.returncode == 0, up.stderr[-3000:]
    rid = json.loads(up.stdout)["run"]
    first = json.loads(sdcloud(sdcloud_home, "status", rid, "--json").stdout)

    other = tmp_path / "second-machine"
    assert sdcloud(other, "status", rid).returncode == 2, "a machine that never saw the run does not know it"
    seen = sdcloud(other, "status", rid, "--store", url, "--json")
    assert seen.returncode == 0, seen.stderr
    second = json.loads(seen.stdout)
    for key in ("state", "step", "total_steps", "tier", "name"):
        assert second[key] == first[key], key
    assert [a["instance_id"] for a in second["attempts"]] == [a["instance_id"] for a in first["attempts"]]
    assert second["cost"]["total"] == pytest.approx(first["cost"]["total"], abs=1e-6)
    logs = sdcloud(other, "logs", rid)
    assert logs.returncode == 0 and "succeeded" in logs.stdout
    report = sdcloud(other, "cost", "report", rid, "--format", "json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["totals"]["runs"] == 1


def _events_written(store) -> list[dict]:
    return [e for o in store.list("runs/r-0000abcd/journal/events/") for e in json.loads(store.get(o.key))]


def test_a_writer_that_restored_the_run_sends_back_only_what_is_new(tmp_path):
    """The cloud function's case, every invocation: a fresh state.db restored from the bucket, then
    written back. Before events had an identity, each such writer sent everything it had read."""
    laptop = StateStore(tmp_path / "laptop.db")
    store = CountingStore(tmp_path / "bucket")
    rid = _a_run(laptop)
    journal.Journal(laptop, store, rid, clock=lambda: 0.0).flush()
    real = len(laptop.events(rid))
    assert len(_events_written(store)) == real
    for i in range(5):  # five invocations, each from an empty /tmp
        fn = StateStore(tmp_path / f"fn-{i}.db")
        journal.restore(fn, store, rid)
        fn.event(rid, "driver-took-over", {"driver": "aws-lambda", "invocation": f"aws-lambda:{i}"})
        before = len(store.puts)
        journal.Journal(fn, store, rid, clock=lambda: 0.0).flush()
        sent = [k for k in store.puts[before:] if "/events/" in k]
        assert len(sent) == 1 and len(json.loads(store.get(sent[0]))) == 1, "only the new event is sent"
    assert len(_events_written(store)) == real + 5
    # A writer of a state.db that never restored (another process on the laptop) learns the bucket first.
    before = len(store.puts)
    journal.Journal(laptop, store, rid, clock=lambda: 0.0).flush()
    assert not [k for k in store.puts[before:] if "/events/" in k], "a rewrite of known events writes nothing"
    third = StateStore(tmp_path / "third.db")
    journal.restore(third, store, rid)
    assert len(third.events(rid)) == real + 5


def test_restore_inserts_each_event_once_however_many_objects_hold_it(tmp_path):
    """Journals written before events had an identity hold copies spread over several objects (the
    doubling of issue 33); each event is restored once, and a second restore adds nothing."""
    laptop = StateStore(tmp_path / "laptop.db")
    store = LocalStore(tmp_path / "bucket")
    rid = _a_run(laptop)
    journal.Journal(laptop, store, rid, clock=lambda: 0.0).flush()
    [obj] = store.list(f"runs/{rid}/journal/events/")
    copies = json.loads(store.get(obj.key))
    for n, host in enumerate(("laptop", "aws-lambda", "aws-lambda")):  # the old naming: <ns>-<host>.json
        store.put(f"runs/{rid}/journal/events/{1_000 + n:020d}-{host}.json", json.dumps(copies * (n + 1)).encode())
    there = StateStore(tmp_path / "there.db")
    journal.restore(there, store, rid)
    assert [(e["kind"], e["data"]) for e in there.events(rid)] == [(e["kind"], e["data"]) for e in laptop.events(rid)]
    journal.restore(there, store, rid)
    journal.restore(laptop, store, rid)  # over the events it wrote itself
    assert len(there.events(rid)) == len(laptop.events(rid)) == len(copies)
    # Two events of one kind at one time are two events when their fields differ.
    laptop.event(rid, "launch-failed", {"attempt": 2, "offer": "a"})
    laptop.event(rid, "launch-failed", {"attempt": 3, "offer": "b"})
    journal.Journal(laptop, store, rid, clock=lambda: 0.0).flush()
    journal.restore(there, store, rid)
    assert [e["data"]["attempt"] for e in there.events(rid) if e["kind"] == "launch-failed"] == [2, 3]


def test_a_driver_that_lost_the_lease_writes_nothing(tmp_path):
    from sdcloud.runs.records.lease import DriverLease

    state = StateStore(tmp_path / "a.db")
    store = CountingStore(tmp_path / "bucket")
    rid = _a_run(state)
    lease = DriverLease(store, rid, 5.0, "laptop-a")
    assert lease.acquire()
    j = journal.Journal(state, store, rid, clock=lambda: 0.0)
    j.lease = lease
    j.flush()
    assert DriverLease(store, rid, 5.0, "laptop-b").acquire(take_over=True)
    assert not lease.renew() and lease.lost
    state.event(rid, "launching", {"attempt": 2})  # what it did after the loss is not the run's
    state.update_run(rid, step=99)
    n = len(store.puts)
    j.flush()
    assert len(store.puts) == n
