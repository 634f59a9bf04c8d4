"""The bytes of a move between clouds: who carries them, and how (runs/driving/cloud_move.py decides when).

Where the destination's host can copy (both stores presign, the destination is an S3 or COS
bucket), the controller carries no byte: it works out what the destination lacks, signs one GET per
file with the source store's keys, and leaves a copy order in the destination store
(sdcloud_agent/move_copy.py). The first host there reads it before its restore and streams each file
from the source into its own bucket with its own role, then lands the checkpoint's manifest last.
The controller reads the host's report of what crossed (`settle`) and records the egress it paid,
a failed copy's included.

Where no host can copy (a store that signs no URL: a folder here, the user's own boxes), the
controller copies as before, streamed through presigned URLs of both stores, a file over one PUT's
limit by multipart upload fed part by part, nothing spooled to disk.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sdcloud_agent import manifest
from sdcloud_agent import move_copy as host_copy

from ..records.store import NotFound, StoreError

URL_SECONDS = 900  # a presigned URL the controller sends bytes through lives for one file, no longer
# The longest a presigned URL may live (SigV4 and COS: 7 days); an order's URLs live long enough for
# a host to boot and copy everything at a quarter of the planning rate, within that.
MAX_URL_SECONDS = 7 * 24 * 3600
BOOT_ALLOWANCE_S = 2 * 3600
SINGLE_PUT_BYTES = host_copy.SINGLE_PUT_BYTES  # a module figure a test may lower
COPY_TRIES = 3  # tries of one whole copy in a step; a step later tries again (the manifest waits)


@dataclass
class Copied:
    """What one copy moved: the checkpoint's step (None: the run had none yet), bytes sent now, bytes
    of everything the destination holds for the move, files skipped as already there, seconds;
    `by_host`: an order left for the destination's host (nothing sent yet), `fetched`: bytes read
    from the source (its egress), a failed try's included."""
    step: int | None
    sent: int
    total: int
    skipped: int
    seconds: float
    by_host: bool = False
    fetched: int = 0


@dataclass
class Plan:
    """What a copy carries: the files the destination lacks, then the checkpoint's manifest."""
    step: int | None
    files: list[tuple[str, int]]
    manifest: tuple[str, int] | None
    total: int
    skipped: int


def _presigned(store: Any, key: str, method: str, seconds: int = URL_SECONDS) -> str | None:
    presign = getattr(store, "presign", None)
    return presign(key, method, seconds) if presign is not None else None


def host_can_copy(src: Any, dst: Any) -> bool:
    """The destination's host can fetch: the source signs GETs and the destination is a bucket its
    host writes with its own role (a folder store has no host of a cloud behind it)."""
    return callable(getattr(src, "presign", None)) and callable(getattr(dst, "presign_put", None))


def copy_object(src: Any, dst: Any, key: str, size: int, tally: host_copy.Fetched | None = None) -> None:
    """One object from `src` to `dst` under the same key: streamed through presigned URLs where both
    stores sign them (one PUT up to SINGLE_PUT_BYTES, else multipart), else by the stores."""
    get_url = _presigned(src, key, "get")
    if get_url is None or not callable(getattr(dst, "presign_put", None)):
        data = src.get(key)
        if tally is not None:
            tally.fetched += len(data)
        dst.put(key, data)
        return
    host_copy.stream_object(get_url, size, dst, key, SINGLE_PUT_BYTES, tally)


def _carried(src: Any, run_id: str, inputs: dict | None) -> tuple[Any, list[tuple[str, int]]]:
    """The newest complete checkpoint's manifest (or None) and the inputs a move carries: the staged
    dataset, a gated model's token, the cached base model."""
    prefix = f"runs/{run_id}"
    # The staged dataset, and a gated model's token where the host reads it (runs/<run>/secrets/).
    keys = [(o.key, o.size) for part in ("dataset", "secrets") for o in src.list(f"{prefix}/{part}/")]
    model = (inputs or {}).get("model")
    if isinstance(model, str) and model.startswith("cache:"):
        from sdcloud_agent.models import split_ref

        key = split_ref(model)[0]
        info = src.head(key)
        if info is not None:
            keys.append((key, info.size))
    return manifest.newest_complete(src, prefix), keys


def carried_bytes(src: Any, run_id: str, inputs: dict | None = None) -> int:
    """Every byte a move of the run would carry out of `src`: checkpoint, manifest, dataset, model."""
    newest, keys = _carried(src, run_id, inputs)
    files = sum(f.size for f in newest.files) if newest is not None else 0
    return sum(size for _, size in keys) + files


def plan_copy(src: Any, dst: Any, run_id: str, inputs: dict | None = None) -> Plan:
    """The run's inputs and its newest complete checkpoint, less what `dst` holds already (same key,
    same size: a PUT lands whole); a manifest `dst` holds for that step unfinished is removed first."""
    prefix = f"runs/{run_id}"
    newest, keys = _carried(src, run_id, inputs)
    step = newest.step if newest is not None else None
    man = None
    if newest is not None and step not in manifest.complete_steps(dst, prefix):
        folder = manifest.checkpoint_prefix(prefix, step)
        man_key = f"{folder}/{manifest.MANIFEST_NAME}"
        try:  # a manifest the destination has for this step from before is not trusted over new files
            dst.delete(man_key)
        except NotFound:
            pass
        keys += [(f"{folder}/{f.path}", f.size) for f in newest.files]
        info = src.head(man_key)
        man = (man_key, info.size if info is not None else 0)
    missing, skipped = [], 0
    for key, size in keys:
        there = dst.head(key)
        if there is not None and there.size == size:
            skipped += 1
        else:
            missing.append((key, size))
    return Plan(step, missing, man, sum(size for _, size in keys), skipped)


def copy_checkpoint(src: Any, dst: Any, run_id: str, inputs: dict | None = None,
                    tally: host_copy.Fetched | None = None) -> Copied:
    """The controller's copy: what `dst` lacks of the run's inputs and newest complete checkpoint,
    the manifest last. `tally` counts the bytes read from the source, a cut copy's included."""
    start, tally = time.time(), tally if tally is not None else host_copy.Fetched()
    plan = plan_copy(src, dst, run_id, inputs)
    sent = 0
    for key, size in plan.files:
        copy_object(src, dst, key, size, tally)
        sent += size
    prefix = f"runs/{run_id}"
    if plan.manifest is not None and plan.step not in manifest.complete_steps(dst, prefix):
        key, size = plan.manifest
        copy_object(src, dst, key, size, tally)  # byte for byte the source's manifest, after every file
        sent += size
        if plan.step not in manifest.complete_steps(dst, prefix):
            raise StoreError(f"checkpoint {plan.step} is not complete in the destination after its copy")
    return Copied(plan.step, sent, plan.total, plan.skipped, round(time.time() - start, 3), fetched=tally.fetched)


def url_seconds(nbytes: int, rate_mb_s: float) -> int:
    """An order's URL lifetime: a host's boot and the copy at a quarter of the planning rate."""
    return int(min(MAX_URL_SECONDS, BOOT_ALLOWANCE_S + 4 * nbytes / (max(rate_mb_s, 0.1) * 1e6)))


def order_copy(src: Any, dst: Any, run_id: str, source: str, inputs: dict | None = None,
               rate_mb_s: float = 100.0, region: str | None = None) -> Copied:
    """Leave a copy order in `dst` for the destination's host: URLs only, no bytes pass here."""
    start = time.time()
    plan = plan_copy(src, dst, run_id, inputs)
    lives = url_seconds(sum(size for _, size in plan.files) + (plan.manifest[1] if plan.manifest else 0), rate_mb_s)
    expires = time.time() + lives - 60  # the host refuses a URL in its last minute rather than be cut

    def item(key: str, size: int) -> dict:
        return {"key": key, "size": size, "url": src.presign(key, "get", lives), "expires": expires}

    order = {"id": uuid.uuid4().hex, "from": source, "region": region, "step": plan.step, "made": time.time(),
             "files": [item(k, s) for k, s in plan.files],
             "manifest": item(*plan.manifest) if plan.manifest is not None else None}
    # The order is a control file of the run's own store (no key in it: URLs that read one object each).
    dst.put(f"runs/{run_id}/{host_copy.ORDER_KEY}", json.dumps(order).encode())
    planned = sum(size for _, size in plan.files) + (plan.manifest[1] if plan.manifest else 0)
    return Copied(plan.step, planned, plan.total, plan.skipped, round(time.time() - start, 3), by_host=True)


def refresh_order(src: Any, dst: Any, run_id: str, rate_mb_s: float = 100.0) -> bool:
    """After a host's copy failed: the order still in `dst` signed again (fresh URLs from `src`, the
    same files), so that the next host does not meet URLs that expired while the run waited."""
    key = f"runs/{run_id}/{host_copy.ORDER_KEY}"
    try:
        order = json.loads(dst.get(key))
    except (NotFound, ValueError):
        return False
    items = order.get("files", []) + ([order["manifest"]] if order.get("manifest") else [])
    lives = url_seconds(sum(int(i["size"]) for i in items), rate_mb_s)
    expires = time.time() + lives - 60
    for item in items:
        item.update(url=src.presign(item["key"], "get", lives), expires=expires)
    dst.put(key, json.dumps(order).encode())
    return True


def settle(store: Any, run_id: str) -> dict | None:
    """The destination host's report of a copy it carried out (or failed), read once: the caller
    records its egress (the bytes it fetched, a failed copy's included). None when there is none."""
    key = f"runs/{run_id}/{host_copy.REPORT_KEY}"
    try:
        report = json.loads(store.get(key))
    except (NotFound, ValueError):
        return None
    store.delete(key)
    return report


__all__ = ["Copied", "Plan", "copy_checkpoint", "copy_object", "host_can_copy", "carried_bytes", "order_copy",
           "refresh_order", "plan_copy", "settle", "url_seconds", "SINGLE_PUT_BYTES", "URL_SECONDS", "COPY_TRIES"]
