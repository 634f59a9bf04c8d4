"""status.json (the heartbeat) and log shipping to the bucket.

status.json: {"run", "attempt", "phase", "step", "total_steps", "it_per_s", "loss", "gpu_util",
"disk_free_gb", "time", "reason", "trained_at": when this attempt first trained a step}
(docs/architecture.md). Every write is atomic: an S3 PUT, or a temp file renamed in a local store;
the local copy in the workdir is written the same way.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

from .store import ObjectStore

log = logging.getLogger("sdcloud_agent.status")

PHASES = ("starting", "staging", "restoring", "training", "saving", "uploading", "succeeded", "failed", "preempted")
FINAL = ("succeeded", "failed", "preempted")
MAX_LOG_SHIP = 8 * 1024 * 1024  # ship at most the last 8 MB of a log
# The log is re-uploaded whole (S3 has no append): at most this often, and at every phase change.
LOG_SHIP_SECONDS = 10.0


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}-{threading.get_ident()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class StatusReporter:
    def __init__(self, store: ObjectStore | None, run_prefix: str, run: str, attempt: int, total_steps: int,
                 *, local_path: Path | None = None, log_path: Path | None = None,
                 extra: Callable[[], dict] | None = None):
        self.store = store
        self.run_prefix = run_prefix
        self.local_path = local_path
        self.log_path = log_path
        self.extra = extra
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self.state = {"run": run, "attempt": attempt, "phase": "starting", "step": 0, "total_steps": total_steps,
                      "it_per_s": None, "loss": None, "gpu_util": None, "disk_free_gb": None,
                      "time": time.time(), "reason": ""}
        self._shipped_size = -1
        self._shipped_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def phase(self) -> str:
        return self.state["phase"]

    def update(self, **fields) -> None:
        with self._lock:
            if self.state["phase"] in FINAL and "phase" in fields and fields["phase"] != self.state["phase"]:
                return  # a final status is never overwritten
            self.state.update(fields)

    def set_phase(self, phase: str, reason: str = "", flush: bool = True) -> None:
        assert phase in PHASES, phase
        self.update(phase=phase, reason=reason)
        if flush:
            self.flush()

    def snapshot(self) -> dict:
        with self._lock:
            doc = dict(self.state)
        if self.extra:
            try:
                doc.update(self.extra())
            except Exception:  # noqa: BLE001 - gauges are best effort
                pass
        doc["time"] = time.time()
        return doc

    def flush(self, ship_log: bool = True) -> bool:
        """Write status.json now (and ship the log if due). Returns False if the bucket write failed."""
        with self._write_lock:
            doc = self.snapshot()
            data = json.dumps(doc, sort_keys=True).encode()
            if self.local_path:
                try:
                    atomic_write(self.local_path, data)
                except OSError as exc:
                    log.warning("cannot write local status: %s", exc)
            ok = True
            if self.store is not None:
                try:
                    self.store.put(f"{self.run_prefix}/status.json", data)
                except Exception as exc:  # noqa: BLE001 - the next heartbeat tries again
                    log.warning("status upload failed: %s", exc)
                    ok = False
                if ship_log or time.monotonic() - self._shipped_at >= LOG_SHIP_SECONDS:
                    self.ship_log()
            return ok

    def ship_log(self) -> None:
        if self.store is None or self.log_path is None or not self.log_path.exists():
            return
        size = self.log_path.stat().st_size
        if size == self._shipped_size:
            return
        with open(self.log_path, "rb") as f:
            if size > MAX_LOG_SHIP:
                f.seek(size - MAX_LOG_SHIP)
            data = f.read()
        try:
            self.store.put(f"{self.run_prefix}/logs/attempt-{self.state['attempt']}.log", data)
            self._shipped_size = size
            self._shipped_at = time.monotonic()
        except Exception as exc:  # noqa: BLE001
            log.debug("log upload failed: %s", exc)

    def start(self, every: float) -> "StatusReporter":
        def loop() -> None:
            while not self._stop.wait(every):
                self.flush(ship_log=False)
        self._thread = threading.Thread(target=loop, name="sdcloud-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
