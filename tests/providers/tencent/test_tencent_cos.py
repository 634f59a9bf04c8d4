"""COS as sdcloud's object store: naming, endpoint, virtual-hosted addressing, and the store itself
against SeaweedFS on loopback with the COS configuration."""

from __future__ import annotations

import json
import uuid

import pytest

from sdcloud.errors import UserError
from sdcloud.providers.tencent import storage as cos

REGION = "ap-guangzhou"


@pytest.mark.parametrize("bucket", ["sdcloud-1250000000", "my-data-2-1300000001", "a1-12345"])
def test_valid_bucket_names(bucket):
    parsed = cos.parse_bucket(bucket, REGION)
    assert parsed.bucket == bucket and parsed.appid == bucket.rsplit("-", 1)[1]


@pytest.mark.parametrize("bucket", ["sdcloud", "SDcloud-1250000000", "sdcloud_x-1250000000", "-x-1250000000",
                                    "x--1250000000", "sdcloud-12ab", "", "sdcloud-1250000000-"])
def test_invalid_bucket_names_are_one_clear_error(bucket):
    with pytest.raises(UserError) as err:
        cos.parse_bucket(bucket)
    assert "<name>-<appid>" in str(err.value) and "\n" not in str(err.value)


def test_bucket_too_long_for_the_host_name():
    with pytest.raises(UserError, match="at most 60"):
        cos.parse_bucket("a" * 40 + "-1250000000", REGION)


def test_endpoint_and_config():
    assert cos.endpoint(REGION) == "https://cos.ap-guangzhou.myqcloud.com"
    assert cos.bucket_host("sd-1250000000", REGION) == "sd-1250000000.cos.ap-guangzhou.myqcloud.com"
    conf = cos.store_config("sd-1250000000", "/runs-root/", REGION)
    assert conf == {"url": "s3://sd-1250000000/runs-root", "endpoint_url": "https://cos.ap-guangzhou.myqcloud.com",
                    "region": REGION, "addressing_style": "virtual"}
    assert cos.store_config("cos://sd-1250000000/p", region="ap-singapore")["url"] == "s3://sd-1250000000/p"
    json.dumps(conf)  # handed to the agent as JSON
    with pytest.raises(UserError, match="region"):
        cos.store_config("sd-1250000000", "", "Guangzhou")
    with pytest.raises(UserError, match="cos://"):
        cos.parse_url("https://sd-1250000000/p")


def test_client_uses_virtual_hosted_addressing_and_tencent_keys(monkeypatch):
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "AKIDexample")
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", "example-secret")
    client = cos.client(REGION)
    url = client.generate_presigned_url("get_object", Params={"Bucket": "sd-1250000000", "Key": "runs/r/status.json"})
    assert url.startswith("https://sd-1250000000.cos.ap-guangzhou.myqcloud.com/runs/r/status.json?")
    assert "AKIDexample" in url and "example-secret" not in url
    assert client.meta.region_name == REGION


def test_store_on_cos_config_against_seaweed(cos_env, tmp_path):
    """Checkpoint-style traffic through the generic store with the COS settings, at COS's own endpoint
    (tests/support/fronts/front_cos.py: HTTPS, virtual-hosted, refusing what COS refuses)."""
    store_mod = pytest.importorskip("sdcloud_agent.store")
    bucket = f"sdcloud-{uuid.uuid4().hex[:8]}-1250000000"
    store = cos.open_store(bucket, "team/sd", REGION, part_size=5 * 1024 * 1024)
    assert isinstance(store, store_mod.S3Store) and store.url == f"s3://{bucket}/team/sd"
    assert store.client.meta.config.s3["addressing_style"] == "virtual"
    store.ensure_bucket()
    store.put("runs/r1/status.json", b'{"phase": "training"}')
    assert store.create("runs/r1/lock", b"1") is True
    assert store.create("runs/r1/lock", b"2") is False  # conditional create
    assert json.loads(store.get("runs/r1/status.json")) == {"phase": "training"}
    big = bytes(range(256)) * (6 * 4096 + 7)  # a little over 6 MiB: multipart with 5 MiB parts
    (tmp_path / "model.safetensors").write_bytes(big)
    store.put_file("runs/r1/checkpoints/000000100/model.safetensors", tmp_path / "model.safetensors")
    store.get_file("runs/r1/checkpoints/000000100/model.safetensors", tmp_path / "back.safetensors")
    assert (tmp_path / "back.safetensors").read_bytes() == big
    keys = sorted(o.key for o in store.list("runs/r1/"))
    assert keys == ["runs/r1/checkpoints/000000100/model.safetensors", "runs/r1/lock", "runs/r1/status.json"]
    store.delete(keys)
    assert store.list("runs/") == []
    # The objects live under the prefix in the bucket, as on S3.
    raw = cos.client(REGION, None, "sdcloud-test", "sdcloud-test-secret")
    assert raw.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    assert not [s.refused for s in cos_env.seen if s.host.startswith(bucket) and s.refused]
