"""A move's bytes go where the bandwidth is (runs/driving/move_copy.py, sdcloud_agent/move_copy.py):
the controller leaves a copy order of presigned GETs in the destination store, and the host there
streams each file into its own bucket with its own keys, a file over one PUT's limit by multipart
upload, the manifest last. Both buckets sit behind tests/support/fronts/front_s3_signatures.py, which checks
every presigned URL as S3 does and counts the bytes it serves. The stores are configured as
production configures them: a bucket URL, the endpoint from the environment (AWS_ENDPOINT_URL_S3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import boto3
import pytest

from sdcloud_agent import manifest
from sdcloud_agent import move_copy as host_copy
from sdcloud_agent.store import StoreError, open_store

from sdcloud.runs.driving import move_copy

from tests.support.fronts.front_s3_signatures import SignatureCheckingFront
from tests.support.server_seaweed import TEST_KEYS

RUN = "r-0000copy"
PREFIX = f"runs/{RUN}"
MiB = 1024 * 1024
BIG = bytes(range(256)) * (12 * 4096)  # 12 MiB: over the lowered limit, three parts of 5 MiB
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def front(seaweed, s3_env, monkeypatch):
    """The S3 test store behind the signature-checking front, reached as a store's endpoint is."""
    with SignatureCheckingFront(seaweed, TEST_KEYS) as f:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f.endpoint)
        monkeypatch.setenv("AWS_CA_BUNDLE", str(f.ca_file))
        yield f


def _buckets(*names: str) -> None:
    s3 = boto3.client("s3")
    for name in names:
        try:
            s3.create_bucket(Bucket=name)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass


def _home(store, tmp_path, files: dict[str, bytes], step: int = 7) -> None:
    folder = tmp_path / f"ckpt-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
        store.put(f"{manifest.checkpoint_prefix(PREFIX, step)}/{name}", data)
    manifest.write(store, PREFIX, manifest.build(folder, step, run=RUN))
    store.put(f"{PREFIX}/dataset/0.png", b"png" * 100)
    store.put(f"{PREFIX}/dataset/0.txt", b"a photo of sks")


def _no_bytes_here(monkeypatch) -> None:
    """The controller's process: any read of a presigned URL, any byte copy, any spool fails the test."""
    def refuse(*_a, **_k):
        raise AssertionError("the controller's process touched the copied bytes")

    monkeypatch.setattr(host_copy, "stream_object", refuse)
    monkeypatch.setattr(move_copy, "copy_object", refuse)
    monkeypatch.setattr("urllib.request.urlopen", refuse)
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    monkeypatch.setattr(tempfile, "mkstemp", refuse)


def _host(conf: dict, put_limit: int, tmp: Path, keys: tuple[str, str] = ("x", "y")) -> subprocess.CompletedProcess:
    """The destination's host as it boots: its own process, its own keys, an empty temp folder."""
    env = {**os.environ, "AWS_ACCESS_KEY_ID": keys[0], "AWS_SECRET_ACCESS_KEY": keys[1], "TMPDIR": str(tmp),
           "PYTHONPATH": f"{ROOT / 'bootstrap'}"}
    code = ("import json, sys; from sdcloud_agent.move_copy import fetch_ordered; from sdcloud_agent.store import open_store;"
            f"d = fetch_ordered(open_store(json.loads(sys.argv[1])), {PREFIX!r}, put_limit={put_limit});"
            "print(json.dumps(d.__dict__))")
    return subprocess.run([sys.executable, "-c", code, json.dumps(conf)], env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_file_over_the_put_limit_goes_host_to_store_streamed_and_the_controller_reads_none(front, tmp_path,
                                                                                               monkeypatch):
    _buckets("copy-home", "copy-away")
    src = open_store({"url": "s3://copy-home/p"})
    away = {"url": "s3://copy-away/q", "part_size": 5 * MiB, "engine": "s3transfer"}
    dst = open_store(away)
    _home(src, tmp_path, {"model.safetensors": BIG, "optimizer.pt": b"o" * 1000})
    assert move_copy.host_can_copy(src, dst)
    with monkeypatch.context() as m:
        _no_bytes_here(m)
        ordered = move_copy.order_copy(src, dst, RUN, "aws", {}, rate_mb_s=100.0)
    assert ordered.by_host and ordered.step == 7 and ordered.skipped == 0
    assert sum(front.served.values()) == 0  # the controller sent URLs only
    assert manifest.newest_complete(dst, PREFIX) is None  # nothing landed yet: the host carries it
    spool = tmp_path / "host-tmp"
    spool.mkdir()
    done = _host(away, put_limit=MiB, tmp=spool)
    assert done.returncode == 0, done.stderr
    fetched = json.loads(done.stdout.strip().splitlines()[-1])
    files = {f"{manifest.checkpoint_prefix(PREFIX, 7)}/{n}": len(d) for n, d in
             (("model.safetensors", BIG), ("optimizer.pt", b"o" * 1000))}
    assert fetched["fetched"] == ordered.sent and fetched["skipped"] == 0
    assert manifest.newest_complete(dst, PREFIX).step == 7
    assert dst.get(f"{manifest.checkpoint_prefix(PREFIX, 7)}/model.safetensors") == BIG
    # Each file read once from the source, by the host (the front counts what it served).
    for key, size in files.items():
        assert front.served[f"/copy-home/p/{key}"] == size
    assert list(spool.iterdir()) == []  # streamed: nothing spooled on the host either
    s3 = boto3.client("s3")
    big = s3.head_object(Bucket="copy-away", Key=f"q/{manifest.checkpoint_prefix(PREFIX, 7)}/model.safetensors")
    assert big["ETag"].strip('"').endswith("-3")  # by multipart upload, three parts
    # The host wrote with its own keys: the order's URLs were the source's (sdcloud-test), the writes its own.
    assert all(v == "v4" and verdict == "taken" for v, _, _, verdict in front.checked if v != "header")
    assert dst.head(f"{PREFIX}/{host_copy.ORDER_KEY}") is None  # done: the order is gone
    report = move_copy.settle(dst, RUN)
    assert report["state"] == "done" and report["fetched"] == ordered.sent and move_copy.settle(dst, RUN) is None


def test_what_a_move_writes_carries_the_class_tag_the_expiry_rule_matches(front, tmp_path):
    _buckets("tag-home", "tag-away")
    src = open_store({"url": "s3://tag-home/p"})
    dst = open_store({"url": "s3://tag-away/q", "part_size": 5 * MiB, "engine": "s3transfer"})
    _home(src, tmp_path, {"model.safetensors": BIG, "optimizer.pt": b"o" * 1000})
    move_copy.order_copy(src, dst, RUN, "aws", {})
    host_copy.fetch_ordered(dst, PREFIX, put_limit=MiB)
    s3 = boto3.client("s3")
    folder = manifest.checkpoint_prefix(PREFIX, 7)
    for name in ("model.safetensors", "optimizer.pt", manifest.MANIFEST_NAME):  # multipart, one PUT, the manifest
        tags = s3.get_object_tagging(Bucket="tag-away", Key=f"q/{folder}/{name}")["TagSet"]
        assert tags == [{"Key": "sdcloud-class", "Value": "checkpoint"}], name
    assert s3.get_object_tagging(Bucket="tag-away", Key=f"q/{PREFIX}/dataset/0.png")["TagSet"] == []  # kept


def test_a_cut_host_copy_reports_its_egress_and_the_next_host_sends_only_what_is_missing(front, tmp_path):
    _buckets("cut2-home", "cut2-away")
    src = open_store({"url": "s3://cut2-home/p"})
    dst = open_store({"url": "s3://cut2-away/q"})
    _home(src, tmp_path, {"model.safetensors": b"m" * 5000, "optimizer.pt": b"o" * 3000})
    move_copy.order_copy(src, dst, RUN, "aws", {})
    order = host_copy.read_order(dst, PREFIX)
    broken = json.loads(json.dumps(order))
    victim = next(i for i in broken["files"] if i["key"].endswith("optimizer.pt"))
    victim["url"] = victim["url"].replace("X-Amz-Signature=", "X-Amz-Signature=0")  # S3 refuses it: 403
    dst.put(f"{PREFIX}/{host_copy.ORDER_KEY}", json.dumps(broken).encode())
    with pytest.raises(StoreError, match="between clouds failed"):
        host_copy.fetch_ordered(dst, PREFIX)
    assert manifest.newest_complete(dst, PREFIX) is None  # no manifest: no host restores a half copy
    report = move_copy.settle(dst, RUN)
    assert report["state"] == "failed" and report["fetched"] >= 5000 + 300 + 14  # what crossed is paid
    dst.put(f"{PREFIX}/{host_copy.ORDER_KEY}", json.dumps(order).encode())  # the order as signed
    again = host_copy.fetch_ordered(dst, PREFIX)
    assert again.skipped == 3 and again.fetched == 3000 + len(src.get(manifest.checkpoint_prefix(PREFIX, 7)
                                                                       + "/" + manifest.MANIFEST_NAME))
    assert manifest.newest_complete(dst, PREFIX).step == 7


def test_an_order_holds_urls_that_read_one_object_each_and_no_key(front, tmp_path):
    _buckets("ord-home", "ord-away")
    src = open_store({"url": "s3://ord-home/p"})
    dst = open_store({"url": "s3://ord-away/q"})
    _home(src, tmp_path, {"model.safetensors": b"m" * 100})
    dst.put(f"{PREFIX}/dataset/0.txt", b"a photo of sks")  # there already: not ordered
    copied = move_copy.order_copy(src, dst, RUN, "aws", {}, rate_mb_s=50.0)
    raw = dst.get(f"{PREFIX}/{host_copy.ORDER_KEY}").decode()
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in raw and "sdcloud-test-secret" not in raw
    order = json.loads(raw)
    keys = [i["key"] for i in order["files"]]
    assert f"{PREFIX}/dataset/0.txt" not in keys and f"{PREFIX}/dataset/0.png" in keys and copied.skipped == 1
    assert order["manifest"]["key"].endswith(manifest.MANIFEST_NAME) and order["step"] == 7
    for item in order["files"] + [order["manifest"]]:
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(item["url"]).query)
        assert q["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"] and "/ord-home/p/" + item["key"] in item["url"]
        assert int(q["X-Amz-Expires"][0]) >= move_copy.BOOT_ALLOWANCE_S


def test_an_orders_urls_cover_a_boot_and_the_copy_within_a_week():
    assert move_copy.url_seconds(0, 100.0) == move_copy.BOOT_ALLOWANCE_S
    seven_gb = 7 * 10**9
    assert move_copy.url_seconds(seven_gb, 100.0) == move_copy.BOOT_ALLOWANCE_S + 280  # 4x the copy at 100 MB/s
    assert move_copy.url_seconds(10**15, 1.0) == move_copy.MAX_URL_SECONDS


def test_an_expired_url_is_not_used_and_the_copy_stops_before_the_manifest(front, tmp_path):
    _buckets("exp-home", "exp-away")
    src = open_store({"url": "s3://exp-home/p"})
    dst = open_store({"url": "s3://exp-away/q"})
    _home(src, tmp_path, {"model.safetensors": b"m" * 100})
    move_copy.order_copy(src, dst, RUN, "aws", {})
    order = host_copy.read_order(dst, PREFIX)
    for item in order["files"]:
        item["expires"] = 1.0
    dst.put(f"{PREFIX}/{host_copy.ORDER_KEY}", json.dumps(order).encode())
    with pytest.raises(StoreError, match="expired"):
        host_copy.fetch_ordered(dst, PREFIX)
    assert manifest.newest_complete(dst, PREFIX) is None and sum(front.served.values()) == 0


def test_a_multipart_upload_cut_short_leaves_no_object_and_no_open_upload(front):
    import io

    _buckets("short-away")
    dst = open_store({"url": "s3://short-away/q", "part_size": 5 * MiB})
    with pytest.raises(StoreError, match="short"):
        host_copy.multipart_from(io.BytesIO(b"x" * (6 * MiB)), dst, f"{PREFIX}/checkpoints/000000001/m", 11 * MiB)
    s3 = boto3.client("s3")
    assert dst.head(f"{PREFIX}/checkpoints/000000001/m") is None
    assert not s3.list_multipart_uploads(Bucket="short-away").get("Uploads")


def test_parts_grow_so_that_the_largest_file_fits_in_ten_thousand():
    assert host_copy.part_size_for(100 * MiB, 8 * MiB) == 8 * MiB
    huge = 200 * 1024**3
    assert host_copy.part_size_for(huge, 8 * MiB) * host_copy.MAX_PARTS >= huge


def test_where_no_host_can_copy_the_controller_streams_it_with_nothing_spooled(front, tmp_path, monkeypatch):
    """A store that signs no URL on one side (a folder): the controller carries it, as before."""
    from sdcloud_agent.store import LocalStore

    _buckets("ctl-home")
    src = open_store({"url": "s3://ctl-home/p"})
    _home(src, tmp_path, {"model.safetensors": b"m" * 100})
    here = LocalStore(tmp_path / "other")
    assert not move_copy.host_can_copy(src, here) and not move_copy.host_can_copy(here, src)
    copied = move_copy.copy_checkpoint(src, here, RUN)
    assert copied.step == 7 and not copied.by_host and copied.fetched == copied.sent > 0
    assert manifest.newest_complete(here, PREFIX).step == 7


def _clouds(src, dst):
    """The run's clouds as the controller holds them (runs/driving/placement.py): home on AWS in
    sa-east-1 with store `src`, the other cloud's bucket `dst`."""
    from sdcloud.offers.tiers import get_tier
    from sdcloud.runs.driving.placement import Clouds, Home
    from sdcloud.runs.inputs.spec import RunSpec

    spec = RunSpec(tier="sd15-lora", provider="aws", providers=["aws", "tencent"], region="sa-east-1")
    clouds = Clouds(None, RUN, Home(spec, {}, {"url": "s3://x/y"}, src), get_tier("sd15-lora"))
    clouds._stores["tencent"] = dst  # the other cloud's bucket, opened once
    return clouds


def test_a_move_between_buckets_sends_an_order_and_the_hosts_report_is_paid_at_the_sources_region(front, tmp_path,
                                                                                                  monkeypatch):
    from sdcloud.runs.driving import cloud_move

    _buckets("mv-home", "mv-away")
    src = open_store({"url": "s3://mv-home/p"})
    dst = open_store({"url": "s3://mv-away/q"})
    _home(src, tmp_path, {"model.safetensors": b"m" * 4000})
    from sdcloud.runs.driving import placement

    events, records = [], []
    clouds = _clouds(src, dst)
    monkeypatch.setattr(cloud_move.cost_ledger, "record_move", lambda *a, **k: records.append((a[2:], k)))
    with monkeypatch.context() as m:
        _no_bytes_here(m)
        assert placement.carry(clouds, "aws", "tencent", {}, lambda k, d: events.append((k, d)), "spot gone") is True
    moved = dict(events)["cloud-moved"]
    assert records == []  # nothing crossed yet: the host's copy is paid as it reports it
    assert moved["bytes"] == sum(i["size"] for i in host_copy.read_order(dst, PREFIX)["files"]) + \
        host_copy.read_order(dst, PREFIX)["manifest"]["size"]
    assert moved["egress_usd"] == pytest.approx(moved["bytes"] / 2**30 * 0.15)  # sa-east-1's list price
    host_copy.fetch_ordered(dst, PREFIX)  # the host, at boot
    cloud_move.settle_host_copy(None, RUN, dst, "tencent", "aws", clouds.store)
    assert records == [(("aws", moved["bytes"], records[0][0][2]), {"region": "sa-east-1"})]
    cloud_move.settle_host_copy(None, RUN, dst, "tencent", "aws", clouds.store)
    assert len(records) == 1  # a report is paid once


def test_a_cut_controller_copy_has_its_egress_recorded(tmp_path, monkeypatch):
    """Where the controller copies (a folder store on one side) and the copy is cut, the bytes it read
    are in the ledger: the source billed them."""
    from sdcloud_agent.store import LocalStore

    from sdcloud.runs.driving import cloud_move

    src = LocalStore(tmp_path / "home")
    _home(src, tmp_path, {"model.safetensors": b"m" * 4000})

    class Cut(LocalStore):
        def put(self, key, data, metadata=None):
            if key.endswith("model.safetensors"):
                raise StoreError("PUT: connection reset")
            super().put(key, data, metadata)

    dst = Cut(tmp_path / "away")
    from sdcloud.runs.driving import placement

    events, records = [], []
    clouds = _clouds(src, dst)
    clouds.state = object()  # the ledger's state store (record_move is watched here)
    monkeypatch.setattr(cloud_move.cost_ledger, "record_move", lambda *a, **k: records.append((a[2:4], k)))
    assert placement.carry(clouds, "aws", "tencent", {}, lambda k, d: events.append((k, d)), "spot gone") is False
    assert [k for k, _ in events] == ["cloud-move-failed"]
    # Three tries; each read the dataset (the first try only: then it is there) and the model file.
    assert [r[0][0] for r in records] == ["aws"] * cloud_move.COPY_TRIES
    assert records[0][0][1] == 300 + 14 + 4000 and records[1][0][1] == 4000
    assert all(k == {"region": "sa-east-1"} for _, k in records)


def test_a_move_is_priced_for_every_byte_it_carries(tmp_path):
    from sdcloud_agent.store import LocalStore

    src = LocalStore(tmp_path / "home")
    _home(src, tmp_path, {"model.safetensors": b"m" * 4000, "optimizer.pt": b"o" * 1000})
    src.put("cache/models/sdxl-0123456789abcdef.tar", b"w" * 7000)  # the cached base model
    checkpoint = 5000
    dataset = 300 + 14
    total = move_copy.carried_bytes(src, RUN, {"model": "cache:cache/models/sdxl-0123456789abcdef.tar"})
    assert total == checkpoint + dataset + 7000
    assert move_copy.carried_bytes(src, RUN, {}) == checkpoint + dataset


def test_another_rank_waits_for_the_copy_within_a_limit(tmp_path):
    from sdcloud_agent.store import LocalStore

    store = LocalStore(tmp_path / "s")
    host_copy.wait_until_carried(store, PREFIX, limit_s=0.0)  # no order: nothing to wait for
    store.put(f"{PREFIX}/{host_copy.ORDER_KEY}", b"{}")
    with pytest.raises(StoreError, match="not done within"):
        host_copy.wait_until_carried(store, PREFIX, limit_s=0.05, poll_s=0.01)


def test_after_a_failed_host_copy_the_next_host_gets_fresh_urls_for_the_same_files(front, tmp_path, monkeypatch):
    from sdcloud.runs.driving import cloud_move

    _buckets("ref-home", "ref-away")
    src = open_store({"url": "s3://ref-home/p"})
    dst = open_store({"url": "s3://ref-away/q"})
    _home(src, tmp_path, {"model.safetensors": b"m" * 100})
    move_copy.order_copy(src, dst, RUN, "aws", {})
    order = host_copy.read_order(dst, PREFIX)
    for item in order["files"]:
        item["expires"] = 1.0  # the run waited longer than the URLs live
    dst.put(f"{PREFIX}/{host_copy.ORDER_KEY}", json.dumps(order).encode())
    with pytest.raises(StoreError, match="expired"):
        host_copy.fetch_ordered(dst, PREFIX)
    # The run is in Tencent now; its home store (AWS) signs the source's URLs afresh.
    monkeypatch.setattr(cloud_move.cost_ledger, "record_move", lambda *a, **k: None)
    cloud_move.settle_host_copy(object(), RUN, dst, "tencent", "aws", lambda name: src)
    fresh = host_copy.read_order(dst, PREFIX)
    assert [i["key"] for i in fresh["files"]] == [i["key"] for i in order["files"]]
    assert all(i["expires"] > time.time() + 3600 for i in fresh["files"])  # alive for a boot and the copy
    assert host_copy.fetch_ordered(dst, PREFIX).sent > 0 and manifest.newest_complete(dst, PREFIX).step == 7
