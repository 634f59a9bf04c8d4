"""Leases on work items: claim with a create-only write, renew and hand over with compare-and-swap.

A lease object holds the owner, a random token and an expiry (wall-clock seconds). A worker owns
an item while its token is the one in the object and the expiry has not passed. Only the writer of
the ETag it last saw can replace the object, so of many racing claimers exactly one wins.

A store without compare-and-swap (COS: it ignores If-Match on PUT) gets the same one-winner takeover
from create-only writes alone: attempt n of an item's lease is its own object (`<item>.json` for the
first, `<item>.json.<n>` after), and taking over an expired attempt n means creating attempt n+1,
which exactly one claimer can do. The owner renews or releases by rewriting its own attempt's
object, after checking that no later attempt exists; a renewal that finds one has lost the lease.
(The check and the rewrite are two requests: a takeover landing between them leaves two workers on
one item until the old owner's next renewal, which then fails. That costs work, never an image.)

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
        self.cas = bool(getattr(store, "compare_and_swap", True))

    def _key(self, item: str, attempt: int = 1) -> str:
        """The object of one attempt's lease (with compare-and-swap every attempt rewrites the first)."""
        base = layout.lease_key(self.job, item)
        return base if self.cas or attempt <= 1 else f"{base}.{attempt}"

    def _latest(self, item: str) -> int:
        """The newest attempt of an item's lease on a store without compare-and-swap (one LIST)."""
        base = layout.lease_key(self.job, item)
        n = 1
        for o in self.store.list(base):
            tail = o.key.removeprefix(base)
            if tail.startswith(".") and tail[1:].isdigit():
                n = max(n, int(tail[1:]))
        return n

    def live(self, held: dict, now: float) -> bool:
        """Whether a lease body still keeps others out: not released and not expired. The hook for
        a lease that lapses on more (the run's driver lease: a holder that is gone, a take-over)."""
        return not held.get("released") and float(held.get("expires_at", 0)) > now

    def _live(self, data: bytes, now: float) -> tuple[bool, dict]:
        try:
            held = json.loads(data)
        except ValueError:  # a torn or foreign object: treat as expired, the swap still guards it
            held = {"expires_at": 0, "attempt": 0}
        return self.live(held, now), held

    def holder(self, item: str) -> dict | None:
        """The item's current lease body, or None when it was never claimed."""
        current = self.store.get_versioned(self._key(item, 1 if self.cas else self._latest(item)))
        return json.loads(current[0]) if current else None

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
        if not self.cas:
            # No compare-and-swap: take over by creating the next attempt's object (one winner).
            latest = self._latest(item)
            current = self.store.get_versioned(self._key(item, latest))
            if current is None or self._live(current[0], self.clock())[0]:
                return None
            etag = self.store.put_if_absent(self._key(item, latest + 1), self._body(item, token, latest + 1, expires))
            return Lease(item, self.worker, token, etag, expires, latest + 1) if etag else None
        current = self.store.get_versioned(key)
        if current is None:  # released by deletion in between: a later pass tries again
            return None
        data, seen = current
        live, held = self._live(data, self.clock())
        if live:
            return None
        attempt = int(held.get("attempt", 0)) + 1
        etag = self.store.put_if_match(key, self._body(item, token, attempt, expires), seen)
        return Lease(item, self.worker, token, etag, expires, attempt) if etag else None

    def _rewrite_own(self, lease: Lease, body: bytes) -> bool:
        """Without compare-and-swap: rewrite our attempt's object unless a later attempt exists."""
        if self.store.head(self._key(lease.item, lease.attempt + 1)) is not None:
            return False
        self.store.put(self._key(lease.item, lease.attempt), body)
        return True

    def renew(self, lease: Lease) -> bool:
        """Push the expiry out; False when the lease was lost (it expired and another worker took it)."""
        expires = self.clock() + self.ttl
        if not self.cas:
            if not self._rewrite_own(lease, self._body(lease.item, lease.token, lease.attempt, expires)):
                return False
            lease.expires_at = expires
            return True
        etag = self.store.put_if_match(layout.lease_key(self.job, lease.item),
                                       self._body(lease.item, lease.token, lease.attempt, expires), lease.etag)
        if etag is None:
            return False
        lease.etag, lease.expires_at = etag, expires
        return True

    def release(self, lease: Lease) -> bool:
        """Give the item back at once (a reclaim notice), so the next worker need not wait for expiry."""
        if not self.cas:
            return self._rewrite_own(lease, self._body(lease.item, lease.token, lease.attempt, 0, released=True))
        etag = self.store.put_if_match(layout.lease_key(self.job, lease.item),
                                       self._body(lease.item, lease.token, lease.attempt, 0, released=True), lease.etag)
        return etag is not None
