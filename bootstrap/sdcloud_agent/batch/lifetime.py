"""How long a batch worker host may live, and whether its job still has a driver.

Two bounds beside the self-end grace (selfend.py), for a host whose driver may be gone:

- A lifetime cap: the job's deadline plus a margin, or twice its estimate plus two hours
  (selfend.lifetime_cap over the agent config's `self_end`). At the cap the worker stops claiming,
  hands its item back (its lease is released, another worker or a later host redoes it) and the
  host ends at once: nobody's mistake bills past it.
- Attendance: the job's driver writes `runs/<job>/controller.json` ({"time", "driver", "every_s"})
  each time it looks at the job: the laptop every poll, the cloud driver once a schedule period
  (five minutes). A heartbeat older than MISSED_LOOKS of its own period (and the config's
  `unattended_after_s`) means nobody drives the job. A job handed to the cloud driver therefore
  keeps its workers working between the function's invocations; a job whose driver is gone with
  no cloud driver to take it has nobody to end its hosts, so its workers stop after the grace.

Standard library only (the host agent never imports the control plane).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

from ..selfend import SelfEnd, controller_key, lifetime_cap

# Looks of its own period a driver may miss before its job counts as having none.
MISSED_LOOKS = 4
CHECK_EVERY_S = 5.0


class DriverWatch:
    """Whether the job has a driver, from its heartbeat (selfend.finish reads `unattended`)."""

    def __init__(self, store: Any, run_prefix: str, after_s: float | None, started: float,
                 clock: Callable[[], float] = time.time):
        self.store, self.run_prefix, self.after_s = store, run_prefix, after_s
        self.started, self.clock = started, clock

    def unattended(self, force: bool = False) -> bool:
        if self.after_s is None or self.store is None:
            return False
        now = self.clock()
        try:
            doc = json.loads(self.store.get(controller_key(self.run_prefix)))
            age, every = now - float(doc["time"]), float(doc.get("every_s") or 0.0)
        except Exception:  # noqa: BLE001 - none yet, or unreadable: judged by how long this host waited
            return now - self.started > self.after_s
        return age > max(self.after_s, MISSED_LOOKS * every)


class Lifetime:
    """Stops `stop` (the worker's flag) at the lifetime cap, or after the grace without a driver;
    `reason` then says which (None: the worker ended on its own)."""

    def __init__(self, se: SelfEnd, watch: DriverWatch, stop: threading.Event, started: float,
                 clock: Callable[[], float] = time.time, every: float = CHECK_EVERY_S,
                 log: Callable[[str], None] = lambda msg: None):
        self.se, self.watch, self.stop, self.clock, self.every, self.log = se, watch, stop, clock, every, log
        cap, self.why = lifetime_cap(se)
        self.ends_at = (se.launched_at if se.launched_at is not None else started) + cap
        self.reason: str | None = None
        self._gone_since: float | None = None
        self._done = threading.Event()

    def check(self) -> str | None:
        """One look: the reason to stop now, or None."""
        now = self.clock()
        if self.se.ends_machine and now >= self.ends_at:
            return f"lifetime cap reached ({self.why})"
        if self.watch.unattended():
            self._gone_since = self._gone_since if self._gone_since is not None else now
            if now - self._gone_since >= self.se.grace_s:
                return f"the job has had no driver for {self.se.grace_s:.0f} s"
        else:
            self._gone_since = None
        return None

    def _loop(self) -> None:
        while not self._done.is_set() and not self.stop.is_set():
            reason = self.check()
            if reason:
                self.reason = reason
                self.log(f"{reason}: stopping; the current item's lease is handed back")
                self.stop.set()
                return
            self._done.wait(self.every)

    def start(self) -> "Lifetime":
        threading.Thread(target=self._loop, name="sdcloud-batch-lifetime", daemon=True).start()
        return self

    def close(self) -> None:
        self._done.set()
