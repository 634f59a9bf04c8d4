"""A bucket on S3 or an S3-compatible endpoint (COS, SeaweedFS, MinIO), through boto3.
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

from .base import (CLASS_TAG, _join, DEFAULT_PART_SIZE, DEFAULT_WORKERS, MiB, _LOCAL_TMP_PREFIX, Cancelled, NotFound,
                   ObjectInfo, StoreError, lifecycle_class)
from .faults import DEFAULT_RETRY, RetryPolicy, with_retries


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
        from .. import transfer
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
        from ..clouds import for_credentials
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
        from .. import cos
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
                # SigV4 for every request and every presigned URL: botocore presigns S3 URLs with SigV2
                # in the regions that once took it (us-east-1, eu-west-1, ...) unless told, and a SigV2
                # URL signs Content-Type, which a PUT's sender adds (urllib: form-urlencoded) and S3 then
                # refuses (403 SignatureDoesNotMatch); buckets made since 2020-06-24 take no SigV2 at all.
                "signature_version": "s3v4",
                # Virtual-hosted at the region's endpoint: a presigned URL at the global endpoint is
                # redirected (307) for a bucket outside us-east-1 in its first day, and a PUT is not
                # followed; a dotted name keeps path-style (its host would not match the certificate).
                "s3": {"addressing_style": addressing_style or ("auto" if "." in bucket else "virtual")},
                # Checksums on every request where the server supports them (CRC32 by default).
                "request_checksum_calculation": "when_supported",
            }
            if on_cos:
                options = cos.config_options()  # no trailer uploads, virtual-hosted only
            elif not self.on_aws:
                options = cos.compatible_options(addressing_style)  # the same bodies, any addressing
            cfg = Config(retries={"max_attempts": 5, "mode": "standard"},
                         max_pool_connections=max(16, workers * 2, self.restore_workers + 4), connect_timeout=5,
                         read_timeout=read_timeout or 60, **options)
            # A named role: COS keys from the CVM's CAM role (boto3 only knows AWS's roles).
            if role is not None:
                session = role.role_session()
            elif credentials and credentials.startswith("file:"):
                from ..cloudcreds import file_session

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
                from ..transfer import transfer_manager
                self._transfer_manager = transfer_manager(self.client, self.part_size, self.workers)
            return self._transfer_manager

    def _crt_engine(self) -> Any:
        """The store's CRT engine, made on first use."""
        with self._tm_lock:
            if self._crt is None:
                from ..transfer import CrtEngine
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
        from .. import transfer
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
        from .. import transfer
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

    def presign(self, key: str, method: str = "get", expires: int = 900) -> str:
        """A URL that lets its holder GET (or PUT) this one key for `expires` seconds, with no keys:
        how a copy between two clouds' stores moves bytes without either side holding the other's."""
        op = {"get": "get_object", "put": "put_object"}[method]
        return self.client.generate_presigned_url(op, Params={"Bucket": self.bucket, "Key": self._k(key)},
                                                  ExpiresIn=int(expires))

    def presign_put(self, key: str, expires: int = 900) -> tuple[str, dict[str, str]]:
        """A presigned PUT of this key and the headers it signed, which its sender must send: the
        object class tag (x-amz-tagging) that the stack's expiry rule matches rides in the signature."""
        tags = self._tagging(key)
        url = self.client.generate_presigned_url("put_object", Params={"Bucket": self.bucket, "Key": self._k(key), **tags},
                                                 ExpiresIn=int(expires))
        return url, ({"x-amz-tagging": tags["Tagging"]} if tags else {})

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
        from ..cos import EXISTS_CODES

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

        from ..cos import FORBID_OVERWRITE_PARAM
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
