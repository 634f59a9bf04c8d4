"""Moving file bytes to and from an S3-compatible store, each byte read once and hashed on the way.

The engine is boto3's TransferManager (s3transfer, what awscli uses), one per store, so that its
`workers` connections are shared by every file in flight. It is fed through file objects that
hash the bytes it moves:

- upload: `HashingReader` is a non-seekable reader, so s3transfer reads each file's parts in
  order and the sha256 comes from the very reads that fill the parts;
- restore: `OrderedHashWriter` is a seekable writer; s3transfer's parallel ranged GETs land at
  their offsets in the file as they complete, and the writer hashes them in file order, holding
  only the ranges that arrived ahead of a missing one, so a file is verified when its last byte
  lands.

Our own parallel-parts engine measured slower on restore and no faster on upload (the figures are
in docs/host-agent.md, "Checkpoint sync"), so it went.
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
