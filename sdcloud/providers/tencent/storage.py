"""What is COS-specific about using Tencent Cloud Object Storage as sdcloud's bucket.

COS speaks the S3 API at `https://cos.<region>.myqcloud.com` with virtual-hosted addressing
(`<bucket>.cos.<region>.myqcloud.com`), and every bucket name ends in the account's APPID
(`<name>-<appid>`). The generic object store (sdcloud_agent.store, on boto3) does the rest, so
checkpoints, dataset staging and reports behave the same on COS as on S3.

COS accepts a Tencent Cloud SecretId/SecretKey pair as the S3 access key and secret.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from sdcloud_agent.store import dialects

from ...errors import UserError

# <name>-<appid>: the name is lower-case letters, digits and hyphens, neither starting nor ending
# with a hyphen; the APPID is the account's numeric id (10 digits today, shorter for old accounts).
_BUCKET_RE = re.compile(r"^(?P<name>[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)-(?P<appid>[0-9]{5,12})$")
_REGION_RE = re.compile(r"^[a-z]{2}-[a-z]+(?:-[a-z0-9]+)*$")
# COS limits the whole virtual-host name `<bucket>.cos.<region>.myqcloud.com` to 60 characters.
_HOST_MAX = 60


@dataclass(frozen=True)
class CosBucket:
    name: str  # the part before the APPID
    appid: str

    @property
    def bucket(self) -> str:
        return f"{self.name}-{self.appid}"


def parse_bucket(bucket: str, region: str | None = None) -> CosBucket:
    """Validate a COS bucket name (`<name>-<appid>`); one clear UserError otherwise."""
    m = _BUCKET_RE.match(bucket or "")
    if not m:
        raise UserError(f"COS bucket {bucket!r} is not <name>-<appid> (lower-case letters, digits and hyphens, then "
                        f"a hyphen and your numeric APPID, e.g. sdcloud-data-1250000000; the APPID is on the "
                        f"console's account page)")
    if region is not None and len(f"{bucket}.cos.{region}.myqcloud.com") > _HOST_MAX:
        raise UserError(f"COS bucket {bucket!r} is too long for region {region}: "
                        f"<bucket>.cos.{region}.myqcloud.com may have at most {_HOST_MAX} characters")
    return CosBucket(m["name"], m["appid"])


def check_region(region: str) -> str:
    if not region or not _REGION_RE.match(region):
        raise UserError(f"COS region {region!r} does not look like a Tencent Cloud region (e.g. ap-guangzhou)")
    return region


def endpoint(region: str) -> str:
    """The S3-compatible endpoint of COS in `region` (the bucket goes in the host name)."""
    return f"https://cos.{check_region(region)}.myqcloud.com"


def bucket_host(bucket: str, region: str) -> str:
    """The virtual-hosted name of a bucket: `<bucket>.cos.<region>.myqcloud.com`."""
    parse_bucket(bucket, region)
    return f"{bucket}.cos.{check_region(region)}.myqcloud.com"


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) from `cos://bucket/prefix` or `s3://bucket/prefix`."""
    parsed = urlparse(url or "")
    if not dialects.is_bucket(parsed.scheme) or not parsed.netloc:
        raise UserError(f"COS location {url!r} must look like cos://<name>-<appid>/prefix")
    return parsed.netloc, parsed.path.strip("/")


def store_config(bucket: str, prefix: str = "", region: str = "", endpoint_url: str | None = None) -> dict:
    """The object-store config for the agent and the control plane (sdcloud_agent.store.open_store).

    `endpoint_url` replaces the public COS endpoint (tests point it at a local S3 server).
    """
    if "://" in bucket:
        bucket, url_prefix = parse_url(bucket)
        prefix = prefix or url_prefix
    parse_bucket(bucket, region or None)
    check_region(region)
    url = f"s3://{bucket}/{prefix.strip('/')}".rstrip("/")
    return {"url": url, "endpoint_url": endpoint_url or endpoint(region), "region": region,
            "addressing_style": "virtual"}


KEY_VARS = ("TENCENTCLOUD_SECRET_ID", "TENCENTCLOUD_SECRET_KEY")


def client(region: str, endpoint_url: str | None = None, secret_id: str | None = None,
           secret_key: str | None = None, session_token: str | None = None, where: str = "COS") -> Any:
    """A boto3 S3 client for COS: SigV4, virtual-hosted addressing, Tencent credentials when set.

    Credentials: the arguments, else TENCENTCLOUD_SECRET_ID/KEY (COS takes them as S3 keys), and
    nothing else: a store's cloud comes from its URL, never from whichever keys the shell holds, so
    AWS keys (boto3's own chain) never sign a request to COS. Without the Tencent keys, one line
    naming the keys that are missing (`where`: the bucket), before any request: botocore would only
    fail at the first request, with a NoCredentialsError traceback (or, signed with AWS keys, six
    refused tries), in the middle of a `down` or a `resume`.
    """
    import boto3
    from botocore.config import Config

    check_region(region)
    secret_id = secret_id or os.environ.get("TENCENTCLOUD_SECRET_ID") or None
    secret_key = secret_key or os.environ.get("TENCENTCLOUD_SECRET_KEY") or None
    session_token = session_token or os.environ.get("TENCENTCLOUD_SESSION_TOKEN") or None
    keys: dict[str, Any] = {}
    if secret_id and secret_key:
        keys = {"aws_access_key_id": secret_id, "aws_secret_access_key": secret_key, "aws_session_token": session_token}
    from sdcloud_agent import cos

    # The same COS settings as the host's store: no trailer uploads, virtual-hosted addressing,
    # Content-MD5 on DeleteObjects.
    cfg = Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=5, read_timeout=60,
                 **cos.config_options())
    session = boto3.Session()
    if not keys:
        missing = " and ".join(v for v in KEY_VARS if not os.environ.get(v)) or " and ".join(KEY_VARS)
        raise UserError(f"cannot read {where}: no Tencent Cloud keys on this machine; set {missing} "
                        "(COS takes them as its S3 keys)")
    client = session.client("s3", region_name=region, endpoint_url=endpoint_url or endpoint(region), config=cfg, **keys)
    return cos.adapt_client(client)


def open_store(bucket: str, prefix: str = "", region: str = "", endpoint_url: str | None = None, **kw: Any):
    """The generic ObjectStore on a COS bucket, through a COS client."""
    from sdcloud_agent.store import open_store as _open

    conf = store_config(bucket, prefix, region, endpoint_url)
    return _open(conf, client=client(region, conf["endpoint_url"], where=f"cos://{bucket}/{prefix}".rstrip("/")), **kw)
