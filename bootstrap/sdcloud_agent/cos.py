"""What a boto3 S3 client must do differently to speak to Tencent Cloud COS.

COS serves the S3 API at `https://<bucket>-<appid>.cos.<region>.myqcloud.com`, but not all of it as
botocore (>= 1.36) now sends it:

- uploads: botocore streams PutObject/UploadPart over HTTPS as `aws-chunked` bodies with a checksum
  trailer and no Content-Length, which COS refuses (411 MissingContentLength). A COS client computes
  checksums only where an operation requires one, so every body goes with its Content-Length;
- DeleteObjects: COS requires Content-MD5 on it, which botocore replaced with a CRC32 header;
- addressing: buckets created since 2024-01-01 answer only virtual-hosted requests;
- create-only writes: COS takes `x-cos-forbid-overwrite: true` on PUT Object and answers 409
  FileAlreadyExists when the key exists (for buckets that never had versioning). S3's
  `If-None-Match: *` and `If-Match` are not COS PUT headers: PUT Object documents neither and says
  an existing object is overwritten with 200 OK (https://www.tencentcloud.com/document/product/436/7749;
  conditional headers are documented on GET/HEAD Object only, product/436/7745). So a create-only
  write on COS must carry forbid-overwrite, and COS has no compare-and-swap on PUT at all.

Both the host agent's store and the control plane's COS client are configured here, so that the
two cannot drift apart.
"""

from __future__ import annotations

import base64
import hashlib
import os
from typing import Any
from urllib.parse import urlparse

COS_DOMAIN = ".myqcloud.com"


def is_cos_endpoint(endpoint_url: str | None) -> bool:
    """True for a COS endpoint (`https://cos.<region>.myqcloud.com` or a bucket's own host)."""
    host = (urlparse(endpoint_url or "").hostname or "").lower()
    return host.endswith(COS_DOMAIN) and (host.startswith("cos.") or ".cos." in host)


# AWS S3's own endpoints (regional, dual-stack, FIPS, access points, the China partition).
AWS_DOMAINS = (".amazonaws.com", ".amazonaws.com.cn")


def effective_endpoint(endpoint_url: str | None) -> str | None:
    """The endpoint a boto3 S3 client will use: the given one, else AWS_ENDPOINT_URL_S3 /
    AWS_ENDPOINT_URL (botocore honours both), else None (AWS's regional endpoint)."""
    return endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def is_aws_endpoint(endpoint_url: str | None) -> bool:
    """True for AWS S3 itself: no endpoint (boto3 resolves the region's) or a host under amazonaws.com."""
    if not endpoint_url:
        return True
    host = (urlparse(endpoint_url).hostname or "").lower()
    return host.endswith(AWS_DOMAINS)


def compatible_options(addressing_style: str | None = None) -> dict[str, Any]:
    """botocore Config keyword arguments for an S3-compatible store that is not AWS S3 (MinIO, Ceph,
    R2, B2, SeaweedFS, COS): the COS rules for bodies, since many such stores refuse botocore's
    aws-chunked uploads with a checksum trailer (411 MissingContentLength) as COS does. A checksum
    only where the S3 API requires one, Content-Length on every body, SigV4; the addressing style
    the user gave, else botocore's (path-style for an IP address or a name a bucket cannot prefix)."""
    return {
        "signature_version": "s3v4",
        "s3": {"addressing_style": addressing_style or "auto"},
        "request_checksum_calculation": "when_required",
        "response_checksum_validation": "when_required",
    }


def config_options() -> dict[str, Any]:
    """botocore Config keyword arguments that every COS client needs."""
    # The S3-compatible dialect, virtual-hosted only (buckets made since 2024 refuse path-style).
    return compatible_options("virtual")


def _content_md5(params: dict, **_: Any) -> None:
    """before-call handler for DeleteObjects: Content-MD5 of the body, and no flexible checksum."""
    body = params.get("body") or b""
    if isinstance(body, str):
        body = body.encode()
    params["headers"]["Content-MD5"] = base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode()
    checksum = params.get("context", {}).get("checksum", {})
    checksum.pop("request_algorithm", None)
    checksum.pop("request_algorithm_header", None)


# PutObject(..., CosForbidOverwrite=True): the flag is taken out of the parameters before botocore
# validates them and becomes the x-cos-forbid-overwrite header before the request is signed.
FORBID_OVERWRITE_PARAM = "CosForbidOverwrite"
EXISTS_CODES = ("FileAlreadyExists",)  # 409, COS's answer to forbid-overwrite on an existing key


def _take_forbid_flag(params: dict, context: dict, **_: Any) -> None:
    if params.pop(FORBID_OVERWRITE_PARAM, False):
        context["sdcloud_cos_forbid_overwrite"] = True


def _forbid_header(params: dict, context: dict, **_: Any) -> None:
    if context.get("sdcloud_cos_forbid_overwrite"):
        params["headers"]["x-cos-forbid-overwrite"] = "true"


def adapt_compatible_client(client: Any) -> Any:
    """What every S3-compatible (non-AWS) client needs beyond its Config: Content-MD5 on
    DeleteObjects, which the S3 API requires and botocore now replaces with a CRC32 header."""
    client.meta.events.register("before-call.s3.DeleteObjects", _content_md5, unique_id="sdcloud-cos-content-md5")
    return client


def adapt_client(client: Any) -> Any:
    """Register what a COS client needs on top of its Config (Content-MD5 on DeleteObjects, the
    forbid-overwrite header for create-only PutObject)."""
    events = client.meta.events
    events.register("before-call.s3.DeleteObjects", _content_md5, unique_id="sdcloud-cos-content-md5")
    events.register_first("before-parameter-build.s3.PutObject", _take_forbid_flag, unique_id="sdcloud-cos-forbid-flag")
    events.register("before-call.s3.PutObject", _forbid_header, unique_id="sdcloud-cos-forbid-header")
    return client
