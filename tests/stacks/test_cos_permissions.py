"""A Tencent host's requests judged against the CAM policy the Tencent stack gives its CVM role.

The host signs with the role's temporary keys (from a local metadata service, as on a CVM); the COS
layer (tests/support/fronts/front_cos.py) checks each request, action by action, against the stack's own policy
document (stacks/tencent/host_policy.py) and answers 403 AccessDenied where CAM would.
"""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from tests.support.fronts.front_cos import CosLayer
from tests.support.server_seaweed import SeaweedS3
from tests.providers.tencent.test_cos_role import RoleMetadata

from tests.support.harness_stacks import stack_module

_host_policy = stack_module("tencent", "host_policy")
OBJECT_ACTIONS, role_policy_document = _host_policy.OBJECT_ACTIONS, _host_policy.role_policy_document

from sdcloud_agent import boot
from sdcloud_agent.store import open_store

REGION, APP_ID, BUCKET, PREFIX = "ap-guangzhou", "1250000000", "perm-ckpt-1250000000", "sdcloud"
MiB = 1 << 20


@pytest.fixture(scope="module")
def anonymous_seaweed():
    """Role keys carry a session token, which SeaweedFS accepts only with no identities configured."""
    server = SeaweedS3(keys=None).start()
    yield server
    server.stop()


def _layer(seaweed, monkeypatch, policy: str) -> CosLayer:
    cos = CosLayer(seaweed, policies={"AKID-tmp-*": policy}).start()
    for k, v in cos.env.items():
        monkeypatch.setenv(k, v)
    owner = boto3.client("s3", endpoint_url=cos.endpoint(REGION), region_name=REGION,
                         config=Config(s3={"addressing_style": "virtual"}), aws_access_key_id="x", aws_secret_access_key="y")
    try:
        owner.create_bucket(Bucket=BUCKET)
    except ClientError:
        pass  # made by an earlier test of this module
    meta = RoleMetadata(expires_in=3600)
    monkeypatch.setenv("SDCLOUD_TENCENT_METADATA_URL", meta.url)
    cos.meta = meta  # type: ignore[attr-defined]
    return cos


def _store_conf(prefix: str = PREFIX, **extra) -> dict:
    return {"url": f"s3://{BUCKET}/{prefix}", "endpoint_url": CosLayer.endpoint(REGION), "region": REGION,
            "addressing_style": "virtual", "credentials": "tencent-cvm-role", **extra}


def _old_policy() -> str:
    """The policy the stack generated before the copy and batch-delete grants (for the failing case)."""
    doc = json.loads(role_policy_document(REGION, APP_ID, BUCKET, PREFIX))
    for st in doc["statement"]:
        st["action"] = [a for a in st["action"] if a != "name/cos:PutObjectCopy"]
    return json.dumps(doc)


@pytest.mark.parametrize("size", [64 * 1024, 9 * MiB], ids=["small", "9MiB-multipart-copy"])
def test_the_cache_write_passes_under_the_stack_policy(anonymous_seaweed, monkeypatch, tmp_path, size):
    """Put .part, copy, delete (boot.put, as the environment and model caches do) with the role's keys."""
    cos = _layer(anonymous_seaweed, monkeypatch, role_policy_document(REGION, APP_ID, BUCKET, PREFIX))
    try:
        src = tmp_path / "env.tar"
        src.write_bytes(b"e" * size)
        boot.put({"store": _store_conf()}, f"cache/env/{size}.tar", str(src))
        store = open_store(_store_conf())
        assert store.head(f"cache/env/{size}.tar").size == size
        assert store.head(f"cache/env/{size}.tar.part") is None
        assert cos.denials() == []
        used = {a for s in cos.seen for a in s.actions}
        assert "name/cos:PutObjectCopy" in used or "name/cos:UploadPartCopy" in used
    finally:
        cos.stop()
        cos.meta.httpd.shutdown()


def test_the_cache_write_fails_without_the_copy_grant(anonymous_seaweed, monkeypatch, tmp_path):
    """Today's failure on every Tencent host: the copy step is refused, so nothing is cached."""
    cos = _layer(anonymous_seaweed, monkeypatch, _old_policy())
    try:
        src = tmp_path / "env.tar"
        src.write_bytes(b"e" * 1024)
        with pytest.raises(ClientError) as err:
            boot.put({"store": _store_conf()}, "cache/env/old.tar", str(src))
        assert err.value.response["Error"]["Code"] == "AccessDenied"
        assert [s.actions[0] for s in cos.denials()] == ["name/cos:PutObjectCopy"]
    finally:
        cos.stop()
        cos.meta.httpd.shutdown()


def test_the_role_reaches_nothing_outside_its_prefix(anonymous_seaweed, monkeypatch):
    cos = _layer(anonymous_seaweed, monkeypatch, role_policy_document(REGION, APP_ID, BUCKET, PREFIX))
    try:
        other = open_store(_store_conf(prefix="other"))
        with pytest.raises(ClientError, match="AccessDenied"):
            other.put("x", b"1")
        with pytest.raises(ClientError, match="AccessDenied"):
            other.list("")
        assert {s.actions[0] for s in cos.denials()} == {"name/cos:PutObject", "name/cos:GetBucket"}
    finally:
        cos.stop()
        cos.meta.httpd.shutdown()


def test_the_policy_grants_only_what_the_store_calls(anonymous_seaweed, monkeypatch, tmp_path):
    """Every store operation a host performs passes, and each granted action is one of them."""
    cos = _layer(anonymous_seaweed, monkeypatch, role_policy_document(REGION, APP_ID, BUCKET, PREFIX))
    try:
        store = open_store(_store_conf(part_size=5 * MiB))
        big = tmp_path / "big.bin"
        big.write_bytes(b"b" * (11 * MiB))
        store.put("runs/r/status.json", b"{}")
        assert store.create("runs/r/lease", b"1") and not store.create("runs/r/lease", b"2")
        store.put_file("runs/r/ckpt/big.bin", big)       # multipart upload
        store.copy("runs/r/ckpt/big.bin", "runs/r/ckpt/copy.bin")  # multipart copy
        store.copy("runs/r/status.json", "runs/r/status2.json")    # one-request copy
        assert store.get("runs/r/status.json") == b"{}"
        store.get_file("runs/r/ckpt/copy.bin", tmp_path / "back.bin")
        assert (tmp_path / "back.bin").read_bytes() == big.read_bytes()
        assert [o.key for o in store.list("runs/r/")][:1] == ["runs/r/ckpt/big.bin"]
        store.delete([o.key for o in store.list("runs/r/")])
        assert store.list("runs/r/") == []
        assert cos.denials() == []
        used = {a for s in cos.seen for a in s.actions}
        granted = set(OBJECT_ACTIONS) | {"name/cos:GetBucket", "name/cos:DeleteMultipleObjects"}
        # AbortMultipartUpload is the clean-up of a failed upload; everything else is used here.
        assert used == granted - {"name/cos:AbortMultipartUpload"}, used ^ granted
    finally:
        cos.stop()
        cos.meta.httpd.shutdown()
