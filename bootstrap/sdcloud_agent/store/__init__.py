"""Object store over S3 / COS (S3-compatible endpoint) or a local directory.

Shared by the host agent and the control plane (`sdcloud.runs.records.store` re-exports it), so it stays
small: keys are relative to the store's root (`s3://bucket/prefix` or `file:///dir`), and every
write is atomic (S3 PUT/complete-multipart are; the local store writes a temp file and renames).

The package's modules: base.py (errors, ObjectInfo, the protocol, lifecycle tags), faults.py
(which errors are transient, retries), local.py (a directory), s3.py (S3 and COS through boto3),
dialects.py (the URL schemes, shared with the control plane's checks);
everything is importable from `sdcloud_agent.store` as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from . import dialects
from .base import (CLASS_TAG, DEFAULT_PART_SIZE, DEFAULT_WORKERS, MiB, Cancelled, NotFound, ObjectInfo,
                   ObjectStore, StoreError, lifecycle_class, sha256_file)
from .faults import (DEFAULT_RETRY, PERMANENT_CAUSES, RECURRING_CAUSES, TRANSIENT_CODES, RetryPolicy,
                     attempt_cause, describe_failure, error_code, failure_cause, is_transient, retry,
                     with_retries)
from .local import LocalStore
from .s3 import S3Store

__all__ = ["CLASS_TAG", "DEFAULT_PART_SIZE", "DEFAULT_RETRY", "DEFAULT_WORKERS", "PERMANENT_CAUSES",
           "RECURRING_CAUSES", "TRANSIENT_CODES", "Cancelled", "LocalStore", "MiB", "NotFound", "ObjectInfo",
           "ObjectStore", "RetryPolicy", "S3Store", "StoreError", "attempt_cause", "describe_failure",
           "error_code", "failure_cause", "is_transient", "lifecycle_class", "open_store", "retry",
           "sha256_file", "with_retries"]

def open_store(spec: str | dict, **overrides: Any) -> LocalStore | S3Store:
    """A store from a URL (`s3://bucket/prefix`, `cos://bucket/prefix`, `file:///dir`, a plain
    path) or a config dict `{"url", "endpoint_url", "region", "addressing_style"}`."""
    opts: dict[str, Any] = {}
    if isinstance(spec, dict):
        opts = {k: v for k, v in spec.items() if k != "url" and v is not None}
        url = spec["url"]
    else:
        url = spec
    opts.update({k: v for k, v in overrides.items() if v is not None})
    parsed = urlparse(url)
    if dialects.is_bucket(parsed.scheme):
        if not parsed.netloc:
            raise ValueError(f"store URL {url!r} has no bucket")
        allowed = {"endpoint_url", "region", "addressing_style", "part_size", "workers", "client", "credentials",
                   "engine", "target_gbps", "restore_workers", "range_size", "retry_policy", "read_timeout"}
        return S3Store(parsed.netloc, parsed.path, **{k: v for k, v in opts.items() if k in allowed})
    if parsed.scheme == dialects.FILE:
        return LocalStore(unquote(parsed.netloc + parsed.path))
    if parsed.scheme == "":
        return LocalStore(Path(url).expanduser().resolve())
    raise ValueError(f"unsupported store URL {url!r}: use s3://bucket/prefix or file:///dir")
