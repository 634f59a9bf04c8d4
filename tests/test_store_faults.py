"""Transient store faults are absorbed; refusals are told apart from them (issue 25, the faults half).

The store talks to SeaweedFS through tests/fault_front.py, which answers 503 SlowDown, resets
connections, truncates GET bodies, stalls, and answers 500 after a write committed, seeded.
"""

from __future__ import annotations

import json
import uuid

import boto3
import pytest

from fault_front import FaultFront, refuse_writes
from sdcloud_agent.store import RetryPolicy, StoreError, failure_cause, is_transient, open_store

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
