"""Who drives a run: a lease in the run's bucket that exactly one driver holds at a time.

A driver is anything that takes controller steps: `sdcloud up` in the foreground, its `--detach`
daemon, or the scheduled function in the user's account (sdcloud.runs.unattended). Each step
renews the lease; a driver whose renewal fails has lost the run and stops acting before its next
step. The lease is the batch items' lease (sdcloud_agent.batch.lease) on the object
`runs/<id>/leases/driver.json`: create-only to claim, compare-and-swap to renew and hand over, and
on COS (no compare-and-swap) one create-only object per lease term. Its time to live is several
polls, so a laptop that goes away passes its runs on within minutes (`LEASE_POLLS`).

One refinement for the common restart: a lease held by a process of this same machine that no
longer exists (a controller killed with -9, a reboot) is expired at once, so `sdcloud resume` right
after a crash does not wait for the lease to lapse.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Callable

from sdcloud_agent.batch.lease import Lease, Leases

from ..errors import UserError

LEASE_ITEM = "driver"
# The lease outlives this many polls without a renewal (and at least a minute).
LEASE_POLLS = 6
MIN_LEASE_SECONDS = 60.0


def this_driver() -> str:
    """The name this process drives under: machine and pid (a laptop, a daemon), or the function's."""
    fn = os.environ.get("SDCLOUD_DRIVER")
    if fn:
        return fn
    return f"{socket.gethostname()}:{os.getpid()}"


def _dead_here(worker: str) -> bool:
    """A lease holder that was a process of this machine which is gone (or a zombie)."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


class _DriverLeases(Leases):
    take_over = False  # the user asked this driver to take the run (sdcloud watch RUN --drive)

    def live(self, held: dict, now: float) -> bool:
        if self.take_over or not super().live(held, now):
            return False
        worker = str(held.get("worker", ""))
        # The same named driver (the cloud function's previous invocation) takes its own lease over;
        # a process of this machine that is gone holds nothing.
        return not (worker == self.worker or _dead_here(worker))


class DriverLease:
    """The run's driver lease as this process holds it (or not)."""

    def __init__(self, store: Any, run_id: str, poll_seconds: float, driver: str | None = None,
                 clock: Callable[[], float] = time.time):
        self.run_id = run_id
        self.driver = driver or this_driver()
        self.ttl = max(MIN_LEASE_SECONDS, LEASE_POLLS * poll_seconds)
        self._leases = _DriverLeases(store, f"runs/{run_id}", self.driver, ttl=self.ttl, clock=clock)
        self._held: Lease | None = None

    @property
    def held(self) -> bool:
        return self._held is not None

    def holder(self) -> dict | None:
        return self._leases.holder(LEASE_ITEM)

    def acquire(self, take_over: bool = False) -> bool:
        """Take the run if no other driver holds a live lease on it; with `take_over`, even if one
        does (an explicit ask of the user's: the other driver's next renewal fails and it stops)."""
        if self._held is None:
            self._leases.take_over = take_over
            try:
                self._held = self._leases.claim(LEASE_ITEM)
            finally:
                self._leases.take_over = False
        return self._held is not None

    def acquire_or_refuse(self, take_over: bool = False) -> None:
        if not self.acquire(take_over):
            held = self.holder() or {}
            left = max(0, int(float(held.get("expires_at", 0)) - time.time()))
            raise UserError(f"run {self.run_id} is driven by {held.get('worker', 'another driver')} "
                            f"(its lease runs {left} s more); follow it with: sdcloud watch {self.run_id}, "
                            f"or drive it from here with: sdcloud watch {self.run_id} --drive")

    def renew(self) -> bool:
        """Before each step: False when another driver has taken the run (then act no more)."""
        if self._held is None:
            return False
        if not self._leases.renew(self._held):
            self._held = None
            return False
        return True

    def release(self) -> None:
        """Hand the run over at once (the run ended, or this driver stops driving it)."""
        if self._held is not None:
            self._leases.release(self._held)
            self._held = None
