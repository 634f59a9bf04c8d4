"""What every store is: its errors, what an object's head says, the protocol, and the tag a
lifecycle rule matches.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


MiB = 1024 * 1024
# Tuned on SeaweedFS over loopback (docs/host-agent.md, "Checkpoint sync"); store options override them.
DEFAULT_PART_SIZE = 8 * MiB
DEFAULT_WORKERS = 10
# The object tag the stacks' lifecycle rules match (stacks/aws: objects under <prefix>/runs/ tagged
# sdcloud-class=checkpoint or log expire after checkpointExpireDays). S3 lifecycle filters match a
# key prefix, and a run's checkpoints sit under runs/<id>/ beside its artifacts, so the class must
# travel with the object: every checkpoint and log upload carries it.
CLASS_TAG = "sdcloud-class"


def lifecycle_class(key: str) -> str | None:
    """`checkpoint` for runs/<id>/checkpoints/..., `log` for runs/<id>/logs/..., else None (kept)."""
    parts = key.strip("/").split("/")
    if len(parts) >= 4 and parts[0] == "runs":
        return {"checkpoints": "checkpoint", "logs": "log"}.get(parts[2])
    return None
# Hidden names in a local store: temp files and metadata sidecars never show up in list().
_LOCAL_META_DIR = ".sdcloud-meta"
_LOCAL_TMP_PREFIX = ".tmp-"


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    metadata: dict[str, str] = field(default_factory=dict)


class StoreError(Exception):
    """An object store operation failed for good (after retries)."""


class NotFound(StoreError):
    pass



class ObjectStore(Protocol):
    url: str

    def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> None: ...
    def create(self, key: str, data: bytes) -> bool: ...
    def put_file(self, key: str, path: str | Path, metadata: dict[str, str] | None = None,
                 cancel: threading.Event | None = None) -> str | None: ...
    def get(self, key: str) -> bytes: ...
    def get_file(self, key: str, path: str | Path) -> str | None: ...
    def head(self, key: str) -> ObjectInfo | None: ...
    def list(self, prefix: str = "") -> list[ObjectInfo]: ...
    def delete(self, keys: str | list[str]) -> None: ...
    def copy(self, src_key: str, dst_key: str) -> None: ...


class Cancelled(StoreError):
    """An upload was abandoned on purpose (a newer checkpoint superseded it)."""


def sha256_file(path: str | Path, bufsize: int = 4 * MiB) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))
