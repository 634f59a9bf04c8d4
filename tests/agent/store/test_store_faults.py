"""Transient store faults are absorbed; refusals are told apart from them (issue 25, the faults half).

The store talks to SeaweedFS through tests/support/fronts/front_faults.py, which answers 503 SlowDown, resets
connections, truncates GET bodies, stalls, and answers 500 after a write committed, seeded.
"""

from __future__ import annotations

import json
import uuid

import boto3
import pytest

from sdcloud_agent.store import RetryPolicy, StoreError, failure_cause, is_transient, open_store

from tests.support.fronts.front_faults import FaultFront, refuse_writes

FAST = RetryPolicy(attempts=8, base_delay=0.01, max_delay=0.05, deadline=30.0)


@pytest.fixture
def bucket(s3_env) -> str:
    name = f"faults-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_env["endpoint_url"]).create_bucket(Bucket=name)
    return name


def _store(front: FaultFront, bucket: str, **kw):
    return open_store({"url": f"s3://{bucket}/p", "endpoint_url": front.endpoint}, retry_policy=FAST, **kw)


@pytest.mark.slow
def test_every_operation_absorbs_faults(seaweed, bucket):
    with FaultFront(seaweed, seed=11, slowdown=0.06, reset=0.06, truncate=0.08, stall=0.02, late_500=0.08,
                    stall_seconds=0.2) as front:
        store = _store(front, bucket)
        for n in range(40):
            data = json.dumps({"n": n, "pad": "x" * (200 + n)}).encode()
            store.put(f"obj/{n:03d}.json", data)
            assert store.get(f"obj/{n:03d}.json") == data
            assert store.head(f"obj/{n:03d}.json").size == len(data)
            etag = store.put_if_absent(f"lease/{n:03d}.json", data)
            assert etag, f"create-only write {n} was called refused"
            assert store.put_if_absent(f"lease/{n:03d}.json", data + b" ") is None
            body, seen = store.get_versioned(f"lease/{n:03d}.json")
            assert body == data
            assert store.put_if_match(f"lease/{n:03d}.json", data + b"!", seen), f"swap {n} was called lost"
        assert [o.key for o in store.list("obj/")] == [f"obj/{n:03d}.json" for n in range(40)]
        store.delete([f"obj/{n:03d}.json" for n in range(40)])
        assert store.list("obj/") == []
    # Every kind of fault was met and absorbed.
    assert all(front.injected[k] > 0 for k in ("slowdown", "reset", "truncate", "stall", "late_500")), front.injected


def test_a_lost_acknowledgement_is_not_a_lost_write(seaweed, bucket):
    """Every write commits and is answered 500: a create-only write whose retry meets its own object
    succeeds; one that meets another's object is refused; a swap whose retry fails is re-read."""
    with FaultFront(seaweed, seed=3, late_500=1.0) as front:
        store = _store(front, bucket)
        etag = store.put_if_absent("lease/a.json", b"mine")
        assert etag and store.get_versioned("lease/a.json") == (b"mine", etag)
        assert store.put_if_absent("lease/a.json", b"someone else's") is None
        new = store.put_if_match("lease/a.json", b"mine, renewed", etag)
        assert new and store.get_versioned("lease/a.json") == (b"mine, renewed", new)
        assert store.put_if_match("lease/a.json", b"stale", etag) is None  # a real loss stays a loss
        assert store.create("runs/r/lease/000000001.json", b"{}")
    assert front.injected["late_500"] >= 4


def test_a_truncated_body_is_read_again(seaweed, bucket):
    """botocore retries a request, not the reading of its body: the store reads it again."""
    with FaultFront(seaweed, seed=5) as front:
        store = _store(front, bucket)
        status = json.dumps({"phase": "training", "step": 7, "reason": "x" * 200}).encode()
        store.put("runs/r/status.json", status)
        front.rates["truncate"] = 0.5
        for _ in range(20):
            assert store.get("runs/r/status.json") == status
    assert front.injected["truncate"] >= 3


def test_a_stall_past_the_read_timeout_is_tried_again(seaweed, bucket):
    with FaultFront(seaweed, seed=9, stall_seconds=2.5) as front:
        store = _store(front, bucket, read_timeout=1)
        store.put("runs/r/status.json", b"{}")
        front.rates["stall"] = 0.3
        for _ in range(6):
            assert store.get("runs/r/status.json") == b"{}"
    assert front.injected["stall"] >= 1


@pytest.mark.slow  # botocore's own backoff between its 5 requests: about 12 s per try
def test_a_fault_that_stays_ends_in_one_store_error(seaweed, bucket):
    with FaultFront(seaweed, seed=2, slowdown=1.0) as front:
        store = open_store({"url": f"s3://{bucket}/p", "endpoint_url": front.endpoint},
                           retry_policy=RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.01))
        with pytest.raises(StoreError, match="failed after 2 attempts.*SlowDown") as err:
            store.get("runs/r/status.json")
        assert is_transient(err.value.__cause__)


@pytest.mark.parametrize("code", ["AccessDenied", "InvalidAccessKeyId"])
def test_a_refusal_is_not_retried_and_names_its_cause(seaweed, bucket, code):
    with FaultFront(seaweed, refuse=refuse_writes(code)) as front:
        store = _store(front, bucket)
        with pytest.raises(Exception) as err:
            store.put_if_absent("runs/r/lease/000000001.json", b"{}")
        assert failure_cause(err.value) == "permission-denied" and not is_transient(err.value)
        assert len(front.refused) == 1, front.refused  # refused once: not retried


# -- end to end: a local training run and a batch job through the fronts --------------------------

def _sdcloud(*args: str, env: dict, timeout: float = 900):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "sdcloud.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1", **env})


# What the controller itself writes to a run's prefix (its driver lease, journal and heartbeat);
# every other write is the host's.
CONTROLLER_KEYS = ("/leases/", "/journal/", "/controller.json")


def _refuse_host_writes(code: str):
    def refuse(method, path, headers):
        if method in ("PUT", "POST", "DELETE") and not any(k in path for k in CONTROLLER_KEYS):
            return 403, code
        return None
    return refuse


@pytest.mark.slow
@pytest.mark.parametrize("code", ["AccessDenied", "InvalidAccessKeyId"])
def test_a_store_refusing_the_hosts_writes_fails_the_run_in_one_attempt(seaweed, bucket, code, sdcloud_home):
    """Today: each refused host was recorded as a reclaim and relaunched (81 times in 5 minutes)."""
    from sdcloud.runs.records.state import StateStore

    with FaultFront(seaweed, refuse=_refuse_host_writes(code)) as front:
        proc = _sdcloud("up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "10",
                        "--store", f"s3://{bucket}/p", "--name", "refused", "--yes", "--json",
                        env={"SDCLOUD_STORE_ENDPOINT": front.endpoint}, timeout=600)
    assert front.refused, "the front never refused a host's write"
    run = next(r for r in StateStore().list_runs() if r["name"] == "refused")
    attempts = StateStore().attempts(run["id"])
    assert run["state"] == "failed", (run, proc.stderr[-2000:])
    assert 1 <= len(attempts) <= 3, [a.end_reason for a in attempts]
    assert not any(a.end_reason == "preempted" for a in attempts)
    reason = run["reason"]
    assert "\n" not in reason and code in reason and "permission-denied" in reason, reason
    assert proc.returncode != 0
    events = [e["kind"] for e in StateStore().events(run["id"])]
    assert "reclaimed" not in events and "host-failed" in events
    print(f"{code}: {len(attempts)} attempt(s), reason: {reason}")


@pytest.mark.slow
def test_a_training_run_with_a_reclaim_succeeds_through_store_faults(seaweed, bucket, sdcloud_home):
    """SlowDown, resets, truncated GET bodies, stalls and 500s after committed writes, a few percent
    each: the run is reclaimed once, resumes at its durable checkpoint and succeeds."""
    from sdcloud.runs.records.state import StateStore

    with FaultFront(seaweed, seed=25, slowdown=0.03, reset=0.03, truncate=0.03, stall=0.02, late_500=0.03,
                    stall_seconds=0.5) as front:
        proc = _sdcloud("up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "40",
                        "--checkpoint-every", "5", "--simulate-preemption", "20", "--store", f"s3://{bucket}/p",
                        "--name", "faulty", "--yes", "--json", env={"SDCLOUD_STORE_ENDPOINT": front.endpoint})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["state"] == "succeeded" and out["step"] == 40, out
    assert [a["end_reason"] for a in out["attempts"]] == ["preempted", "succeeded"]
    resumed = [e["data"] for e in StateStore().events(out["run"]) if e["kind"] == "resumed"]
    assert resumed and resumed[0]["from_step"] > 0, resumed
    assert all(front.injected[k] > 0 for k in ("slowdown", "reset", "truncate", "stall", "late_500")), front.injected


@pytest.mark.slow
def test_a_batch_job_with_a_killed_worker_verifies_through_store_faults(seaweed, bucket, tmp_path, monkeypatch,
                                                                        sdcloud_home):
    from tests.batch.test_batch_cli import _job_state, _kill_one_worker_mid_item, _wait

    with FaultFront(seaweed, seed=26, slowdown=0.03, reset=0.03, truncate=0.03, stall=0.02, late_500=0.03,
                    stall_seconds=0.5) as front:
        monkeypatch.setenv("SDCLOUD_STORE_ENDPOINT", front.endpoint)
        p = tmp_path / "many.jsonl"
        p.write_text("".join(json.dumps({"prompt": f"product shot {n}", "count": 6}) + "\n" for n in range(8)))
        sub = _sdcloud("batch", "submit", "--tier", "batch-sd15", "--model", "tiny", "--generator", "fake",
                       "--prompts", str(p), "--workers", "2", "--fake-delay", "0.3", "--store", f"s3://{bucket}/b",
                       "--detach", "--json", env={}, timeout=120)
        assert sub.returncode == 0, sub.stderr
        job = json.loads(sub.stdout)["job"]
        _kill_one_worker_mid_item(job)
        _wait(lambda: _job_state(job)["state"] in ("succeeded", "failed"), 600, "the job to end")
        assert _job_state(job)["state"] == "succeeded", _job_state(job)
        from sdcloud.runs.records.state import StateStore

        exits = [e["data"]["rc"] for e in StateStore().events(job) if e["kind"] == "worker-exited"]
        # Only the killed worker ended badly: none died of a store fault (rc 1).
        assert sorted(rc for rc in exits if rc != 0) == [-9], exits
        v = _sdcloud("batch", "verify", job, "--json", env={}, timeout=300)
    verdict = json.loads(v.stdout)
    assert verdict["ok"] and verdict["images_present"] == 48 and not verdict["duplicate_keys"], verdict
    assert front.injected["late_500"] > 0 and front.injected["truncate"] > 0, front.injected


# -- the controller's side, on an in-process cloud --------------------------------------------------

def _controller(tmp_path):
    from tests.fleet.test_fleet import CloudDouble

    from sdcloud.runs.driving.controller import Controller
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    spec = {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1", "model": "tiny", "steps": 100,
            "market": "spot", "store": (tmp_path / "bucket").as_uri()}
    state.create_run("r-fault001", "sd15-lora", spec, 100)
    cloud = CloudDouble()
    return Controller(state, "r-fault001", provider=cloud), cloud, state


def test_a_host_whose_agent_failed_is_not_a_reclaim_and_is_bounded(tmp_path, sdcloud_home):
    from sdcloud.providers.base import FAILED

    ctl, cloud, state = _controller(tmp_path)
    for n in range(1, 4):
        ctl._start_attempt()
        cur = ctl.current()
        assert cur.n == n
        cloud.instances[cur.instance_id].state = FAILED  # its agent's process failed, no reclaim notice
        ctl._watch(cur)
    ends = [a.end_reason for a in state.attempts("r-fault001")]
    assert ends == ["host-failed"] * 3
    run = state.get_run("r-fault001")
    assert run["state"] == "failed" and "3 failed boots in a row" in run["reason"]
    kinds = [e["kind"] for e in state.events("r-fault001")]
    assert "reclaimed" not in kinds and kinds.count("host-failed") == 3


def test_a_recurring_refusal_in_the_status_ends_the_run_after_one_attempt(tmp_path, sdcloud_home):
    ctl, cloud, state = _controller(tmp_path)
    ctl._start_attempt()
    cur = ctl.current()
    ctl.store.put("runs/r-fault001/status.json", json.dumps({
        "attempt": 1, "phase": "failed", "failure_cause": "no-bucket", "time": 1.0,
        "reason": "the store refused this host (no-bucket): NoSuchBucket (The specified bucket does not exist)\n"
                  "on PutObject"}).encode())
    ctl._watch(cur)
    run = state.get_run("r-fault001")
    assert run["state"] == "failed" and "NoSuchBucket" in run["reason"] and "\n" not in run["reason"]
    assert [a.end_reason for a in state.attempts("r-fault001")] == ["failed:no-bucket"]


def test_hosts_that_vanish_before_reporting_are_bounded(tmp_path, sdcloud_home):
    from sdcloud.runs.driving import hostboot

    ctl, cloud, state = _controller(tmp_path)
    for _ in range(hostboot.MAX_UNREPORTED_ENDS):
        ctl._start_attempt()
        cur = ctl.current()
        cloud.reclaim(cur.instance_id)  # gone before its first heartbeat
        ctl._watch(cur)
    assert state.get_run("r-fault001")["state"] == "failed"
    assert len(state.attempts("r-fault001")) == hostboot.MAX_UNREPORTED_ENDS


def test_a_store_that_cannot_be_read_is_a_fault_to_wait_out(tmp_path, sdcloud_home):
    """read_status raises (rather than passing for a host that never reported) and the controller
    notes the outage as events that `watch` prints, once a minute, and its end."""
    from botocore.exceptions import ResponseStreamingError

    from sdcloud.verbs.progress_view import plain
    from sdcloud.runs.driving import hostboot

    ctl, cloud, state = _controller(tmp_path)
    err = ResponseStreamingError(error="IncompleteRead(111 bytes read, 112 more expected)")
    assert hostboot.is_store_fault(err) and not hostboot.is_store_fault(ValueError("a bug"))

    def broken(key):
        raise StoreError("GET runs/r-fault001/status.json failed after 6 attempts: ResponseStreamingError") from err
    ctl.store.get = broken
    with pytest.raises(StoreError):
        ctl.host.read_status(strict=True)
    assert ctl.host.read_status() is None
    for t in (1000.0, 1005.0, 1030.0, 1061.0):
        hostboot.store_unreachable(ctl, err, now=t)
    hostboot.store_reachable(ctl, now=1070.0)
    events = [(e["kind"], e["data"]) for e in state.events("r-fault001") if e["kind"].startswith("store-")]
    assert [k for k, _ in events] == ["store-unreachable", "store-unreachable", "store-reachable"]
    assert events[1][1]["for_s"] == 61 and events[2][1]["after_s"] == 70
    assert "cannot be reached" in plain(*events[0]) and "answers again" in plain(*events[2])
