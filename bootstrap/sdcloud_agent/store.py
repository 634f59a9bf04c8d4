"""Object store over S3 / COS (S3-compatible endpoint) or a local directory.

Shared by the host agent and the control plane (`sdcloud.runs.store` re-exports it), so it stays
small: keys are relative to the store's root (`s3://bucket/prefix` or `file:///dir`), and every
write is atomic (S3 PUT/complete-multipart are; the local store writes a temp file and renames).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol
from urllib.parse import unquote, urlparse

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


# ----------------------------------------------------------------------------------------------
# Transient faults (docs/runs.md, "Store faults")
# ----------------------------------------------------------------------------------------------
# botocore retries a request (5 attempts, standard mode), but not the reading of its body: a reset
# or a short body while reading get_object()["Body"] raises ResponseStreamingError out of read().
# Every S3Store call therefore runs inside `with_retries`, request and body read together, with a
# bounded, jittered backoff. (A plain loop, not tenacity: the agent's wheel depends on boto3 only.)

# Codes that say "try again later": throttling, a server's own error, a request that timed out.
TRANSIENT_CODES = frozenset({
    "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "RequestTimeTooSkewed", "Throttling",
    "ThrottlingException", "RequestLimitExceeded", "TooManyRequests", "OperationAborted", "BadGateway",
    "GatewayTimeout", "500", "502", "503", "504", "429"})
# Codes that the next request, and the next host with the same grant, would meet again.
PERMANENT_CAUSES = {
    "AccessDenied": "permission-denied", "InvalidAccessKeyId": "permission-denied",
    "SignatureDoesNotMatch": "permission-denied", "AllAccessDisabled": "permission-denied",
    "AccountProblem": "permission-denied", "InvalidToken": "permission-denied", "403": "permission-denied",
    "NoSuchBucket": "no-bucket",
}


@dataclass(frozen=True)
class RetryPolicy:
    """At most `attempts` tries and `deadline` seconds per operation; full-jitter exponential backoff."""
    attempts: int = 6
    base_delay: float = 0.25
    max_delay: float = 4.0
    deadline: float = 90.0

    def delay(self, retry: int, rng: random.Random = random.Random()) -> float:
        return rng.uniform(self.base_delay / 2, min(self.max_delay, self.base_delay * 2 ** retry))


DEFAULT_RETRY = RetryPolicy()


def error_code(exc: BaseException) -> str:
    """The S3 error code of a botocore ClientError (or of the error it wraps), else ''."""
    seen = 0
    while exc is not None and seen < 5:
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            err = response.get("Error") or {}
            code = str(err.get("Code") or "")
            if not code:
                code = str((response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or "")
            if code:
                return code
        # __cause__ only: an error raised while handling another (a read-back after a 412) is its own.
        exc, seen = exc.__cause__, seen + 1
    return ""


def is_transient(exc: BaseException) -> bool:
    """A fault that a later try may not meet: throttling, a 5xx, a reset, a short body, a stall."""
    import http.client

    if isinstance(exc, (Cancelled, NotFound)):
        return False
    code = error_code(exc)
    if code:
        return code in TRANSIENT_CODES or (code.isdigit() and (int(code) >= 500 or int(code) == 429))
    try:
        from botocore import exceptions as bx
        if isinstance(exc, (bx.ConnectionError, bx.HTTPClientError, bx.IncompleteReadError)):
            return True
    except ImportError:  # a LocalStore-only process
        pass
    try:
        from urllib3 import exceptions as ux
        if isinstance(exc, (ux.ProtocolError, ux.ReadTimeoutError, ux.SSLError)):
            return True
    except ImportError:
        pass
    from .transfer import ShortRead
    return isinstance(exc, (http.client.IncompleteRead, ConnectionError, TimeoutError, ShortRead))


def failure_cause(exc: BaseException) -> str | None:
    """`permission-denied` or `no-bucket` for a refusal that will recur on the next host, else None."""
    return PERMANENT_CAUSES.get(error_code(exc))


# Why an attempt ended, as the agent reports it in status.json (`failure_cause`); the first three
# recur on the next host (the same grant, the same bucket, the same config), so the run ends there.
RECURRING_CAUSES = ("permission-denied", "no-bucket", "bad-config")


def attempt_cause(exc: BaseException) -> str:
    """The cause an exception stands for: a refusal that recurs, a store that stayed unreachable
    (`store-unreachable`: its faults outlasted the retries) or refused otherwise (`store-refused`),
    a bad store configuration, or `agent-error`."""
    cause = failure_cause(exc)
    if cause:
        return cause
    if isinstance(exc, StoreError) or is_transient(exc):
        return "store-unreachable"
    if error_code(exc):
        return "store-refused"
    if isinstance(exc, ValueError):
        return "bad-config"
    return "agent-error"


def describe_failure(exc: BaseException, where: str = "") -> str:
    """One line for a store error: `AccessDenied (Access Denied) on PutObject of s3://...`."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and response.get("Error"):
        err = response["Error"]
        op = getattr(exc, "operation_name", "") or "a request"
        text = f"{err.get('Code')} ({err.get('Message') or 'no message'}) on {op}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return f"{text} at {where}" if where else text


def with_retries(fn: Callable[[], Any], what: str, policy: RetryPolicy = DEFAULT_RETRY,
                 log: Callable[[str], None] | None = None) -> Any:
    """fn() again after a transient fault, within the policy's bounds. A refusal (403, 404, 412) is
    not retried; a fault still there at the end becomes a StoreError that names it."""
    start = time.monotonic()
    for i in range(policy.attempts):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - sorted by is_transient
            if not is_transient(exc):
                raise
            delay = policy.delay(i)
            if i == policy.attempts - 1 or time.monotonic() - start + delay > policy.deadline:
                raise StoreError(f"{what} failed after {i + 1} attempts: {type(exc).__name__}: {exc}") from exc
            (log or _log_retry)(f"{what}: {type(exc).__name__}: {exc}; retry {i + 1} in {delay:.2f}s")
            time.sleep(delay)
    raise AssertionError("unreachable")


def _log_retry(msg: str) -> None:
    import logging
    logging.getLogger("sdcloud_agent.store").info("%s", msg)


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


# ----------------------------------------------------------------------------------------------
# Local directory
# ----------------------------------------------------------------------------------------------

class LocalStore:
    """A directory as an object store. Crash-safe: temp file + fsync + rename for every write."""

    compare_and_swap = True  # put_if_match is atomic (an exclusive flock around check and rename)

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        key = key.strip("/")
        if not key or ".." in key.split("/"):
            raise ValueError(f"bad key {key!r}")
        return self.root / key

    def _meta_path(self, key: str) -> Path:
        return self.root / _LOCAL_META_DIR / (key.strip("/") + ".json")

    def _write_tmp(self, final: Path, writer: Callable[[Any], None]) -> Path:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f"{_LOCAL_TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as f:
                writer(f)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    @staticmethod
    def _fsync_dir(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _set_meta(self, key: str, metadata: dict[str, str] | None) -> None:
        mp = self._meta_path(key)
        if not metadata:
            mp.unlink(missing_ok=True)
            return
        tmp = self._write_tmp(mp, lambda f: f.write(json.dumps(metadata).encode()))
        os.replace(tmp, mp)

    def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        final = self._path(key)
        tmp = self._write_tmp(final, lambda f: f.write(data))
        self._replace(key, tmp, final, metadata)

    def _replace(self, key: str, tmp: Path, final: Path, metadata: dict[str, str] | None) -> None:
        # Old metadata goes before the new bytes land and new metadata after: a crash in between
        # leaves an object without metadata (re-uploaded), never one with another object's sha256.
        self._meta_path(key).unlink(missing_ok=True)
        os.replace(tmp, final)
        self._fsync_dir(final.parent)
        self._set_meta(key, metadata)

    def create(self, key: str, data: bytes) -> bool:
        final = self._path(key)
        tmp = self._write_tmp(final, lambda f: f.write(data))
        try:
            os.link(tmp, final)  # fails if the name exists: an atomic create-if-absent
            self._fsync_dir(final.parent)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def put_file(self, key: str, path: str | Path, metadata: dict[str, str] | None = None,
                 cancel: threading.Event | None = None) -> str:
        final = self._path(key)
        h = hashlib.sha256()

        def copy(f):
            with open(path, "rb") as src:
                while chunk := src.read(8 * MiB):
                    if cancel is not None and cancel.is_set():
                        raise Cancelled(key)
                    h.update(chunk)
                    f.write(chunk)
        tmp = self._write_tmp(final, copy)
        self._replace(key, tmp, final, metadata)
        return h.hexdigest()

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise NotFound(key) from None

    def get_file(self, key: str, path: str | Path) -> str:
        src = self._path(key)
        if not src.is_file():
            raise NotFound(key)
        dest = Path(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f"{_LOCAL_TMP_PREFIX}{uuid.uuid4().hex}"
        h = hashlib.sha256()
        try:
            with open(src, "rb") as fin, open(tmp, "wb") as fout:
                while chunk := fin.read(8 * MiB):
                    h.update(chunk)
                    fout.write(chunk)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return h.hexdigest()

    def head(self, key: str) -> ObjectInfo | None:
        p = self._path(key)
        if not p.is_file():
            return None
        try:
            meta = json.loads(self._meta_path(key).read_text())
        except (OSError, ValueError):
            meta = {}
        return ObjectInfo(key.strip("/"), p.stat().st_size, meta)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        base = self.root
        out = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != _LOCAL_META_DIR]
            for name in filenames:
                if name.startswith(_LOCAL_TMP_PREFIX):
                    continue
                p = Path(dirpath) / name
                key = p.relative_to(base).as_posix()
                if key.startswith(prefix):
                    try:
                        out.append(ObjectInfo(key, p.stat().st_size))
                    except FileNotFoundError:
                        pass
        return sorted(out, key=lambda o: o.key)

    def delete(self, keys: str | list[str]) -> None:
        for key in [keys] if isinstance(keys, str) else keys:
            for p in (self._path(key), self._meta_path(key)):
                p.unlink(missing_ok=True)
                self._prune_dirs(p.parent)

    def _prune_dirs(self, d: Path) -> None:
        # Empty folders are invisible in S3; remove them here too so listings match.
        while d != self.root and self.root in d.parents:
            try:
                d.rmdir()
            except OSError:
                return
            d = d.parent

    def copy(self, src_key: str, dst_key: str) -> None:
        info = self.head(src_key)
        if info is None:
            raise NotFound(src_key)
        self.put_file(dst_key, self._path(src_key), info.metadata)


    # -- conditional writes (batch work items and leases; see sdcloud_agent.batch) --------------
    # The local ETag is the MD5 of the bytes, as S3's is for a single PUT. Compare-and-swap holds an
    # exclusive flock on a per-key lock file, so it is atomic between processes on one file system.

    @staticmethod
    def _etag(data: bytes) -> str:
        return '"' + hashlib.md5(data).hexdigest() + '"'

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and ETag, or None when it is absent."""
        try:
            data = self.get(key)
        except NotFound:
            return None
        return data, self._etag(data)

    def put_if_absent(self, key: str, data: bytes) -> str | None:
        """Create-only write (O_EXCL semantics via link): the new ETag, or None if the key exists."""
        return self._etag(data) if self.create(key, data) else None

    def put_if_match(self, key: str, data: bytes, etag: str) -> str | None:
        """Replace the object only if its ETag is still `etag`: the new ETag, or None if it changed."""
        import fcntl

        final = self._path(key)
        lock = self.root / _LOCAL_META_DIR / (key.strip("/") + ".lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "a+b") as lf:
            fcntl.flock(lf.fileno(), fcntl.LOCK_EX)
            try:
                current = self.get_versioned(key)
                if current is None or current[1] != etag:
                    return None
                tmp = self._write_tmp(final, lambda f: f.write(data))
                os.replace(tmp, final)
                self._fsync_dir(final.parent)
                return self._etag(data)
            finally:
                fcntl.flock(lf.fileno(), fcntl.LOCK_UN)


# ----------------------------------------------------------------------------------------------
# S3 / COS
# ----------------------------------------------------------------------------------------------

class S3Store:
    """A bucket (and key prefix) on S3 or an S3-compatible endpoint (COS, SeaweedFS, MinIO)."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str | None = None, addressing_style: str | None = None,
                 part_size: int = DEFAULT_PART_SIZE, workers: int = DEFAULT_WORKERS, client: Any = None,
                 credentials: str | None = None, engine: str = "auto", target_gbps: float | None = None,
                 restore_workers: int | None = None, range_size: int | None = None,
                 retry_policy: RetryPolicy | None = None, read_timeout: float | None = None):
        if part_size < 5 * MiB or workers < 1:
            raise ValueError("part_size must be at least 5 MiB (the S3 minimum) and workers at least 1")
        from . import transfer
        # Restores: four connections were fastest on two cores; a bigger host gets one per core.
        self.restore_workers = restore_workers or max(4, os.cpu_count() or 1)
        self.range_size = range_size or transfer.BLOCK
        if self.restore_workers < 1 or self.range_size < MiB:
            raise ValueError("restore_workers must be at least 1 and range_size at least 1 MiB")
        self._range_pool: Any = None
        if target_gbps is not None and target_gbps <= 0:
            raise ValueError("target_gbps must be positive")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.part_size = part_size
        self.workers = workers
        self.retry_policy = retry_policy or DEFAULT_RETRY
        # A cloud's own role named by the store config (COS through Tencent's CVM role: clouds/).
        from .clouds import for_credentials
        role = for_credentials(credentials)
        # COS takes object tags in its own header and its lifecycle rules cannot filter on them: tag on S3 only.
        self.tag_objects = role is None and "myqcloud.com" not in (endpoint_url or "")
        if engine not in ("auto", "crt", "s3transfer"):
            raise ValueError(f"unknown transfer engine {engine!r}: use auto, crt or s3transfer")
        # One transfer engine per store: `workers` connections however many files move.
        self._transfer_manager: Any = None
        self._crt: Any = None
        self._crt_args: dict[str, Any] | None = None
        self._tm_lock = threading.Lock()
        injected = client is not None
        from . import cos
        on_cos = cos.is_cos_endpoint(endpoint_url)
        # COS: create-only by x-cos-forbid-overwrite, and no compare-and-swap on PUT (cos.py).
        self.on_cos = on_cos
        self.compare_and_swap = not on_cos
        # One dialect for every store that is not AWS S3 itself (cos.compatible_options): no
        # checksum trailers, Content-Length on every body, Content-MD5 on DeleteObjects.
        self.on_aws = not on_cos and role is None and cos.is_aws_endpoint(cos.effective_endpoint(endpoint_url))
        session: Any = None
        if client is None:
            import boto3
            from botocore.config import Config

            options: dict[str, Any] = {
                "s3": {"addressing_style": addressing_style or "auto"},
                # Checksums on every request where the server supports them (CRC32 by default).
                "request_checksum_calculation": "when_supported",
            }
            if on_cos:
                options = cos.config_options()  # no trailer uploads, virtual-hosted only
            elif not self.on_aws:
                options = cos.compatible_options(addressing_style)  # the same bodies, any addressing
            cfg = Config(retries={"max_attempts": 5, "mode": "standard"},
                         max_pool_connections=max(16, workers * 2, self.restore_workers + 4), connect_timeout=5, read_timeout=read_timeout or 60, **options)
            # A named role: COS keys from the CVM's CAM role (boto3 only knows AWS's roles).
            if role is not None:
                session = role.role_session()
            elif credentials and credentials.startswith("file:"):
                from .cloudcreds import file_session

                session = file_session(credentials[len("file:"):])
            elif credentials in (None, "default"):
                session = boto3
            else:
                raise ValueError(f"unknown store credentials {credentials!r}: use tencent-cvm-role, file:PATH or leave it out")
            client = session.client("s3", endpoint_url=endpoint_url, region_name=region, config=cfg)
            if on_cos:
                cos.adapt_client(client)  # Content-MD5 on DeleteObjects, forbid-overwrite
            elif not self.on_aws:
                cos.adapt_compatible_client(client)  # Content-MD5 on DeleteObjects
        self.client = client
        # The CRT engine on S3 and S3-compatible servers where awscrt is installed (transfer.py
        # says why not on COS); a client handed in by a caller (a test's stub) keeps s3transfer.
        cos_like = on_cos or role is not None  # the one role a store config names is COS's (Tencent's)
        # "auto" takes the CRT on AWS S3 only: it signs checksum trailers into uploads, which
        # S3-compatible stores refuse as COS does. Asked for by name it runs anywhere but COS.
        use_crt = engine == "crt" or (engine == "auto" and not injected and self.on_aws and transfer.crt_available())
        if use_crt:
            if injected or cos_like:
                raise ValueError("the crt engine needs the store's own session and an S3 endpoint (not COS)")
            # The endpoint the client resolved (config, AWS_ENDPOINT_URL*, or the region's) says
            # whether the CRT speaks TLS.
            self._crt_args = {"session": session, "endpoint_url": endpoint_url, "region": region, "config": cfg,
                              "resolved_endpoint": client.meta.endpoint_url,
                              "part_size": part_size, "target_gbps": target_gbps,
                              "ca_bundle": os.environ.get("AWS_CA_BUNDLE") or None}
        self.engine = "crt" if use_crt else "s3transfer"

    def _k(self, key: str) -> str:
        return _join(self.prefix, key)

    def _tm(self) -> Any:
        """The store's boto3 TransferManager, made on first use."""
        with self._tm_lock:
            if self._transfer_manager is None:
                from .transfer import transfer_manager
                self._transfer_manager = transfer_manager(self.client, self.part_size, self.workers)
            return self._transfer_manager

    def _crt_engine(self) -> Any:
        """The store's CRT engine, made on first use."""
        with self._tm_lock:
            if self._crt is None:
                from .transfer import CrtEngine
                self._crt = CrtEngine(**self._crt_args)
            return self._crt

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1:] if self.prefix else full

    @staticmethod
    def _missing(exc: Exception) -> bool:
        code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
        return code in ("404", "NoSuchKey", "NotFound")

    def _tagging(self, key: str) -> dict[str, str]:
        cls = lifecycle_class(key) if self.tag_objects else None
        return {"Tagging": f"{CLASS_TAG}={cls}"} if cls else {}

    def _retry(self, fn: Callable[[], Any], what: str) -> Any:
        return with_retries(fn, f"{what} (s3://{self.bucket})", self.retry_policy)

    def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        # A plain PUT is idempotent: a retry after a lost answer writes the same bytes again.
        self._retry(lambda: self.client.put_object(Bucket=self.bucket, Key=self._k(key), Body=data,
                                                   Metadata=metadata or {}, **self._tagging(key)),
                    f"PUT {self._k(key)}")

    def create(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError
        try:
            return self.put_if_absent(key, data) is not None
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NotImplemented", "501"):
                # An older S3-compatible server: best effort head-then-put.
                if self.head(key) is not None:
                    return False
                self.put(key, data)
                return True
            raise

    def put_file(self, key: str, path: str | Path, metadata: dict[str, str] | None = None,
                 cancel: threading.Event | None = None) -> str:
        """Upload a file (multipart above one part); returns the sha256 of the bytes sent, with their
        block checksums (a transfer.FileDigest)."""
        from . import transfer
        size = os.path.getsize(path)
        full = self._k(key)
        try:
            tagging = self._tagging(key).get("Tagging")
            if size <= self.part_size:
                # One PUT of the whole file: retried whole (multipart parts are retried by s3transfer).
                return self._retry(lambda: transfer.put_single(self.client, self.bucket, full, path, metadata, cancel,
                                                               tagging=tagging, block=self.range_size),
                                   f"PUT {full}")
            if self.engine == "crt":
                return self._crt_engine().upload(self.bucket, full, path, metadata=metadata, cancel=cancel,
                                                 tagging=tagging, block=self.range_size)
            return transfer.upload_s3transfer(self._tm(), self.bucket, full, path, metadata=metadata,
                                              cancel=cancel, tagging=tagging, block=self.range_size)
        except transfer.TransferCancelled:
            raise Cancelled(key) from None

    def get(self, key: str) -> bytes:
        from botocore.exceptions import ClientError
        full = self._k(key)
        try:
            # The body is read inside the retry: a reset or a short body mid-read fetches it again.
            return self._retry(lambda: self.client.get_object(Bucket=self.bucket, Key=full)["Body"].read(),
                               f"GET {full}")
        except ClientError as exc:
            if self._missing(exc):
                raise NotFound(key) from None
            raise

    # A restore checks the manifest's block checksums as the ranges land (transfer.download_ranges).
    verifies_blocks = True

    def _pool(self) -> Any:
        """The store's pool for ranged GETs: `restore_workers` connections however many files move."""
        with self._tm_lock:
            if self._range_pool is None:
                from concurrent.futures import ThreadPoolExecutor
                self._range_pool = ThreadPoolExecutor(self.restore_workers, thread_name_prefix="sdcloud-range")
            return self._range_pool

    def get_file(self, key: str, path: str | Path, sums: Any = None) -> str | None:
        """Parallel ranged GETs read straight into the file (a temp name, renamed into place when
        complete). Returns the sha256 of the bytes received, taken as they land; or, with `sums`
        (a manifest's transfer.BlockSums), checks each range against its block as it lands
        (ChecksumMismatch) and returns None."""
        from . import transfer
        info = self.head(key)
        if info is None:
            raise NotFound(key)
        dest = Path(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f"{_LOCAL_TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            # No fsync: what is downloaded is a copy of what the bucket keeps (a restore is redone
            # on every agent start), and a flush of a whole checkpoint costs seconds.
            digest = transfer.download_ranges(self.client, self.bucket, self._k(key), tmp, info.size, self._pool(),
                                              sums=sums, block=self.range_size)
            os.replace(tmp, dest)
        except transfer.ShortRead as exc:
            tmp.unlink(missing_ok=True)
            raise StoreError(str(exc)) from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return digest

    def head(self, key: str) -> ObjectInfo | None:
        from botocore.exceptions import ClientError
        try:
            r = self._retry(lambda: self.client.head_object(Bucket=self.bucket, Key=self._k(key)),
                            f"HEAD {self._k(key)}")
        except ClientError as exc:
            if self._missing(exc):
                return None
            raise
        return ObjectInfo(key.strip("/"), int(r["ContentLength"]), dict(r.get("Metadata") or {}))

    def _iter(self, prefix: str) -> Iterator[dict]:
        full = self._k(prefix) if prefix else (self.prefix + "/" if self.prefix else "")
        if prefix.endswith("/") and not full.endswith("/"):
            full += "/"
        pager = self.client.get_paginator("list_objects_v2")
        for page in pager.paginate(Bucket=self.bucket, Prefix=full):
            yield from page.get("Contents", [])

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        # A fault on page n lists again from the start: a listing is a snapshot, not a cursor to resume.
        return self._retry(lambda: sorted((ObjectInfo(self._rel(o["Key"]), int(o["Size"])) for o in self._iter(prefix)),
                                          key=lambda o: o.key), f"LIST {self._k(prefix)}")

    def delete(self, keys: str | list[str]) -> None:
        keys = [keys] if isinstance(keys, str) else list(keys)
        for i in range(0, len(keys), 1000):
            batch = [{"Key": self._k(k)} for k in keys[i:i + 1000]]
            if batch:
                resp = self._retry(lambda: self.client.delete_objects(Bucket=self.bucket,
                                                                      Delete={"Objects": batch, "Quiet": True}),
                                   f"DELETE {len(batch)} keys")
                # DeleteObjects answers 200 even when keys were not deleted: those are in Errors.
                errors = resp.get("Errors") or []
                if errors:
                    first = errors[0]
                    raise StoreError(f"{len(errors)} of {len(batch)} deletes refused in {self.bucket}, e.g. "
                                     f"{first.get('Key')}: {first.get('Code')} {first.get('Message', '')}".rstrip())

    def copy(self, src_key: str, dst_key: str) -> None:
        self._retry(lambda: self.client.copy({"Bucket": self.bucket, "Key": self._k(src_key)}, self.bucket,
                                             self._k(dst_key)), f"COPY {self._k(src_key)}")

    def ensure_bucket(self) -> None:
        """Create the bucket if it is absent (tests, the local demo; real runs get it from the stacks)."""
        from botocore.exceptions import ClientError
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError:
            self.client.create_bucket(Bucket=self.bucket)


    # -- conditional writes (batch work items and leases; see sdcloud_agent.batch) --------------
    # S3 (and SeaweedFS) take If-None-Match: * and If-Match: <etag> on PutObject and answer 412
    # PreconditionFailed (or 409 ConditionalRequestConflict while a racing write is in flight).
    # COS ignores both on PUT (it would overwrite); its create-only write is x-cos-forbid-overwrite,
    # refused with 409 FileAlreadyExists, and it has no compare-and-swap (cos.py).

    @staticmethod
    def _precondition_failed(exc: Exception) -> bool:
        from .cos import EXISTS_CODES

        code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
        return code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409", *EXISTS_CODES)

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        from botocore.exceptions import ClientError
        def once() -> tuple[bytes, str]:
            r = self.client.get_object(Bucket=self.bucket, Key=self._k(key))
            return r["Body"].read(), r["ETag"]
        try:
            return self._retry(once, f"GET {self._k(key)}")
        except ClientError as exc:
            if self._missing(exc):
                return None
            raise

    def put_if_absent(self, key: str, data: bytes) -> str | None:
        """Create-only write: the new ETag, or None if the key exists (S3 If-None-Match, COS forbid-overwrite)."""
        from botocore.exceptions import ClientError

        from .cos import FORBID_OVERWRITE_PARAM
        cond = {FORBID_OVERWRITE_PARAM: True} if self.on_cos else {"IfNoneMatch": "*"}
        try:
            return self._retry(lambda: self.client.put_object(Bucket=self.bucket, Key=self._k(key), Body=data,
                                                              **cond)["ETag"], f"PUT {self._k(key)} (create-only)")
        except ClientError as exc:
            if self._precondition_failed(exc):
                # A lost acknowledgement: the write committed, its answer (a 500, a reset) did not
                # arrive, and the retry (ours or botocore's) met our own object. It is ours when it
                # holds our bytes (leases and markers carry a random token; an image that equals
                # ours is the same image).
                return self._own_write(key, data)
            raise

    def _own_write(self, key: str, data: bytes) -> str | None:
        """The object's ETag when it holds exactly `data` (our write landed), else None."""
        current = self.get_versioned(key)
        return current[1] if current is not None and current[0] == data else None

    def put_if_match(self, key: str, data: bytes, etag: str) -> str | None:
        from botocore.exceptions import ClientError
        if not self.compare_and_swap:
            # COS would ignore If-Match and overwrite: refuse rather than pretend (leases use create-only there).
            raise StoreError(f"{self.url} has no compare-and-swap on PUT (COS): use create-only writes")
        try:
            return self._retry(lambda: self.client.put_object(Bucket=self.bucket, Key=self._k(key), Body=data,
                                                              IfMatch=etag)["ETag"], f"PUT {self._k(key)} (if-match)")
        except ClientError as exc:
            if self._precondition_failed(exc) or self._missing(exc):
                # Read again before calling the swap lost: a retry after a committed write finds the
                # ETag changed by our own write.
                return self._own_write(key, data)
            raise


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
    if parsed.scheme in ("s3", "cos"):
        if not parsed.netloc:
            raise ValueError(f"store URL {url!r} has no bucket")
        allowed = {"endpoint_url", "region", "addressing_style", "part_size", "workers", "client", "credentials",
                   "engine", "target_gbps", "restore_workers", "range_size", "retry_policy", "read_timeout"}
        return S3Store(parsed.netloc, parsed.path, **{k: v for k, v in opts.items() if k in allowed})
    if parsed.scheme == "file":
        return LocalStore(unquote(parsed.netloc + parsed.path))
    if parsed.scheme == "":
        return LocalStore(Path(url).expanduser().resolve())
    raise ValueError(f"unsupported store URL {url!r}: use s3://bucket/prefix or file:///dir")


def retry(fn: Callable[[], Any], *, attempts: int = 5, base_delay: float = 0.5, max_delay: float = 8.0,
          log: Callable[[str], None] | None = None, what: str = "",
          stop: threading.Event | None = None) -> Any:
    """Call fn with bounded retries and exponential backoff; Cancelled is never retried."""
    for i in range(attempts):
        try:
            return fn()
        except Cancelled:
            raise
        except Exception as exc:  # noqa: BLE001 - the store raises many kinds; all are retryable here
            if i == attempts - 1:
                raise StoreError(f"{what or 'store operation'} failed after {attempts} attempts: {exc}") from exc
            delay = min(max_delay, base_delay * 2 ** i)
            if log:
                log(f"{what or 'store operation'} failed ({exc}); retry {i + 1}/{attempts - 1} in {delay:.1f}s")
            if stop is not None and stop.wait(delay):
                raise Cancelled(what) from exc
            elif stop is None:
                time.sleep(delay)
    raise AssertionError("unreachable")
