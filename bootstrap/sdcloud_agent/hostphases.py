"""The agent's own boot phases (model, dataset, first step), appended to the phases file the
user-data started and reported to the bucket in the same boot report (`boot/attempt-<n>.json`).

Only on a host booted by the user-data (it sets SDCLOUD_BOOT_DIR in the agent's unit); elsewhere
(local and SSH hosts) every call here does nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

from . import s3lite

log = logging.getLogger("sdcloud_agent.phases")


class _Phase:
    result = "ok"


class AgentPhases:
    def __init__(self, store, cfg):
        d = os.environ.get("SDCLOUD_BOOT_DIR")
        self.dir = Path(d) if d else None
        self.log_file = os.environ.get("SDCLOUD_BOOT_LOG", "")
        self.store = store
        self.cfg = {"run_id": cfg.run_id, "attempt": cfg.attempt, "steps": cfg.steps}
        self.started = time.time()
        self._first_step = False

    @property
    def enabled(self) -> bool:
        return self.dir is not None

    def record(self, name: str, seconds: float, result: str) -> None:
        """A phase timed elsewhere (the checkpoint restore runs beside the staging phases)."""
        self._record(name, seconds, result)

    def _record(self, name: str, seconds: float, result: str) -> None:
        if self.dir is None:
            return
        from .boot import record

        record(self.dir, name, seconds, result)
        self.report()

    def report(self, failed: str | None = None) -> None:
        try:
            s3lite.report(self.store.put, self.cfg, str(self.dir / "phases.jsonl"), self.log_file, failed,
                          reason="written by the agent" if failed else "")
        except Exception as exc:  # noqa: BLE001 - the report is best effort; status.json is not
            log.warning("boot report upload failed: %s", exc)

    @contextlib.contextmanager
    def phase(self, name: str):
        t0, ph = time.monotonic(), _Phase()
        yield ph
        self._record(name, time.monotonic() - t0, ph.result)

    def failed(self, name: str) -> None:
        if self.dir is not None:
            from .boot import record

            record(self.dir, name, 0.0, "failed")
            self.report(failed=name)

    def first_step(self) -> None:
        if not self._first_step:
            self._first_step = True
            self._record("first-step", time.time() - self.started, "ok")
