"""Moving file bytes to and from an S3-compatible store, each byte read once and checked on the way.

Uploads use boto3's own transfer libraries:

- **CRT** (`awscrt` through s3transfer's CRTTransferManager, what boto3 uses with
  `preferred_transfer_client="crt"`): the AWS Common Runtime's S3 client, in C, splits each file
  into parts on its own threads without the GIL. Used on S3 and S3-compatible servers when awscrt
  is installed (the training environment's lock has it).
- **s3transfer** (boto3's TransferManager, what awscli uses): Python threads. Used on COS (the
  CRT client signs trailing checksums into every upload, which COS refuses), where awscrt is
  absent, and where a test hands the store its own client.

Both read a file through `HashingReader`, a non-seekable reader, so the parts are read in order
and the manifest's sha256 and its block checksums (CRC64/NVME per `BLOCK` bytes, `BlockSums`)
come from the very reads that fill the parts.

Restores are our own (`download_ranges`): parallel ranged GETs through the store's boto3 client,
each body read straight into a memory map of the destination file, so the bytes are written once,
and each range is checked against the manifest's block checksum while it is still in the CPU's
cache. On this machine the CRT's file download and s3transfer's both spent about twice the CPU
per byte (the CRT copies each whole part into the page cache from a buffer the size of the
part), which on two cores shared with the server set the speed; the figures are in
docs/host-agent.md, "Checkpoint sync".
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import threading
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TransferCancelled(Exception):
    """Raised inside an engine when the caller's cancel event is set (store.py maps it)."""


class ShortRead(Exception):
    """A ranged GET returned fewer bytes than asked for (a truncated object or connection)."""


class ChecksumMismatch(Exception):
    """A restored range's bytes differ from the block checksum recorded when it was uploaded."""


def _cancelled(cancel: threading.Event | None) -> bool:
    return cancel is not None and cancel.is_set()


# ----------------------------------------------------------------------------------------------
# Block checksums
# ----------------------------------------------------------------------------------------------

# The bytes per block checksum, and so per ranged GET of a restore: 32 MiB over four connections
# restored fastest on two cores (docs/host-agent.md, "Checkpoint sync").
BLOCK = 32 * 1024 * 1024
BLOCK_ALG = "crc64nvme"


def _crc64() -> Any:
    """awscrt's CRC64/NVME (SIMD: about 19 GB/s here, against 1.7 GB/s for sha256), or None."""
    try:
        from awscrt.checksums import crc64nvme
    except ImportError:
        return None
    return crc64nvme


@dataclass(frozen=True)
class BlockSums:
    """One checksum per `block` bytes of a file, in order: what lets a restore check each range
    as it lands, whatever order the ranges land in, for a small part of sha256's cost."""

    alg: str
    block: int
    crc: tuple[str, ...]

    def usable(self) -> bool:
        return self.alg == BLOCK_ALG and self.block > 0 and _crc64() is not None


class _BlockSummer:
    """Block checksums of a stream read in order."""

    def __init__(self, block: int = BLOCK):
        self._fn = _crc64()
        self.block = block
        self._crcs: list[int] = []
        self._cur = 0
        self._filled = 0

    def update(self, data) -> None:
        if self._fn is None:
            return
        view = memoryview(data)
        while view:
            n = min(len(view), self.block - self._filled)
            self._cur = self._fn(view[:n], self._cur)
            self._filled += n
            view = view[n:]
            if self._filled == self.block:
                self._crcs.append(self._cur)
                self._cur, self._filled = 0, 0

    def sums(self) -> BlockSums | None:
        if self._fn is None:
            return None
        crcs = self._crcs + ([self._cur] if self._filled else [])
        return BlockSums(BLOCK_ALG, self.block, tuple(f"{c:016x}" for c in crcs))


class FileDigest(str):
    """The sha256 (hex) of the bytes an upload sent, carrying their block checksums, taken from
    the same reads. A str, so that every caller that wants only the sha256 keeps working."""

    sums: BlockSums | None = None

    def __new__(cls, sha256: str, sums: BlockSums | None) -> FileDigest:  # noqa: PYI034 - always this class
        obj = super().__new__(cls, sha256)
        obj.sums = sums
        return obj

    def __getnewargs__(self) -> tuple[str, BlockSums | None]:  # copy and pickle keep the sums
        return str(self), self.sums


# ----------------------------------------------------------------------------------------------
# Upload
# ----------------------------------------------------------------------------------------------

def put_single(client: Any, bucket: str, key: str, path: str | Path, metadata: dict[str, str] | None,
               cancel: threading.Event | None, tagging: str | None = None, block: int = BLOCK) -> FileDigest:
    with open(path, "rb") as f:
        data = f.read()
    if _cancelled(cancel):
        raise TransferCancelled(key)
    client.put_object(Bucket=bucket, Key=key, Body=data, Metadata=metadata or {}, **({"Tagging": tagging} if tagging else {}))
    summer = _BlockSummer(block)
    summer.update(data)
    return FileDigest(hashlib.sha256(data).hexdigest(), summer.sums())


class HashingReader:
    """A non-seekable file object over a file that hashes every byte read, into its sha256 and its
    block checksums (the engines then read parts in order from one thread), and stops the
    transfer when `cancel` is set."""

    def __init__(self, path: str | Path, cancel: threading.Event | None, block: int = BLOCK):
        self._f = open(path, "rb")
        self._cancel = cancel
        self.hash = hashlib.sha256()
        self.blocks = _BlockSummer(block)

    def digest(self) -> FileDigest:
        return FileDigest(self.hash.hexdigest(), self.blocks.sums())

    def read(self, n: int = -1) -> bytes:
        if _cancelled(self._cancel):
            raise TransferCancelled(self._f.name)
        data = self._f.read(n)
        self.hash.update(data)
        self.blocks.update(data)
        return data

    def readinto(self, buf) -> int:
        # The CRT client fills its own part buffers through readinto: no bytes object per read.
        if _cancelled(self._cancel):
            raise TransferCancelled(self._f.name)
        n = self._f.readinto(buf)
        if n:
            view = memoryview(buf)[:n]
            self.hash.update(view)
            self.blocks.update(view)
        return n or 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self._f.close()


# The size of each read from a response body: 1 MiB restored faster here than s3transfer's default
# 256 KiB and much faster than 4 MiB (docs/host-agent.md, "Checkpoint sync").
IO_CHUNK = 1024 * 1024


def transfer_manager(client: Any, part_size: int, workers: int):
    """boto3's TransferManager for one store: `workers` connections shared by all its files."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager
    cfg = TransferConfig(multipart_threshold=part_size + 1, multipart_chunksize=part_size,
                         max_concurrency=workers, use_threads=True, io_chunksize=IO_CHUNK)
    return create_transfer_manager(client, cfg)


def upload_s3transfer(tm: Any, bucket: str, key: str, path: str | Path, *, metadata: dict[str, str] | None,
                      cancel: threading.Event | None, tagging: str | None = None, block: int = BLOCK) -> FileDigest:
    reader = HashingReader(path, cancel, block)
    try:
        # Tagging: the lifecycle class the stacks' expiry rules match (store.lifecycle_class).
        extra = {**({"Metadata": metadata} if metadata else {}), **({"Tagging": tagging} if tagging else {})} or None
        tm.upload(reader, bucket, key, extra_args=extra).result()
    finally:
        reader.close()
    if _cancelled(cancel):
        raise TransferCancelled(key)
    return reader.digest()


# ----------------------------------------------------------------------------------------------
# Download
# ----------------------------------------------------------------------------------------------

def download_ranges(client: Any, bucket: str, key: str, path: str | Path, size: int, pool: Executor, *,
                    sums: BlockSums | None = None, block: int = BLOCK, attempts: int = 3) -> str | None:
    """The object into the new file `path`, by parallel ranged GETs on `pool`, each body read
    straight into a memory map of the file (one copy of each byte, by the TLS layer itself).

    With `sums` (the manifest's block checksums), the ranges are its blocks and each is checked as
    it lands, while its bytes are still in the CPU's cache: ChecksumMismatch on a difference, and
    None is returned (no sha256 is taken). Without, the file's sha256 is taken in file order as
    the ranges complete (each range is hashed while the later ones are still on the wire) and
    returned. A range that fails in transit is fetched again, up to `attempts` times."""
    if sums is not None:
        block = sums.block
        if len(sums.crc) != -(-size // block):
            raise ChecksumMismatch(f"{key}: {size} bytes do not make the manifest's {len(sums.crc)} blocks")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        if size == 0:
            return None if sums is not None else hashlib.sha256().hexdigest()
        _reserve(fd, size)
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    crc = _crc64() if sums is not None else None
    offsets = range(0, size, block)
    futures: list[Future] = []
    try:
        futures = [pool.submit(_range_with_retries, client, bucket, key, mm, off, min(block, size - off),
                               crc, sums.crc[i] if sums is not None else None, attempts)
                   for i, off in enumerate(offsets)]
        h = hashlib.sha256() if sums is None else None
        for off, fut in zip(offsets, futures):
            fut.result()
            if h is not None:
                with memoryview(mm) as whole:
                    h.update(whole[off:off + block])
        return h.hexdigest() if h is not None else None
    finally:
        for fut in futures:
            fut.cancel()
        wait(futures)  # a range still landing holds a view of the map
        mm.close()


def _reserve(fd: int, size: int) -> None:
    """The file's blocks, allocated before the map is written: a full disk is then ENOSPC here, an
    error the restore reports, where a write into a sparse map would kill the agent with SIGBUS."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)  # a filesystem that cannot allocate ahead: sparse, as before


def _range_with_retries(client: Any, bucket: str, key: str, mm: mmap.mmap, off: int, n: int, crc: Any,
                        want: str | None, attempts: int) -> None:
    for i in range(attempts):
        try:
            return _range(client, bucket, key, mm, off, n, crc, want)
        except ChecksumMismatch:
            raise  # the bucket's bytes will not change
        except Exception:  # a reset, a timeout, a short body: fetch the range again
            if i == attempts - 1:
                raise


def _range(client: Any, bucket: str, key: str, mm: mmap.mmap, off: int, n: int, crc: Any, want: str | None) -> None:
    body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={off}-{off + n - 1}")["Body"]
    got, value = 0, 0
    try:
        with memoryview(mm) as whole:
            view = whole[off:off + n]
            try:
                while got < n:
                    k = body.readinto(view[got:got + IO_CHUNK])
                    if not k:
                        raise ShortRead(f"{key}: range at {off} ended after {got} of {n} bytes")
                    if crc is not None:
                        value = crc(view[got:got + k], value)  # while the chunk is still in cache
                    got += k
            finally:
                view.release()
    finally:
        body.close()
    if want is not None and f"{value:016x}" != want:
        raise ChecksumMismatch(f"{key}: the block at byte {off} differs from the manifest's {BLOCK_ALG}")


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

    def upload(self, bucket: str, key: str, path: str | Path, *, metadata: dict[str, str] | None,
               cancel: threading.Event | None, tagging: str | None = None, block: int = BLOCK) -> FileDigest:
        reader = HashingReader(path, cancel, block)
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
        return reader.digest()


# The CRT's throughput target decides how many connections it opens. 10 Gbit/s is its own
# fallback when it cannot tell the NIC; on loopback with two cores more only adds contention.
CRT_TARGET_GBPS = 10
CRT_MIN_THREADS = 4
