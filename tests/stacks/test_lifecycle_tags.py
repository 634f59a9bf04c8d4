"""The stacks' lifecycle rule applies to what the agent uploads: checkpoints and logs are tagged
`sdcloud-class` on S3 (SeaweedFS here), everything else is kept untagged."""

from __future__ import annotations

import os
import uuid

import boto3
import pytest

from sdcloud_agent.store import CLASS_TAG, lifecycle_class, open_store
from sdcloud_agent.sync import CheckpointSync
from tests.support.harness_stacks import stack_module


def test_classes_follow_the_bucket_layout():
    assert lifecycle_class("runs/r-1/checkpoints/000000010/manifest.json") == "checkpoint"
    assert lifecycle_class("runs/r-1/logs/attempt-2.log") == "log"
    for kept in ("runs/r-1/status.json", "runs/r-1/artifacts/model.safetensors", "runs/r-1/dataset/a.png",
                 "runs/r-1/checkpoints", "other/r-1/checkpoints/x"):
        assert lifecycle_class(kept) is None, kept


def test_the_stack_rule_matches_the_agent_tag():
    pytest.importorskip("pulumi_aws")
    stack = stack_module("aws")

    assert stack.CLASS_TAG == CLASS_TAG


def test_agent_uploads_carry_the_class_tag(s3_env, tmp_path):
    bucket = f"lc-{uuid.uuid4().hex[:10]}"
    s3 = boto3.client("s3", endpoint_url=s3_env["endpoint_url"])
    s3.create_bucket(Bucket=bucket)
    store = open_store({"url": f"s3://{bucket}/sdcloud", "endpoint_url": s3_env["endpoint_url"]}, part_size=5 * 1024 * 1024)
    ckpt = tmp_path / "step-10"
    ckpt.mkdir()
    (ckpt / "small.bin").write_bytes(b"w" * 1000)
    (ckpt / "big.bin").write_bytes(os.urandom(6 * 1024 * 1024))  # multipart
    CheckpointSync(store, "runs/r-1").upload(ckpt, 10)
    store.put("runs/r-1/logs/attempt-1.log", b"hello\n")
    store.put("runs/r-1/status.json", b"{}")
    store.put("runs/r-1/artifacts/model.bin", b"m")

    def tags(key: str) -> dict:
        return {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket=bucket, Key=f"sdcloud/{key}")["TagSet"]}

    keys = [o.key for o in store.list("runs/r-1/checkpoints/")]
    assert any(k.endswith("big.bin") for k in keys) and any(k.endswith("manifest.json") for k in keys)
    for key in keys:
        assert tags(key) == {CLASS_TAG: "checkpoint"}, key
    assert tags("runs/r-1/logs/attempt-1.log") == {CLASS_TAG: "log"}
    assert tags("runs/r-1/status.json") == {} and tags("runs/r-1/artifacts/model.bin") == {}


def test_cos_stores_do_not_tag():
    store = open_store({"url": "s3://b-1250000000/sdcloud", "endpoint_url": "https://cos.ap-guangzhou.myqcloud.com",
                        "region": "ap-guangzhou"})
    assert store.tag_objects is False and store._tagging("runs/r/checkpoints/1/x") == {}
