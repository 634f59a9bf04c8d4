"""What the controller reads of its host, and what it tells the host: status.json, a self-end, and the
controller's own heartbeat in the bucket (the host's `unattended` reads it).

The Controller (runs/driving/controller.py) holds one HostStatus (`ctl.host`), so that the controller
holds the run's steps and this module the two sides of the bucket the host and the controller
share; what it reads of the controller is HostStatusOwner.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Protocol

from ...events import Kind
from ...offers.groups import node_count
from ..records.state import Attempt, StateStore
from ..records.nodes_view import group_status


# The attempt ends whose run quotes a checkpoint step afterwards (settle_step).
SETTLED_ENDS = ("stopped", "budget", "failed", "lifetime-cap")
# An attempt this driver ended while its host trained, in words (the stop's own words win).
DRIVER_ENDS = {"stopped": "stopped", "budget": "the run's budget was reached",
               "switched": "the run moved to another offer"}


def driver_words(ended_for: tuple[str, str | None] | None) -> str | None:
    """Why this driver ended an attempt, for `logs`; None when the host ended on its own account."""
    if not ended_for or ended_for[0] not in DRIVER_ENDS:
        return None
    return ended_for[1] or DRIVER_ENDS[ended_for[0]]


def status_key(run_id: str) -> str:
    return f"runs/{run_id}/status.json"


class HostStatusOwner(Protocol):
    """What HostStatus reads of the controller that holds it (at each call: the store may change)."""

    run_id: str
    state: StateStore
    store: Any
    timing: Any
    spec: Any  # the run's RunSpec: its `nodes` (offers.groups.node_count)

    emit: Callable[[Kind, dict], None]  # what the user sees of the run, beside its events

    def event(self, kind: Kind, data: dict | None = None) -> None: ...


class HostStatus:
    """The Controller's side of the host's reports, and its heartbeat to the host."""

    def __init__(self, owner: HostStatusOwner):
        self.owner = owner

    def heartbeat(self) -> None:
        """runs/<id>/controller.json: someone drives this run (the host's `unattended` reads it)."""
        doc = {"time": time.time(), "pid": os.getpid(), "poll_seconds": self.owner.timing.poll_seconds}
        try:
            self.owner.store.put(f"runs/{self.owner.run_id}/controller.json", json.dumps(doc).encode())
        except Exception as exc:  # noqa: BLE001 - a missed heartbeat is not worth dying for
            self.owner.emit(Kind.HEARTBEAT_FAILED, {"error": str(exc)})

    def note_self_end(self, cur: Attempt, status: dict | None,
                      ended_for: tuple[str, str | None] | None = None) -> float | None:
        """A host that ended itself: one event with its reason; the time its billing stopped. A host
        this driver ended (`ended_for`: a stop, the budget, a move) is said to have ended
        for that, in the run's words: the host itself cannot tell a stop from any shutdown."""
        se = (status or {}).get("self_end")
        if not isinstance(se, dict) or status.get("attempt") != cur.n:
            return None
        if not any(e["kind"] is Kind.SELF_ENDED and e["data"].get("attempt") == cur.n
                   for e in self.owner.state.events(self.owner.run_id)):
            by = driver_words(ended_for)
            self.owner.event(Kind.SELF_ENDED, {"attempt": cur.n, "reason": se.get("reason"), "action": se.get("action"),
                                         "unattended": bool(se.get("unattended")), "at": se.get("at"),
                                         "error": se.get("error"), **({"ended_by": by} if by else {})})
        return float(se["at"]) if se.get("at") and not se.get("error") else None

    def settle_step(self, cur: Attempt, status: dict | None, ended_for: tuple[str, str | None] | None) -> None:
        """The run's step once this driver ended its attempt (a stop, the budget, a failure): the step
        of its durable checkpoint, which stop messages and `resume` quote. The host's own last
        report where it reached `preempted` (after its save on the stop); else the newest complete
        checkpoint in the bucket (a host still saving as its instance goes: the one known now),
        never the last progress step seen, which may be ahead of any checkpoint or behind the save."""
        if not ended_for or ended_for[0] not in SETTLED_ENDS:
            return
        step = None
        if status and status.get("attempt") == cur.n and status.get("phase") == "preempted":
            step = status.get("step")
        if step is None:
            from sdcloud_agent import manifest
            from sdcloud_agent.store import StoreError

            try:
                newest = manifest.newest_complete(self.owner.store, f"runs/{self.owner.run_id}")
            except (StoreError, OSError, ValueError):
                return
            step = newest.step if newest is not None else None
        if step is not None:
            self.owner.state.update_run(self.owner.run_id, step=int(step))

    def read_status(self, strict: bool = False) -> dict | None:
        """The host's status.json; None when absent. `strict`: a store that cannot be read raises
        (the step is tried again) rather than passing for a host that never reported."""
        from sdcloud_agent.store import NotFound, StoreError

        try:
            doc = json.loads(self.owner.store.get(status_key(self.owner.run_id)))
            nodes = node_count(self.owner.spec)
            return doc if nodes <= 1 else group_status(doc, self.owner.store, self.owner.run_id, nodes)
        except (NotFound, ValueError):
            return None
        except (StoreError, OSError):
            if strict:
                raise
            return None
