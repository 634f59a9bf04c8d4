"""The run events: every kind a run or batch job records, its fields, its group and its words.

An event is a row of the run's journal (`runs/records/state.py` table `events`, copied to the run's bucket
by `runs/records/journal.py`): a kind, a JSON object of fields, a time. The kind is a member of `Kind`
(a `str` enum, so the row stores its hyphenated value and a reader compares members). Readers
decide on members, never on a spelling typed again: `logs`, `watch` and `status` say each kind
in the words of `words()`, the cost report counts `DRIVER_TOOK_OVER`, `hostboot` counts
`RECLAIMED` and `HOST_LOST`.

Spellings of earlier releases (`launch_failed`, `zone_failover`, `budget`, `gc.terminated`, ...)
are aliases: `parse()` maps them to today's kind, so a journal written by an older sdcloud is
read back (`runs/records/journal.py` restores through it) and shown with the same words.

This module sits at the bottom of the house (rank 0): it imports nothing of sdcloud, so every
domain, the providers included, can name a kind.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    # -- the run's own lifecycle (runs/driving/controller.py) ----------------------------------------------
    RUN_SUCCEEDED = "run-succeeded"
    RUN_FAILED = "run-failed"
    RUN_STOPPED = "run-stopped"
    RESUME = "resume"  # the user asked to resume (sdcloud resume / up --name)
    RESUMED = "resumed"  # a host resumed from a checkpoint
    PROGRESS = "progress"
    BUDGET_WARNING = "budget-warning"
    BUDGET_REACHED = "budget-reached"
    DEADLINE_FALLBACK = "deadline-fallback"
    SPOT_UNAVAILABLE = "spot-unavailable"
    DATASET_UPLOADED = "dataset-uploaded"
    MODEL_UPLOADED = "model-uploaded"
    INPUTS_STAGED = "inputs-staged"  # the run's inputs are in its bucket, with its settings (runs/inputs/staging.py)
    STOP_REQUESTED = "stop-requested"  # `down` from a machine that does not drive the run (verbs/stop.py)
    SELF_ENDED = "self-ended"
    HEARTBEAT_FAILED = "heartbeat-failed"
    PULLED = "pulled"
    # -- who drives the run (runs/records/lease.py, driver/unattended.py) -----------------------------------
    DRIVER_TOOK_OVER = "driver-took-over"
    DRIVER_LOST = "driver-lost"
    HANDED_OVER = "handed-over"
    JOURNAL_DEFERRED = "journal-deferred"
    # -- what the host reports (runs/driving/hostboot.py, agent_reports.py, health_view.py, oom_move.py) ----
    BOOT_FAILED = "boot-failed"
    HOST_FAILED = "host-failed"
    STORE_UNREACHABLE = "store-unreachable"
    STORE_REACHABLE = "store-reachable"
    PRUNE_FAILED = "prune-failed"
    HEALTH = "health"
    OOM_RETRY = "oom-retry"
    OUT_OF_MEMORY = "out-of-memory"
    HEALTH_ACTION = "health-action"  # the host acted on a verdict (sdcloud_agent/health_act.py)
    HEALTH_RECHECK = "health-recheck"  # judged again after that action
    THROTTLE_MOVE = "throttle-move"  # a throttled host weighed against a fresh one (runs/driving/oom_move.py)
    # -- the fleet: hosts launched, checked, ended (fleet/) ----------------------------------------
    LAUNCHING = "launching"
    LAUNCHED = "launched"
    LAUNCH_FAILED = "launch-failed"
    ADOPTED = "adopted"
    RECLAIMED = "reclaimed"
    HOST_PAUSED = "host-paused"  # a marketplace host outbid: paused with its disk; the pause policy's choice (fleet/pauses.py)
    HOST_RESUMED = "host-resumed"  # ...and running again on the same machine
    HOST_LOST = "host-lost"
    RECONCILE = "reconcile"
    STRAYS = "strays"
    SWEEP_FAILED = "sweep-failed"
    TERMINATE_FAILED = "terminate-failed"
    ZONES_UNKNOWN = "zones-unknown"
    # -- what a provider saw while launching (providers/) ------------------------------------------
    RETRY = "retry"
    FAILOVER = "failover"
    SUBNET_FULL = "subnet-full"
    QUOTA = "quota"
    QUOTE = "quote"
    PRICE_TOO_LOW = "price-too-low"
    PRICE_LOOKUP_FAILED = "price-lookup-failed"
    HOST_STARTED = "host-started"
    RECLAIM_NOTICE = "reclaim-notice"
    HOST_BUSY = "host-busy"
    HOST_UNREACHABLE = "host-unreachable"
    SSH_RETRY = "ssh-retry"
    SSH_HOST_KEY_TRUSTED = "ssh-host-key-trusted"
    STORE_CREDENTIALS = "store-credentials"
    STORE_CREDENTIALS_RENEWED = "store-credentials-renewed"
    STORE_CREDENTIALS_FAILED = "store-credentials-failed"
    # -- what the run cost (costs/) ------------------------------------------------------------------
    REPRICED = "repriced"
    PRICE_HISTORY_FAILED = "price-history-failed"
    BUCKET_SIZE_FAILED = "bucket-size-failed"
    GC_TERMINATED = "gc-terminated"
    # -- batch jobs (batch/) ------------------------------------------------------------------------
    BATCH_SUBMITTED = "batch-submitted"
    BATCH_CANCELLED = "batch-cancelled"
    BATCH_CANCEL_MARKER_FAILED = "batch-cancel-marker-failed"
    BATCH_SUCCEEDED = "batch-succeeded"
    BATCH_FAILED = "batch-failed"
    BATCH_STOPPED = "batch-stopped"
    BATCH_SCHEDULE_FIRED = "batch-schedule-fired"  # a cloud schedule's invocation submitted the job
    WORKER_STARTED = "worker-started"
    WORKER_EXITED = "worker-exited"
    WORKER_ADOPTED = "worker-adopted"  # a resumed local job keeps a worker its dead driver left running
    # -- a run across clouds (runs/driving/placement.py) ------------------------------------------------
    CLOUD_MOVED = "cloud-moved"  # the checkpoint landed in the other cloud's store; launches go there
    CLOUD_MOVE_FAILED = "cloud-move-failed"  # the copy was cut: no manifest landed, tried again later


# Spellings of earlier releases, read back from old journals and state files.
ALIASES: dict[str, Kind] = {
    "launch_failed": Kind.LAUNCH_FAILED,
    "zone_failover": Kind.FAILOVER,
    "subnet_full": Kind.SUBNET_FULL,
    "price_too_low": Kind.PRICE_TOO_LOW,
    "budget": Kind.BUDGET_REACHED,
    "gc.terminated": Kind.GC_TERMINATED,
}


def parse(kind: str) -> Kind | str:
    """The member for a stored kind (an old spelling gives today's); an unknown kind stays a string.

    Unknown kinds are kept rather than refused: a journal written by a newer sdcloud must still
    be readable by this one, and its rows shown as they are.
    """
    if isinstance(kind, Kind):
        return kind
    try:
        return Kind(kind)
    except ValueError:
        return ALIASES.get(kind, kind)


def identity(time: float, kind: str, data: dict | None) -> str:
    """An event's identity: a digest of its kind, fields and the time it happened (not when it was
    copied). The journal writes and restores by it (runs/records/journal.py), so a copy of an event that
    reached the bucket twice, or was restored by several drivers, is one event."""
    import hashlib
    import json

    body = json.dumps([repr(float(time)), str(parse(kind)), data or {}], sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:24]


def run_ended(state: str) -> Kind:
    """The kind that records a run's end in `state` (succeeded, failed, stopped)."""
    return Kind(f"run-{state}")


def batch_ended(state: str) -> Kind:
    """The kind that records a batch job's end in `state` (succeeded, failed, stopped)."""
    return Kind(f"batch-{state}")


# -- groups: the kinds a reader asks about together ------------------------------------------------
RUN_ENDED = frozenset({Kind.RUN_SUCCEEDED, Kind.RUN_FAILED, Kind.RUN_STOPPED})
BATCH_ENDED = frozenset({Kind.BATCH_SUCCEEDED, Kind.BATCH_FAILED, Kind.BATCH_STOPPED})
# Something went wrong that the user may need to act on (shown even under -q).
FAILURES = frozenset({
    Kind.RUN_FAILED, Kind.BATCH_FAILED, Kind.LAUNCH_FAILED, Kind.BOOT_FAILED, Kind.HOST_FAILED, Kind.HOST_LOST,
    Kind.STORE_UNREACHABLE, Kind.STRAYS, Kind.TERMINATE_FAILED, Kind.SWEEP_FAILED, Kind.PRICE_HISTORY_FAILED,
    Kind.PRICE_LOOKUP_FAILED, Kind.BUCKET_SIZE_FAILED, Kind.STORE_CREDENTIALS_FAILED, Kind.PRUNE_FAILED,
    Kind.HEARTBEAT_FAILED, Kind.JOURNAL_DEFERRED, Kind.BATCH_CANCEL_MARKER_FAILED, Kind.HOST_UNREACHABLE,
})
# A host went away: reclaimed by the cloud or lost without a word.
HOST_GONE = frozenset({Kind.RECLAIMED, Kind.HOST_LOST})
# A host paused (a marketplace's outbid) and back: the run neither lost nor ended it.
PAUSES = frozenset({Kind.HOST_PAUSED, Kind.HOST_RESUMED})
# Who drives the run.
DRIVER = frozenset({Kind.DRIVER_TOOK_OVER, Kind.DRIVER_LOST, Kind.HANDED_OVER, Kind.JOURNAL_DEFERRED})
# What the host said about itself (its boot, its health, its memory).
HOST = frozenset({Kind.BOOT_FAILED, Kind.HOST_FAILED, Kind.HOST_STARTED, Kind.RECLAIM_NOTICE, Kind.STORE_UNREACHABLE,
                  Kind.STORE_REACHABLE, Kind.PRUNE_FAILED, Kind.HEALTH, Kind.OOM_RETRY, Kind.OUT_OF_MEMORY,
                  Kind.HEALTH_ACTION, Kind.HEALTH_RECHECK, Kind.THROTTLE_MOVE,
                  Kind.SELF_ENDED})

# Routine steps: `logs` tells them in words, the live view (`up`, `watch`) only under -v, so that a
# run's screen holds what a user acts on (verbs/progress_view.py).
ROUTINE = frozenset({Kind.PROGRESS, Kind.INPUTS_STAGED, Kind.PULLED, Kind.RETRY, Kind.QUOTE, Kind.HOST_STARTED,
                     Kind.STORE_CREDENTIALS, Kind.STORE_CREDENTIALS_RENEWED, Kind.REPRICED, Kind.SSH_RETRY,
                     Kind.RECONCILE, Kind.ADOPTED, Kind.BATCH_SUBMITTED, Kind.WORKER_STARTED, Kind.WORKER_EXITED})


@dataclass(frozen=True)
class Fields:
    """The fields a kind's events carry (the keys of its JSON object); `docs/runs.md` shows examples."""
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()


# Each kind's fields, as the code that records it writes them. A test records one of each and checks it.
FIELDS: dict[Kind, Fields] = {
    Kind.RUN_SUCCEEDED: Fields((), ("reason",)),
    Kind.RUN_FAILED: Fields(("reason",)),
    Kind.RUN_STOPPED: Fields(("reason",)),
    Kind.RESUME: Fields(("from_state", "step", "changed"), ("spent_usd",)),
    Kind.RESUMED: Fields(("attempt", "from_step", "lost_steps"), ("instance_type", "zone")),
    Kind.PROGRESS: Fields(("attempt", "step", "total"), ("phase", "it_per_s", "cost")),
    Kind.BUDGET_WARNING: Fields(("pct", "budget", "spent")),
    Kind.BUDGET_REACHED: Fields((), ("attempt", "budget", "spent", "budget_usd", "cost_usd")),
    Kind.DEADLINE_FALLBACK: Fields(("attempt", "to")),
    Kind.SPOT_UNAVAILABLE: Fields(("failed_launches",), ("next",)),
    Kind.DATASET_UPLOADED: Fields(("files", "sent", "mb", "seconds")),
    Kind.MODEL_UPLOADED: Fields(("sent", "seconds"), ("cached", "files", "mb", "key")),
    Kind.INPUTS_STAGED: Fields(("dataset", "model", "settings", "effective", "staged_on"),
                               ("trainer_sources", "store", "drive")),
    Kind.STOP_REQUESTED: Fields(("by",), ("reason", "holder")),
    Kind.SELF_ENDED: Fields(("attempt", "reason"), ("action", "at", "error", "unattended", "ended_by")),
    Kind.HEARTBEAT_FAILED: Fields(("error",)),
    Kind.PULLED: Fields(("dir",)),
    Kind.DRIVER_TOOK_OVER: Fields(("driver",), ("invocation", "from", "step")),
    Kind.DRIVER_LOST: Fields(("driver",), ("holder",)),
    Kind.HANDED_OVER: Fields(("to",)),
    Kind.JOURNAL_DEFERRED: Fields(("error",)),
    Kind.BOOT_FAILED: Fields(("attempt", "instance", "boot_phase"), ("reason",)),
    Kind.HOST_FAILED: Fields(("attempt",), ("instance", "cause", "phase", "reason", "state")),
    Kind.STORE_UNREACHABLE: Fields(("error",), ("for_s", "retry_s")),
    Kind.STORE_REACHABLE: Fields((), ("after_s",)),
    Kind.PRUNE_FAILED: Fields(("attempt", "error")),
    Kind.HEALTH: Fields(("attempt",), ("verdict", "why", "gpu_util", "data_wait_pct", "throttle_pct", "trainer_exit",
                                     "save_seconds", "data_wait_seconds", "sample_seconds")),
    Kind.OOM_RETRY: Fields(("attempt",), ("n", "rung", "change", "peak_gb", "resume_step", "lost_s")),
    Kind.OUT_OF_MEMORY: Fields(("attempt",), ("offer", "vram_mib", "rungs", "next")),
    Kind.HEALTH_ACTION: Fields(("attempt", "n", "cause", "changes"), ("why_not", "before", "step", "resume_step")),
    Kind.HEALTH_RECHECK: Fields(("attempt", "n", "cause", "still"), ("after", "after_verdict", "before")),
    Kind.THROTTLE_MOVE: Fields(("attempt", "offer", "moved", "why"),
                               ("throttle_pct", "reasons", "sm_clock_pct", "stay_min", "move_min", "stay_cost",
                                "move_cost")),
    Kind.LAUNCHING: Fields(("attempt", "offer", "market"), ("price_usd",)),
    Kind.LAUNCHED: Fields((), ("attempt", "instance", "instance_id", "instance_type", "provider", "region", "zone",
                               "market", "max_price", "currency", "token", "adopted", "host", "pid")),
    Kind.LAUNCH_FAILED: Fields((), ("attempt", "error", "offer", "instance", "provider", "state", "zone")),
    Kind.ADOPTED: Fields((), ("instance", "instance_id", "provider", "region", "zone", "token")),
    Kind.RECLAIMED: Fields(("attempt",), ("instance", "reported", "heartbeat_age_s")),
    Kind.HOST_PAUSED: Fields(("attempt", "instance", "choice"), ("why", "paused_s", "bid", "new_bid")),
    Kind.HOST_RESUMED: Fields(("attempt", "instance"), ("paused_s",)),
    Kind.HOST_LOST: Fields(("attempt",), ("instance", "reported", "heartbeat_age_s")),
    Kind.RECONCILE: Fields(("action",), ("attempt", "instance")),
    Kind.STRAYS: Fields(("instances",)),
    Kind.SWEEP_FAILED: Fields(("error",)),
    Kind.TERMINATE_FAILED: Fields(("attempt", "error")),
    Kind.ZONES_UNKNOWN: Fields(("region", "error")),
    Kind.RETRY: Fields(("call",), ("action", "attempt", "code", "provider", "region", "wait_s")),
    Kind.FAILOVER: Fields(("zone",), ("code", "reason", "provider", "region", "next_zone", "instance_type", "market",
                                      "max_price", "current_price")),
    Kind.SUBNET_FULL: Fields(("subnet",), ("code", "provider", "zone", "next_subnet", "next_zone")),
    Kind.QUOTA: Fields(("code",), ("provider", "region", "zone", "instance_type", "market")),
    Kind.QUOTE: Fields(("price",), ("currency", "instance_type", "market", "max_price", "provider", "zone")),
    Kind.PRICE_TOO_LOW: Fields(("max_price",), ("currency", "current_price", "provider", "zone")),
    Kind.PRICE_LOOKUP_FAILED: Fields(("code",), ("provider", "region")),
    Kind.HOST_STARTED: Fields(("instance",), ("pid", "nodes", "pids")),  # nodes, pids: a local multi-node group
    Kind.RECLAIM_NOTICE: Fields(("instance",), ("simulated", "terminate_at", "node")),  # node: the group's host
    Kind.HOST_BUSY: Fields(("host",), ("run",)),
    Kind.HOST_UNREACHABLE: Fields(("host",), ("error",)),
    Kind.SSH_RETRY: Fields(("host", "op"), ("error",)),
    Kind.SSH_HOST_KEY_TRUSTED: Fields(("host", "fingerprint"), ("address", "key_type")),
    Kind.STORE_CREDENTIALS: Fields(("instance",), ("expires",)),
    Kind.STORE_CREDENTIALS_RENEWED: Fields(("instance",), ("expires",)),
    Kind.STORE_CREDENTIALS_FAILED: Fields(("instance", "error")),
    Kind.REPRICED: Fields(("attempt", "price_usd", "source")),
    Kind.PRICE_HISTORY_FAILED: Fields(("attempt", "error")),
    Kind.BUCKET_SIZE_FAILED: Fields(("attempt", "error")),
    Kind.GC_TERMINATED: Fields(("instance_id",), ("provider", "region")),
    Kind.BATCH_SUBMITTED: Fields(("items",), ("images", "workers")),
    Kind.BATCH_CANCELLED: Fields((), ("reason",)),
    Kind.BATCH_CANCEL_MARKER_FAILED: Fields(("error",)),
    Kind.BATCH_SUCCEEDED: Fields((), ("reason",)),
    Kind.BATCH_FAILED: Fields((), ("reason",)),
    Kind.BATCH_STOPPED: Fields((), ("reason",)),
    Kind.BATCH_SCHEDULE_FIRED: Fields(("schedule", "wall"), ("driver",)),
    Kind.WORKER_STARTED: Fields(("slot",), ("n", "pid")),
    Kind.WORKER_EXITED: Fields(("slot",), ("pid", "rc")),
    Kind.WORKER_ADOPTED: Fields(("n", "pid")),
    Kind.CLOUD_MOVED: Fields(("from", "to", "bytes", "egress_usd"),
                             ("why", "step", "skipped", "seconds", "transfer_hours", "reason")),
    Kind.CLOUD_MOVE_FAILED: Fields(("from", "to"), ("error",)),
}


# -- words: how `watch`, `logs` and `status` tell each kind to a user ------------------------------
# Every kind has words (tests/test_event_words.py); `kind key=value ...` is -v's. The health kinds' words
# (HEALTH, OOM_RETRY, OUT_OF_MEMORY, HEALTH_ACTION, HEALTH_RECHECK, THROTTLE_MOVE) are
# runs/driving/health_view.py's, which knows the health figures.


def _attempt(data: dict) -> str:
    return f"attempt {data.get('attempt')}"


def _launching(data: dict) -> str:
    parts = str(data.get("offer") or "").split("/")  # provider/region/zone/type/market
    what = f"{parts[3]} in {parts[2] if parts[2] not in ('', '*') else parts[1]}" if len(parts) >= 4 else data.get("offer")
    return f"{_attempt(data)}: launching {what} ({data.get('market')}, ${data.get('price_usd')}/h)"


def _reclaimed(data: dict) -> str:
    step = data.get("step")
    saved = "the host saved its checkpoint" if data.get("phase") == "preempted" else "the host is gone"
    return f"spot reclaim of {_attempt(data)}" + (f" at step {step}" if step is not None else "") + f": {saved}"


def _host_failed(data: dict) -> str:
    why = data.get("cause") or data.get("state") or "failed"
    return f"{_attempt(data)}: host {data.get('instance')} failed ({why}), not a reclaim" + (
        f": {data['reason']}" if data.get("reason") else "")


def _resumed(data: dict) -> str:
    where = " ".join(str(x) for x in (data.get("instance_type"), data.get("zone") and f"in {data['zone']}") if x)
    lost = data.get("lost_steps") or 0
    return (f"{_attempt(data)}{' on ' + where if where else ''} resumed from step {data.get('from_step')}, "
            f"{lost} step{'s' if lost != 1 else ''} lost")


def _budget_reached(data: dict) -> str | None:
    if "budget" not in data:  # a batch job's stop (budget_usd, cost_usd): its status says it
        return None
    return f"budget ${data.get('budget')} reached (${data.get('spent')} spent): stopping with the checkpoint kept"


def _model_uploaded(data: dict) -> str:
    if data.get("cached"):
        return f"model: already in the run's bucket ({data.get('key')}, {data.get('mb')} MB), nothing sent"
    return f"model: {data.get('files')} file(s), {data.get('mb')} MB sent to the run's bucket in {data.get('seconds')} s"


# The resume command a stopped or failed run's reason ends with (Controller.end_run): said once, by
# the stop line (verbs/stop_words.py), not again inside the reason it quotes.
_RESUME_TAIL = re.compile(r";\s*resume with: sdcloud resume [^\n;]*")
# "; last output:" / "; last lines of the bootstrap log:": the announcement of the lines one_line leaves out.
_LAST_OUTPUT = re.compile(r"(?:[;,]\s*last (?:output|lines\b[^:;]*)|:?\s*Traceback \(most recent call last\))$")
# The line a Python traceback ends with: the exception and its message.
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)|error)\b:?")


def one_line(reason: str | None) -> str:
    """A recorded reason in one line, for people: its first line and, where a trainer's output or a
    traceback follows, the error it ended with (`trainer exited with code 1: ValueError: boom`);
    without the resume command. The whole text stays in the row, `logs` and under -v."""
    text = _RESUME_TAIL.sub("", reason or "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    head = _LAST_OUTPUT.sub("", lines[0].removesuffix(":"))
    error = error_line(lines[1:])
    return f"{head}: {error}" if error else head


def error_line(lines: list[str]) -> str | None:
    """The last line of `lines` that names an error (`ValueError: boom`, `error: ...`), or None."""
    return next((line for line in reversed(lines) if _ERROR_LINE.match(line)), None)


def _run_ended(kind: Kind) -> Callable[[dict], str]:
    def told(data: dict) -> str:
        reason = data.get("reason")
        return f"run {kind.value.removeprefix('run-')}" + (f": {one_line(reason)}" if reason else "")
    return told


def _inputs_staged(d: dict) -> str:
    net = (d.get("effective") or {}).get("network_profile")
    return (f"inputs staged on {d.get('staged_on')}: "
            + (f"dataset {d['dataset']}" if d.get("dataset") else "no dataset") + f", model {d.get('model')}, settings "
            f"[{', '.join(sorted(d.get('settings') or {})) or 'none'}]" + (f", network profile {net}" if net else "")
            + (", trainer sources in the bucket" if d.get("trainer_sources") else ""))


_RECONCILED = {"adopted": "its host was found by its launch token and kept",
               "adopted-orphan": "a host a dead driver left at work was kept in its slot: no second host started",
               "ended-orphan": "a host a dead driver left with no slot for it was ended before any launch",
               "no-instance": "no host was ever started for it; closed", "resumed-watch": "its host runs; watched again",
               "finish-terminate": "its end was interrupted; the host is ended now"}


def _batch_ended(kind: Kind) -> Callable[[dict], str]:
    return lambda d: f"batch job {kind.value.removeprefix('batch-')}" + (f": {d['reason']}" if d.get("reason") else "")


def _clock(iso: object) -> str:
    """An ISO time as this machine's clock time to the second (as the lines' own stamps are), or as
    given when it is not one."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(iso)).astimezone().strftime("%H:%M:%S")
    except ValueError:
        return str(iso)


def _if(d: dict, key: str, form: str) -> str:
    """`form` with the field's value in it ({}), or nothing when the event has no such field."""
    return form.format(d[key]) if d.get(key) not in (None, "") else ""


WORDS: dict[Kind, Callable[[dict], str | None]] = {
    Kind.LAUNCHING: _launching,
    Kind.LAUNCHED: lambda d: f"{_attempt(d)}: host {d.get('instance')} is up" + (
        " (adopted: it was already running)" if d.get("adopted") else ""),
    Kind.LAUNCH_FAILED: lambda d: f"{_attempt(d)}: could not launch ({d.get('error')}); trying the next offer",
    Kind.RECLAIMED: _reclaimed,
    Kind.HOST_PAUSED: lambda d: (f"{_attempt(d)}: host {d.get('instance')} paused (outbid, no notice): "
                                 f"{d.get('choice')}" + _if(d, "why", " ({})")),
    Kind.HOST_RESUMED: lambda d: f"{_attempt(d)}: host {d.get('instance')} resumed on the same machine"
                                 + _if(d, "paused_s", " after {} s"),
    Kind.HOST_FAILED: _host_failed,
    Kind.STORE_UNREACHABLE: lambda d: (f"the run's store cannot be reached ({d.get('error')}); trying again every "
                                       f"{d.get('retry_s')} s" + (f" ({d['for_s']} s so far)" if d.get("for_s") else "")),
    Kind.STORE_REACHABLE: lambda d: f"the run's store answers again (after {d.get('after_s')} s)",
    Kind.HOST_LOST: lambda d: f"{_attempt(d)}: host {d.get('instance')} lost" + (
        f" (no heartbeat for {d['heartbeat_age_s']} s)" if d.get("heartbeat_age_s") else ""),
    Kind.RESUMED: _resumed,
    Kind.DEADLINE_FALLBACK: lambda d: f"the deadline is at risk: moving from spot to on-demand ({d.get('to')})",
    Kind.BUDGET_REACHED: lambda d: _budget_reached(d) or (f"budget ${d.get('budget_usd')} reached "
                                                          f"(${d.get('cost_usd')} spent): no new items; the images stay"),
    Kind.DATASET_UPLOADED: lambda d: (f"dataset: {d.get('files')} files in the run's bucket ({d.get('sent')} sent, "
                                      f"{d.get('mb')} MB)"),
    Kind.MODEL_UPLOADED: _model_uploaded,
    Kind.DRIVER_TOOK_OVER: lambda d: (f"{d.get('driver')} took the run over" + (
        f" from {d['from']}" if d.get("from") else "") + (f" at step {d['step']}" if d.get("step") is not None else "")),
    Kind.STOP_REQUESTED: lambda d: f"stop requested by {d.get('by')}" + (f" ({d['reason']})" if d.get("reason") else ""),
    Kind.WORKER_ADOPTED: lambda d: (f"worker {d.get('n')} (pid {d.get('pid')}) outlived its driver and is still "
                                    "at work: kept in its slot, no second worker started"),
    Kind.RESUME: lambda d: (f"resuming a {d.get('from_state')} run from step {d.get('step')}"
                            + _if(d, "spent_usd", " (${} already spent)")),
    Kind.PROGRESS: lambda d: (f"{_attempt(d)}: step {d.get('step')}/{d.get('total')}" + _if(d, "phase", " ({})")
                              + _if(d, "it_per_s", ", {} it/s")),
    Kind.BUDGET_WARNING: lambda d: f"{d.get('pct')}% of the ${d.get('budget')} budget spent (${d.get('spent')})",
    Kind.SPOT_UNAVAILABLE: lambda d: f"no spot ({d.get('failed_launches')} launches failed)" + _if(d, "next", "; next, {}"),
    Kind.INPUTS_STAGED: _inputs_staged,
    Kind.SELF_ENDED: lambda d: ((f"{_attempt(d)}: the host ended ({d['ended_by']})" if d.get("ended_by") else
                                 f"{_attempt(d)}: the host ended itself ({d.get('reason')}"
                                 + (", nobody driving the run)" if d.get("unattended") else ")")) + _if(d, "error", "; {}")),
    Kind.HEARTBEAT_FAILED: lambda d: f"the driver's heartbeat could not be written ({d.get('error')}); it tries again",
    Kind.PULLED: lambda d: f"pulled to {d.get('dir')}",
    Kind.DRIVER_LOST: lambda d: f"{d.get('driver')} no longer drives the run" + _if(d, "holder", ": {} has it"),
    Kind.HANDED_OVER: lambda d: f"handed over to {d.get('to')}",
    Kind.JOURNAL_DEFERRED: lambda d: f"the journal could not reach the bucket ({d.get('error')}); it goes next step",
    Kind.BOOT_FAILED: lambda d: (f"{_attempt(d)}: host {d.get('instance')} failed to boot at {d.get('boot_phase')}"
                                 + _if(d, "reason", ": {}")),
    Kind.PRUNE_FAILED: lambda d: f"{_attempt(d)}: old checkpoints could not be pruned ({d.get('error')})",
    Kind.ADOPTED: lambda d: f"host {d.get('instance') or d.get('instance_id')} already ran for this launch: kept",
    Kind.RECONCILE: lambda d: (f"after a restart, {_attempt(d)}{_if(d, 'instance', ' ({})')}: "
                               f"{_RECONCILED.get(str(d.get('action')), d.get('action'))}"),
    Kind.ZONES_UNKNOWN: lambda d: f"the zones of {d.get('region')} could not be listed ({d.get('error')})",
    Kind.RETRY: lambda d: (f"{d.get('provider') or 'the cloud'} call {d.get('call') or d.get('action')} retried"
                           + _if(d, "code", " after {}") + _if(d, "wait_s", " in {} s")),
    Kind.FAILOVER: lambda d: f"no room in {d.get('zone')}" + _if(d, "code", " ({})") + _if(d, "next_zone", ": trying {}"),
    Kind.SUBNET_FULL: lambda d: f"subnet {d.get('subnet')} is full" + _if(d, "next_subnet", ": trying {}"),
    Kind.QUOTA: lambda d: f"an account quota blocks {d.get('instance_type') or 'the launch'} ({d.get('code')})",
    Kind.QUOTE: lambda d: (f"quoted {d.get('price')} {d.get('currency') or ''}/h for {d.get('instance_type')} "
                           f"({d.get('market')})" + _if(d, "zone", " in {}")),
    Kind.PRICE_TOO_LOW: lambda d: (f"the max price {d.get('max_price')} is below the spot price"
                                   + _if(d, "current_price", " {}") + _if(d, "zone", " in {}")),
    Kind.PRICE_LOOKUP_FAILED: lambda d: f"the price could not be looked up ({d.get('code')})",
    Kind.HOST_STARTED: lambda d: f"host {d.get('instance')} started" + _if(d, "pid", " (pid {})")
    + _if(d, "nodes", ", a group of {} hosts"),
    # The words keep the name "reclaim-notice": a reader finds it by that (tests/e2e/test_run_local.py).
    Kind.RECLAIM_NOTICE: lambda d: (f"reclaim-notice for host {d.get('instance')}" + _if(d, "node", " (node {})")
                                    + (f": taken back at {_clock(d['terminate_at'])}" if d.get("terminate_at") else "")
                                    + (" (simulated)" if d.get("simulated") else "") + "; the host saves and stops"),
    Kind.HOST_BUSY: lambda d: f"host {d.get('host')} is busy" + _if(d, "run", " with {}"),
    Kind.HOST_UNREACHABLE: lambda d: f"host {d.get('host')} cannot be reached" + _if(d, "error", " ({})"),
    Kind.SSH_RETRY: lambda d: f"ssh to {d.get('host')} retried ({d.get('op')})" + _if(d, "error", ": {}"),
    Kind.SSH_HOST_KEY_TRUSTED: lambda d: f"host key of {d.get('host')} trusted on first use ({d.get('fingerprint')})",
    Kind.STORE_CREDENTIALS: lambda d: f"host {d.get('instance')} given bucket credentials" + _if(d, "expires", " until {}"),
    Kind.STORE_CREDENTIALS_RENEWED: lambda d: (f"host {d.get('instance')}'s bucket credentials renewed"
                                               + _if(d, "expires", " until {}")),
    Kind.REPRICED: lambda d: f"{_attempt(d)} repriced at ${d.get('price_usd')}/h from the {d.get('source')}",
    Kind.BUCKET_SIZE_FAILED: lambda d: f"{_attempt(d)}: the bucket could not be sized ({d.get('error')})",
    Kind.GC_TERMINATED: lambda d: f"gc ended host {d.get('instance_id')}, which no live run owned",
    Kind.BATCH_SUBMITTED: lambda d: (f"batch job submitted: {d.get('items')} items" + _if(d, "images", ", {} images")
                                     + _if(d, "workers", ", {} workers")),
    Kind.BATCH_CANCELLED: lambda d: "batch job cancelled" + _if(d, "reason", ": {}"),
    Kind.BATCH_CANCEL_MARKER_FAILED: lambda d: f"the cancel marker could not reach the bucket ({d.get('error')})",
    Kind.BATCH_SCHEDULE_FIRED: lambda d: f"schedule {d.get('schedule')} fired for {d.get('wall')}" + _if(d, "driver", " ({})"),
    Kind.WORKER_STARTED: lambda d: f"worker started in slot {d.get('slot')}" + _if(d, "pid", " (pid {})"),
    Kind.WORKER_EXITED: lambda d: f"worker in slot {d.get('slot')} exited" + _if(d, "rc", " (exit {})"),
    **{k: _batch_ended(k) for k in BATCH_ENDED},
    **{k: _run_ended(k) for k in RUN_ENDED},
    Kind.STRAYS: lambda d: f"hosts of this run that no attempt owns, ended: {', '.join(map(str, d.get('instances') or []))}",
    Kind.TERMINATE_FAILED: lambda d: f"{_attempt(d)}: its host could not be ended ({d.get('error')}); the next sweep tries",
    Kind.SWEEP_FAILED: lambda d: f"the search for stray hosts failed ({d.get('error')}); it tries again",
    Kind.PRICE_HISTORY_FAILED: lambda d: (f"{_attempt(d)}: the spot price history could not be read ({d.get('error')}); "
                                          "priced at its launch quote"),
    Kind.STORE_CREDENTIALS_FAILED: lambda d: f"host {d.get('instance')}'s bucket credentials failed ({d.get('error')})",
    Kind.CLOUD_MOVED: lambda d: (f"moved from {d.get('from')} to {d.get('to')}" + _if(d, "why", " ({})")
                                 + _if(d, "step", ": checkpoint {}") + _if(d, "bytes", ", {} bytes copied")
                                 + _if(d, "egress_usd", ", egress {} USD")),
    Kind.CLOUD_MOVE_FAILED: lambda d: (f"the copy to {d.get('to')} was cut ({d.get('error')}); the run stays in "
                                       f"{d.get('from')} and tries again, using no half-made checkpoint"),
}


def words(kind: Kind | str, data: dict) -> str | None:
    """An event told in plain words, or None for a kind only -v shows (an old spelling reads as today's)."""
    told = WORDS.get(parse(kind))  # type: ignore[call-overload]
    return told(data) if told is not None else None
