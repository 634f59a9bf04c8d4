"""Batch schedules on the clouds' own schedulers, so that a scheduled job needs no laptop.

`sdcloud batch schedule add --provider aws|tencent` puts the schedule on the cloud the job runs on:
an EventBridge Scheduler cron schedule or an SCF timer trigger (the provider's schedules module,
capabilities.SchedulesBatch) that invokes the stack's cloud driver with `{"sdcloud": "batch-fire",
"schedule": SID}`. What the fire needs is in the stack's bucket first, since the function knows
nothing else: the submit options, the prompts file's bytes, the job's store and the stack's outputs
(`batch/schedules/<sid>/`, batch/schedule_keys.py). The function then submits under the laptop
scheduler's job-id rule (schedules.fire_job_id) and drives the job to its end.

Local and SSH jobs keep this machine's timer (schedules.py, `sdcloud scheduler install`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..providers.capabilities import SchedulesBatch
from ..providers.traits import ProviderTraits, names
from .schedule_keys import FIRE, last_job_key, prompts_key, schedule_key

PREFIX = "sdcloud-batch-"


def has_cloud_schedules(t: ProviderTraits) -> bool:
    return t.schedules is not None and t.function is not None


def cloud_providers() -> tuple[str, ...]:
    """The providers whose schedules go on their cloud's scheduler (the others: this machine's timer)."""
    return names(where=has_cloud_schedules)


def default_tz(provider: str) -> str:
    """The zone a schedule is in when --tz is not given: UTC, or what the cloud's scheduler runs in."""
    return module_for(provider).DEFAULT_TZ if provider in cloud_providers() else "UTC"


def module_for(provider: str) -> SchedulesBatch:
    from ..providers.loader import schedules

    return schedules(provider)


def _infra(provider: str) -> dict:
    from .status import state_store

    infra = state_store().infra(provider, "")
    if not infra or not infra.get("driver_function"):
        raise UserError(f"a schedule on {provider} invokes the stack's cloud driver, and this machine knows of none: "
                        f"run: sdcloud infra up --provider {provider}")
    return infra


def _known() -> list[tuple[str, dict, SchedulesBatch]]:
    """(provider, the stack's outputs, its schedules module) for each cloud whose stack has a driver."""
    from .status import state_store

    out = []
    for provider in names(where=has_cloud_schedules):
        infra = state_store().infra(provider, "")
        if infra and infra.get("driver_function"):
            out.append((provider, infra, module_for(provider)))
    return out


def add(cron: str, tz: str, opts: Any) -> dict:
    """Put the schedule on `opts.provider`'s scheduler; `opts` are the submit options, validated."""
    from ..runs.records.store import open_run_store
    from .schedules import check_cron
    from .submit import store_conf

    check_cron(cron, tz)
    module = module_for(opts.provider)
    expression = module.expression(cron, tz)
    if opts.lora:
        raise UserError("--lora cannot go on a cloud schedule yet: the function reads only the stack's bucket "
                        "(schedule it on this machine with --provider local or ssh, or submit it now)")
    infra = _infra(opts.provider)
    conf = store_conf(opts.provider, opts.store)
    own = store_conf(opts.provider, None)
    if conf["url"] != own["url"]:
        raise UserError(f"a cloud schedule's jobs live in the stack's bucket ({own['url']}), the one the function "
                        f"reads: drop --store {opts.store}")
    prompts = Path(opts.prompts)
    options = {k: v for k, v in dataclasses.asdict(opts).items() if k not in ("prompts", "store")}
    sid = "s-" + hashlib.sha256(f"{cron}{tz}{json.dumps(options, sort_keys=True, default=str)}{time.time()}"
                                .encode()).hexdigest()[:8]
    store = open_run_store(conf)
    store.put(prompts_key(sid), prompts.read_bytes())
    store.put(schedule_key(sid), json.dumps({"id": sid, "cron": cron, "tz": tz, "options": options, "store": conf,
                                             "infra": infra, "prompts_name": prompts.name, "created": time.time()},
                                            sort_keys=True, default=str).encode())
    name = PREFIX + sid
    try:
        module.create(name, expression, tz, {"sdcloud": FIRE, "schedule": sid}, infra)
    except Exception:
        store.delete([schedule_key(sid), prompts_key(sid)])  # nothing left behind for a schedule not made
        raise
    warning = f"{module.ZONE_NOTE}; {cron} in {tz} is {expression} there" if module.ZONE_NOTE else None
    return {"id": sid, "provider": opts.provider, "kind": module.KIND, "name": name, "expression": expression,
            "tz": tz, "cron": cron, "warning": warning}


def listed() -> list[dict]:
    """The batch schedules on every cloud whose stack this machine knows, with the last job each submitted."""
    from ..runs.records.store import NotFound, open_run_store
    from .submit import store_conf

    rows = []
    for provider, infra, module in _known():
        store = open_run_store(store_conf(provider, None))
        for s in module.listed(infra):
            sid = s["payload"].get("schedule") or s["name"].removeprefix(PREFIX)
            try:
                last = store.get(last_job_key(sid)).decode()
            except NotFound:
                last = None
            rows.append({"id": sid, "provider": provider, "kind": module.KIND, "name": s["name"],
                         "expression": s["expression"], "tz": s["tz"], "state": s["state"], "last_job": last})
    return rows


def set_paused(sid: str, paused: bool) -> dict | None:
    """Pause (disable) or resume (enable) the schedule on the cloud that has it; None: none has.
    `was_paused` is its state before, so that a second pause can say nothing changed."""
    for provider, infra, module in _known():
        before = module.set_enabled(PREFIX + sid, not paused, infra)
        if before is not None:
            return {"id": sid, "provider": provider, "kind": module.KIND, "name": PREFIX + sid,
                    "was_paused": before != "ENABLED"}
    return None


def remove(sid: str) -> dict | None:
    """Remove the schedule from the cloud that has it (and its record from the bucket); None: none has."""
    from ..runs.records.store import open_run_store
    from .submit import store_conf

    for provider, infra, module in _known():
        if module.delete(PREFIX + sid, infra):
            open_run_store(store_conf(provider, None)).delete([schedule_key(sid), prompts_key(sid), last_job_key(sid)])
            return {"id": sid, "provider": provider, "kind": module.KIND, "name": PREFIX + sid}
    return None
