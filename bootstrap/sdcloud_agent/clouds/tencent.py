"""Tencent Cloud: the CVM metadata service for the reclaim notice and the CAM role's keys; the host
ends itself with its own TerminateInstances.

The notice: GET /latest/meta-data/spot/termination-time, plain text in UTC+8 (404 = nothing).

boto3 knows AWS's instance roles but not Tencent's: on a CVM the role's temporary keys are served
by the metadata service at /latest/meta-data/cam/security-credentials/<role>, as TmpSecretId,
TmpSecretKey, Token and ExpiredTime. They are fed to botocore as refreshable credentials, so an
upload that runs past the expiry picks up new keys. Nothing here is written to disk or logged.

The end: TerminateInstances, signed TC3-HMAC-SHA256 with the CVM role's temporary keys (an OS
shutdown would leave a pay-as-you-go instance stopped and still charged for its disks:
https://tencentcloud.com/document/product/213/19922). The stack's role may end only instances
carrying the stack's tag (stacks/tencent/host_policy.py).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
import urllib.request
from datetime import datetime, timedelta, timezone

from ..watchers import DEFAULT_NOTICE_S, MetadataHttp, Notice, parse_iso

KIND = "tencent"
METADATA_BASE = "http://metadata.tencentyun.com"
# The environment's override of the metadata base (tests, and the boot's S3 client alike).
METADATA_ENV = "SDCLOUD_TENCENT_METADATA_URL"
ROLE_PATH = "/latest/meta-data/cam/security-credentials/"
# The store config's "credentials" value that asks for the CVM role (the control plane writes it).
ROLE_CREDENTIALS = "tencent-cvm-role"
ENDS_MACHINE = True
END_ACTION = "terminate-instances"
CVM_ENDPOINT = "https://cvm.tencentcloudapi.com"
CVM_VERSION = "2017-03-12"


# -- the reclaim notice -----------------------------------------------------------------------------

def parse_notice_time(text: str) -> float | None:
    """Tencent gives 'YYYY-MM-DD HH:MM:SS' in China Standard Time (UTC+8)."""
    text = text.strip()
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=timezone(timedelta(hours=8))).timestamp()
        except ValueError:
            continue
    return parse_iso(text)


class NoticeWatcher:
    def __init__(self, base_url: str = METADATA_BASE, timeout: float = 2.0):
        self.http = MetadataHttp(base_url, timeout)

    def check(self) -> list[Notice]:
        now = time.time()
        status, body = self.http.request("GET", "/latest/meta-data/spot/termination-time")
        if status == 200 and body.strip():
            deadline = parse_notice_time(body) or now + DEFAULT_NOTICE_S
            return [Notice("terminate", deadline, now, f"termination-time {body.strip()}")]
        return []


def watcher(base_url: str | None = None) -> NoticeWatcher:
    return NoticeWatcher(base_url or METADATA_BASE)


# -- the CVM role's keys ----------------------------------------------------------------------------

def _base() -> str:
    return os.environ.get(METADATA_ENV, METADATA_BASE).rstrip("/")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=3) as resp:
        return resp.read().decode()


def boot_role_keys(metadata: dict, opener) -> dict:
    """{"key", "secret", "token"} of the CVM role. userdata.py copies this function and
    METADATA_BASE, METADATA_ENV and ROLE_PATH into the boot's S3 client, which travels alone: it
    uses only what s3lite.py imports (json, os) and `opener`, s3lite's urlopen."""
    base = os.environ.get(METADATA_ENV) or metadata.get("base_url") or METADATA_BASE
    path = base.rstrip("/") + ROLE_PATH
    with opener(path, 3) as r:
        role = r.read().decode().split()[0].strip("/")
    with opener(path + role, 3) as r:
        doc = json.loads(r.read())
    return {"key": doc["TmpSecretId"], "secret": doc["TmpSecretKey"], "token": doc.get("Token", "")}


def role_keys() -> dict:
    """The role's current temporary keys in botocore's metadata shape."""
    role = _get(_base() + ROLE_PATH).split()[0].strip("/")
    doc = json.loads(_get(_base() + ROLE_PATH + role))
    if doc.get("Code", "Success") != "Success":
        raise RuntimeError(f"CVM role {role}: the metadata service answered {doc.get('Code')}")
    expiry = datetime.fromtimestamp(int(doc["ExpiredTime"]), timezone.utc)
    return {"access_key": doc["TmpSecretId"], "secret_key": doc["TmpSecretKey"], "token": doc["Token"],
            "expiry_time": expiry.isoformat()}


def role_session():
    """A boto3 session whose credentials come from the CVM role and refresh before they expire."""
    from ..cloudcreds import refreshing_session

    return refreshing_session(role_keys, "tencent-cvm-role")


# -- ending the machine -----------------------------------------------------------------------------

def _metadata_get(path: str) -> str:
    return _get(_base() + path).strip()


def instance() -> tuple[str, str]:
    """(instance id, region) from the CVM metadata service."""
    return _metadata_get("/latest/meta-data/instance-id"), _metadata_get("/latest/meta-data/placement/region")


def tc3_headers(secret_id: str, secret_key: str, token: str | None, host: str, action: str, region: str,
                body: bytes, timestamp: int, service: str = "cvm", version: str = CVM_VERSION) -> dict[str, str]:
    """The headers of a TC3-HMAC-SHA256 signed POST (https://www.tencentcloud.com/document/api/213/30654)."""
    date = datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%d")
    ctype = "application/json"
    canonical = "\n".join(["POST", "/", "", f"content-type:{ctype}\nhost:{host}\n", "content-type;host",
                           hashlib.sha256(body).hexdigest()])
    scope = f"{date}/{service}/tc3_request"
    to_sign = "\n".join(["TC3-HMAC-SHA256", str(timestamp), scope, hashlib.sha256(canonical.encode()).hexdigest()])

    def mac(key: bytes, msg: str) -> bytes:
        return hmac.new(key, msg.encode(), hashlib.sha256).digest()

    key = mac(mac(mac(("TC3" + secret_key).encode(), date), service), "tc3_request")
    sig = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers = {"Authorization": f"TC3-HMAC-SHA256 Credential={secret_id}/{scope}, SignedHeaders=content-type;host, "
                                f"Signature={sig}",
               "Content-Type": ctype, "Host": host, "X-TC-Action": action, "X-TC-Timestamp": str(timestamp),
               "X-TC-Version": version, "X-TC-Region": region}
    if token:
        headers["X-TC-Token"] = token
    return headers


def terminate(instance_id: str, region: str, keys: dict, endpoint: str | None = None,
              now: float | None = None) -> dict:
    """This instance's own TerminateInstances with the role's keys; the API's Response, or raises."""
    endpoint = (endpoint or os.environ.get("SDCLOUD_TENCENT_ENDPOINT") or CVM_ENDPOINT).rstrip("/")
    host = endpoint.split("://", 1)[-1].split("/", 1)[0]
    body = json.dumps({"InstanceIds": [instance_id]}).encode()
    headers = tc3_headers(keys["access_key"], keys["secret_key"], keys.get("token"), host, "TerminateInstances",
                          region, body, int(now if now is not None else time.time()))
    req = urllib.request.Request(endpoint + "/", data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=15) as resp:
        answer = json.loads(resp.read().decode()).get("Response", {})
    if "Error" in answer:
        raise RuntimeError(f"TerminateInstances {instance_id}: {answer['Error'].get('Code')}: "
                           f"{answer['Error'].get('Message')}")
    return answer


def end_machine(se) -> str:
    """TerminateInstances on this instance, in the run's region (else the one the metadata names)."""
    iid, region = instance()
    terminate(iid, se.region or region, role_keys())
    return END_ACTION


def launch_index(base_url: str | None = None) -> None:
    """None: this cloud launches a group's hosts one request each, every host's rank in its own config."""
    return None
