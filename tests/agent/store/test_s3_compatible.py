"""S3-compatible stores that are not AWS S3 (MinIO, Ceph, R2, B2, SeaweedFS behind TLS): one
upload dialect, as for COS. The agent's store uploads, prunes and resumes through a front at a
plain IP address that refuses trailer bodies as COS does (tests/support/fronts/front_s3_compatible.py), with no refusal."""

from __future__ import annotations

import os
import uuid

import boto3
import pytest

from sdcloud.runs.records.store import open_run_store, store_config
from sdcloud_agent import cos
from sdcloud_agent import manifest as mf
from sdcloud_agent.store import open_store
from sdcloud_agent.sync import CheckpointSync

from tests.support.fronts.front_s3_compatible import TrailerRefusingFront
from tests.support.server_seaweed import TEST_KEYS

MiB = 1 << 20


@pytest.fixture
def front(seaweed, monkeypatch):
    with TrailerRefusingFront(seaweed) as f:
        for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            monkeypatch.delenv(k, raising=False)
        monkeypatch.setenv("AWS_CA_BUNDLE", str(f.ca_file))
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "sdcloud-test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_KEYS["sdcloud-test"])
        yield f


def _bucket(seaweed) -> str:
    name = f"compat-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=seaweed.endpoint, region_name="us-east-1", verify=str(seaweed.ca_file),
                 aws_access_key_id="sdcloud-test", aws_secret_access_key=TEST_KEYS["sdcloud-test"]).create_bucket(Bucket=name)
    return name


def _checkpoint(tmp_path, step: int, big: int = 0):
    folder = tmp_path / f"ckpt-{step}"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(f"weights of step {step}".encode() * 100)
    if big:
        (folder / "big.bin").write_bytes(os.urandom(big))
    (folder / "state.json").write_text(f'{{"step": {step}}}')
    return folder


@pytest.mark.parametrize("endpoint,aws", [
    (None, True), ("https://s3.us-east-1.amazonaws.com", True), ("https://bucket.s3.eu-west-1.amazonaws.com", True),
    ("https://s3.cn-north-1.amazonaws.com.cn", True), ("https://10.0.0.5:9000", False),
    ("https://abc.r2.cloudflarestorage.com", False), ("https://s3.us-west-004.backblazeb2.com", False),
    ("https://cos.ap-guangzhou.myqcloud.com", False), ("http://127.0.0.1:8333", False)])
def test_only_aws_s3_itself_keeps_botocores_defaults(endpoint, aws, monkeypatch):
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    assert cos.is_aws_endpoint(cos.effective_endpoint(endpoint)) is aws
    store = open_store({"url": "s3://b-1250000000/p", "endpoint_url": endpoint, "region": "us-east-1"}, engine="s3transfer")
    cfg = store.client.meta.config
    want = "when_supported" if aws else "when_required"
    assert cfg.request_checksum_calculation == want
    assert store.on_aws is aws


def test_the_endpoint_from_the_environment_counts(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://minio.internal:9000")
    assert open_store({"url": "s3://b/p"}, engine="s3transfer").on_aws is False


def test_agent_uploads_prunes_and_resumes_through_a_front_that_refuses_trailers(seaweed, front, tmp_path):
    bucket = _bucket(seaweed)
    conf = store_config("aws", f"s3://{bucket}/sdcloud", "us-east-1", None) | {"endpoint_url": front.endpoint}
    store = open_store(conf, part_size=5 * MiB)
    assert store.engine == "s3transfer"  # the CRT signs trailers: AWS S3 only, unless asked for
    store.put("runs/r/status.json", b'{"phase": "training"}')
    assert store.create("runs/r/lock", b"1") is True and store.create("runs/r/lock", b"2") is False
    sync = CheckpointSync(store, "runs/r", keep=1, base_delay=0.01, attempts=2)
    for step in (100, 200, 300):  # the last one multipart (11 MiB in 5 MiB parts)
        sync.upload(_checkpoint(tmp_path, step, big=11 * MiB if step == 300 else 0), step)
    assert sync.prune_error is None
    assert sorted(mf.list_steps(store, "runs/r")) == [300]  # pruned with DeleteObjects (Content-MD5)
    got = mf.restore_newest(store, "runs/r", lambda m: tmp_path / "restored")
    assert got is not None and got[0].step == 300
    assert (got[1] / "big.bin").read_bytes() == (tmp_path / "ckpt-300" / "big.bin").read_bytes()
    # The control plane reads the run's bucket the same way.
    assert open_run_store(conf).get("runs/r/status.json") == b'{"phase": "training"}'
    assert front.refused == [], front.refused
    assert any(s.startswith("PUT ") and "uploadId=" in s for s in front.seen)  # multipart went through it
