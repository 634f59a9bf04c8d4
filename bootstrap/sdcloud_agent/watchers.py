"""Reclaim watchers: what a notice is, and the thread that polls a cloud's watcher for one.

Each cloud's watcher (how its metadata service announces a reclaim) is in clouds/<kind>.py and is
made by `clouds.make_watcher(metadata)`. Base URLs are configurable so that tests and the local
provider point them at a local server.
"""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from typing import Callable

log = logging.getLogger("sdcloud_agent.watchers")

# What we assume when a notice carries no usable time (AWS and Tencent both give two minutes).
DEFAULT_NOTICE_S = 120.0


@dataclass(frozen=True)
class Notice:
    kind: str  # "terminate" (reclaim coming) or "rebalance" (elevated risk: save early)
    deadline: float  # unix seconds when the host goes away (best estimate)
    received: float  # unix seconds when we saw it
    detail: str = ""


def parse_iso(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class MetadataHttp:
    """GET/PUT on a metadata service: (status, body); an HTTP error is its status with no body."""

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
