"""One writer per run: a lease on the run's prefix, taken with a conditional create.

    runs/<run_id>/lease/<generation:09d>.json   {"holder", "attempt", "expires"}

The holder is the newest generation. Taking the lease is creating the next generation with
If-None-Match: * (O_EXCL, through a hard link, on a local store), so of two agents racing for it
exactly one wins. A newer generation is created only when the newest one has expired (its holder
renews `expires` every few seconds). A holder that sees a newer generation has lost the run: it
stops at once, before it writes another checkpoint. A second agent on a live run leaves without
touching checkpoints or status; an agent of a later attempt (a relaunch while the old host still
runs) first waits up to one lease period for the old one to expire.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Callable

from .store import NotFound, StoreError

log = logging.getLogger("sdcloud_agent.lease")


class LeaseHeld(Exception):
    """Another live agent holds the run."""


class Lease:
    def __init__(self, store, run_prefix: str, attempt: int, ttl: float = 60.0, holder: str | None = None):
        self.store = store
        self.prefix = f"{run_prefix}/lease/"
        self.attempt = attempt
        self.ttl = ttl
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{attempt}"
        self.generation: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _key(self, gen: int) -> str:
        return f"{self.prefix}{gen:09d}.json"

    def _doc(self) -> bytes:
        return json.dumps({"holder": self.holder, "attempt": self.attempt, "expires": time.time() + self.ttl}).encode()

    def newest(self) -> tuple[int, dict | None]:
        gens = []
        for o in self.store.list(self.prefix):
            name = o.key.rsplit("/", 1)[-1]
            if name.endswith(".json") and name[:-5].isdigit():
                gens.append(int(name[:-5]))
        if not gens:
            return 0, None
        gen = max(gens)
        try:
            return gen, json.loads(self.store.get(self._key(gen)))
        except (NotFound, ValueError):
            return gen, {"holder": "?", "attempt": 0, "expires": time.time() + self.ttl}  # being written

    def acquire(self, wait: float | None = None) -> None:
        """Take the run or raise LeaseHeld. `wait`: seconds to wait for an older attempt's lease to lapse."""
        deadline = time.time() + (self.ttl + 2 if wait is None else wait)
        while True:
            gen, cur = self.newest()
            if cur is None or cur.get("expires", 0) < time.time() or cur.get("holder") == self.holder:
                if self.store.create(self._key(gen + 1), self._doc()):
                    self.generation = gen + 1
                    log.info("took the run's lease (generation %d)", self.generation)
                    return
                continue  # someone else took gen + 1 first: look again
            older = int(cur.get("attempt") or 0) < self.attempt
            if not older or time.time() >= deadline:
                raise LeaseHeld(f"another agent ({cur.get('holder')}, attempt {cur.get('attempt')}) holds this run "
                                f"until {time.strftime('%H:%M:%S', time.gmtime(cur.get('expires', 0)))} UTC")
            log.info("the lease of attempt %s is still live; waiting for it to lapse", cur.get("attempt"))
            time.sleep(min(2.0, max(0.1, self.ttl / 10)))

    def renew(self) -> bool:
        """Extend our generation; False when a newer generation exists (we lost the run)."""
        gen, _ = self.newest()
        if gen != self.generation:
            return False
        self.store.put(self._key(gen), self._doc())
        return True

    def start(self, every: float, on_lost: Callable[[], None]) -> "Lease":
        def loop() -> None:
            while not self._stop.wait(every):
                try:
                    if not self.renew():
                        log.error("a newer agent took this run's lease: stopping without another write")
                        on_lost()
                        return
                except (StoreError, OSError) as exc:  # the next round tries again; the ttl has room
                    log.warning("lease renewal failed: %s", exc)
                except Exception as exc:  # noqa: BLE001 - boto3 errors are not StoreErrors
                    log.warning("lease renewal failed: %s", exc)
        self._thread = threading.Thread(target=loop, name="sdcloud-lease", daemon=True)
        self._thread.start()
        return self

    def release(self) -> None:
        """Expire our generation now, so that a relaunch need not wait for it."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self.generation is None:
            return
        try:
            gen, _ = self.newest()
            if gen == self.generation:
                self.store.put(self._key(gen), json.dumps({"holder": self.holder, "attempt": self.attempt,
                                                           "expires": 0}).encode())
        except Exception as exc:  # noqa: BLE001
            log.warning("lease release failed: %s", exc)
