"""Ending a host that only the run's bucket reaches: one that another machine launched (a local host
of that machine) and this machine's provider does not know, found alive by its heartbeat in the
bucket after a take-over (`watch --drive`, a second machine's background controller).

`sdcloud down`, a budget or a deadline's move then ends the host that actually trains: the driver
asks it through the bucket (sdcloud_agent/end_request.py) to save and end, and waits for its
terminal phase, its durable checkpoint uploaded. The attempt is closed at the host's own end (the
time of its last report), with the step of its last durable checkpoint.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from sdcloud_agent.end_request import END_GRACE_S, ask

from ..records.lease import this_driver
from ..records.lease import DriverLease
from ..records.state import Attempt, StateStore
from .host_status import HostStatus

TERMINAL = ("preempted", "succeeded", "failed")
# The driver waits this much beyond the host's own grace before it gives the host up as lost.
SLACK_S = 30.0


class RemoteEndOwner(Protocol):
    """What ending a host through the bucket reads of the run's driver."""

    provider: Any
    host: HostStatus
    timing: Any
    run_id: str
    store: Any
    lease: DriverLease
    state: StateStore


def alive_elsewhere(ctl: RemoteEndOwner, cur: Attempt) -> dict | None:
    """The host's status when this machine's provider does not know its instance but the bucket
    says it lives (a fresh heartbeat, a phase that is not its last); otherwise None."""
    if not cur.instance_id:
        return None
    try:
        if ctl.provider.describe([cur.instance_id], region=cur.region):
            return None  # the provider reaches it: ended the ordinary way
    except Exception:  # noqa: BLE001 - a provider that cannot say: the ordinary way
        return None
    status = ctl.host.read_status()
    if not status or status.get("attempt") != cur.n or status.get("phase") in TERMINAL:
        return None
    if time.time() - float(status.get("time") or 0.0) > ctl.timing.heartbeat_timeout:
        return None
    return status


def ask_host(ctl: RemoteEndOwner, cur: Attempt, reason: str, sleep: Any = time.sleep) -> float | None:
    """Ask a host that only the bucket reaches to save and end, and wait for it: the time it ended (its
    last report), or None when the provider here reaches the host (nothing asked)."""
    status = alive_elsewhere(ctl, cur)
    if status is None:
        return None
    ask(ctl.store, f"runs/{ctl.run_id}", cur.n, this_driver(), reason)
    until = time.time() + END_GRACE_S + SLACK_S
    last = status
    while time.time() < until:
        seen = ctl.host.read_status()
        if seen and seen.get("attempt") == cur.n:
            last = seen
            if seen.get("phase") in TERMINAL:
                break
            if time.time() - float(seen.get("time") or 0.0) > ctl.timing.heartbeat_timeout:
                break  # it went away before it said so
        sleep(max(0.2, min(1.0, ctl.timing.poll_seconds)))
        ctl.lease.renew()  # the wait outlasts a lease term: the run stays this driver's meanwhile
    if last.get("step") is not None:
        ctl.state.update_run(ctl.run_id, step=int(last["step"]))  # its durable step, after the save
    return float(last.get("time") or time.time())
