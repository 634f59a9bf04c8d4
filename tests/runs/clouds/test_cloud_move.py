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


def _clouds(tmp_path, dst_store, state=None):
    """The run's clouds as the controller holds them (runs/driving/placement.py), both stores folders here."""
    from sdcloud.offers.tiers import get_tier
    from sdcloud.runs.driving.placement import Clouds, Home
    from sdcloud.runs.inputs.spec import RunSpec

    src = _home(tmp_path)
    spec = RunSpec(tier="sd15-lora", provider="aws", providers=["aws", "tencent"])
    clouds = Clouds(state, RUN, Home(spec, {}, {"url": "file:///home"}, src), get_tier("sd15-lora"))
    clouds._stores["tencent"] = dst_store  # the other cloud's bucket, opened once
    return clouds


def test_a_cut_move_lands_nothing_counts_a_failure_and_the_next_try_lands_it_priced(tmp_path, monkeypatch):
    from sdcloud.runs.driving import placement

    events, moves = [], []
    plain = LocalStore(tmp_path / "other")
    flaky = CutAfter(plain, 4)
    clouds = _clouds(tmp_path, flaky)
    monkeypatch.setattr(placement.cost_ledger, "record_move", lambda *a, **k: moves.append((*a, k)))
    emit = lambda k, d: events.append((k, d))  # noqa: E731
    assert placement.carry(clouds, "aws", "tencent", {}, emit, "spot gone") is False  # the copy was cut
    assert moves == [] and [k for k, _ in events] == ["cloud-move-failed"] and clouds.moves.failures == {"tencent": 1}
    assert manifest.newest_complete(plain, PREFIX) is None
    flaky.left = 10**6  # the store answers again
    assert placement.carry(clouds, "aws", "tencent", {}, emit, "spot gone") is True
    moved = events[-1][1]
    assert events[-1][0] == "cloud-moved" and moved["why"] == "spot gone"
    assert moved["step"] == 20 and moved["skipped"] == 4 and moved["egress_usd"] > 0
    assert moves == [(None, RUN, "aws", moved["bytes"], moved["seconds"], {"region": None})]
    assert manifest.newest_complete(plain, PREFIX).step == 20


def test_a_cloud_whose_copies_never_land_is_no_candidate_after_max_move_failures(tmp_path):
    from sdcloud.runs.driving.placement import MAX_MOVE_FAILURES

    clouds = _clouds(tmp_path, None)
    listed = []
    listing = lambda provider, name, spec, plan: listed.append((name, spec.region)) or ["offer of " + name]  # noqa: E731
    clouds._providers["tencent"] = object()
    clouds.state = type("S", (), {"infra": staticmethod(lambda name, region: {})})()
    assert clouds.elsewhere("aws", listing) == ["offer of tencent"]
    assert clouds.elsewhere("aws", listing) == ["offer of tencent"] and len(listed) == 1  # listed once
    assert listed[0][1] == "ap-guangzhou"  # the other cloud's default region, its stack's where it has one
    clouds.moves.failures["tencent"] = MAX_MOVE_FAILURES
    assert clouds.elsewhere("aws", listing) == []
    clouds._providers["aws"] = object()
    assert clouds.elsewhere("tencent", listing) == ["offer of aws"]  # from there, home is the other cloud


def test_the_policy_is_told_the_bytes_a_move_carries_priced_at_the_rate_moves_measured(tmp_path, sdcloud_home):
    from sdcloud.events import Kind
    from sdcloud.runs.driving.placement import Placement, across, carried_bytes, measured_mb_s
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    state.create_run(RUN, "sd15-lora", {"provider": "aws", "tier": "sd15-lora"}, 10)
    clouds = _clouds(tmp_path, LocalStore(tmp_path / "other"), state)
    model = {"model": "cache:cache/models/local-0123456789abcdef.tar"}
    # Step 20's two files, the dataset's two, the token and the cached model.
    assert carried_bytes(clouds.home.store, RUN, model) == 1500 + 30 + 7 + 19 + 300
    at_home = Placement("aws", None, None, clouds.home.store_conf)
    terms = across(clouds, at_home, model, 1)
    assert terms.data_cloud == "aws" and terms.move_usd == pytest.approx(1856 / 2**30 * 0.09)
    assert terms.move_hours == pytest.approx(1856 / 40e6 / 3600)  # the planning rate: no move measured yet
    assert measured_mb_s(state, RUN) is None
    state.event(RUN, Kind.CLOUD_MOVED, {"bytes": 8_000_000, "seconds": 2.0})
    assert measured_mb_s(state, RUN) == pytest.approx(4.0)
    assert across(clouds, at_home, model, 1) is terms  # measured once an attempt
    again = across(clouds, at_home, model, 2)
    assert again.move_hours == pytest.approx(1856 / 4e6 / 3600)  # this run's own rate now
    one = _clouds(tmp_path / "one", None, state)
    one.names = ["aws"]
    assert across(one, at_home, model, 1) is None  # one cloud: the policy is told nothing of moves


def test_the_staged_dataset_is_read_from_the_store_of_the_cloud_the_run_is_in():
    from sdcloud.runs.driving.placement import dataset_in

    home, away = {"url": "s3://home/sd"}, {"url": "s3://away/q/"}
    assert dataset_in(home, away, "s3://home/sd/runs/r-1/dataset") == "s3://away/q/runs/r-1/dataset"
    assert dataset_in(home, away, "hf://user/photos") == "hf://user/photos"  # not staged: read where it is
    assert dataset_in(home, away, None) is None


def test_a_store_fault_halfway_through_a_presigned_copy_leaves_the_last_complete_checkpoint(s3_env, seaweed, tmp_path):
    """The destination's store answers a checkpoint file's PUT with an error (tests/support/fronts/front_faults.py):
    the copy stops, no manifest lands, and a host there restores the complete checkpoint it had."""
    import boto3

    from sdcloud_agent.store import open_store

    from tests.support.fronts.front_faults import FaultFront

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
    """The Tencent side of a move: COS at its own endpoint (tests/support/fronts/front_cos.py, HTTPS, virtual
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


def test_a_cloud_not_reachable_from_here_is_no_candidate_now_and_asked_again_later(tmp_path):
    from sdcloud.errors import UserError

    clouds = _clouds(tmp_path, None)
    clouds._providers["tencent"] = object()
    clouds.state = type("S", (), {"infra": staticmethod(lambda name, region: {})})()
    answers = [UserError("no Tencent Cloud credentials"), ["offer of tencent"]]

    def listing(provider, name, spec, plan):
        out = answers.pop(0)
        if isinstance(out, Exception):
            raise out
        return out

    assert clouds.elsewhere("aws", listing) == []  # `down` on a machine without its keys still works
    assert clouds.elsewhere("aws", listing) == ["offer of tencent"]
