"""An end asked through the bucket (sdcloud_agent/end_request.py): the host of that attempt takes it
as a notice, saves, reports `preempted` with `ended_by: driver` (not a reclaim), and ends."""

from __future__ import annotations

from sdcloud_agent.end_request import EndRequestWatcher, ask, end_key
from sdcloud_agent.store import LocalStore


def test_only_the_asked_attempt_sees_the_notice(tmp_path):
    store = LocalStore(tmp_path / "bucket")
    mine, other = EndRequestWatcher(store, "runs/r-1", 2), EndRequestWatcher(store, "runs/r-1", 3)
    assert mine.check() == [] and other.check() == []
    seen = []
    mine.on_asked = seen.append
    ask(store, "runs/r-1", 2, "laptop-b:7", "stopped by sdcloud down")
    assert end_key("runs/r-1", 2) == "runs/r-1/end/2.json"
    [notice] = mine.check()
    assert notice.kind == "terminate" and notice.deadline > notice.received
    assert "asked to end by laptop-b:7: stopped by sdcloud down" == notice.detail
    assert seen and seen[0]["attempt"] == 2
    assert other.check() == [], "a later attempt is not ended by its predecessor's request"
