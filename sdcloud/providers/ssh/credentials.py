"""Short-lived, prefix-scoped store credentials for a box of the user's, reached over SSH.

A cloud host signs with its instance role; a box the user owns has none, and long-lived keys must
never be copied to it. So the controller asks AWS STS for a session that can touch only the run's
prefix (and the shared cache/), hands it to the host over SSH (stdin of the host helper, never argv),
and renews it while the run lives. With a role to assume (`SDCLOUD_SSH_STORE_ROLE_ARN`, or the
stack's host role in the infra outputs) the session is AssumeRole on it; without one it is
GetFederationToken on the user's own identity. Either way the inline policy scopes it down.
The keys are held in memory only: never logged, never written to the state store.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from urllib.parse import urlparse

from ..base import CredentialsError

# STS sessions live at least 15 minutes; an hour, renewed at half-life, rides out a missed renewal.
DEFAULT_SECONDS = 3600
MIN_SECONDS = 900
RENEW_FRACTION = 0.5
WRITE_ACTIONS = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                 "s3:ListMultipartUploadParts", "s3:GetObjectTagging", "s3:PutObjectTagging"]


def scoped_policy(bucket: str, prefix: str, run_id: str) -> dict:
    """Objects under the run's prefix and the shared cache; listing only there."""
    base = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    roots = [f"{base}runs/{run_id}/", f"{base}cache/"]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": WRITE_ACTIONS, "Resource": [f"arn:aws:s3:::{bucket}/{r}*" for r in roots]},
            {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:ListBucketMultipartUploads"],
             "Resource": f"arn:aws:s3:::{bucket}", "Condition": {"StringLike": {"s3:prefix": [f"{r}*" for r in roots]}}},
        ],
    }


class StoreCredentials:
    """One run's session keys: minted on first use, renewed past half their life."""

    def __init__(self, store_conf: dict, run_id: str, seconds: int | None = None, renew_seconds: float | None = None,
                 role_arn: str | None = None):
        self.store_conf = store_conf
        self.run_id = run_id
        self.seconds = max(MIN_SECONDS, int(seconds or os.environ.get("SDCLOUD_SSH_CREDENTIALS_SECONDS") or DEFAULT_SECONDS))
        self.renew_seconds = float(renew_seconds or os.environ.get("SDCLOUD_SSH_CREDENTIALS_RENEW_SECONDS")
                                   or self.seconds * RENEW_FRACTION)
        self.role_arn = role_arn or os.environ.get("SDCLOUD_SSH_STORE_ROLE_ARN")
        self.issued = 0.0
        self.keys: dict | None = None

    @staticmethod
    def needed(store_conf: dict) -> bool:
        """Only an S3 store needs keys on the host (a file:// store is a folder there)."""
        return str(store_conf.get("url", "")).startswith("s3://") and store_conf.get("credentials") in (None, "default")

    def due(self) -> bool:
        return self.keys is None or time.time() - self.issued >= self.renew_seconds

    def current(self) -> dict:
        if self.due():
            self.keys = self._mint()
            self.issued = time.time()
        return self.keys

    def _mint(self) -> dict:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError

        url = urlparse(self.store_conf["url"])
        policy = json.dumps(scoped_policy(url.netloc, url.path, self.run_id))
        sts = boto3.session.Session().client("sts", region_name=self.store_conf.get("region") or None)
        try:
            if self.role_arn:
                resp = sts.assume_role(RoleArn=self.role_arn, RoleSessionName=f"sdcloud-{self.run_id}"[:64],
                                       Policy=policy, DurationSeconds=self.seconds)
            else:
                resp = sts.get_federation_token(Name=f"sdcloud-{self.run_id}"[:32], Policy=policy,
                                                DurationSeconds=self.seconds)
        except (BotoCoreError, ClientError) as exc:
            raise CredentialsError(f"could not get short-lived store keys for the ssh host from AWS STS: {exc}") from None
        c = resp["Credentials"]
        expiry = c["Expiration"]
        if isinstance(expiry, datetime):
            expiry = expiry.astimezone(timezone.utc).isoformat()
        return {"AccessKeyId": c["AccessKeyId"], "SecretAccessKey": c["SecretAccessKey"],
                "SessionToken": c["SessionToken"], "Expiration": expiry}

    def expiry(self) -> str | None:
        return self.keys["Expiration"] if self.keys else None
