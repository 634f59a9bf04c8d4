"""What a cloud batch schedule keeps in the stack's bucket (`batch/schedules/<sid>/`), and how the
cloud driver's invocation that fires it is told apart from the others.

Written by `sdcloud batch schedule add` (batch/cloud_schedules.py) and read by the cloud driver
(sdcloud/driver/batch_jobs.py), which sits above batch: so they live here, in batch, for both.
"""

from __future__ import annotations

import json
from typing import Any

FIRE = "batch-fire"


def schedule_key(sid: str) -> str:
    """The cloud schedule's record in the bucket (options, cron, zone, the job's store, the stack's outputs)."""
    return f"batch/schedules/{sid}/schedule.json"


def last_job_key(sid: str) -> str:
    return f"batch/schedules/{sid}/last-job"


def prompts_key(sid: str) -> str:
    return f"batch/schedules/{sid}/prompts"


def fire_of(event: Any) -> dict | None:
    """The schedule and its time when `event` is a batch schedule's invocation, else None."""
    if not isinstance(event, dict):
        return None
    body: Any = event
    when = event.get("time")
    # SCF: the trigger's custom argument arrives as Message. `Timer` or `timer`: Tencent's documents show both.
    if str(event.get("Type", "")).lower() == "timer":
        try:
            body = json.loads(event.get("Message") or "{}")
        except ValueError:
            return None
        when = event.get("Time")
    if not isinstance(body, dict) or body.get("sdcloud") != FIRE or not body.get("schedule") or not when:
        return None
    return {"schedule": str(body["schedule"]), "time": str(when)}
