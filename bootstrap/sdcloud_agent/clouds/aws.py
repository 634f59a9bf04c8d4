"""AWS: IMDSv2 for the reclaim notice and the boot's role keys; the OS shutdown ends the instance.

IMDSv2: PUT /latest/api/token, then GET /latest/meta-data/spot/instance-action (404 = nothing,
401 = token expired) and /latest/meta-data/events/recommendations/rebalance.

The host ends itself with the OS shutdown: the instance was launched with
InstanceInitiatedShutdownBehavior=terminate, so an OS shutdown terminates it
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_ChangingInstanceInitiatedShutdownBehavior.html;
`shutdown -h` powers off under systemd, unlike `halt`, which AWS says does not end the instance).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
import urllib.request

from ..watchers import DEFAULT_NOTICE_S, MetadataHttp, Notice, parse_iso

log = logging.getLogger("sdcloud_agent.selfend")

KIND = "aws"
METADATA_BASE = "http://169.254.169.254"
TOKEN_TTL = 21600
# boto3 finds the instance role itself: no store config names it.
ROLE_CREDENTIALS = None
ENDS_MACHINE = True
END_ACTION = "os-shutdown"
SHUTDOWN = ["shutdown", "-h", "now"]
POWEROFF = ["systemctl", "poweroff"]


class NoticeWatcher:
    def __init__(self, base_url: str = METADATA_BASE, timeout: float = 2.0):
        self.http = MetadataHttp(base_url, timeout)
        self._token: str | None = None

    def _get(self, path: str) -> tuple[int, str]:
        for _ in range(2):
            if self._token is None:
                status, body = self.http.request("PUT", "/latest/api/token",
                                                 {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)})
                if status != 200:
                    return status, ""
                self._token = body.strip()
            status, body = self.http.request("GET", path, {"X-aws-ec2-metadata-token": self._token})
            if status != 401:
                return status, body
            self._token = None  # expired or revoked: get a new one and try once more
        return 401, ""

    def check(self) -> list[Notice]:
        now = time.time()
        out = []
        status, body = self._get("/latest/meta-data/spot/instance-action")
        if status == 200 and body.strip():
            deadline = None
            action = "terminate"
            try:
                doc = json.loads(body)
                deadline = parse_iso(str(doc.get("time", "")))
                action = str(doc.get("action", "terminate"))
            except ValueError:
                pass
            out.append(Notice("terminate", deadline or now + DEFAULT_NOTICE_S, now, f"spot {action}"))
        status, body = self._get("/latest/meta-data/events/recommendations/rebalance")
        if status == 200 and body.strip():
            out.append(Notice("rebalance", now + DEFAULT_NOTICE_S * 5, now, "rebalance recommendation"))
        return out


def launch_index(base_url: str | None = None) -> int | None:
    """This instance's launch index in its RunInstances request (IMDSv2 `meta-data/ami-launch-index`):
    a multi-node group launched in one request numbers its hosts 0..N-1. Raises OSError where the
    metadata service does not answer it (the host cannot know its rank)."""
    status, body = NoticeWatcher(base_url or METADATA_BASE)._get("/latest/meta-data/ami-launch-index")
    if status != 200:
        raise OSError(f"instance metadata ami-launch-index: HTTP {status}")
    try:
        return int(body.strip())
    except ValueError:
        raise OSError(f"instance metadata ami-launch-index: not a number: {body.strip()[:40]!r}") from None


def watcher(base_url: str | None = None) -> NoticeWatcher:
    return NoticeWatcher(base_url or METADATA_BASE)


def boot_role_keys(metadata: dict, opener) -> dict:
    """{"key", "secret", "token"} of the instance role, through IMDSv2. userdata.py copies this
    function and METADATA_BASE into the boot's S3 client, which travels alone: it uses only what
    s3lite.py imports (json, os, urllib.request) and `opener`, s3lite's urlopen."""
    base = (os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or metadata.get("base_url")
            or METADATA_BASE).rstrip("/")
    req = urllib.request.Request(base + "/latest/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": "21600"})
    with opener(req, 3) as r:
        token = r.read().decode()
    hdr = {"X-aws-ec2-metadata-token": token}
    path = base + "/latest/meta-data/iam/security-credentials/"
    with opener(urllib.request.Request(path, headers=hdr), 3) as r:
        role = r.read().decode().split()[0].strip("/")
    with opener(urllib.request.Request(path + role, headers=hdr), 3) as r:
        doc = json.loads(r.read())
    return {"key": doc["AccessKeyId"], "secret": doc["SecretAccessKey"], "token": doc.get("Token", "")}


def role_session():
    """None: boto3's own credential chain reads the instance role."""
    return None


def shutdown_command() -> list[str]:
    """The OS shutdown; SDCLOUD_SHUTDOWN_COMMAND replaces it (the tests' shim records it)."""
    override = os.environ.get("SDCLOUD_SHUTDOWN_COMMAND")
    return override.split() if override else SHUTDOWN


def end_machine(se) -> str:
    """The OS shutdown, or systemd's poweroff where `shutdown` is missing."""
    for cmd in (shutdown_command(), POWEROFF):
        try:
            subprocess.run(cmd, check=True, timeout=60)
            return END_ACTION
        except (OSError, subprocess.SubprocessError) as exc:
            log.error("self-end: %s failed: %s", " ".join(cmd), exc)
    raise RuntimeError("no shutdown command worked")
