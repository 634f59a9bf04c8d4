"""What the controller's helpers may ask of the driver they serve: the owner contract.

`hostboot`, `oom_move`, `health_view` and `agent_reports` act for a run's driver (the training
run's `Controller`, a batch job's `BatchController`): they record events, end an attempt or the
run, and remember what they saw between steps. They do it through `RunOwner`, never through the
driver's private members, and what they remember lives in the driver's `Memo`, the one place that
lists it, instead of attributes set on the driver from outside.

Nothing in a `Memo` is written to the state store: a driver that starts again (another process,
the cloud driver's next invocation) learns each again, at the cost noted beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ...events import HOST_GONE, Kind

if TYPE_CHECKING:
    from ...fleet.lifecycle import Fleet, Timing
    from ...offers.optimizer import Offer
    from ...providers.base import LaunchSpec
    from ..records.run_state import RunState
    from ..records.state import Attempt, StateStore


@dataclass
class Memo:
    """What a driver learned while it drives, kept for its later steps."""

    # The local dataset's folder in the bucket (a new driver lists the bucket and sends what is missing).
    dataset_url: str | None = None
    # The local base model's cache reference in the bucket (a new driver hashes the model again).
    model_ref: str | None = None
    # The offer being launched: its price bounds the host's lifetime cap (the agent config's self_end).
    launch_offer: Offer | None = None
    # What the latest launch carried (its root volume is priced in the cost ledger).
    launched_spec: LaunchSpec | None = None
    # The budget shares already warned about; None until read back from the run's events.
    budget_warned: set[int] | None = None
    # The simulated reclaim (--simulate-preemption, runs/driving/simulated_reclaim.py) is on its timer.
    reclaim_scheduled: bool = False
    # Attempts whose training was first seen (a resume is announced once per attempt; read_back seeds it).
    seen_attempts: set[int] = field(default_factory=set)
    # (attempt, rung) of the out-of-memory retries already recorded (runs/driving/oom_move.py).
    oom_seen: set[tuple[int, Any]] = field(default_factory=set)
    # (attempt, verdict, time) of the last health event (runs/driving/health_view.py).
    health_last: tuple[int, str, float] | None = None
    # (attempt, n, "action" | "recheck") of the host's health actions already recorded (health_view.py).
    health_acted: set[tuple[int, int, str]] = field(default_factory=set)
    # Attempts whose throttling was weighed against a move (runs/driving/oom_move.py): once each.
    throttle_weighed: set[int] = field(default_factory=set)
    # The agent's last pruning error (runs/driving/agent_reports.py): each new one is one event.
    prune_error: str | None = None
    # Since when the store has been unreachable, and when that was last said (runs/driving/hostboot.py).
    store_down_since: float | None = None
    store_noted: float = 0.0
    # The run's rate book (sdcloud speeds), read once from the state store (runs/driving/lessons.py).
    rate_book: Any = None

    @classmethod
    def read_back(cls, state: StateStore, run_id: str) -> "Memo":
        """A new driver's memo, with what the run's history already says: the attempts whose resume
        was announced (a driver that takes the run over, or merely continues it, does not announce
        them again), and whether the simulated reclaim was."""
        memo = cls()
        events = state.events(run_id)
        memo.seen_attempts = {int(e["data"]["attempt"]) for e in events
                              if e["kind"] is Kind.RESUMED and str(e["data"].get("attempt", "")).isdigit()}
        # A simulated reclaim already announced is not announced again by a driver that restarts
        # within the notice; one whose driver died before announcing it is put on a new timer.
        memo.reclaim_scheduled = any(e["kind"] is Kind.RECLAIM_NOTICE and e["data"].get("simulated")
                                     for e in events)
        return memo


def steps_before(state: StateStore, run: dict, n: int) -> int:
    """The furthest step the attempts before attempt `n` reached, as they were seen (the cost ledger's
    last training step of each, the step their host reported when it was reclaimed or lost); the
    run's step when none was seen. A resume's lost steps are counted from it: the figure of the
    moment it happened, whichever driver records it and whenever (not the run's step by then).
    `run`: the run's row, as the step read it."""
    run_id = run["id"]
    seen = [int(c["last_step"]) for k, c in state.attempt_costs(run_id).items()
            if k < n and c.get("last_step") is not None]
    seen += [int(e["data"]["step"]) for e in state.events(run_id)
             if e["kind"] in HOST_GONE and str(e["data"].get("step", "")).isdigit()
             and int(e["data"].get("attempt") or 0) < n]
    if seen:
        return max(seen)
    return int(run["step"] or 0)


class RunOwner(Protocol):
    """A run's (or a batch job's) driver, as its helpers see it."""

    state: StateStore
    spec: Any  # a training run's RunSpec; a batch job's spec dict
    memo: Memo
    fleet: Fleet
    timing: Timing

    @property
    def run_id(self) -> str: ...

    def event(self, kind: Kind, data: dict | None = None) -> None: ...

    def attempts(self) -> list[Attempt]: ...

    def end_attempt(self, cur: Attempt, reason: str) -> None:
        """End the host of attempt `cur` for `reason` (and price it, for a training run)."""

    def end_run(self, state: RunState, reason: str | None) -> None:
        """End the run (or job) in `state` with one line of `reason`."""

    def set_state(self, state: RunState) -> None:
        """Put the run (or job) in `state` ('recovering'): through its driver, so that what the
        driver read of the run this step stays current (runs/driving/run_row.py)."""
