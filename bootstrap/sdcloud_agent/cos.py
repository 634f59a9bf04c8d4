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
from typing import Any
from urllib.parse import urlparse

COS_DOMAIN = ".myqcloud.com"


def is_cos_endpoint(endpoint_url: str | None) -> bool:
    """True for a COS endpoint (`https://cos.<region>.myqcloud.com` or a bucket's own host)."""
    host = (urlparse(endpoint_url or "").hostname or "").lower()
    return host.endswith(COS_DOMAIN) and (host.startswith("cos.") or ".cos." in host)


def config_options() -> dict[str, Any]:
    """botocore Config keyword arguments that every COS client needs."""
    return {
        "signature_version": "s3v4",
        "s3": {"addressing_style": "virtual"},
        # Checksums only where an operation requires one: no aws-chunked trailer uploads.
        "request_checksum_calculation": "when_required",
        "response_checksum_validation": "when_required",
    }


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


def adapt_client(client: Any) -> Any:
    """Register what a COS client needs on top of its Config (Content-MD5 on DeleteObjects, the
    forbid-overwrite header for create-only PutObject)."""
    events = client.meta.events
    events.register("before-call.s3.DeleteObjects", _content_md5, unique_id="sdcloud-cos-content-md5")
    events.register_first("before-parameter-build.s3.PutObject", _take_forbid_flag, unique_id="sdcloud-cos-forbid-flag")
    events.register("before-call.s3.PutObject", _forbid_header, unique_id="sdcloud-cos-forbid-header")
    return client
