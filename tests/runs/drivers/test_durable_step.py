"""The step a stopped run quotes is its last durable checkpoint's (runs/driving/host_status.py
`settle_step`), and the host's end after a stop is told as the stop, not as a reclaim (`logs`).

A stop message said "checkpoint kept at step 29" while the host, saving on that stop, had made
step 32 durable: the run kept the last progress step the controller saw. Fast: a file bucket, one
manifest written by the agent's own module, rows; no trainer."""

from __future__ import annotations

import json
import time

import pytest

from sdcloud.events import Kind, WORDS
from sdcloud.runs.driving.host_status import HostStatus
from sdcloud.runs.records.state import StateStore
from sdcloud_agent import manifest
from sdcloud_agent.store import open_store

RUN = "r-d0ab1e00"


class _Owner:
    """What HostStatus reads of its controller."""

    def __init__(self, state, store):
        self.run_id, self.state, self.store = RUN, state, store
        self.events: list[tuple[Kind, dict]] = []

    def emit(self, kind, data):
        pass

    def event(self, kind, data=None):
        self.events.append((kind, data or {}))
        self.state.event(self.run_id, kind, data or {})


@pytest.fixture
def host(sdcloud_home, tmp_path):
    state = StateStore()
    state.create_run(RUN, "sd15-lora", {"tier": "sd15-lora", "provider": "local"}, 400)
    state.update_run(RUN, state="running", step=29)  # the last progress the controller saw
    state.add_attempt(RUN, 1, "local", "tok1")
    store = open_store((tmp_path / "bucket").as_uri())
    return HostStatus(_Owner(state, store)), state, store, tmp_path


def _durable(store, tmp_path, step: int) -> None:
    folder = tmp_path / f"ck-{step}"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"w" * 8)
    prefix = manifest.checkpoint_prefix(f"runs/{RUN}", step)
    store.put(f"{prefix}/weights.bin", b"w" * 8)
    manifest.write(store, f"runs/{RUN}", manifest.build(folder, step))


def _attempt(state):
    return state.attempts(RUN)[0]


def test_a_host_that_saved_on_the_stop_gives_its_durable_step(host):
    hs, state, store, tmp = host
    _durable(store, tmp, 20)
    status = {"attempt": 1, "phase": "preempted", "step": 32}  # its report after the save on the stop
    hs.settle_step(_attempt(state), status, ("stopped", "stopped by sdcloud down"))
    assert state.get_run(RUN)["step"] == 32
    from sdcloud.verbs.stop_words import ended_line

    state.update_run(RUN, state="stopped", reason="stopped by sdcloud down")
    assert "checkpoint kept at step 32;" in ended_line(state.get_run(RUN))


def test_a_host_still_saving_as_it_goes_gives_the_newest_checkpoint_in_the_bucket(host):
    """Terminated on a cloud, the host saves while its instance goes: the step known durable now,
    never the progress step (29), which no checkpoint holds."""
    hs, state, store, tmp = host
    _durable(store, tmp, 20)
    hs.settle_step(_attempt(state), {"attempt": 1, "phase": "training", "step": 29}, ("budget", None))
    assert state.get_run(RUN)["step"] == 20


@pytest.mark.parametrize("ended_for", [None, ("succeeded", None), ("switched", None)])
def test_other_ends_keep_the_step(host, ended_for):
    hs, state, store, tmp = host
    _durable(store, tmp, 20)
    hs.settle_step(_attempt(state), {"attempt": 1, "phase": "preempted", "step": 32}, ended_for)
    assert state.get_run(RUN)["step"] == 29


def test_the_hosts_end_after_a_stop_is_told_as_the_stop(host):
    hs, state, _, _ = host
    status = {"attempt": 1, "phase": "preempted", "step": 32,
              "self_end": {"reason": "saved as the host was shut down", "action": "agent-exit", "at": time.time()}}
    hs.note_self_end(_attempt(state), status, ("stopped", "stopped by sdcloud down"))
    kind, data = hs.owner.events[-1]
    said = WORDS[kind](data)
    assert said == "attempt 1: the host ended (stopped by sdcloud down)"
    assert "reclaim" not in json.dumps(data) and "itself" not in said


def test_a_host_that_ended_on_its_own_says_so(host):
    hs, state, _, _ = host
    status = {"attempt": 1, "phase": "succeeded",
              "self_end": {"reason": "succeeded", "action": "agent-exit", "at": time.time(), "unattended": True}}
    hs.note_self_end(_attempt(state), status, ("succeeded", None))
    kind, data = hs.owner.events[-1]
    assert WORDS[kind](data) == "attempt 1: the host ended itself (succeeded, nobody driving the run)"
