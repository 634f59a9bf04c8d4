"""The boot side of a cloud launch: the per-run user-data (with the agent wheel uploaded first),
and what the controller does when a host reports a failed boot phase.

A boot failure (a phase of the user-data, the agent's model or dataset staging, or a GPU the agent
cannot use) ends that attempt and cools down that offer, not the run; after `max_failed_boots`
failed boots in a row the run ends with one line.

Why an attempt ended is the agent's `failure_cause` in status.json (docs/runs.md). A cause that
recurs on the next host (the store refused the host's credentials or grant, no bucket, a bad store
configuration) ends the run after that attempt; a store that stayed unreachable, refused otherwise,
or an agent error counts toward the same limit as a failed boot, as does a host that ended (or whose
agent failed) before a reclaim notice. Only a reclaim notice, or a host that reported and then
vanished, is a reclaim (sdcloud.fleet.lifecycle.Fleet.check).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from sdcloud_agent import wheel as agent_wheel

from ... import events
from ...events import Kind
from ...providers.capabilities import HasHostDir
from ...providers.traits import traits
from ..records.run_state import RunState
from .owner import RunOwner

# What a tier's run file may override with `max-failed-boots:`.
DEFAULT_MAX_FAILED_BOOTS = 3
BOOT_FAILURES = ("boot-failed", "boot-timeout", "host-failed")
# Fleet.check's outcomes that count toward the limit.
COUNTED_OUTCOMES = ("boot-failed", "boot-timeout", "host-failed")
# failure_cause values that count toward the limit (another host may not meet them); the recurring
# ones (sdcloud_agent.store.RECURRING_CAUSES) end the run at once.
COUNTED_CAUSES = ("store-unreachable", "store-refused", "agent-error")
# Hosts in a row that vanished before their first heartbeat (reclaimed during boot, or ended by a
# store that refused them) before the run ends: a bound even where no cause could be reported.
MAX_UNREPORTED_ENDS = 5
# A controller that cannot reach the store says so again at most this often while it waits.
STORE_NOTE_SECONDS = 60.0


def cloud_user_data(provider: str, store, agent: dict, infra: dict | None = None) -> str:
    """The per-run user-data for a cloud's host; uploads the agent wheel if needed."""
    from sdcloud_agent.userdata import render_user_data

    from ..inputs.network import host_network

    store_conf = agent.get("store") if isinstance(agent.get("store"), dict) else {}
    region = (infra or {}).get("region") or store_conf.get("region")
    # The region's profile, config.toml's mirrors and the run's own (sdcloud/runs/inputs/network.py).
    net = host_network(region, provider, agent.get("network"))
    agent = {k: v for k, v in agent.items() if k != "network"}
    if net:
        agent["network"] = net
    if net.get("trainer_sources") == "bucket":
        from ..inputs.carry import carry_trainer_sources

        carry_trainer_sources(store, agent)  # the host will not fetch them from GitHub
    wheel = agent_wheel.ensure_uploaded(store)
    driver = ""
    default_driver = traits(provider).host_driver
    if default_driver:  # the per-run user-data replaces the template's, driver install included
        driver = str((infra or {}).get("nvidia_driver") or default_driver)
    return render_user_data(agent, wheel_key=wheel.key, driver=driver)


def is_boot_failure(status: dict | None) -> bool:
    return bool(status and status.get("phase") == "failed" and status.get("boot_phase"))


def failed_boots_in_a_row(attempts) -> int:
    n = 0
    for a in reversed([a for a in attempts if a.end_reason]):
        if not a.end_reason.startswith(BOOT_FAILURES):
            break
        n += 1
    return n


def on_boot_failure(ctrl: RunOwner, cur, status: dict) -> None:
    """End the attempt, cool down its offer, and end the run after N failed boots in a row."""
    phase = status.get("boot_phase")
    reason = (status.get("reason") or "").strip()
    ctrl.event(Kind.BOOT_FAILED, {"attempt": cur.n, "instance": cur.instance_id, "boot_phase": phase,
                                  "reason": reason[-2000:]})
    # The phase in the attempt's end reason, so that `sdcloud status` shows it.
    ctrl.end_attempt(cur, f"boot-failed:{phase}")
    ctrl.fleet.cool_down(f"{cur.provider}/{cur.region}/{cur.zone or '*'}/{cur.instance_type}", "boot-failed")
    check_limit(ctrl, phase)


def check_limit(ctrl: RunOwner, phase: str | None = None) -> None:
    # A training run's spec is a RunSpec, a batch job's a dict (sdcloud.batch.jobs.submit).
    spec = ctrl.spec
    limit = (spec.get("max_failed_boots") if isinstance(spec, dict) else getattr(spec, "max_failed_boots", None))
    limit = limit or DEFAULT_MAX_FAILED_BOOTS
    n = failed_boots_in_a_row(ctrl.attempts())
    if n >= limit:
        where = f" (last: phase {phase})" if phase else ""
        ctrl.end_run(RunState.FAILED, f"{n} failed boots in a row{where}; see: sdcloud logs {ctrl.run_id}")
    else:
        ctrl.set_state(RunState.RECOVERING)


# -- why an attempt ended ---------------------------------------------------------------------------

def host_side_status(provider, cur) -> dict | None:
    """The host's own copy of status.json, where the controller can read it (a provider whose host
    folders are on this machine): a store that refused the host's writes leaves the bucket's copy missing."""
    if not isinstance(provider, HasHostDir) or not cur.instance_id:
        return None
    try:
        folder = provider.host_dir(cur.instance_id)
        if not folder:
            return None
        doc = json.loads((Path(folder) / "work" / "status.json").read_text())
    except (OSError, ValueError, TypeError):
        return None
    return doc if isinstance(doc, dict) and doc.get("attempt") == cur.n else None


def on_failure_cause(ctrl: RunOwner, cur, status: dict | None) -> bool:
    """End the run (a cause that recurs) or the attempt (a cause counted toward the limit) for a
    failed status; False when the status is not one of those (the caller goes on)."""
    from sdcloud_agent.store import RECURRING_CAUSES

    if not status or status.get("phase") != "failed":
        return False
    cause = status.get("failure_cause")
    reason = " ".join(str(status.get("reason") or "the host agent failed").split())
    if cause in RECURRING_CAUSES:
        ctrl.event(Kind.HOST_FAILED, {"attempt": cur.n, "instance": cur.instance_id, "cause": cause,
                                      "reason": reason[:2000]})
        ctrl.end_attempt(cur, f"failed:{cause}")
        ctrl.end_run(RunState.FAILED, f"{reason[:500]} (attempt {cur.n}; the next host would meet it too, so no other "
                                f"was launched)")
        return True
    if cause in COUNTED_CAUSES and not status.get("boot_phase"):
        ctrl.event(Kind.HOST_FAILED, {"attempt": cur.n, "instance": cur.instance_id, "cause": cause,
                                      "reason": reason[:2000]})
        ctrl.end_attempt(cur, f"host-failed:{cause}")
        check_limit(ctrl, cause)
        return True
    return False


# -- a controller that cannot reach the store ------------------------------------------------------

def is_store_fault(exc: BaseException) -> bool:
    """An error of the run's store (the agent's StoreError, botocore's transport errors, an S3
    refusal), as opposed to a bug or a provider's answer."""
    from sdcloud_agent.store import StoreError

    if isinstance(exc, StoreError):
        return True
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        return False
    if isinstance(exc, BotoCoreError):
        return True
    return isinstance(exc, ClientError) and getattr(exc, "operation_name", "") in _S3_OPERATIONS


_S3_OPERATIONS = frozenset({"GetObject", "PutObject", "HeadObject", "ListObjectsV2", "ListObjects", "DeleteObject",
                            "DeleteObjects", "CopyObject", "CreateMultipartUpload", "UploadPart",
                            "CompleteMultipartUpload", "AbortMultipartUpload", "HeadBucket"})


def store_unreachable(ctrl: RunOwner, exc: BaseException, now: float | None = None) -> None:
    """A step could not reach the store: note it (an event `watch` shows, again every minute while
    it lasts) and let the loop wait a poll and try the step again."""
    from sdcloud_agent.store import describe_failure

    now = time.time() if now is None else now
    memo = ctrl.memo
    since = memo.store_down_since
    if since is None:
        memo.store_down_since = since = now
        memo.store_noted = 0.0
    if now - memo.store_noted >= STORE_NOTE_SECONDS:
        memo.store_noted = now
        ctrl.event(Kind.STORE_UNREACHABLE, {"error": describe_failure(exc)[:500], "for_s": round(now - since),
                                            "retry_s": ctrl.timing.poll_seconds})


def store_reachable(ctrl: RunOwner, now: float | None = None) -> None:
    """The step went through: if the store had been unreachable, say that it is back."""
    since = ctrl.memo.store_down_since
    if since is not None:
        ctrl.memo.store_down_since = None
        ctrl.event(Kind.STORE_REACHABLE, {"after_s": round((time.time() if now is None else now) - since)})


def guarded(ctrl: RunOwner, step) -> bool:
    """`step()`, except that a step that cannot reach the store is noted (an event `watch` shows) and
    tried again after a poll: a store fault never ends a run's or a batch job's driver."""
    try:
        done = step()
    except Exception as exc:
        if not is_store_fault(exc):
            raise
        store_unreachable(ctrl, exc)
        return False
    store_reachable(ctrl)
    return done


def check_unreported(ctrl: RunOwner) -> None:
    """End the run when the last MAX_UNREPORTED_ENDS attempts all vanished before they reported."""
    unreported = {e["data"].get("attempt") for e in ctrl.state.events(ctrl.run_id)
                  if e["kind"] in events.HOST_GONE and e["data"].get("reported") is False}
    n = 0
    for a in reversed([a for a in ctrl.attempts() if a.end_reason]):
        if a.n not in unreported:
            break
        n += 1
    if n >= MAX_UNREPORTED_ENDS:
        ctrl.end_run(RunState.FAILED, f"{n} hosts in a row ended before they reported (reclaimed while booting, or refused "
                                f"by the store); see: sdcloud logs {ctrl.run_id}")
