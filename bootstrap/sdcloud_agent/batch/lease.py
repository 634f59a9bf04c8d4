"""Leases on work items: claim with a create-only write, renew and hand over with compare-and-swap.

A lease object holds the owner, a random token and an expiry (wall-clock seconds). A worker owns
an item while its token is the one in the object and the expiry has not passed. Only the writer of
the ETag it last saw can replace the object, so of many racing claimers exactly one wins.

The lease saves work; it does not guard correctness. Images and done markers are create-only, so
even two workers on one item (a store without compare-and-swap, a worker whose clock is wrong)
make each image once; the loser's writes are refused and it records nothing.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from . import layout


@dataclass
class Lease:
    item: str
    worker: str
    token: str
    etag: str
    expires_at: float
    attempt: int


class Leases:
    def __init__(self, store: Any, job: str, worker: str, ttl: float = 60.0,
                 clock: Callable[[], float] = time.time):
        self.store, self.job, self.worker, self.ttl, self.clock = store, job, worker, ttl, clock

    def _body(self, item: str, token: str, attempt: int, expires_at: float, released: bool = False) -> bytes:
        return json.dumps({"item": item, "worker": self.worker, "token": token, "attempt": attempt,
                           "expires_at": round(expires_at, 3), "released": released}).encode()

    def claim(self, item: str) -> Lease | None:
        """Take the item if nobody holds a live lease on it; None when someone does or a racer won."""
        key = layout.lease_key(self.job, item)
        token = uuid.uuid4().hex
        expires = self.clock() + self.ttl
        # Most items were never claimed: try the create first, one request on the common path.
        etag = self.store.put_if_absent(key, self._body(item, token, 1, expires))
        if etag:
            return Lease(item, self.worker, token, etag, expires, 1)
        current = self.store.get_versioned(key)
        if current is None:  # released by deletion in between: a later pass tries again
            return None
        data, seen = current
        try:
            held = json.loads(data)
        except ValueError:  # a torn or foreign object: treat as expired, the swap still guards it
            held = {"expires_at": 0, "attempt": 0}
        if not held.get("released") and float(held.get("expires_at", 0)) > self.clock():
            return None
        attempt = int(held.get("attempt", 0)) + 1
        etag = self.store.put_if_match(key, self._body(item, token, attempt, expires), seen)
        return Lease(item, self.worker, token, etag, expires, attempt) if etag else None

    def renew(self, lease: Lease) -> bool:
        """Push the expiry out; False when the lease was lost (it expired and another worker took it)."""
        expires = self.clock() + self.ttl
        etag = self.store.put_if_match(layout.lease_key(self.job, lease.item),
                                       self._body(lease.item, lease.token, lease.attempt, expires), lease.etag)
        if etag is None:
            return False
        lease.etag, lease.expires_at = etag, expires
        return True

    def release(self, lease: Lease) -> bool:
        """Give the item back at once (a reclaim notice), so the next worker need not wait for expiry."""
        etag = self.store.put_if_match(layout.lease_key(self.job, lease.item),
                                       self._body(lease.item, lease.token, lease.attempt, 0, released=True), lease.etag)
        return etag is not None
