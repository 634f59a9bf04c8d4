"""What a host agent reports in status.json that is not a phase, turned into run events.

Today: `prune_error`, set when old checkpoints could not be deleted from the bucket (they stay on
the user's storage bill). Each distinct problem becomes one event, not one per heartbeat.
"""

from __future__ import annotations

from typing import Any

PRUNE_FAILED = "prune-failed"


def report_agent_problems(controller: Any, attempt: int, status: dict | None) -> None:
    """Emit a `prune-failed` event the first time the agent reports a (new) pruning failure."""
    error = (status or {}).get("prune_error")
    last = getattr(controller, "_last_prune_error", None)
    if error and error != last:
        controller.event(PRUNE_FAILED, {"attempt": attempt, "error": str(error)[:500]})
    if status is not None:
        controller._last_prune_error = error
