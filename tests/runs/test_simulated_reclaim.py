"""`--simulate-preemption`: the reclaim is put on its timer once per run, not once per driver. A driver
that starts again during attempt 1 (`watch --drive`, `resume`, a daemon restarted) before the
announcement schedules it anew (the old timer died with its process); one that starts after the
announcement does not announce a second reclaim. Fast: no host runs here."""

from __future__ import annotations

from types import SimpleNamespace

from sdcloud.events import Kind
from sdcloud.runs.driving import simulated_reclaim
from sdcloud.runs.driving.owner import Memo
from sdcloud.runs.records.state import StateStore


class Provider:
    """A provider that can announce a reclaim on its own host; it records what it was asked."""

    def __init__(self) -> None:
        self.scheduled: list[tuple[str, float]] = []

    def schedule_reclaim(self, instance_id: str, after_seconds: float, events=lambda k, d: None) -> None:
        self.scheduled.append((instance_id, after_seconds))


def _driver(state: StateStore, run_id: str) -> SimpleNamespace:
    return SimpleNamespace(spec=SimpleNamespace(simulate_preemption=20), memo=Memo.read_back(state, run_id),
                           event=lambda kind, data: state.event(run_id, str(kind), data))


def test_the_simulated_reclaim_is_announced_once_per_run_whichever_driver_sees_the_first_step(tmp_path):
    state = StateStore(tmp_path / "state.db")
    state.create_run("r-5151aaaa", "sd15-lora", {"provider": "local", "tier": "sd15-lora"}, 40)
    cur = SimpleNamespace(n=1, instance_id="local-1")  # the attempt as the controller sees it
    provider = Provider()

    first = _driver(state, "r-5151aaaa")
    simulated_reclaim.on_progress(first, provider, cur, 1)
    simulated_reclaim.on_progress(first, provider, cur, 2)
    assert provider.scheduled == [("local-1", 20)]

    # The first driver died before its timer fired: the next one puts the reclaim on a timer again.
    second = _driver(state, "r-5151aaaa")
    simulated_reclaim.on_progress(second, provider, cur, 5)
    assert provider.scheduled == [("local-1", 20)] * 2

    # The reclaim was announced (the run's events say so); a driver started within the notice does not
    # announce another.
    state.event("r-5151aaaa", str(Kind.RECLAIM_NOTICE), {"attempt": 1, "instance": "local-1", "simulated": True})
    third = _driver(state, "r-5151aaaa")
    simulated_reclaim.on_progress(third, provider, cur, 9)
    assert provider.scheduled == [("local-1", 20)] * 2
    # Nor does any driver of a later attempt.
    later = _driver(state, "r-5151aaaa")
    later.memo.reclaim_scheduled = False
    simulated_reclaim.on_progress(later, provider, SimpleNamespace(n=2, instance_id="local-2"), 12)
    assert len(provider.scheduled) == 2
