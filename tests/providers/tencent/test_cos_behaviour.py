"""Both stores against COS as it really answers: HTTPS at COS's own host names, through the
COS-behaviour layer (tests/support/fronts/front_cos.py) in front of SeaweedFS.

The clients are configured exactly as in production (endpoint `https://cos.<region>.myqcloud.com`,
virtual-hosted addressing); only HTTPS_PROXY and AWS_CA_BUNDLE point them at the layer, which
refuses what COS refuses: trailer uploads without Content-Length, DeleteObjects without
Content-MD5, path-style requests, bucket names that are not `<name>-<appid>`.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from sdcloud.providers.tencent import storage as cos
from sdcloud.runs.records.store import open_run_store
from sdcloud_agent import manifest as mf
from sdcloud_agent.store import StoreError, open_store
from sdcloud_agent.sync import CheckpointSync
from tests.support.server_seaweed import TEST_KEYS

REGION = "ap-guangzhou"
KEY_ID = "sdcloud-test"


def new_bucket() -> str:
    bucket = f"sd-{uuid.uuid4().hex[:10]}-1250000000"
    cos.client(REGION).create_bucket(Bucket=bucket)
    return bucket


def agent_conf(bucket: str, prefix: str = "sdcloud") -> dict:
    """The store config the controller hands a Tencent host (less the CVM role: keys come from the env)."""
    return {"url": f"s3://{bucket}/{prefix}", "endpoint_url": cos.endpoint(REGION), "region": REGION,
            "addressing_style": "virtual"}


def test_the_layer_refuses_what_cos_refuses(cos_env):
    bucket = new_bucket()
    plain = dict(endpoint_url=cos.endpoint(REGION), region_name=REGION, aws_access_key_id=KEY_ID,
                 aws_secret_access_key=TEST_KEYS[KEY_ID])
    trailer = boto3.client("s3", config=Config(s3={"addressing_style": "virtual"}, retries={"max_attempts": 1},
                                               request_checksum_calculation="when_supported"), **plain)
    with pytest.raises(ClientError) as err:
        trailer.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert err.value.response["Error"]["Code"] == "MissingContentLength"
    assert "TraceId" in err.value.response["Error"]  # COS's envelope
    with pytest.raises(ClientError) as err:
        trailer.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "k"}]})
    assert err.value.response["Error"]["Code"] == "MissingContentMD5"
    path = boto3.client("s3", config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                                            request_checksum_calculation="when_required"), **plain)
    with pytest.raises(ClientError) as err:
        path.list_objects_v2(Bucket=bucket)
    assert err.value.response["Error"]["Code"] == "PathStyleDomainForbidden"
    with pytest.raises(ClientError) as err:
        cos.client(REGION).create_bucket(Bucket="no-appid-here")
    assert err.value.response["Error"]["Code"] == "InvalidBucketName"


def test_the_layer_does_create_only_writes_as_cos_does(cos_env):
    """COS's create-only write is x-cos-forbid-overwrite (409 FileAlreadyExists); S3's If-None-Match and
    If-Match on PUT are not COS headers, so they are ignored and the PUT overwrites."""
    bucket = new_bucket()
    raw = cos.client(REGION)
    raw.put_object(Bucket=bucket, Key="k", Body=b"one")
    raw.put_object(Bucket=bucket, Key="k", Body=b"two", IfNoneMatch="*")
    assert raw.get_object(Bucket=bucket, Key="k")["Body"].read() == b"two", "COS ignores If-None-Match on PUT"
    raw.put_object(Bucket=bucket, Key="k", Body=b"three", IfMatch='"not-the-etag"')
    assert raw.get_object(Bucket=bucket, Key="k")["Body"].read() == b"three", "COS ignores If-Match on PUT"

    def forbid(params, **_):
        params["headers"]["x-cos-forbid-overwrite"] = "true"
    raw.meta.events.register("before-call.s3.PutObject", forbid, unique_id="test-forbid")
    try:
        with pytest.raises(ClientError) as err:
            raw.put_object(Bucket=bucket, Key="k", Body=b"four")
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 409
        assert err.value.response["Error"]["Code"] == "FileAlreadyExists" and "TraceId" in err.value.response["Error"]
        raw.put_object(Bucket=bucket, Key="new", Body=b"first")
    finally:
        raw.meta.events.unregister("before-call.s3.PutObject", unique_id="test-forbid")
    assert raw.get_object(Bucket=bucket, Key="k")["Body"].read() == b"three"
    assert raw.get_object(Bucket=bucket, Key="new")["Body"].read() == b"first"


def test_agent_store_creates_once_on_cos_with_racers(cos_env):
    """The agent's create-only write on COS: one winner of many racers, the loser told "exists"."""
    store = open_store(agent_conf(new_bucket()))
    assert store.compare_and_swap is False
    with ThreadPoolExecutor(8) as pool:
        won = list(pool.map(lambda n: store.put_if_absent("race/k", str(n).encode()), range(8)))
    assert sum(e is not None for e in won) == 1, won
    winner = next(n for n, e in enumerate(won) if e)
    assert store.get("race/k") == str(winner).encode()
    assert store.create("race/k", b"x") is False and store.create("race/other", b"x") is True


def test_agent_store_uploads_to_cos_without_trailers(cos_env, tmp_path):
    """Status, manifest and checkpoint uploads from a Tencent host: single and multipart."""
    bucket = new_bucket()
    store = open_store(agent_conf(bucket), part_size=5 * 1024 * 1024)
    store.put("runs/r/status.json", b'{"phase": "training"}')
    assert store.create("runs/r/lock", b"1") is True and store.create("runs/r/lock", b"2") is False
    big = bytes(range(256)) * (6 * 4096 + 7)  # a little over 6 MiB: two parts of 5 MiB
    (tmp_path / "model.safetensors").write_bytes(big)
    store.put_file("runs/r/ckpt/model.safetensors", tmp_path / "model.safetensors", {"sha256": "abc"})
    store.get_file("runs/r/ckpt/model.safetensors", tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == big
    assert store.head("runs/r/ckpt/model.safetensors").metadata == {"sha256": "abc"}
    assert store.get("runs/r/status.json") == b'{"phase": "training"}'
    assert [o.key for o in store.list("runs/r/")] == ["runs/r/ckpt/model.safetensors", "runs/r/lock", "runs/r/status.json"]
    seen = [s for s in cos_env.seen if s.host.startswith(bucket)]
    assert seen and not [s.refused for s in seen if s.refused]
    assert not any("x-amz-trailer" in s.headers or s.headers.get("transfer-encoding") for s in seen)
    assert all(s.host == f"{bucket}.cos.{REGION}.myqcloud.com" for s in seen)  # virtual-hosted only


def _checkpoint(tmp_path, step: int):
    folder = tmp_path / f"ckpt-{step}"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(f"weights of step {step}".encode() * 100)
    (folder / "state.json").write_text(f'{{"step": {step}}}')
    return folder


def test_agent_prunes_old_checkpoints_on_cos(cos_env, tmp_path):
    """Pruning deletes in batches (DeleteObjects, which COS takes only with Content-MD5)."""
    bucket = new_bucket()
    store = open_store(agent_conf(bucket))
    sync = CheckpointSync(store, "runs/r", keep=1, base_delay=0.01, attempts=2)
    for step in (100, 200, 300):
        sync.upload(_checkpoint(tmp_path, step), step)
    assert sorted(mf.list_steps(store, "runs/r")) == [300]
    assert sync.prune_error is None


def test_a_pruning_failure_is_kept_for_the_run_events(cos_env, tmp_path):
    bucket = new_bucket()
    store = open_store(agent_conf(bucket))
    sync = CheckpointSync(store, "runs/r", keep=1, base_delay=0.01, attempts=2)
    sync.upload(_checkpoint(tmp_path, 100), 100)

    def refused(keys):
        raise StoreError("DeleteObjects refused: AccessDenied")
    store.delete = refused
    sync.upload(_checkpoint(tmp_path, 200), 200)  # the upload itself succeeds
    assert sync.durable_step == 200
    assert "AccessDenied" in sync.prune_error and "100" in sync.prune_error
    del store.delete  # deletes work again: the next pruning catches up and clears the error
    sync.upload(_checkpoint(tmp_path, 300), 300)
    assert sync.prune_error is None and sorted(mf.list_steps(store, "runs/r")) == [300]


def test_store_delete_raises_on_per_key_errors(cos_env):
    """DeleteObjects answers 200 with per-key errors: those are failures, not silence."""
    bucket = new_bucket()
    store = open_store(agent_conf(bucket))
    store.put("a", b"1")
    real = store.client.delete_objects

    def partial(**kw):
        real(**kw)
        return {"Errors": [{"Key": "sdcloud/a", "Code": "AccessDenied", "Message": "Access Denied"}]}
    store.client.delete_objects = partial
    with pytest.raises(StoreError, match="AccessDenied"):
        store.delete(["a"])


@pytest.mark.slow
@pytest.mark.parametrize("side", ["host", "control-plane"])
def test_both_stores_list_and_delete_past_1000_keys(cos_env, side):
    """The host agent's store, and the controller's store of the same Tencent run (which opens it
    with the user's keys, not the host's role)."""
    bucket = new_bucket()
    conf = agent_conf(bucket)
    store = open_store(conf) if side == "host" else open_run_store({**conf, "credentials": "tencent-cvm-role"})
    keys = [f"runs/r/logs/{i:05d}.txt" for i in range(1005)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.put(k, b"x"), keys))
    store.put("runs/other/status.json", b"{}")
    assert [o.key for o in store.list("runs/r/")] == keys
    store.delete(keys)  # two DeleteObjects batches
    assert [o.key for o in store.list("runs/")] == ["runs/other/status.json"]


def test_the_controller_reports_each_pruning_failure_once():
    from sdcloud.runs.driving.agent_reports import PRUNE_FAILED, report_agent_problems
    from sdcloud.runs.driving.owner import Memo

    events: list[tuple[str, dict]] = []
    controller = type("Controller", (), {"event": lambda self, kind, data: events.append((kind, data)),
                                         "memo": Memo()})()
    for status in ({"prune_error": None}, {"prune_error": "step 100: AccessDenied"},
                   {"prune_error": "step 100: AccessDenied"}, None, {"prune_error": None},
                   {"prune_error": "step 200: AccessDenied"}):
        report_agent_problems(controller, 2, status)
    assert events == [(PRUNE_FAILED, {"attempt": 2, "error": "step 100: AccessDenied"}),
                      (PRUNE_FAILED, {"attempt": 2, "error": "step 200: AccessDenied"})]
