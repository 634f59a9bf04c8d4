"""The state store hands out events parsed: kinds as members (old spellings as today's), unknown
kinds as their own strings, so readers compare with `is Kind.X` and never parse again."""

from __future__ import annotations

from sdcloud.events import Kind
from sdcloud.runs.records.state import StateStore


def test_events_come_out_of_the_store_as_members(tmp_path):
    state = StateStore(tmp_path / "state.db")
    state.create_run("r-1", "sd15-lora", {"tier": "sd15-lora"}, 10)
    state.event("r-1", Kind.RESUMED, {"attempt": 2})
    state.event("r-1", "zone_failover", {"zone": "a"})  # an old record's spelling
    state.event("r-1", "a-kind-from-a-newer-sdcloud", {"x": 1})
    got = [e["kind"] for e in state.events("r-1")]
    assert got[0] is Kind.RESUMED
    assert got[1] is Kind.FAILOVER
    assert got[2] == "a-kind-from-a-newer-sdcloud" and not isinstance(got[2], Kind)


def test_readers_of_the_store_see_an_old_spelling_as_todays_event(tmp_path):
    # A driver that takes a run over reads what was announced from rows stored as plain words.
    from sdcloud.runs.driving.owner import Memo

    state = StateStore(tmp_path / "state.db")
    state.create_run("r-1", "sd15-lora", {"tier": "sd15-lora"}, 10)
    state.event("r-1", Kind.RESUMED, {"attempt": 3})
    memo = Memo.read_back(state, "r-1")
    assert memo.seen_attempts == {3}
