"""A run's checkpoint carried to another cloud's store (`up --provider aws,tencent`): the copy.

The spot policy decides a move and the controller makes it (runs/driving/placement.py); this module
holds how the bytes go:

1. The newest complete checkpoint (and the run's inputs: its staged dataset, its cached model) is
   copied from the store holding it to the other cloud's store through short-lived presigned URLs:
   a GET signed by the source, a PUT signed by the destination. The controller holds the user's keys
   of both clouds; no host ever holds the other cloud's keys.
2. Files first, the manifest last (bootstrap/sdcloud_agent/manifest.py owns what "complete" means):
   a copy cut halfway leaves no manifest in the destination, so no host restores it; the next try
   sends only what is missing (a PUT lands whole or not at all) and lands the manifest then.
"""
from __future__ import annotations

import os
import ssl
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from ..records.store import NotFound, StoreError

URL_SECONDS = 900  # a presigned URL lives long enough for one file, no longer
# The largest object one PUT may carry: 5 GB on S3 ("Uploading objects": a single PUT up to 5 GB) and
# on COS (PUT Object, "up to 5 GB"). A larger file (an SDXL fine-tune's weights with their optimizer
# state) is fetched through its presigned GET into a temporary file here and sent by the destination
# store's multipart upload, signed with the user's keys of that cloud, which this machine holds.
SINGLE_PUT_BYTES = 5 * 1024**3
COPY_TRIES = 3  # tries of one whole copy in a step; a step later tries again (the manifest waits)


@dataclass
class Copied:
    """What one copy moved: the checkpoint's step (None: the run had none yet), bytes sent now, bytes
    of everything the destination holds for the move, files skipped as already there, seconds."""
    step: int | None
    sent: int
    total: int
    skipped: int
    seconds: float


def _presigned(store: Any, key: str, method: str) -> str | None:
    presign = getattr(store, "presign", None)
    return presign(key, method, URL_SECONDS) if presign is not None else None


def copy_object(src: Any, dst: Any, key: str, size: int) -> None:
    """One object from `src` to `dst` under the same key: through presigned URLs where both stores sign
    them (the bytes stream from one cloud to the other through this machine), else by the stores."""
    get_url, put_url = _presigned(src, key, "get"), _presigned(dst, key, "put")
    if get_url is None or put_url is None:
        dst.put(key, src.get(key))
        return
    # The CA bundle the stores' own client trusts (AWS_CA_BUNDLE, as boto3 reads it), else the system's.
    tls = ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or None)
    try:
        with urllib.request.urlopen(get_url, timeout=60, context=tls) as body:
            if size > SINGLE_PUT_BYTES:
                _multipart_from(body, dst, key)
                return
            req = urllib.request.Request(put_url, data=body, method="PUT",
                                         headers={"Content-Length": str(size)})
            urllib.request.urlopen(req, timeout=300, context=tls).close()
    except OSError as exc:  # urllib's HTTPError and URLError are OSErrors: the copy is cut, redone later
        raise StoreError(f"copy of {key} between clouds failed: {exc}") from None


def _multipart_from(body: Any, dst: Any, key: str) -> None:
    """A file too large for one PUT: spooled to a temporary file, then the destination store's own
    multipart upload (all parts or no object), the temporary file removed either way."""
    import shutil
    import tempfile

    with tempfile.NamedTemporaryFile(prefix="sdcloud-move-") as spool:
        shutil.copyfileobj(body, spool, 8 * 1024 * 1024)
        spool.flush()
        dst.put_file(key, spool.name)


def _copy_keys(src: Any, dst: Any, keys: list[tuple[str, int]]) -> tuple[int, int]:
    """Copy what the destination lacks (same key, same size: a PUT lands whole); (bytes sent, skipped)."""
    sent = skipped = 0
    for key, size in keys:
        there = dst.head(key)
        if there is not None and there.size == size:
            skipped += 1
            continue
        copy_object(src, dst, key, size)
        sent += size
    return sent, skipped


def copy_checkpoint(src: Any, dst: Any, run_id: str, inputs: dict | None = None) -> Copied:
    """The run's inputs and its newest complete checkpoint from `src` to `dst`, the manifest last."""
    from sdcloud_agent import manifest

    start = time.time()
    prefix = f"runs/{run_id}"
    # The staged dataset, and a gated model's token where the host reads it (runs/<run>/secrets/).
    keys: list[tuple[str, int]] = [(o.key, o.size) for part in ("dataset", "secrets") for o in src.list(f"{prefix}/{part}/")]
    model = (inputs or {}).get("model")
    if isinstance(model, str) and model.startswith("cache:"):
        from sdcloud_agent.models import split_ref

        key = split_ref(model)[0]
        info = src.head(key)
        if info is not None:
            keys.append((key, info.size))
    newest = manifest.newest_complete(src, prefix)
    step = newest.step if newest is not None else None
    folder = manifest.checkpoint_prefix(prefix, step) if newest is not None else ""
    manifest_key = f"{folder}/{manifest.MANIFEST_NAME}"
    if newest is not None and step not in manifest.complete_steps(dst, prefix):
        try:  # a manifest the destination has for this step from before is not trusted over new files
            dst.delete(manifest_key)
        except NotFound:
            pass
        keys += [(f"{folder}/{f.path}", f.size) for f in newest.files]
    sent, skipped = _copy_keys(src, dst, keys)
    total = sum(size for _, size in keys)
    if newest is not None and step not in manifest.complete_steps(dst, prefix):
        raw = src.get(manifest_key)  # byte for byte the source's manifest, landed after every file
        copy_object(src, dst, manifest_key, len(raw))
        sent += len(raw)
        if step not in manifest.complete_steps(dst, prefix):
            raise StoreError(f"checkpoint {step} is not complete in the destination after its copy")
    return Copied(step, sent, total, skipped, round(time.time() - start, 3))


__all__ = ["COPY_TRIES", "Copied", "copy_checkpoint", "copy_object"]
