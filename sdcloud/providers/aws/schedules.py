"""Batch schedules on EventBridge Scheduler: a cron schedule per batch schedule, whose target is the
stack's cloud driver (the Lambda function) with the schedule's payload (capabilities.SchedulesBatch).

EventBridge Scheduler's cron has six fields, `cron(minutes hours day-of-month month day-of-week year)`,
one of day-of-month and day-of-week must be `?`, and day-of-week counts 1-7 from Sunday (the Scheduler
User Guide, "Schedule types": cron-based schedules). The zone is the schedule's own
(`ScheduleExpressionTimezone`), daylight saving included, so the laptop's `--tz` carries over unchanged.
The target's input names the invocation's scheduled time with the context attribute
`<aws.scheduler.scheduled-time>`, which Scheduler replaces at each invocation; the handler derives the
job id from it (sdcloud/driver/batch_jobs.py), so a retried invocation submits the same job.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from ...errors import UserError

KIND = "EventBridge Scheduler schedule"
DEFAULT_TZ = "UTC"  # any zone works: Scheduler keeps its own (ScheduleExpressionTimezone)
ZONE_NOTE = None  # the zone is the schedule's own, nothing assumed
PREFIX = "sdcloud-batch-"
SCHEDULED_TIME = "<aws.scheduler.scheduled-time>"


def _weekday(token: str) -> str:
    """One day-of-week item of a five-field cron (0-7, Sunday 0 or 7) in Scheduler's 1-7 from Sunday."""
    if token in ("*", "?") or re.fullmatch(r"[A-Za-z]{3}(-[A-Za-z]{3})?", token):
        return token.upper()
    if "/" in token:
        raise UserError(f"day-of-week step {token!r} cannot be put on EventBridge Scheduler: list the days instead")
    m = re.fullmatch(r"(\d)(?:-(\d))?", token)
    if not m:
        raise UserError(f"day-of-week {token!r} cannot be put on EventBridge Scheduler")
    a = int(m.group(1)) % 7 + 1
    if m.group(2) is None:
        return str(a)
    b = int(m.group(2)) % 7 + 1
    if a <= b:
        return f"{a}-{b}"
    return f"{a}-7,1" if b == 1 else f"{a}-7,1-{b}"  # 5-7 (Friday to Sunday) is 6-7,1


def expression(cron: str, tz: str) -> str:
    minute, hour, dom, month, dow = cron.split()
    if dom not in ("*", "?") and dow not in ("*", "?"):
        raise UserError(f"cron {cron!r} restricts both the day of month and the day of week, which EventBridge "
                        "Scheduler refuses: keep one of them '*'")
    if dow in ("*", "?"):
        dow = "?"
    else:
        dom = "?"
        dow = ",".join(_weekday(t) for t in dow.split(","))
    return f"cron({minute} {hour} {dom} {month.upper()} {dow} *)"


def _client(infra: dict, client: Any):
    if client is not None:
        return client
    import boto3

    return boto3.client("scheduler", region_name=infra.get("region") or None)


def _driver(infra: dict) -> tuple[str, str]:
    fn, role = infra.get("driver_function_arn"), infra.get("driver_scheduler_role_arn")
    if not fn or not role:
        raise UserError("the AWS stack has no cloud driver to schedule (or predates batch schedules): "
                        "run: sdcloud infra up --provider aws")
    return fn, role


def _refused(action: str, exc: Exception) -> UserError:
    err = getattr(exc, "response", {}).get("Error", {})
    return UserError(f"EventBridge Scheduler refused {action}: {err.get('Code', type(exc).__name__)}: "
                     f"{err.get('Message', str(exc))}")


def create(name: str, expression: str, tz: str, payload: dict, infra: dict, client: Any = None) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    fn, role = _driver(infra)
    try:
        _client(infra, client).create_schedule(
            Name=name, ScheduleExpression=expression, ScheduleExpressionTimezone=tz,
            Description=f"sdcloud batch schedule {payload.get('schedule')}",
            # OFF: the job's cron time is the invocation's; the job id comes from it.
            FlexibleTimeWindow={"Mode": "OFF"}, State="ENABLED",
            Target={"Arn": fn, "RoleArn": role, "Input": json.dumps({**payload, "time": SCHEDULED_TIME}),
                    # A failed invoke is tried again: the fire is idempotent on its job id.
                    "RetryPolicy": {"MaximumRetryAttempts": 2, "MaximumEventAgeInSeconds": 3600}})
    except (ClientError, BotoCoreError) as exc:
        raise _refused("CreateSchedule", exc) from None


def _unless_missing(action: str, call: Callable[[], Any]) -> Any | None:
    """The call's answer; None where the schedule does not exist; any other refusal as one line."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return call()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
            return None
        raise _refused(action, exc) from None
    except BotoCoreError as exc:
        raise _refused(action, exc) from None


def delete(name: str, infra: dict, client: Any = None) -> bool:
    return _unless_missing("DeleteSchedule", lambda: _client(infra, client).delete_schedule(Name=name)) is not None


def set_enabled(name: str, enabled: bool, infra: dict, client: Any = None) -> str | None:
    """Turn the schedule on or off; its state before (ENABLED or DISABLED), None: there is no such schedule.

    UpdateSchedule replaces the whole schedule with what the request holds (an omitted field is reset,
    not kept: the Scheduler API Reference, UpdateSchedule), so the request carries every field that
    GetSchedule returned, with only the state changed. A disabled schedule invokes nothing; enabled
    again, it goes on from its next cron time (the times it was off are not made up)."""
    from botocore.exceptions import BotoCoreError, ClientError

    c = _client(infra, client)
    full = _unless_missing("GetSchedule", lambda: c.get_schedule(Name=name))
    if full is None:
        return None
    before = full.get("State") or "ENABLED"
    state = "ENABLED" if enabled else "DISABLED"
    if before == state:
        return before
    kept = {k: full[k] for k in ("GroupName", "ScheduleExpression", "ScheduleExpressionTimezone", "Description",
                                 "StartDate", "EndDate", "FlexibleTimeWindow", "Target", "KmsKeyArn",
                                 "ActionAfterCompletion") if full.get(k) is not None}
    try:
        c.update_schedule(Name=name, State=state, **kept)
    except (ClientError, BotoCoreError) as exc:
        raise _refused("UpdateSchedule", exc) from None
    return before


def listed(infra: dict, client: Any = None) -> list[dict]:
    """The batch schedules on the account's scheduler: name, expression, zone, state and payload."""
    from botocore.exceptions import BotoCoreError, ClientError

    c = _client(infra, client)
    out = []
    try:
        for page in c.get_paginator("list_schedules").paginate(NamePrefix=PREFIX):
            for s in page.get("Schedules", []):
                full = c.get_schedule(Name=s["Name"])
                out.append({"name": s["Name"], "expression": full.get("ScheduleExpression"),
                            "tz": full.get("ScheduleExpressionTimezone") or "UTC", "state": full.get("State"),
                            "payload": json.loads(full.get("Target", {}).get("Input") or "{}")})
    except (ClientError, BotoCoreError) as exc:
        raise _refused("ListSchedules", exc) from None
    return out
