"""ObjectStore (local directory and SeaweedFS S3), the checkpoint manifest and checkpoint sync."""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
import time
import uuid
from pathlib import Path

import boto3
import pytest

from sdcloud_agent import manifest as mf
from sdcloud_agent.staging import stage
from sdcloud_agent.status import StatusReporter
from sdcloud_agent.store import Cancelled, LocalStore, S3Store, open_store
from sdcloud_agent.sync import CheckpointSync, SyncWorker

RUN = "runs/r1"


def _s3_store(s3_env, **opts):
    bucket = f"st-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_env["endpoint_url"]).create_bucket(Bucket=bucket)
    # A small part size so that multipart (parallel parts) runs on small files.
    return open_store({"url": f"s3://{bucket}/pre/fix", "endpoint_url": s3_env["endpoint_url"]},
                      part_size=5 * 1024 * 1024, **opts)


@pytest.fixture(params=["local", "s3-crt", "s3-s3transfer"])
def store(request, tmp_path):
    """Every store test runs on a local folder and on S3 through both transfer engines."""
    if request.param == "local":
        return LocalStore(tmp_path / "bucket")
    engine = request.param.split("-", 1)[1]
    got = _s3_store(request.getfixturevalue("s3_env"), engine=engine)
    assert got.engine == engine
    return got


@pytest.fixture(params=["crt", "s3transfer"])
def engine(request) -> str:
    return request.param


def _ckpt(folder: Path, step: int, big: int = 0) -> Path:
    d = folder / f"step-{step:09d}"
    (d / "sub").mkdir(parents=True, exist_ok=True)
    (d / "weights.bin").write_bytes(hashlib.sha256(f"w{step}".encode()).digest() * 1000)
    (d / "sub" / "config.json").write_text('{"same": "in every checkpoint"}')
    if big:
        (d / "big.bin").write_bytes(os.urandom(big))
    return d


def test_open_store_urls(tmp_path):
    assert isinstance(open_store(f"file://{tmp_path}/a"), LocalStore)
    assert isinstance(open_store(str(tmp_path / "b")), LocalStore)
    s = open_store({"url": "s3://bkt/some/prefix", "endpoint_url": "http://127.0.0.1:1", "region": "us-east-1"})
    assert isinstance(s, S3Store) and s.bucket == "bkt" and s.prefix == "some/prefix"
    with pytest.raises(ValueError):
        open_store("gs://nope")


def test_put_get_list_delete_create_and_multipart(store, tmp_path):
    store.put("a/b.txt", b"hello", {"sha256": "x"})
    assert store.get("a/b.txt") == b"hello"
    assert store.head("a/b.txt").metadata.get("sha256") == "x"
    assert store.head("a/none") is None
    assert store.create("lock", b"1") is True
    assert store.create("lock", b"2") is False and store.get("lock") == b"1"
    big = tmp_path / "big.bin"
    data = os.urandom(12 * 1024 * 1024 + 123)
    big.write_bytes(data)
    store.put_file("c/big.bin", big, {"sha256": "y"})
    assert store.head("c/big.bin").size == len(data)
    out = tmp_path / "back.bin"
    store.get_file("c/big.bin", out)
    assert out.read_bytes() == data
    assert [o.key for o in store.list("")] == ["a/b.txt", "c/big.bin", "lock"]
    assert [o.key for o in store.list("a/")] == ["a/b.txt"]
    store.copy("a/b.txt", "d/copy.txt")
    assert store.get("d/copy.txt") == b"hello"
    store.delete(["a/b.txt", "c/big.bin"])
    assert [o.key for o in store.list("")] == ["d/copy.txt", "lock"]


def test_a_listing_matches_keys_by_prefix_as_s3_does(store):
    """A prefix is a string, not a folder: it may end mid-name, name a folder with or without its
    slash, or name nothing; the local folder answers as S3 does (and walks only where keys can match)."""
    for key in ("job/done/a1.json", "job/done/a2.json", "job/doneness.txt", "job/leases/a1.json",
                "jobs/x", "job/done/deep/b.json", "top"):
        store.put(key, b"x")
    keys = lambda prefix: [o.key for o in store.list(prefix)]  # noqa: E731
    assert keys("job/done/") == ["job/done/a1.json", "job/done/a2.json", "job/done/deep/b.json"]
    assert keys("job/done") == ["job/done/a1.json", "job/done/a2.json", "job/done/deep/b.json", "job/doneness.txt"]
    assert keys("job/done/a") == ["job/done/a1.json", "job/done/a2.json"]
    assert keys("job") == [k for k in keys("") if k.startswith("job")] and "jobs/x" in keys("job")
    assert keys("t") == ["top"] and keys("nothing/") == [] and keys("job/done/a1.json") == ["job/done/a1.json"]


def test_cancelled_multipart_leaves_no_object(store, tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(11 * 1024 * 1024))
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        store.put_file("x/big.bin", big, cancel=cancel)
    assert store.head("x/big.bin") is None


def test_upload_cancelled_mid_file_aborts_its_multipart_upload(s3_env, tmp_path, monkeypatch, engine):
    import sdcloud_agent.transfer as transfer
    store = _s3_store(s3_env, engine=engine)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(21 * 1024 * 1024))  # five parts of 5 MiB
    cancel = threading.Event()
    reads = []
    real_read, real_readinto = transfer.HashingReader.read, transfer.HashingReader.readinto

    def noticed() -> None:
        reads.append(1)
        if len(reads) == 2:  # the notice lands after the first part was read
            cancel.set()

    def read(self, n=-1):  # the s3transfer engine reads bytes ...
        noticed()
        return real_read(self, n)

    def readinto(self, buf):  # ... the CRT engine fills its own part buffers
        noticed()
        return real_readinto(self, buf)
    monkeypatch.setattr(transfer.HashingReader, "read", read)
    monkeypatch.setattr(transfer.HashingReader, "readinto", readinto)
    with pytest.raises(Cancelled):
        store.put_file("x/big.bin", big, cancel=cancel)
    assert store.head("x/big.bin") is None and len(reads) < 5
    ups = store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
    assert not [u for u in ups if u["Key"].endswith("x/big.bin")]


def test_manifest_is_last_and_newest_complete_ignores_partial_and_corrupt(store, tmp_path):
    sync = CheckpointSync(store, RUN, keep=5)
    for step in (10, 20):
        sync.upload(_ckpt(tmp_path, step), step)
    assert mf.newest_complete(store, RUN).step == 20
    # A newer checkpoint whose upload died before its manifest: invisible.
    store.put(f"{mf.checkpoint_prefix(RUN, 30)}/weights.bin", b"partial")
    # A manifest whose file is missing or has the wrong size: not complete either.
    m = mf.build(_ckpt(tmp_path, 40), 40)
    store.put(f"{mf.checkpoint_prefix(RUN, 40)}/manifest.json", m.to_json())
    store.put(f"{mf.checkpoint_prefix(RUN, 50)}/manifest.json", b"{not json")
    assert mf.complete_steps(store, RUN) == [10, 20]
    got = mf.newest_complete(store, RUN)
    assert got.step == 20 and {f.path for f in got.files} == {"weights.bin", "sub/config.json"}
    dest = mf.download(store, RUN, got, tmp_path / "restored" / got.name)
    assert (dest / "weights.bin").read_bytes() == (tmp_path / "step-000000020" / "weights.bin").read_bytes()
    # A file changed in the bucket after commit fails the sha256 check; nothing is left behind.
    size = next(f.size for f in got.files if f.path == "weights.bin")
    store.put(f"{mf.checkpoint_prefix(RUN, 20)}/weights.bin", b"x" * size)
    with pytest.raises(mf.CorruptCheckpoint):
        mf.download(store, RUN, got, tmp_path / "restored2" / got.name)
    assert not (tmp_path / "restored2" / got.name).exists()


def test_sync_skips_uploaded_content_copies_shared_files_and_keeps_k(store, tmp_path):
    sync = CheckpointSync(store, RUN, keep=2)
    r1 = sync.upload(_ckpt(tmp_path, 10), 10)
    assert r1.skipped == 0 and r1.copied == 0 and r1.bytes_sent == r1.bytes_total
    again = sync.upload(tmp_path / "step-000000010", 10)  # a retry after a crash: nothing re-sent
    assert again.skipped == 2 and again.bytes_sent == 0
    r2 = sync.upload(_ckpt(tmp_path, 20), 20)
    assert r2.copied == 1  # config.json is the same content: server-side copy
    sync.upload(_ckpt(tmp_path, 30), 30)
    assert mf.complete_steps(store, RUN) == [20, 30]
    assert not [o for o in store.list(f"{RUN}/checkpoints/000000010/")]
    fresh = CheckpointSync(store, RUN, keep=2)
    fresh.seed()
    assert fresh.durable_step == 30


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_transfers_return_the_sha256_of_the_bytes_they_moved(store, tmp_path):
    for size in (0, 1000, 12 * 1024 * 1024 + 5):  # empty, one PUT, three parts / ranges
        src = tmp_path / f"f{size}"
        src.write_bytes(os.urandom(size))
        assert store.put_file(f"t/{size}", src) == _sha(src)
        back = tmp_path / f"back{size}"
        assert store.get_file(f"t/{size}", back) == _sha(src) and back.read_bytes() == src.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_big_files_are_hashed_from_the_upload_reads_and_unchanged_ones_cost_nothing(store, tmp_path, monkeypatch):
    import sdcloud_agent.sync as sync_mod
    hashed_first: list[str] = []
    real = sync_mod.sha256_file
    monkeypatch.setattr(sync_mod, "sha256_file", lambda p: hashed_first.append(Path(p).name) or real(p))
    sync = CheckpointSync(store, RUN, hash_first_below=1024 * 1024)
    d = _ckpt(tmp_path, 10, big=12 * 1024 * 1024)
    r = sync.upload(d, 10)
    assert r.bytes_sent == r.bytes_total and "big.bin" not in hashed_first  # one read: the upload's
    m = mf.read(store, RUN, 10)
    assert {f.path: f.sha256 for f in m.files} == {p: _sha(d / p) for p in ("big.bin", "weights.bin", "sub/config.json")}
    hashed_first.clear()
    again = sync.upload(d, 10)
    assert again.bytes_sent == 0 and again.skipped == 3 and hashed_first == []  # nothing read again
    # A file rewritten in place (same size, new bytes) is not mistaken for the one already sent.
    (d / "big.bin").write_bytes(os.urandom(12 * 1024 * 1024))
    changed = sync.upload(d, 10)
    assert changed.bytes_sent == 12 * 1024 * 1024 and changed.skipped == 2
    assert next(f.sha256 for f in mf.read(store, RUN, 10).files if f.path == "big.bin") == _sha(d / "big.bin")


def test_restore_falls_back_past_a_corrupt_part_a_truncated_and_a_missing_file(store, tmp_path):
    sync = CheckpointSync(store, RUN, keep=10)
    big = 12 * 1024 * 1024
    for step in (10, 20, 30, 40):
        sync.upload(_ckpt(tmp_path, step, big=big), step)
    key = lambda step, name: f"{mf.checkpoint_prefix(RUN, step)}/{name}"  # noqa: E731
    raw = bytearray(store.get(key(40, "big.bin")))
    raw[7 * 1024 * 1024] ^= 0xFF  # one byte of the middle part / range
    store.put(key(40, "big.bin"), bytes(raw))
    store.put(key(30, "big.bin"), bytes(raw[:-1]))  # truncated
    store.delete(key(20, "sub/config.json"))  # missing
    logs: list[str] = []
    got = mf.restore_newest(store, RUN, lambda m: tmp_path / "resume" / m.name, log=logs.append)
    assert got is not None
    m, dest = got
    assert m.step == 10 and (dest / "big.bin").read_bytes() == (tmp_path / "step-000000010" / "big.bin").read_bytes()
    assert any("checkpoint 40" in line and "sha256" in line for line in logs)
    assert sorted(p.name for p in (tmp_path / "resume").iterdir()) == ["step-000000010"]  # no temp folders


def test_many_files_share_one_connection_without_deadlock(s3_env, tmp_path):
    # One connection for four multi-part files moving at once, both ways.
    store = _s3_store(s3_env, workers=1)
    d = tmp_path / "step-000000010"
    d.mkdir()
    for i in range(4):
        (d / f"shard{i}.bin").write_bytes(os.urandom(11 * 1024 * 1024 + i))
    done = threading.Event()

    def go():
        sync = CheckpointSync(store, RUN, file_workers=4)
        sync.upload(d, 10)
        mf.download(store, RUN, mf.read(store, RUN, 10), tmp_path / "back" / d.name, workers=4)
        done.set()
    t = threading.Thread(target=go, daemon=True)
    t.start()
    assert done.wait(60), "the transfers deadlocked"
    for i in range(4):
        assert (tmp_path / "back" / d.name / f"shard{i}.bin").read_bytes() == (d / f"shard{i}.bin").read_bytes()


class ShortBodies:
    """A client whose ranged GETs of one part come back short (a connection cut mid-body)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get_object(self, **kw):
        resp = self.inner.get_object(**kw)
        if kw.get("Range", "bytes=0-").startswith("bytes=5242880-"):
            body = resp["Body"].read()
            resp["Body"] = io.BytesIO(body[:-10])
        return resp


def test_a_short_ranged_read_fails_the_file_and_the_restore_falls_back(s3_env, tmp_path):
    store = _s3_store(s3_env, range_size=5 * 1024 * 1024)
    sync = CheckpointSync(store, RUN, keep=10)
    sync.upload(_ckpt(tmp_path, 10), 10)  # small files only: one range each
    sync.upload(_ckpt(tmp_path, 20, big=12 * 1024 * 1024), 20)
    store = S3Store(store.bucket, store.prefix, client=ShortBodies(store.client), part_size=store.part_size,
                    range_size=store.range_size)
    with pytest.raises(Exception):
        store.get_file(f"{mf.checkpoint_prefix(RUN, 20)}/big.bin", tmp_path / "out" / "big.bin")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
    m, _ = mf.restore_newest(store, RUN, lambda m: tmp_path / "resume" / m.name, attempts=2)
    assert m.step == 10


class Flaky:
    """A store whose first N put_file calls fail: bounded retries with backoff must cope."""

    def __init__(self, inner, failures):
        self.inner, self.failures, self.calls = inner, failures, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def put_file(self, *a, **kw):
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionResetError("injected")
        return self.inner.put_file(*a, **kw)


def test_failed_uploads_are_retried_and_never_committed_early(tmp_path):
    inner = LocalStore(tmp_path / "bucket")
    flaky = Flaky(inner, failures=2)
    sync = CheckpointSync(flaky, RUN, base_delay=0.01)
    sync.upload(_ckpt(tmp_path, 10), 10)
    assert mf.complete_steps(inner, RUN) == [10] and flaky.calls >= 4
    dead = Flaky(inner, failures=10 ** 6)
    worker = SyncWorker(CheckpointSync(dead, RUN, base_delay=0.001, attempts=3), checkpoint_tries=2)
    worker.submit(20, _ckpt(tmp_path, 20))
    assert worker.wait_idle(timeout=30)
    worker.close()
    assert worker.failed == [20] and mf.complete_steps(inner, RUN) == [10]
    assert inner.head(f"{mf.checkpoint_prefix(RUN, 20)}/manifest.json") is None


def test_worker_in_urgent_mode_uploads_the_newest_first_then_the_older_one_it_cancelled(tmp_path):
    manifests: list[int] = []
    blocked = threading.Event()

    class Slow(LocalStore):
        def put_file(self, key, path, metadata=None, cancel=None):
            if "000000010" in key and not blocked.is_set():  # the first try of step 10 waits for its cancel
                blocked.set()
                assert cancel is not None and cancel.wait(10), "the old upload was not cancelled"
                raise Cancelled(key)
            return super().put_file(key, path, metadata, cancel)

        def put(self, key, data, metadata=None):
            if key.endswith("/manifest.json"):
                manifests.append(int(key.split("/")[-2]))
            return super().put(key, data, metadata)

    store = Slow(tmp_path / "bucket")
    worker = SyncWorker(CheckpointSync(store, RUN))
    worker.submit(10, _ckpt(tmp_path, 10))
    assert blocked.wait(10)
    worker.set_urgent()
    worker.submit(15, _ckpt(tmp_path, 15))
    assert worker.wait_idle(timeout=20)
    worker.close()
    # The notice's checkpoint first; the one it cancelled is not lost (nor its samples with it).
    assert manifests == [15, 10] and mf.complete_steps(store, RUN) == [10, 15]


def test_worker_in_urgent_mode_skips_an_older_checkpoint_that_pruning_would_delete(tmp_path):
    gate = threading.Event()

    class Gated(LocalStore):
        def put_file(self, key, path, metadata=None, cancel=None):
            if "000000020" in key:  # step 20 goes up while step 10 waits behind it
                assert gate.wait(10)
            return super().put_file(key, path, metadata, cancel)

    store = Gated(tmp_path / "bucket")
    worker = SyncWorker(CheckpointSync(store, RUN, keep=1))
    worker.set_urgent()
    worker.submit(20, _ckpt(tmp_path, 20))
    worker.submit(10, _ckpt(tmp_path, 10))
    gate.set()
    assert worker.wait_idle(timeout=20)
    worker.close()
    assert mf.complete_steps(store, RUN) == [20] and not store.list(f"{mf.checkpoint_prefix(RUN, 10)}/")


def test_staging_downloads_in_parallel_and_skips_present_files(store, tmp_path):
    for i in range(12):
        store.put(f"ds/img{i:02d}.png", os.urandom(1000 + i))
    url = store.url + "/ds"
    opts = {"endpoint_url": store.client.meta.endpoint_url} if isinstance(store, S3Store) else {}
    res = stage(url, tmp_path / "data", opts)
    assert res.files == 12 and len(list((tmp_path / "data").iterdir())) == 12
    assert stage(url, tmp_path / "data", opts).skipped == 12


def test_status_json_is_written_atomically_with_the_log(store, tmp_path):
    logf = tmp_path / "a.log"
    logf.write_text("hello\n")
    st = StatusReporter(store, RUN, "r1", 2, 100, local_path=tmp_path / "status.json", log_path=logf)
    st.update(step=5, loss=0.1)
    st.set_phase("training")
    doc = json.loads(store.get(f"{RUN}/status.json"))
    assert doc["phase"] == "training" and doc["step"] == 5 and doc["attempt"] == 2
    assert set(doc) >= {"run", "attempt", "phase", "step", "total_steps", "it_per_s", "loss", "gpu_util",
                        "disk_free_gb", "time", "reason"}
    assert json.loads((tmp_path / "status.json").read_text())["phase"] == "training"
    assert store.get(f"{RUN}/logs/attempt-2.log") == b"hello\n"
    st.set_phase("preempted", "reclaim")
    st.set_phase("training")  # a final status is never overwritten
    assert json.loads(store.get(f"{RUN}/status.json"))["phase"] == "preempted"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


@pytest.mark.parametrize("given", ["config", "environment"])
def test_crt_engine_speaks_plain_http_where_the_resolved_endpoint_says_so(seaweed, s3_env, tmp_path, monkeypatch, given):
    """The CRT client takes TLS from the endpoint botocore resolved: one in the store config, or one
    from AWS_ENDPOINT_URL (a proxy, moto, a plain test port); TLS against a plain port closes the socket."""
    bucket = f"st-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_env["endpoint_url"]).create_bucket(Bucket=bucket)
    conf = {"url": f"s3://{bucket}/p", "engine": "crt"}
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    if given == "config":
        conf["endpoint_url"] = seaweed.http_endpoint
    else:
        monkeypatch.setenv("AWS_ENDPOINT_URL", seaweed.http_endpoint)
    store = open_store(conf, part_size=5 * 1024 * 1024)
    assert store.engine == "crt"
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(11 * 1024 * 1024))
    digest = store.put_file("big.bin", src)
    assert store.get_file("big.bin", tmp_path / "back.bin") == digest == hashlib.sha256(src.read_bytes()).hexdigest()


@pytest.mark.parametrize("with_blocks", [True, False])
def test_a_restore_checks_each_range_while_the_file_lands(seaweed, s3_env, tmp_path, monkeypatch, with_blocks):
    """Ranges land in any order; each is checked against its block checksum as it arrives (or,
    for a file without block checksums, hashed in file order as the ranges complete), so the
    checking is done when the last byte lands. Four connections at 5 MB/s each make the download
    last about 2.5 s."""
    from tests.support.fake_host import SlowProxy

    from sdcloud_agent import transfer

    bucket = f"st-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_env["endpoint_url"]).create_bucket(Bucket=bucket)
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(40 * 1024 * 1024))
    want = hashlib.sha256(src.read_bytes()).hexdigest()
    mib4 = 4 * 1024 * 1024
    up = open_store({"url": f"s3://{bucket}/p", "endpoint_url": s3_env["endpoint_url"]}, range_size=mib4)
    sent = up.put_file("big.bin", src)
    assert sent == want and sent.sums.block == mib4 and len(sent.sums.crc) == 10
    checked: list[float] = []
    real = transfer._range

    def timed_range(*a):
        real(*a)
        checked.append(time.monotonic())

    monkeypatch.setattr(transfer, "_range", timed_range)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    proxy = SlowProxy(seaweed.port, down_bytes_per_s=5e6)
    try:
        store = open_store({"url": f"s3://{bucket}/p", "endpoint_url": proxy.endpoint}, range_size=mib4,
                           restore_workers=4)
        got = store.get_file("big.bin", tmp_path / "back.bin", sums=sent.sums if with_blocks else None)
        done = time.monotonic()
    finally:
        proxy.stop()
    assert got == (None if with_blocks else want)
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
    assert len(checked) == 10 and checked[0] < done - 1.0, "the first range was not checked while the rest landed"
    if with_blocks:
        # A flipped byte in the bucket fails its block, and leaves no file behind.
        raw = bytearray(src.read_bytes())
        raw[21 * 1024 * 1024] ^= 1
        up.put("big.bin", bytes(raw))
        with pytest.raises(transfer.ChecksumMismatch, match="block at byte 20971520"):
            up.get_file("big.bin", tmp_path / "bad.bin", sums=sent.sums)
        assert not (tmp_path / "bad.bin").exists() and not list(tmp_path.glob(".sdcloud*"))


def test_manifests_carry_block_checksums_and_restore_without_them(s3_env, tmp_path, monkeypatch):
    """Uploads record a CRC64/NVME per block from the upload's own reads; skipped and copied
    files keep theirs. A manifest without them (an uploader without awscrt) restores by sha256."""
    from sdcloud_agent import transfer

    store = _s3_store(s3_env, range_size=5 * 1024 * 1024)
    sync = CheckpointSync(store, RUN, keep=10)
    d10 = _ckpt(tmp_path, 10, big=12 * 1024 * 1024)
    sync.upload(d10, 10)
    m10 = mf.read(store, RUN, 10)
    big = next(f for f in m10.files if f.path == "big.bin")
    assert big.blocks is not None and big.blocks.alg == "crc64nvme" and len(big.blocks.crc) == 3
    assert all(f.blocks is not None for f in m10.files)
    sync.upload(d10, 11)  # every file copied or skipped: the blocks come along
    assert [f.blocks for f in mf.read(store, RUN, 11).files] == [f.blocks for f in m10.files]
    monkeypatch.setattr(transfer, "_crc64", lambda: None)
    d20 = _ckpt(tmp_path, 20, big=6 * 1024 * 1024)
    CheckpointSync(store, RUN, keep=10).upload(d20, 20)
    assert all(f.blocks is None for f in mf.read(store, RUN, 20).files)
    m, dest = mf.restore_newest(_s3_store_at(store), RUN, lambda m: tmp_path / "resume" / m.name)
    assert m.step == 20 and (dest / "big.bin").read_bytes() == (d20 / "big.bin").read_bytes()


def test_a_full_disk_fails_the_restore_with_enospc_and_leaves_nothing(s3_env, tmp_path, monkeypatch):
    """The file's blocks are allocated before the ranges are written into its map, so a full disk
    is an error the agent reports and falls back from, not a SIGBUS that kills it."""
    import errno

    from sdcloud_agent import transfer

    store = _s3_store(s3_env)
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(6 * 1024 * 1024))
    store.put_file("big.bin", src)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(transfer.os, "posix_fallocate", full)
    out = tmp_path / "out"
    with pytest.raises(OSError, match="No space left"):
        store.get_file("big.bin", out / "big.bin")
    assert list(out.iterdir()) == []


def _s3_store_at(store):
    return S3Store(store.bucket, store.prefix, endpoint_url=store.client.meta.endpoint_url, range_size=store.range_size)


class WrongDigests:
    """A store whose get_file lands the right bytes but reports a wrong sha256 (a hash taken while
    bytes were still landing, on a filesystem without holes)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get_file(self, key, path):
        self.inner.get_file(key, path)
        return "0" * 64


def test_a_wrong_landing_digest_is_rechecked_from_disk_before_a_file_is_called_corrupt(tmp_path):
    store = LocalStore(tmp_path / "bucket")
    sync = CheckpointSync(store, RUN, keep=10)
    sync.upload(_ckpt(tmp_path, 10), 10)
    sync.upload(_ckpt(tmp_path, 20), 20)
    m, dest = mf.restore_newest(WrongDigests(store), RUN, lambda m: tmp_path / "resume" / m.name)
    assert m.step == 20 and (dest / "weights.bin").read_bytes() == (tmp_path / "step-000000020/weights.bin").read_bytes()
