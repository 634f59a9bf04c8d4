"""How AWS Lambda calls the cloud driver (TRAITS.function.entry): which events are its, the time an
invocation has left, its request id, the handler the stack names, and what the package needs for it.

Lambda invokes `handler(event, context)` with the EventBridge Scheduler schedule's input (the stack
sets `{"sdcloud": "drive"}`; a batch schedule `{"sdcloud": "batch-fire", ...}`) or a classic
EventBridge rule's `Scheduled Event` envelope, and a context object whose
`get_remaining_time_in_millis()` bounds the invocation.
"""

from __future__ import annotations

from typing import Any, Callable

# The function's handler as the stack names it (stacks/aws/driver_policy.py FUNCTION_HANDLER).
HANDLER = "sdcloud.driver.unattended.handler"
# Lambdas deployed before the cloud driver had its own package (sdcloud/driver/) were configured with
# the handler `sdcloud.runs.unattended.handler`. The package keeps that name as an alias, so a
# function whose code is updated before its configuration (or whose configuration update failed)
# still finds its handler.
LEGACY_HANDLER = "sdcloud/runs/unattended.py"
LEGACY_HANDLER_TEXT = '''"""The cloud driver's entry under its name before it moved to sdcloud.driver.unattended."""
from sdcloud.driver.unattended import handler, main_handler  # noqa: F401
'''

# Files at the package's root beside the control plane: Lambda imports the handler from sdcloud itself,
# and finds it under its old name too.
ENTRY_FILES: dict[str, str] = {LEGACY_HANDLER: LEGACY_HANDLER_TEXT}
# Distributions the package carries for this cloud beyond the control plane's own (boto3 is the store's too).
REQUIREMENTS: tuple[str, ...] = ()


def matches(event: Any) -> bool:
    """An event Lambda hands over: the schedule's input or an EventBridge scheduled event."""
    return isinstance(event, dict) and ("sdcloud" in event or event.get("detail-type") == "Scheduled Event")


def time_left(context: Any, started: float) -> Callable[[], float] | None:
    """Seconds the invocation has left, from Lambda's context object; None for a context of another shape."""
    if context is None or isinstance(context, dict) or not hasattr(context, "get_remaining_time_in_millis"):
        return None
    return lambda: context.get_remaining_time_in_millis() / 1000.0


def request_id(context: Any) -> str | None:
    """Lambda's id of this invocation (`aws_request_id`); None for a context of another shape."""
    if context is None or isinstance(context, dict):
        return None
    return getattr(context, "aws_request_id", None)
