"""Lease ages in `status` and `watch` come from the lease's own expiry, never from zero (issue 46): a
lease its holder handed back is written with expires_at 0, and its "age" counted from 0 was printed
as `lapsed 1796391789 s ago` (57 years). Handed back says so; a lapsed lease says how long ago."""

from __future__ import annotations

import time

from sdcloud.runs.records.lease import DriverLease, Holder, driving_line, holder
from sdcloud_agent.store import LocalStore

RUN = "r-a9e50001"


def test_a_lease_handed_back_is_said_so_without_an_age(tmp_path):
    store = LocalStore(tmp_path / "bucket")
    lease = DriverLease(store, RUN, 5.0, "laptop")
    assert lease.acquire()
    lease.release()
    h = holder(store, RUN)
    line = driving_line(h, RUN)
    assert line.endswith("handed it back") and "lapsed" not in line, line
    assert not h.live and h.released and h.expires_in == 0.0


def test_a_lapsed_lease_says_how_long_ago_from_its_own_expiry():
    now = time.time()
    h = Holder.of({"worker": "laptop:host-1:4242", "expires_at": now - 30.0}, now)
    assert not h.live and driving_line(h, RUN).endswith("lapsed 30 s ago")
    h = Holder.of({"worker": "laptop:host-1:4242", "expires_at": now + 12.0}, now)
    assert h.live and "lease runs 12 s more" in driving_line(h, RUN)
