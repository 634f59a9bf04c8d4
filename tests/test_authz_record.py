"""Who made each recorded call: the access key that signed it first, then the stack, and for a call
from s3transfer's pool the principal of the thread that made its transfer task (tests/support/authz/authz_record.py)."""

from __future__ import annotations

import pytest

REGION, BUCKET = "us-east-1", "authz-record"
MiB = 1 << 20


@pytest.fixture
def s3(monkeypatch):
    import boto3
    from moto import mock_aws

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
        yield
    boto3.DEFAULT_SESSION = None


def test_a_multipart_upload_from_the_pool_is_the_hosts(s3, monkeypatch, tmp_path):
    from tests.support.authz.authz_record import record_calls

    from sdcloud_agent.store import open_store

    calls = record_calls(monkeypatch)
    big = tmp_path / "ckpt.bin"
    big.write_bytes(b"c" * (11 * MiB))
    store = open_store({"url": f"s3://{BUCKET}/p", "region": REGION, "part_size": 5 * MiB, "engine": "s3transfer"})
    store.put_file("runs/r/ckpt.bin", big)
    parts = [c for c in calls if c.operation == "UploadPart"]
    assert len(parts) == 3, [c.operation for c in calls]
    assert {c.principal for c in calls} == {"host"}, {(c.operation, c.principal) for c in calls}


def test_the_signing_key_decides_before_the_stack(s3, monkeypatch):
    from tests.support.authz import authz_record

    from sdcloud_agent.store import open_store

    calls = authz_record.record_calls(monkeypatch)
    store = open_store({"url": f"s3://{BUCKET}/p", "region": REGION})
    key = authz_record._key_of(store.client)
    monkeypatch.setitem(authz_record.KEYS, key, "batch-worker")  # as_principal, undone after the test
    store.put("x", b"1")
    assert [(c.operation, c.principal, c.key) for c in calls] == [("PutObject", "batch-worker", key)]
    monkeypatch.delitem(authz_record.KEYS, key)
    store.put("y", b"1")
    assert calls[-1].principal == "host"
