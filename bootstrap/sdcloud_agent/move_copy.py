"""A run's checkpoint and inputs carried into this host's store from another cloud's, by this host.

When a run moves to another cloud (the control plane's runs/driving/cloud_move.py), the controller
does not carry the bytes: it writes a copy order into the destination store (`<run>/moves/order.json`),
one presigned GET per file that the source store signed, and launches there. The host that boots
in the destination cloud reads the order before its restore and streams each file from the source
straight into its own bucket, signing the writes with its own role: the bytes cross between the two
clouds' networks, never through the user's machine, and nobody holds the other cloud's keys (a
presigned URL is not a key). Files go first and the checkpoint's manifest last (manifest.py owns
what "complete" means): a copy cut halfway leaves no manifest, and the next host sends only what
is missing. The host writes what it fetched to `<run>/moves/report.json`, which the controller
reads to record the egress paid, a failed copy's included.

The same streaming functions carry a copy where no host can (the controller, through presigned
URLs of both stores): one PUT up to one PUT's limit, else a multipart upload fed part by part
from the GET, with no spool to disk either way.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.request
from dataclasses import dataclass
from typing import Any, BinaryIO

from . import manifest
from .store import StoreError

log = logging.getLogger("sdcloud_agent.move_copy")

# The largest object one PUT may carry: 5 GB on S3 ("Uploading objects": a single PUT up to 5 GB) and
# on COS (PUT Object, "up to 5 GB"). A larger file goes by multipart upload, streamed part by part.
SINGLE_PUT_BYTES = 5 * 1024**3
MAX_PARTS = 10_000  # S3's and COS's most parts in one multipart upload
CHUNK = 1024 * 1024
ORDER_KEY = "moves/order.json"
REPORT_KEY = "moves/report.json"
FILE_TRIES = 3  # tries of one file (each sends it again whole): a transient fault of either cloud


@dataclass
class Fetched:
    """What one copy moved: bytes read from the source (the egress paid, a failed try's included),
    bytes landed, files skipped as already there."""
    fetched: int = 0
    sent: int = 0
    skipped: int = 0


class _Counted:
    """A GET's body read through, counting what crossed (the source cloud bills every byte read)."""

    def __init__(self, body: BinaryIO, tally: Fetched):
        self.body, self.tally = body, tally

    def read(self, n: int = -1) -> bytes:
        data = self.body.read(n)
        self.tally.fetched += len(data)
        return data


def tls_context() -> ssl.SSLContext:
    """The CA bundle the stores' own client trusts (AWS_CA_BUNDLE, as boto3 reads it), else the system's."""
    return ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or None)


def part_size_for(size: int, part_size: int) -> int:
    """The store's part size, grown so that `size` fits in S3's 10,000 parts."""
    return max(part_size, -(-size // MAX_PARTS))


def multipart_from(body: Any, dst: Any, key: str, size: int) -> None:
    """A file too large for one PUT, sent by the destination's multipart upload fed from `body` one
    part at a time (one part held in memory, nothing on disk): all parts land or no object does."""
    part = part_size_for(size, dst.part_size)
    client, bucket, full = dst.client, dst.bucket, dst._k(key)
    upload = client.create_multipart_upload(Bucket=bucket, Key=full, **dst._tagging(key))["UploadId"]
    try:
        parts, left, number = [], size, 1
        while left > 0:
            want, chunks = min(part, left), []
            while want > 0:
                data = body.read(min(want, CHUNK))
                if not data:
                    raise StoreError(f"the source of {key} ended {left - want} bytes short")
                chunks.append(data)
                want -= len(data)
            data = b"".join(chunks)
            etag = client.upload_part(Bucket=bucket, Key=full, UploadId=upload, PartNumber=number, Body=data)["ETag"]
            parts.append({"ETag": etag, "PartNumber": number})
            left -= len(data)
            number += 1
        client.complete_multipart_upload(Bucket=bucket, Key=full, UploadId=upload, MultipartUpload={"Parts": parts})
    except BaseException:
        try:  # no half upload left billing storage in the destination
            client.abort_multipart_upload(Bucket=bucket, Key=full, UploadId=upload)
        except Exception as exc:  # noqa: BLE001 - the first fault is the one to report
            log.warning("abort of the multipart upload of %s failed: %s", key, exc)
        raise


def stream_object(get_url: str, size: int, dst: Any, key: str, put_limit: int = SINGLE_PUT_BYTES,
                  tally: Fetched | None = None, put_url: str | None = None) -> None:
    """One object from a presigned GET into `dst` under `key`, streamed: by one PUT (presigned by
    `dst`, with the object class tag the stack's expiry rule matches) up to `put_limit`, else by a
    multipart upload. `tally` counts the bytes read from the source."""
    tally = tally if tally is not None else Fetched()
    tls = tls_context()
    try:
        with urllib.request.urlopen(get_url, timeout=60, context=tls) as resp:
            body = _Counted(resp, tally)
            if size > put_limit:
                multipart_from(body, dst, key, size)
                return
            url, headers = put_url, {"Content-Length": str(size)}
            if url is None:
                url, signed = dst.presign_put(key, expires=900)
                headers.update(signed)
            req = urllib.request.Request(url, data=body, method="PUT", headers=headers)
            urllib.request.urlopen(req, timeout=300, context=tls).close()
    except OSError as exc:  # urllib's HTTPError and URLError are OSErrors: the copy is cut, redone later
        raise StoreError(f"copy of {key} between clouds failed: {exc}") from None


def read_order(store: Any, run_prefix: str) -> dict | None:
    from .store import NotFound

    try:
        return json.loads(store.get(f"{run_prefix}/{ORDER_KEY}"))
    except NotFound:
        return None


def carry_out(store: Any, run_prefix: str, order: dict, put_limit: int = SINGLE_PUT_BYTES) -> Fetched:
    """The order's files into `store` (those it lacks), then the checkpoint's manifest, then the
    report; the order removed once done. A file that fails FILE_TRIES times raises StoreError
    after the report (with the bytes fetched) is written."""
    tally, start = Fetched(), time.time()
    step = order.get("step")
    try:
        man = order.get("manifest")
        landing = man is not None and step not in manifest.complete_steps(store, run_prefix)
        if landing:
            store.delete(man["key"])  # a manifest from an earlier copy is not trusted over new files
        for item in order.get("files", []):
            _one(store, item, put_limit, tally)
        if landing:
            _one(store, man, put_limit, tally, force=True)
            if step not in manifest.complete_steps(store, run_prefix):
                raise StoreError(f"checkpoint {step} is not complete here after its copy")
    except StoreError as exc:
        _report(store, run_prefix, order, tally, start, str(exc))
        raise
    _report(store, run_prefix, order, tally, start, None)
    store.delete(f"{run_prefix}/{ORDER_KEY}")
    return tally


def _one(store: Any, item: dict, put_limit: int, tally: Fetched, force: bool = False) -> None:
    key, size = item["key"], int(item["size"])
    there = None if force else store.head(key)
    if there is not None and there.size == size:
        tally.skipped += 1
        return
    if time.time() > float(item.get("expires", float("inf"))):
        raise StoreError(f"the source's URL for {key} expired before its copy: the controller orders it again")
    error = ""
    for _ in range(FILE_TRIES):
        try:
            stream_object(item["url"], size, store, key, put_limit, tally)
            tally.sent += size
            return
        except StoreError as exc:
            error = str(exc)
            log.info("%s; trying again", error)
    raise StoreError(error)


def _report(store: Any, run_prefix: str, order: dict, tally: Fetched, start: float, error: str | None) -> None:
    doc = {"order": order.get("id"), "from": order.get("from"), "region": order.get("region"),
           "state": "failed" if error else "done",
           "fetched": tally.fetched, "sent": tally.sent, "skipped": tally.skipped, "step": order.get("step"),
           "seconds": round(time.time() - start, 3), "error": error}
    try:
        store.put(f"{run_prefix}/{REPORT_KEY}", json.dumps(doc).encode())
    except StoreError as exc:  # the copy's own outcome matters more than its report
        log.warning("the move's report could not be written: %s", exc)


def fetch_ordered(store: Any, run_prefix: str, put_limit: int = SINGLE_PUT_BYTES) -> Fetched | None:
    """At boot, before the restore: carry out the copy order the controller left here, if any."""
    order = read_order(store, run_prefix)
    if order is None:
        return None
    log.info("carrying %d files of the run from %s into this cloud's store", len(order.get("files", [])),
             order.get("from"))
    done = carry_out(store, run_prefix, order, put_limit)
    log.info("move copy done: %d bytes fetched, %d files skipped", done.fetched, done.skipped)
    return done


ORDER_WAIT_S = 4 * 3600  # how long another rank of a group waits for rank 0's copy


def wait_until_carried(store: Any, run_prefix: str, limit_s: float = ORDER_WAIT_S, poll_s: float = 5.0) -> None:
    """Another rank: wait until rank 0 has carried out the order (it is removed when done)."""
    end = time.monotonic() + limit_s
    while read_order(store, run_prefix) is not None:
        if time.monotonic() > end:
            raise StoreError(f"the move's copy into this store was not done within {limit_s:.0f} s")
        time.sleep(poll_s)
