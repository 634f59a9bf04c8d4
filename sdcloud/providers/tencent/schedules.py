"""Batch schedules as SCF timer triggers on the stack's cloud driver function (capabilities.SchedulesBatch).

SCF's timer cron has seven fields, `second minute hour day month week year`, the week 0-6 from
Sunday (SCF's "Timer Trigger" document, 583/9708); the trigger's custom argument (at most 4 KB)
reaches the function as the timer event's `Message`, beside the event's `Time`, from which the
handler derives the job id (sdcloud/driver/batch_jobs.py). A timer has no time zone of its own: it
fires in China Standard Time (UTC+8), so a schedule here must be in a zone that is UTC+8 all year
(not verified against a live account; docs/batch.md says so).

The API is SCF's (2018-04-16: CreateTrigger, DeleteTrigger, ListTriggers, UpdateTriggerStatus), called with the SDK's
common client, signed as every Tencent Cloud API; SDCLOUD_TENCENT_ENDPOINT points it elsewhere (tests).
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from ...errors import UserError
from .session import credentials, endpoint_override

KIND = "SCF timer trigger"
DEFAULT_TZ = "Asia/Shanghai"  # the only zone its timers know (UTC+8)
PREFIX = "sdcloud-batch-"
SERVICE, VERSION = "scf", "2018-04-16"
NAMESPACE = "default"
UTC8 = timedelta(hours=8)


def _weekday(token: str) -> str:
    """Sunday is 0 or 7 in a five-field cron, 0 only in SCF's."""
    if token == "7":
        return "0"
    m = re.fullmatch(r"(\d)-7", token)
    return f"{m.group(1)}-6,0" if m else token


def expression(cron: str, tz: str) -> str:
    zone = ZoneInfo(tz)
    if any(datetime(2026, m, 1, tzinfo=zone).utcoffset() != UTC8 for m in (1, 7)):
        raise UserError(f"SCF timers fire in China Standard Time (UTC+8): use --tz Asia/Shanghai, not {tz}")
    minute, hour, dom, month, dow = cron.split()
    dow = ",".join(_weekday(t) for t in dow.split(",")).upper()
    return f"0 {minute} {hour} {dom} {month.upper()} {dow} *"


def _client(infra: dict, client: Any):
    if client is not None:
        return client
    from tencentcloud.common.common_client import CommonClient
    from tencentcloud.common.profile.client_profile import ClientProfile
    from tencentcloud.common.profile.http_profile import HttpProfile

    override = endpoint_override()
    http = HttpProfile(protocol=override[0], endpoint=override[1]) if override else HttpProfile()
    return CommonClient(SERVICE, VERSION, credentials(), infra.get("region") or "",
                        ClientProfile(httpProfile=http, language="en-US"))


def _function(infra: dict) -> str:
    fn = infra.get("driver_function")
    if not fn:
        raise UserError("the Tencent stack has no cloud driver to schedule: run: sdcloud infra up --provider tencent")
    return fn


def _call(c: Any, action: str, params: dict) -> dict:
    from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException

    try:
        return c.call_json(action, params)["Response"]
    except TencentCloudSDKException as exc:
        raise UserError(f"SCF refused {action}: {exc.code}: {exc.message}") from None


def create(name: str, expression: str, tz: str, payload: dict, infra: dict, client: Any = None) -> None:
    arg = json.dumps(payload)
    if len(arg.encode()) > 4096:
        raise UserError(f"the schedule's argument is {len(arg.encode())} bytes; an SCF timer takes at most 4 KB")
    _call(_client(infra, client), "CreateTrigger",
          {"FunctionName": _function(infra), "Namespace": NAMESPACE, "TriggerName": name, "Type": "timer",
           "TriggerDesc": expression, "Enable": "OPEN", "CustomArgument": arg,
           "Description": f"sdcloud batch schedule {payload.get('schedule')}"})


def delete(name: str, infra: dict, client: Any = None) -> bool:
    from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException

    try:
        _client(infra, client).call_json("DeleteTrigger", {"FunctionName": _function(infra), "Namespace": NAMESPACE,
                                                           "TriggerName": name, "Type": "timer"})
    except TencentCloudSDKException as exc:
        if str(exc.code).startswith("ResourceNotFound"):
            return False
        raise UserError(f"SCF refused DeleteTrigger: {exc.code}: {exc.message}") from None
    return True


def set_enabled(name: str, enabled: bool, infra: dict, client: Any = None) -> str | None:
    """Open or close the timer (UpdateTriggerStatus, Enable OPEN or CLOSE: SCF's API document 583/89800);
    its state before (ENABLED or DISABLED), None: the function has no such timer. A closed timer invokes
    nothing; opened again it fires at its next cron time."""
    c = _client(infra, client)
    before = next((t["state"] for t in listed(infra, c) if t["name"] == name), None)
    if before is None or before == ("ENABLED" if enabled else "DISABLED"):
        return before
    _call(c, "UpdateTriggerStatus", {"FunctionName": _function(infra), "Namespace": NAMESPACE, "TriggerName": name,
                                     "Type": "timer", "Enable": "OPEN" if enabled else "CLOSE"})
    return before


def listed(infra: dict, client: Any = None) -> list[dict]:
    c = _client(infra, client)
    out, offset = [], 0
    for _ in range(100):  # 20 a page: 2,000 triggers at most, far above SCF's per-function quota
        page = _call(c, "ListTriggers", {"FunctionName": _function(infra), "Namespace": NAMESPACE,
                                         "Offset": offset, "Limit": 20})
        triggers = page.get("Triggers") or []
        for t in triggers:
            if t.get("Type") != "timer" or not str(t.get("TriggerName", "")).startswith(PREFIX):
                continue
            try:
                desc = json.loads(t.get("TriggerDesc") or "{}").get("cron")
            except ValueError:
                desc = t.get("TriggerDesc")
            try:
                payload = json.loads(t.get("CustomArgument") or "{}")
            except ValueError:
                payload = {}
            out.append({"name": t["TriggerName"], "expression": desc, "tz": "Asia/Shanghai",
                        "state": "ENABLED" if str(t.get("Enable")) in ("1", "OPEN", "True") else "DISABLED",
                        "payload": payload})
        offset += len(triggers)
        if not triggers or offset >= int(page.get("TotalCount") or 0):
            break
    return out
