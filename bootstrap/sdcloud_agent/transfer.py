"""Moving file bytes to and from an S3-compatible store, each byte read once and hashed on the way.

Two engines, both from boto3's own transfer libraries:

- **CRT** (`awscrt` through s3transfer's CRTTransferManager, what boto3 uses with
  `preferred_transfer_client="crt"`): the AWS Common Runtime's S3 client, in C, splits each file
  into parts on its own threads without the GIL. Used on S3 and S3-compatible servers when awscrt
  is installed (the training environment's lock has it). An upload reads its body stream in
  order, so the manifest's sha256 comes from the reads that fill the parts. A restore hands the
  CRT a file path: it writes the ranges at their offsets itself, and `HoleFollower` hashes the
  file's written prefix from the page cache while it lands (handing each chunk to Python
  instead cost half the speed).
- **s3transfer** (boto3's TransferManager, what awscli uses): Python threads. Used on COS (the
  CRT client signs trailing checksums into every upload, which COS refuses), where awscrt is
  absent, and where a test hands the store its own client:
  - upload: `HashingReader` is a non-seekable reader, so s3transfer reads each file's parts in
    order and the sha256 comes from the very reads that fill the parts;
  - restore: `OrderedHashWriter` is a seekable writer; s3transfer's parallel ranged GETs land at
    their offsets in the file as they complete, and the writer hashes them in file order, holding
    only the ranges that arrived ahead of a missing one, so a file is verified when its last byte
    lands.

The figures that chose the engines are in docs/host-agent.md, "Checkpoint sync". Our own
parallel-parts engine measured slower than both and went.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any


class TransferCancelled(Exception):
    """Raised inside an engine when the caller's cancel event is set (store.py maps it)."""


class ShortRead(Exception):
    """A ranged GET returned fewer bytes than asked for (a truncated object or connection)."""


def _cancelled(cancel: threading.Event | None) -> bool:
    return cancel is not None and cancel.is_set()


# ----------------------------------------------------------------------------------------------
# Upload
# ----------------------------------------------------------------------------------------------

def put_single(client: Any, bucket: str, key: str, path: str | Path, metadata: dict[str, str] | None,
               cancel: threading.Event | None, tagging: str | None = None) -> str:
    with open(path, "rb") as f:
        data = f.read()
    if _cancelled(cancel):
        raise TransferCancelled(key)
    client.put_object(Bucket=bucket, Key=key, Body=data, Metadata=metadata or {}, **({"Tagging": tagging} if tagging else {}))
    return hashlib.sha256(data).hexdigest()


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

    def readinto(self, buf) -> int:
        # The CRT client fills its own part buffers through readinto: no bytes object per read.
        if _cancelled(self._cancel):
            raise TransferCancelled(self._f.name)
        n = self._f.readinto(buf)
        if n:
            self.hash.update(memoryview(buf)[:n])
        return n or 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self._f.close()


# The size of the writes a download hands to OrderedHashWriter: 1 MiB restored faster here than
# s3transfer's default 256 KiB and much faster than 4 MiB (docs/host-agent.md, "Checkpoint sync").
IO_CHUNK = 1024 * 1024


def transfer_manager(client: Any, part_size: int, workers: int):
    """boto3's TransferManager for one store: `workers` connections shared by all its files."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager
    cfg = TransferConfig(multipart_threshold=part_size + 1, multipart_chunksize=part_size,
                         max_concurrency=workers, use_threads=True, io_chunksize=IO_CHUNK)
    return create_transfer_manager(client, cfg)


def upload_s3transfer(tm: Any, bucket: str, key: str, path: str | Path, *,
                      metadata: dict[str, str] | None, cancel: threading.Event | None, tagging: str | None = None) -> str:
    reader = HashingReader(path, cancel)
    try:
        # Tagging: the lifecycle class the stacks' expiry rules match (store.lifecycle_class).
        extra = {**({"Metadata": metadata} if metadata else {}), **({"Tagging": tagging} if tagging else {})} or None
        tm.upload(reader, bucket, key, extra_args=extra).result()
    finally:
        reader.close()
    if _cancelled(cancel):
        raise TransferCancelled(key)
    return reader.hash.hexdigest()


# ----------------------------------------------------------------------------------------------
# Download
# ----------------------------------------------------------------------------------------------

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
            if self._pos == self._next and not self._ahead:
                self.hash.update(data)  # in order (always, from the CRT engine): nothing to hold
                self._next = pos
            else:
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


# ----------------------------------------------------------------------------------------------
# The CRT engine
# ----------------------------------------------------------------------------------------------

def crt_available() -> bool:
    try:
        import awscrt.s3  # noqa: F401
        import s3transfer.crt  # noqa: F401
    except ImportError:
        return False
    return True


class CrtEngine:
    """One CRT S3 client and transfer manager per store. Requests are serialized by botocore from
    the store's own session and client settings (endpoint, region, addressing style), and signed
    by the CRT with the session's credentials, asked for at every request (refreshable role keys
    keep working)."""

    def __init__(self, session: Any, *, endpoint_url: str | None, region: str | None, config: Any,
                 part_size: int, ca_bundle: str | None, resolved_endpoint: str | None = None,
                 target_gbps: float | None = None):
        from s3transfer.crt import (BotocoreCRTCredentialsWrapper, BotocoreCRTRequestSerializer,
                                    CRTTransferManager, create_s3_crt_client)
        if getattr(session, "__name__", "") == "boto3":  # the boto3 module: its default credential chain
            import botocore.session
            core = botocore.session.get_session()
        else:
            core = getattr(session, "_session", session)  # a boto3 Session wraps a botocore one
        region = region or core.get_config_variable("region") or "us-east-1"
        creds = BotocoreCRTCredentialsWrapper(core.get_credentials()).to_crt_credentials_provider()
        # Event-loop threads: one per core, and at least four (restores on two cores ran faster
        # with four than with two: docs/host-agent.md). The CRT opens as many connections as its
        # throughput target needs; `workers` is s3transfer's knob.
        self.client = create_s3_crt_client(region, crt_credentials_provider=creds,
                                           num_threads=max(CRT_MIN_THREADS, os.cpu_count() or 1),
                                           part_size=part_size, verify=ca_bundle,
                                           # TLS unless the endpoint says plain HTTP (a proxy, a test server).
                                           use_ssl=not (resolved_endpoint or endpoint_url or "").startswith("http://"),
                                           target_throughput=int((target_gbps or CRT_TARGET_GBPS) * 1e9 / 8))
        kwargs: dict[str, Any] = {"region_name": region, "config": config}
        if endpoint_url:
            kwargs["endpoint_url"] = endpoint_url
        if ca_bundle:
            kwargs["verify"] = ca_bundle
        serializer = BotocoreCRTRequestSerializer(core, kwargs)
        self.manager = CRTTransferManager(self.client, serializer)
        # Restores go to a file path, so that the CRT writes the body itself, in C: two to three
        # times the restore speed of handing every chunk to Python (docs/host-agent.md). One
        # manager more, on the same client. (s3transfer 0.19 drops an `osutil` handed to the
        # manager, hence the two assignments.)
        self.file_manager = CRTTransferManager(self.client, serializer)
        self.file_manager._osutil = self.file_manager._s3_args_creator._os_utils = DownloadFiles()

    def upload(self, bucket: str, key: str, path: str | Path, *, metadata: dict[str, str] | None,
               cancel: threading.Event | None, tagging: str | None = None) -> str:
        reader = HashingReader(path, cancel)
        extra = {**({"Metadata": metadata} if metadata else {}), **({"Tagging": tagging} if tagging else {})}
        try:
            future = self.manager.upload(reader, bucket, key, extra_args=extra)
            if cancel is not None:
                # Cancel the CRT request itself (it aborts the multipart upload); the reader's own
                # check is the backstop for a read already under way.
                while not future.done():
                    if cancel.wait(0.05):
                        future.cancel()
                        break
            future.result()
        except Exception:
            if _cancelled(cancel):
                raise TransferCancelled(key) from None
            raise
        finally:
            reader.close()
        if _cancelled(cancel):
            raise TransferCancelled(key)
        return reader.hash.hexdigest()

    def download_file(self, bucket: str, key: str, path: str | Path, size: int) -> str:
        """The object into `path`, written by the CRT itself (parallel ranged GETs landing at their
        offsets, no Python in the body's path) to `<path>.crt` and renamed when whole; returns the
        sha256 of the file, hashed from the page cache while it lands (HoleFollower)."""
        path = str(path)
        files: DownloadFiles = self.file_manager._osutil
        settled = files.expect(path)
        follower = HoleFollower(files.name_for(path), size)
        try:
            future = self.file_manager.download(bucket, key, path)
            try:
                future.result()
            finally:
                settled.wait(60)  # the rename into place (or the removal) after the CRT's done
                follower.stop()
            got = os.stat(path).st_size
            if got != size:
                raise ShortRead(f"{key}: {got} bytes, expected {size}")
            return follower.finish(path)
        finally:
            follower.close()
            files.forget(path)

class DownloadFiles:
    """s3transfer's file utilities for the CRT's file downloads: the temp file is `<path>.crt`, and
    the rename into place (or the removal after a failure), which s3transfer runs in a done
    callback that can still be running when the future's result() returns, is waited for."""

    def __init__(self):
        from s3transfer.utils import OSUtils

        self._os = OSUtils()
        self._settled: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def expect(self, path: str) -> threading.Event:
        with self._lock:
            return self._settled.setdefault(self.name_for(path), threading.Event())

    def forget(self, path: str) -> None:
        with self._lock:
            self._settled.pop(self.name_for(path), None)

    def _settle(self, temp: str) -> None:
        with self._lock:
            ev = self._settled.get(temp)
        if ev is not None:
            ev.set()

    @staticmethod
    def name_for(path: str) -> str:
        return path + ".crt"

    def get_temp_filename(self, filename: str) -> str:
        return self.name_for(filename)

    def rename_file(self, current: str, new: str) -> None:
        try:
            self._os.rename_file(current, new)
        finally:
            self._settle(current)

    def remove_file(self, filename: str) -> None:
        try:
            self._os.remove_file(filename)
        finally:
            self._settle(filename)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._os, name)


class HoleFollower:
    """Hashes a file while the CRT writes it. The CRT writes ranges at their offsets in any order
    into a new, sparse file, so the bytes before the file's first hole (`SEEK_HOLE`) have all been
    written, except possibly the page (or large folio) a write is filling right then, which sits
    just below that hole: a thread of its own hashes up to `HOLD_BACK` bytes short of the first
    hole, and `finish()` hashes the rest once the download is done. So a restore's hashing runs
    beside its transfer instead of after it. A filesystem without holes (every offset up to the
    end reads as data) would let it read bytes not yet written: the digest would then be wrong,
    never silently right, and the restore rechecks a mismatch from disk before it calls a file
    corrupt (manifest.download)."""

    HOLD_BACK = 2 * 1024 * 1024  # the largest folio on x86-64
    CHUNK = 8 * 1024 * 1024

    def __init__(self, path: str, size: int):
        self.path, self.size = path, size
        self.hash = hashlib.sha256()
        self.hashed = 0
        self._fd: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="sdcloud-restore-hash", daemon=True)
        self._thread.start()

    def _landed(self) -> int:
        try:
            return os.lseek(self._fd, self.hashed, os.SEEK_HOLE)
        except OSError:  # ENXIO: nothing at or past `hashed` yet
            return self.hashed

    def _hash_to(self, end: int) -> None:
        while self.hashed < end:
            chunk = os.pread(self._fd, min(self.CHUNK, end - self.hashed), self.hashed)
            if not chunk:
                return
            self.hash.update(chunk)
            self.hashed += len(chunk)

    def _follow(self) -> None:
        while self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                if self._stop.wait(0.005):
                    return
        while not self._stop.is_set():
            safe = self._landed() - self.HOLD_BACK
            if safe - self.hashed >= self.HOLD_BACK:
                self._hash_to(safe)
            else:
                self._stop.wait(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def finish(self, final_path: str) -> str:
        """The digest, once the download is done: the rest of the file hashed through the same
        descriptor (the rename into place keeps the inode)."""
        self.stop()
        if self._fd is None:  # a small file landed and was renamed before the thread opened it
            return _sha256_path(final_path)
        try:
            self._hash_to(os.fstat(self._fd).st_size)
        finally:
            self.close()
        return self.hash.hexdigest()

    def close(self) -> None:
        self.stop()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _sha256_path(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * 1024 * 1024):
            h.update(chunk)
    return h.hexdigest()


# The CRT's throughput target decides how many connections it opens. 10 Gbit/s is its own
# fallback when it cannot tell the NIC; on loopback with two cores more only adds contention.
CRT_TARGET_GBPS = 10
CRT_MIN_THREADS = 4
