"""A run's checkpoint carried to another cloud's store (runs/driving/cloud_move.py): the newest
complete checkpoint and the run's inputs, files first and the manifest last; a copy cut halfway is
never restored from, and the next try sends only what is missing. Fast: stores are folders here,
and one test copies between two S3 buckets through presigned URLs on the SeaweedFS fixture."""

from __future__ import annotations

import pytest

from sdcloud_agent import manifest
from sdcloud_agent.store import LocalStore, StoreError

from sdcloud.runs.driving.cloud_move import copy_checkpoint

RUN = "r-0000move"
PREFIX = f"runs/{RUN}"


def _checkpoint(store, step: int, files: dict[str, bytes], tmp_path, complete: bool = True) -> None:
    folder = tmp_path / f"ckpt-{step}"
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
        store.put(f"{manifest.checkpoint_prefix(PREFIX, step)}/{name}", data)
    if complete:
        manifest.write(store, PREFIX, manifest.build(folder, step, run=RUN))


def _home(tmp_path) -> LocalStore:
    src = LocalStore(tmp_path / "home")
    _checkpoint(src, 10, {"model.safetensors": b"a" * 1000, "optimizer.pt": b"b" * 500}, tmp_path)
    _checkpoint(src, 20, {"model.safetensors": b"c" * 1000, "optimizer.pt": b"d" * 500}, tmp_path)
    _checkpoint(src, 30, {"model.safetensors": b"e" * 1000}, tmp_path, complete=False)  # still uploading
    src.put(f"{PREFIX}/dataset/0.png", b"png" * 10)
    src.put(f"{PREFIX}/dataset/0.txt", b"a photo")
    src.put(f"{PREFIX}/secrets/hf-token", b"hf_not_a_real_token")
    src.put("cache/models/local-0123456789abcdef.tar", b"tar" * 100)
    return src


class CutAfter:
    """A destination store whose writes fail after `n` of them (a store fault halfway through a copy)."""

    def __init__(self, inner, n: int):
        self.inner, self.left = inner, n

    def put(self, key, data, metadata=None):
        if self.left <= 0:
            raise StoreError(f"PUT {key}: connection reset")
        self.left -= 1
        self.inner.put(key, data, metadata)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_the_newest_complete_checkpoint_and_the_inputs_land_with_the_manifest_last(tmp_path):
    src, dst = _home(tmp_path), LocalStore(tmp_path / "other")
    copied = copy_checkpoint(src, dst, RUN, {"model": "cache:cache/models/local-0123456789abcdef.tar"})
    assert copied.step == 20  # 30 has no manifest: not durable, not carried
    assert manifest.complete_steps(dst, PREFIX) == [20]
    folder = manifest.checkpoint_prefix(PREFIX, 20)
    for name in ("model.safetensors", "optimizer.pt", manifest.MANIFEST_NAME):
        assert dst.get(f"{folder}/{name}") == src.get(f"{folder}/{name}")  # byte for byte
    assert dst.get(f"{PREFIX}/dataset/0.png") == b"png" * 10
    assert dst.head("cache/models/local-0123456789abcdef.tar").size == 300
    assert dst.get(f"{PREFIX}/secrets/hf-token") == b"hf_not_a_real_token"  # a gated model's host reads it there
    assert manifest.list_steps(dst, PREFIX).keys() == {20}
    assert copied.sent == copied.total + len(src.get(f"{folder}/{manifest.MANIFEST_NAME}"))
    again = copy_checkpoint(src, dst, RUN, {"model": "cache:cache/models/local-0123456789abcdef.tar"})
    assert again.sent == 0 and again.step == 20  # already there: nothing sent twice


def test_a_copy_cut_halfway_is_never_restored_from_and_the_next_try_sends_only_what_is_missing(tmp_path):
    src, plain = _home(tmp_path), LocalStore(tmp_path / "other")
    _checkpoint(plain, 10, {"model.safetensors": b"a" * 1000, "optimizer.pt": b"b" * 500}, tmp_path / "..")
    with pytest.raises(StoreError):
        copy_checkpoint(src, CutAfter(plain, 4), RUN)  # the dataset's two files, the token, one of step 20's
    # Half of 20 is there, without its manifest: the host restores the last complete one, 10.
    assert manifest.complete_steps(plain, PREFIX) == [10]
    assert manifest.newest_complete(plain, PREFIX).step == 10
    folder = manifest.checkpoint_prefix(PREFIX, 20)
    assert plain.head(f"{folder}/{manifest.MANIFEST_NAME}") is None
    copied = copy_checkpoint(src, plain, RUN)
    assert copied.skipped == 4 and copied.step == 20
    assert manifest.complete_steps(plain, PREFIX) == [10, 20]


def test_a_stale_manifest_of_the_same_step_is_removed_before_new_files_arrive(tmp_path):
    src, plain = _home(tmp_path), LocalStore(tmp_path / "other")
    folder = manifest.checkpoint_prefix(PREFIX, 20)
    plain.put(f"{folder}/{manifest.MANIFEST_NAME}", src.get(f"{folder}/{manifest.MANIFEST_NAME}"))
    plain.put(f"{folder}/model.safetensors", b"x" * 7)  # another copy's leftover: wrong size
    with pytest.raises(StoreError):
        copy_checkpoint(src, CutAfter(plain, 3), RUN)
    assert plain.head(f"{folder}/{manifest.MANIFEST_NAME}") is None
    assert manifest.newest_complete(plain, PREFIX) is None


def test_between_two_buckets_the_bytes_go_through_presigned_urls(s3_env, tmp_path):
    import boto3

    from sdcloud_agent.store import open_store

    s3 = boto3.client("s3", endpoint_url=s3_env["endpoint_url"])
    for bucket in ("move-home", "move-away"):
        s3.create_bucket(Bucket=bucket)
    src = open_store({"url": "s3://move-home/p"})
    dst = open_store({"url": "s3://move-away/q"})
    _checkpoint(src, 5, {"model.safetensors": b"w" * 4096}, tmp_path)
    url = src.presign(f"{PREFIX}/checkpoints/000000005/model.safetensors", "get", 60)
    assert "X-Amz-Signature=" in url and "move-home" in url
    calls = []
    real = dst.put
    dst.put = lambda *a, **k: calls.append(a[0]) or real(*a, **k)  # the store's own PUT is not used
    copied = copy_checkpoint(src, dst, RUN)
    assert copied.step == 5 and calls == []
    assert manifest.complete_steps(dst, PREFIX) == [5]
    assert dst.get(f"{PREFIX}/checkpoints/000000005/model.safetensors") == b"w" * 4096


def _ctl(tmp_path, events, dst_store):
    """The parts of a Controller a move reads (runs/driving/controller.py holds the real one)."""
    from types import SimpleNamespace

    from sdcloud.runs.inputs.spec import RunSpec

    class Fleet:
        @staticmethod
        def failed_launches(market=None):
            return 12

    src = _home(tmp_path)
    return SimpleNamespace(spec=RunSpec(tier="sd15-lora", provider="aws", providers=["aws", "tencent"]),
                           cloud="aws", home_cloud="aws", fleet=Fleet(), store=src, home_store=src,
                           home_store_conf={"url": "file:///home"}, run_id=RUN, ensure_inputs=lambda: {},
                           event=lambda k, d: events.append((k, d)), state=None)


def test_a_cut_move_launches_nothing_tries_again_and_the_landed_one_is_priced(tmp_path, monkeypatch):
    from sdcloud.runs.driving import cloud_move

    events, bound, moves = [], [], []
    plain = LocalStore(tmp_path / "other")
    flaky = CutAfter(plain, 4)
    ctl = _ctl(tmp_path, events, flaky)
    monkeypatch.setattr(cloud_move, "store_conf_for", lambda c, name: {"url": "file:///other"})
    monkeypatch.setattr(cloud_move, "open_run_store", lambda conf: flaky)
    monkeypatch.setattr(cloud_move, "bind", lambda c, name: bound.append(name))
    monkeypatch.setattr(cloud_move.cost_ledger, "record_move", lambda *a, **k: moves.append((*a, k)))
    assert cloud_move.after_spot_refused(ctl) is True  # the copy was cut: no launch this step
    assert bound == [] and moves == [] and [k for k, _ in events] == ["cloud-move-failed"]
    assert manifest.newest_complete(plain, PREFIX) is None
    flaky.left = 10**6  # the store answers again
    assert cloud_move.after_spot_refused(ctl) is True
    assert bound == ["tencent"] and [k for k, _ in events][-1] == "cloud-moved"
    moved = events[-1][1]
    assert moved["step"] == 20 and moved["skipped"] == 4 and moved["egress_usd"] > 0
    assert moves == [(None, RUN, "aws", moved["bytes"], moved["seconds"], {"region": None})]
    assert manifest.newest_complete(plain, PREFIX).step == 20


def test_a_run_with_one_cloud_or_on_demand_never_moves(tmp_path):
    from dataclasses import replace

    from sdcloud.runs.driving import cloud_move

    ctl = _ctl(tmp_path, [], None)
    ctl.spec = replace(ctl.spec, providers=None)
    assert cloud_move.other_cloud(ctl) is None and cloud_move.after_spot_refused(ctl) is False
    ctl.spec = replace(ctl.spec, providers=["aws", "tencent"], market="on-demand")
    assert cloud_move.other_cloud(ctl) == "tencent" and cloud_move.after_spot_refused(ctl) is False


def test_the_other_cloud_must_be_cheaper_to_finish_with_the_move_priced_in():
    from sdcloud.offers.moves import MoveCost
    from sdcloud.runs.driving.cloud_move import MOVE_MARGIN, worth_moving

    move = MoveCost(egress_usd=0.5, transfer_hours=0.1, bytes=2**30, reason="")
    assert worth_moving(10.0, 5.0, move)
    assert not worth_moving(10.0, 10.0 * (1 - MOVE_MARGIN) - 0.4, move)  # cheaper, but not once egress is paid
    assert not worth_moving(10.0, None, move) and worth_moving(None, 3.0, move)


def test_a_run_never_moves_back_for_price_to_the_cloud_whose_spot_ran_dry(tmp_path):
    from sdcloud.runs.driving import cloud_move

    ctl = _ctl(tmp_path, [], None)
    ctl.cloud, ctl.clouds_refused = "tencent", {"aws"}
    assert cloud_move.other_cloud(ctl) == "aws" and cloud_move.cheaper_elsewhere(ctl) is False


def test_a_store_fault_halfway_through_a_presigned_copy_leaves_the_last_complete_checkpoint(s3_env, seaweed, tmp_path):
    """The destination's store answers a checkpoint file's PUT with an error (tests/support/front_faults.py):
    the copy stops, no manifest lands, and a host there restores the complete checkpoint it had."""
    import boto3

    from sdcloud_agent.store import open_store

    from tests.support.front_faults import FaultFront

    s3 = boto3.client("s3", endpoint_url=s3_env["endpoint_url"])
    for bucket in ("cut-home", "cut-away"):
        s3.create_bucket(Bucket=bucket)
    src = open_store({"url": "s3://cut-home/p"})
    _checkpoint(src, 8, {"model.safetensors": b"m" * 2048, "optimizer.pt": b"o" * 1024}, tmp_path / "a")
    broken = {"on": True}

    def refuse(method, path, headers):
        return (503, "ServiceUnavailable") if broken["on"] and method == "PUT" and "optimizer" in path else None

    with FaultFront(seaweed, seed=1, refuse=refuse) as front:
        dst = open_store({"url": "s3://cut-away/q", "endpoint_url": front.endpoint})
        _checkpoint(dst, 4, {"model.safetensors": b"k" * 2048}, tmp_path / "b")  # carried by an earlier move
        with pytest.raises(StoreError, match="between clouds failed"):
            copy_checkpoint(src, dst, RUN)
        assert dst.head(f"{PREFIX}/checkpoints/000000008/model.safetensors") is not None  # half of it is there
        assert manifest.complete_steps(dst, PREFIX) == [4] and manifest.newest_complete(dst, PREFIX).step == 4
        broken["on"] = False
        again = copy_checkpoint(src, dst, RUN)
        assert again.step == 8 and again.skipped == 1 and manifest.newest_complete(dst, PREFIX).step == 8


def test_cos_takes_the_presigned_get_and_put_of_a_move(cos_env, tmp_path):
    """The Tencent side of a move: COS at its own endpoint (tests/support/front_cos.py, HTTPS, virtual
    hosts) answers the presigned GET and PUT as it answers its own client."""
    import uuid

    from sdcloud.providers.tencent import storage as cos

    stores = []
    for side in ("from", "to"):
        store = cos.open_store(f"move-{side}-{uuid.uuid4().hex[:6]}-1250000000", "sd", "ap-guangzhou")
        store.ensure_bucket()
        stores.append(store)
    src, dst = stores
    _checkpoint(src, 12, {"model.safetensors": b"z" * 3000}, tmp_path)
    url = dst.presign(f"{PREFIX}/checkpoints/000000012/model.safetensors", "put", 60)
    assert url.startswith("https://move-to-") and ".cos.ap-guangzhou.myqcloud.com/" in url
    copied = copy_checkpoint(src, dst, RUN)
    assert copied.step == 12 and manifest.newest_complete(dst, PREFIX).step == 12
    assert dst.get(f"{PREFIX}/checkpoints/000000012/model.safetensors") == b"z" * 3000
    assert not [s for s in cos_env.seen if s.refused]


def test_a_file_over_one_puts_limit_goes_by_the_destinations_multipart_upload(s3_env, tmp_path, monkeypatch):
    """S3 and COS take at most 5 GB in one PUT: where the controller copies, a larger file streams from
    its presigned GET into the destination's multipart upload part by part, with no spool to disk
    (here the limit is lowered to 1 MiB). The stores are configured as production's: a bucket URL."""
    import tempfile

    import boto3

    from sdcloud.runs.driving import move_copy
    from sdcloud_agent.store import open_store

    s3 = boto3.client("s3", endpoint_url=s3_env["endpoint_url"])
    for bucket in ("big-home", "big-away"):
        s3.create_bucket(Bucket=bucket)
    src = open_store({"url": "s3://big-home/p"})
    dst = open_store({"url": "s3://big-away/q", "engine": "s3transfer", "part_size": 5 * 1024 * 1024})
    big = bytes(range(256)) * (12 * 4096)  # 12 MiB: three parts of 5 MiB
    _checkpoint(src, 5, {"model.safetensors": big, "optimizer.pt": b"o" * 100}, tmp_path)
    monkeypatch.setattr(move_copy, "SINGLE_PUT_BYTES", 1024 * 1024)

    def no_spool(*_a, **_k):
        raise AssertionError("a move's copy spooled to disk")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", no_spool)
    monkeypatch.setattr(tempfile, "mkstemp", no_spool)
    copied = copy_checkpoint(src, dst, RUN)
    assert copied.step == 5 and copied.fetched == copied.sent
    assert manifest.complete_steps(dst, PREFIX) == [5]
    assert dst.get(f"{PREFIX}/checkpoints/000000005/model.safetensors") == big
    head = s3.head_object(Bucket="big-away", Key=f"q/{PREFIX}/checkpoints/000000005/model.safetensors")
    assert head["ETag"].strip('"').endswith("-3")  # landed as a multipart object of three parts
