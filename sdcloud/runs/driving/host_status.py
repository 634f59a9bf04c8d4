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
from ..records.state import Attempt, StateStore
from ..records.nodes_view import group_status


def status_key(run_id: str) -> str:
    return f"runs/{run_id}/status.json"


class HostStatusOwner(Protocol):
    """What HostStatus reads of the controller that holds it (at each call: the store may change)."""

    run_id: str
    state: StateStore
    store: Any
    timing: Any

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

    def note_self_end(self, cur: Attempt, status: dict | None) -> float | None:
        """A host that ended itself: one event with its reason; the time its billing stopped."""
        se = (status or {}).get("self_end")
        if not isinstance(se, dict) or status.get("attempt") != cur.n:
            return None
        if not any(e["kind"] is Kind.SELF_ENDED and e["data"].get("attempt") == cur.n
                   for e in self.owner.state.events(self.owner.run_id)):
            self.owner.event(Kind.SELF_ENDED, {"attempt": cur.n, "reason": se.get("reason"), "action": se.get("action"),
                                         "unattended": bool(se.get("unattended")), "at": se.get("at"),
                                         "error": se.get("error")})
        return float(se["at"]) if se.get("at") and not se.get("error") else None

    def read_status(self, strict: bool = False) -> dict | None:
        """The host's status.json; None when absent. `strict`: a store that cannot be read raises
        (the step is tried again) rather than passing for a host that never reported."""
        from sdcloud_agent.store import NotFound, StoreError

        try:
            doc = json.loads(self.owner.store.get(status_key(self.owner.run_id)))
            nodes = int(getattr(getattr(self.owner, "spec", None), "nodes", 1) or 1)
            return doc if nodes <= 1 else group_status(doc, self.owner.store, self.owner.run_id, nodes)
        except (NotFound, ValueError):
            return None
        except (StoreError, OSError):
            if strict:
                raise
            return None
