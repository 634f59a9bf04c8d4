"""What a host agent reports in status.json that is not a phase, turned into run events.

Today: `prune_error`, set when old checkpoints could not be deleted from the bucket (they stay on
the user's storage bill). Each distinct problem becomes one event, not one per heartbeat.
"""

from __future__ import annotations

from ...events import Kind
from .owner import RunOwner

PRUNE_FAILED = Kind.PRUNE_FAILED


def report_agent_problems(controller: RunOwner, attempt: int, status: dict | None) -> None:
    """Emit a `prune-failed` event the first time the agent reports a (new) pruning failure."""
    error = (status or {}).get("prune_error")
    if error and error != controller.memo.prune_error:
        controller.event(Kind.PRUNE_FAILED, {"attempt": attempt, "error": str(error)[:500]})
    if status is not None:
        controller.memo.prune_error = error
