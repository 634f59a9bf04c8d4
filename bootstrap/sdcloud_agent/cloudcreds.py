"""Store credentials that boto3 cannot find by itself: a CVM's CAM role, or a file the controller renews.

A Tencent Cloud host signs COS requests with its CVM role's keys (below). A box of the user's,
reached over SSH, gets short-lived, prefix-scoped keys from the controller, written to a 0600 file
beside the agent's config and rewritten before they expire (`file_session`).

boto3 knows AWS's instance roles but not Tencent's: on a CVM the role's temporary keys are served
by the metadata service at /latest/meta-data/cam/security-credentials/<role>, as TmpSecretId,
TmpSecretKey, Token and ExpiredTime. They are fed to botocore as refreshable credentials, so an
upload that runs past the expiry picks up new keys. Nothing here is written to disk or logged.
"""

from __future__ import annotations

import json
import os
import urllib.request
from datetime import datetime, timezone

TENCENT_METADATA = "http://metadata.tencentyun.com"
ROLE_PATH = "/latest/meta-data/cam/security-credentials/"


def _base() -> str:
    return os.environ.get("SDCLOUD_TENCENT_METADATA_URL", TENCENT_METADATA).rstrip("/")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=3) as resp:
        return resp.read().decode()


def tencent_role_keys() -> dict:
    """The role's current temporary keys in botocore's metadata shape."""
    role = _get(_base() + ROLE_PATH).split()[0].strip("/")
    doc = json.loads(_get(_base() + ROLE_PATH + role))
    if doc.get("Code", "Success") != "Success":
        raise RuntimeError(f"CVM role {role}: the metadata service answered {doc.get('Code')}")
    expiry = datetime.fromtimestamp(int(doc["ExpiredTime"]), timezone.utc)
    return {"access_key": doc["TmpSecretId"], "secret_key": doc["TmpSecretKey"], "token": doc["Token"],
            "expiry_time": expiry.isoformat()}


def tencent_role_session():
    """A boto3 session whose credentials come from the CVM role and refresh before they expire."""
    import boto3
    from botocore.credentials import RefreshableCredentials
    from botocore.session import get_session

    creds = RefreshableCredentials.create_from_metadata(metadata=tencent_role_keys(), refresh_using=tencent_role_keys,
                                                        method="tencent-cvm-role")
    core = get_session()
    core._credentials = creds  # botocore has no public setter for a ready credential provider
    return boto3.Session(botocore_session=core)


def file_keys(path: str) -> dict:
    """The keys in the controller's credentials file (AWS STS shape), in botocore's metadata shape."""
    with open(path) as f:
        doc = json.load(f)
    return {"access_key": doc["AccessKeyId"], "secret_key": doc["SecretAccessKey"], "token": doc.get("SessionToken"),
            "expiry_time": doc["Expiration"]}


def file_session(path: str):
    """A boto3 session on the keys in `path`; botocore re-reads the file as they near their expiry."""
    import boto3
    from botocore.credentials import RefreshableCredentials
    from botocore.session import get_session

    creds = RefreshableCredentials.create_from_metadata(metadata=file_keys(path), refresh_using=lambda: file_keys(path),
                                                        method="sdcloud-credentials-file")
    core = get_session()
    core._credentials = creds  # botocore has no public setter for a ready credential provider
    return boto3.Session(botocore_session=core)
