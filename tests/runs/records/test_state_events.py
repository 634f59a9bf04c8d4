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


def test_run_states_are_a_named_kind_stored_as_their_words(tmp_path):
    from sdcloud.runs.records.run_state import ACTIVE_RUN_STATES, FINAL_RUN_STATES, RESUMABLE_RUN_STATES, RunState

    state = StateStore(tmp_path / "state.db")
    state.create_run("r-1", "sd15-lora", {"tier": "sd15-lora"}, 10)
    row = state.get_run("r-1")
    assert row["state"] == "pending" and RunState.of(row) is RunState.PENDING and RunState.of(row).active
    state.update_run("r-1", state=RunState.STOPPED)
    row = state.get_run("r-1")
    # The database keeps the plain word (journals and `status --json` read the same as before).
    assert type(row["state"]) is str and row["state"] == "stopped" and RunState.of(row).final
    assert not set(ACTIVE_RUN_STATES) & set(FINAL_RUN_STATES)
    assert set(ACTIVE_RUN_STATES) | set(FINAL_RUN_STATES) == set(RunState)  # every state is one or the other
    assert set(RESUMABLE_RUN_STATES) <= set(FINAL_RUN_STATES) and RunState.SUCCEEDED not in RESUMABLE_RUN_STATES
    assert "cancelled" in FINAL_RUN_STATES and "recovering" in ACTIVE_RUN_STATES  # a word from a row compares equal
