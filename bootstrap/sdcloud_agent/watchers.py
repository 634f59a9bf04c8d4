"""Reclaim watchers: poll the cloud's instance metadata for a spot interruption notice.

Base URLs are configurable so that tests and the local provider point them at a local server.
AWS (IMDSv2): PUT /latest/api/token, then GET /latest/meta-data/spot/instance-action (404 =
nothing, 401 = token expired) and /latest/meta-data/events/recommendations/rebalance.
Tencent: GET /latest/meta-data/spot/termination-time, plain text in UTC+8 (404 = nothing).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable

log = logging.getLogger("sdcloud_agent.watchers")

AWS_BASE = "http://169.254.169.254"
TENCENT_BASE = "http://metadata.tencentyun.com"
TOKEN_TTL = 21600
# What we assume when a notice carries no usable time (AWS and Tencent both give two minutes).
DEFAULT_NOTICE_S = 120.0


@dataclass(frozen=True)
class Notice:
    kind: str  # "terminate" (reclaim coming) or "rebalance" (elevated risk: save early)
    deadline: float  # unix seconds when the host goes away (best estimate)
    received: float  # unix seconds when we saw it
    detail: str = ""


def _parse_iso(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def parse_tencent_time(text: str) -> float | None:
    """Tencent gives 'YYYY-MM-DD HH:MM:SS' in China Standard Time (UTC+8)."""
    text = text.strip()
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=timezone(timedelta(hours=8))).timestamp()
        except ValueError:
            continue
    return _parse_iso(text)


class _Http:
    def __init__(self, base_url: str, timeout: float = 2.0):
        self.base = base_url.rstrip("/")
        self.timeout = timeout

    def request(self, method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        req = urllib.request.Request(self.base + path, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            return exc.code, ""


class AwsWatcher:
    def __init__(self, base_url: str = AWS_BASE, timeout: float = 2.0):
        self.http = _Http(base_url, timeout)
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
                deadline = _parse_iso(str(doc.get("time", "")))
                action = str(doc.get("action", "terminate"))
            except ValueError:
                pass
            out.append(Notice("terminate", deadline or now + DEFAULT_NOTICE_S, now, f"spot {action}"))
        status, body = self._get("/latest/meta-data/events/recommendations/rebalance")
        if status == 200 and body.strip():
            out.append(Notice("rebalance", now + DEFAULT_NOTICE_S * 5, now, "rebalance recommendation"))
        return out


class TencentWatcher:
    def __init__(self, base_url: str = TENCENT_BASE, timeout: float = 2.0):
        self.http = _Http(base_url, timeout)

    def check(self) -> list[Notice]:
        now = time.time()
        status, body = self.http.request("GET", "/latest/meta-data/spot/termination-time")
        if status == 200 and body.strip():
            deadline = parse_tencent_time(body) or now + DEFAULT_NOTICE_S
            return [Notice("terminate", deadline, now, f"termination-time {body.strip()}")]
        return []


def make_watcher(metadata: dict | None):
    kind = (metadata or {}).get("kind", "none")
    base = (metadata or {}).get("base_url")
    if kind == "aws":
        return AwsWatcher(base or AWS_BASE)
    if kind == "tencent":
        return TencentWatcher(base or TENCENT_BASE)
    if kind in ("none", "", None):
        return None
    raise ValueError(f"unknown metadata kind {kind!r}: aws, tencent or none")


class WatchThread:
    """Polls a watcher every `poll_seconds`; calls `on_notice` once per notice kind."""

    def __init__(self, watcher, on_notice: Callable[[Notice], None], poll_seconds: float = 5.0):
        self.watcher = watcher
        self.on_notice = on_notice
        self.poll = poll_seconds
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sdcloud-watch", daemon=True)

    def start(self) -> "WatchThread":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                for notice in self.watcher.check():
                    if notice.kind not in self.seen:
                        self.seen.add(notice.kind)
                        log.warning("%s notice: %s (deadline in %.0fs)", notice.kind, notice.detail,
                                    notice.deadline - notice.received)
                        self.on_notice(notice)
                failures = 0
            except OSError as exc:
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.info("metadata endpoint unreachable (%s)", exc)
            self._stop.wait(self.poll)
