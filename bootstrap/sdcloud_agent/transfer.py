"""Moving file bytes to and from an S3-compatible store, each byte read once and hashed on the way.

Two engines do the same job behind `S3Store.put_file` / `get_file`:

- `parts` (the default): our own. Parts of a file are read in order by the calling thread, which
  feeds the same bytes to sha256 and hands them to a pool of upload threads shared by every file
  of the store (so the number of connections stays `workers` however many files are in flight).
  A restore issues ranged GETs to the same pool, writes each range straight to its place in the
  file as it arrives, and hashes the ranges in order from memory (at most `2 x workers` part
  buffers per store, uploads and restores alike), so a file is verified when its last byte lands.
- `s3transfer`: boto3's TransferManager (what awscli uses), fed through a reader that hashes the
  bytes s3transfer reads, and on restore through an in-order writer that hashes what it writes.

`docs/host-agent.md` ("Checkpoint sync") gives the figures that chose the default, part size and
concurrency. Both engines return the sha256 hex digest of exactly the bytes sent or received.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

ENGINES = ("parts", "s3transfer")


class TransferCancelled(Exception):
    """Raised inside an engine when the caller's cancel event is set (store.py maps it)."""


class ShortRead(Exception):
    """A ranged GET returned fewer bytes than asked for (a truncated object or connection)."""


def _cancelled(cancel: threading.Event | None) -> bool:
    return cancel is not None and cancel.is_set()


class PartPool:
    """The threads that carry parts and ranges for one store (created on first use), and the
    slots that bound the part-sized buffers held in memory by every file of the store together."""

    def __init__(self, workers: int):
        self.workers = max(1, workers)
        # Two buffers per thread: one on the wire, one read ahead (or waiting to be hashed).
        self.slots = threading.BoundedSemaphore(2 * self.workers)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(self, fn, *args) -> Future:
        """Run fn in the pool; the caller holds a slot, released when fn is done."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sdcloud-part")
            pool = self._pool
        try:
            return pool.submit(fn, *args)
        except BaseException:
            self.slots.release()
            raise


def _drain(inflight: deque[Future]) -> None:
    """Wait for every future (errors ignored: the caller is already failing)."""
    for fut in inflight:
        try:
            fut.result()
        except Exception:  # noqa: BLE001 - the first error is the one being raised
            pass


# ----------------------------------------------------------------------------------------------
# Upload
# ----------------------------------------------------------------------------------------------

def put_single(client: Any, bucket: str, key: str, path: str | Path, metadata: dict[str, str] | None,
               cancel: threading.Event | None) -> str:
    with open(path, "rb") as f:
        data = f.read()
    if _cancelled(cancel):
        raise TransferCancelled(key)
    client.put_object(Bucket=bucket, Key=key, Body=data, Metadata=metadata or {})
    return hashlib.sha256(data).hexdigest()


def upload_parts(client: Any, pool: PartPool, bucket: str, key: str, path: str | Path, size: int, *,
                 part_size: int, metadata: dict[str, str] | None, cancel: threading.Event | None) -> str:
    """Multipart upload; this thread reads and hashes parts in order while the pool sends them."""
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key, Metadata=metadata or {})["UploadId"]
    nparts = (size + part_size - 1) // part_size
    h = hashlib.sha256()
    done: list[dict] = []
    inflight: deque[Future] = deque()

    def send(n: int, body: bytes) -> dict:
        if _cancelled(cancel):
            raise TransferCancelled(key)
        resp = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=n, Body=body)
        return {"PartNumber": n, "ETag": resp["ETag"]}

    fd = os.open(path, os.O_RDONLY)
    try:
        for n in range(1, nparts + 1):
            while not pool.slots.acquire(timeout=0.1):
                if _cancelled(cancel):
                    raise TransferCancelled(key)
            if _cancelled(cancel):
                pool.slots.release()
                raise TransferCancelled(key)
            offset = (n - 1) * part_size
            try:
                body = os.pread(fd, min(part_size, size - offset), offset)
                if len(body) != min(part_size, size - offset):
                    raise OSError(f"{path} shrank while it was being uploaded")
                h.update(body)  # hashlib drops the GIL here: hashing overlaps the sends
            except BaseException:
                pool.slots.release()
                raise
            fut = pool.submit(send, n, body)
            fut.add_done_callback(lambda _f: pool.slots.release())
            inflight.append(fut)
            del body
            while inflight and inflight[0].done():
                done.append(inflight.popleft().result())
        while inflight:
            done.append(inflight.popleft().result())
        if _cancelled(cancel):
            raise TransferCancelled(key)
        done.sort(key=lambda p: p["PartNumber"])
        client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                         MultipartUpload={"Parts": done})
    except BaseException:
        _drain(inflight)
        try:
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except Exception:  # noqa: BLE001 - the store expires abandoned uploads anyway
            pass
        raise
    finally:
        os.close(fd)
    return h.hexdigest()


class HashingReader:
    """A non-seekable file object over a file that hashes every byte read (for s3transfer, which
    then reads parts in order from one thread) and stops the transfer when `cancel` is set."""

    def __init__(self, path: str | Path, cancel: threading.Event | None):
        self._f = open(path, "rb")
        self._cancel = cancel
        self.hash = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        if _cancelled(self._cancel):
            raise TransferCancelled(self._f.name)
        data = self._f.read(n)
        self.hash.update(data)
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self._f.close()


def transfer_manager(client: Any, part_size: int, workers: int):
    """boto3's TransferManager for one store: `workers` connections shared by all its files."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager
    cfg = TransferConfig(multipart_threshold=part_size + 1, multipart_chunksize=part_size,
                         max_concurrency=workers, use_threads=True)
    return create_transfer_manager(client, cfg)


def upload_s3transfer(tm: Any, bucket: str, key: str, path: str | Path, *,
                      metadata: dict[str, str] | None, cancel: threading.Event | None) -> str:
    reader = HashingReader(path, cancel)
    try:
        extra = {"Metadata": metadata} if metadata else None
        tm.upload(reader, bucket, key, extra_args=extra).result()
    finally:
        reader.close()
    if _cancelled(cancel):
        raise TransferCancelled(key)
    return reader.hash.hexdigest()


# ----------------------------------------------------------------------------------------------
# Download
# ----------------------------------------------------------------------------------------------

def download_ranges(client: Any, pool: PartPool, bucket: str, key: str, fd: int, size: int, *,
                    part_size: int) -> str:
    """Ranged GETs in parallel, each written at its offset in `fd` as it arrives; this thread
    hashes the ranges in order. Returns the sha256 of the object's bytes."""
    h = hashlib.sha256()

    def fetch(offset: int) -> bytes:
        end = min(offset + part_size, size) - 1
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={offset}-{end}")["Body"].read()
        if len(body) != end - offset + 1:
            raise ShortRead(f"{key}: {len(body)} bytes at {offset}, expected {end - offset + 1}")
        os.pwrite(fd, body, offset)
        return body

    window: deque[Future] = deque()
    try:
        for off in range(0, size, part_size):
            # A slot per range, held until the range is hashed: the ranges that wait for an
            # earlier one to be hashed are what bounds the memory.
            while not pool.slots.acquire(blocking=False):
                # Never wait for a slot while holding ranges that could be hashed and let go:
                # another file's restore may be waiting for them (and this one for its).
                if window:
                    h.update(window[0].result())
                    window.popleft()
                    pool.slots.release()
                else:
                    pool.slots.acquire()
                    break
            window.append(pool.submit(fetch, off))
            while window and window[0].done():
                h.update(window.popleft().result())
                pool.slots.release()
        while window:
            h.update(window[0].result())
            window.popleft()
            pool.slots.release()
    except BaseException:
        for _ in window:
            pool.slots.release()
        _drain(window)
        raise
    return h.hexdigest()


class OrderedHashWriter:
    """A seekable file object for s3transfer's downloads: each write lands at its offset in the
    file at once (s3transfer writes ranges as they complete, in any order), and the bytes are
    hashed in file order, holding only the ranges that arrived ahead of a missing one."""

    def __init__(self, fd: int):
        self._fd = fd
        self._pos = 0
        self._next = 0
        self._ahead: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self.hash = hashlib.sha256()

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence != 0:
            raise OSError("only absolute seeks")
        self._pos = offset
        return offset

    def tell(self) -> int:
        return self._pos

    def write(self, data: bytes) -> int:
        with self._lock:
            pos = self._pos
            view = memoryview(data)
            while view:
                n = os.pwrite(self._fd, view, pos)
                view, pos = view[n:], pos + n
            self._ahead[self._pos] = bytes(data)
            self._pos = pos
            while self._next in self._ahead:
                chunk = self._ahead.pop(self._next)
                self.hash.update(chunk)
                self._next += len(chunk)
        return len(data)

    @property
    def hashed(self) -> int:
        return self._next

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True


def download_s3transfer(tm: Any, bucket: str, key: str, fd: int, size: int) -> str:
    writer = OrderedHashWriter(fd)
    tm.download(bucket, key, writer).result()
    if writer.hashed != size:
        raise ShortRead(f"{key}: {writer.hashed} contiguous bytes, expected {size}")
    return writer.hash.hexdigest()
