"""Worker hosts a batch job's dead driver left running, found before the job launches another.

A driver that dies (the laptop's killed, a cloud driver's invocation cut short before it journaled)
can leave a worker host at work whose attempt this driver's rows do not hold open: launched by the
other driver, or ended here while its terminate failed. The fleet's stray sweep would end it, but
only after the step had launched a replacement, so the job would pay two hosts for one worker slot
for a while. Before any launch the controller asks the cloud for the job's tagged hosts: one it has
no row for, next in the attempts' order, is adopted into an open slot (its worker keeps its id and
its items' leases; its on-demand price goes into the cost ledger); any other is ended. The local
pool does the same for its worker processes (local_pool.adopt_orphans, event worker-adopted).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Protocol

from ..events import Kind
from ..offers.optimizer import Offer
from ..providers.base import TAG_ATTEMPT, TAG_TOKEN, LaunchSpec, ProviderError
from ..fleet.lifecycle import Fleet

ROOT_VOLUME_GB = next(f.default for f in dataclasses.fields(LaunchSpec) if f.name == "root_volume_gb")


class OrphanOwner(Protocol):
    """What adopting or ending a batch job's orphan hosts reads of its controller (batch/controller.py)."""

    fleet: Fleet
    provider: Any
    job_id: str
    state: Any
    event: Callable[..., None]


def _offer_for(ctl: OrphanOwner, inst: Any) -> Offer | None:
    """The candidate offer the host was launched from: its type in its zone, else its type anywhere."""
    same = [o for o in ctl.fleet.candidates if o.row.instance_type == inst.instance_type]
    best = next((o for o in same if o.row.zone == inst.zone), None) or next(iter(same), None)
    return Offer(best.row, inst.market) if best is not None else None


def _attempt_of(inst: Any) -> int:
    tag = str(inst.tags.get(TAG_ATTEMPT, ""))
    return int(tag) if tag.isdigit() else 0


def adopt_or_end(ctl: OrphanOwner, want: int) -> dict[str, list[str]]:
    """Adopt the job's orphan hosts into the slots left of `want` open hosts; end the others.
    Returns what was done, by instance id. A cloud that cannot be asked now changes nothing
    (the sweep asks again; a launch then may briefly overlap a host the sweep ends)."""
    fleet = ctl.fleet
    try:
        live = [i for i in ctl.provider.find_tagged(ctl.job_id) if i.live]
    except ProviderError as exc:
        ctl.event(Kind.SWEEP_FAILED, {"error": str(exc)})
        return {"adopted": [], "ended": []}
    owned = {a.token for a in fleet.open_attempts()}
    done: dict[str, list[str]] = {"adopted": [], "ended": []}
    for inst in sorted((i for i in live if i.tags.get(TAG_TOKEN) not in owned), key=_attempt_of):
        rows = fleet.attempts()
        n = _attempt_of(inst)
        # Adoptable: a host whose attempt this machine never recorded, numbered next, so its worker's
        # id and boot report (both by attempt) stay its own and the next launch takes the next number.
        if len(fleet.open_attempts()) < want and n == len(rows) + 1 and inst.tags.get(TAG_TOKEN):
            _adopt(ctl, inst, n)
            done["adopted"].append(inst.id)
            continue
        try:
            ctl.provider.terminate([inst.id], region=inst.region)
        except ProviderError as exc:
            ctl.event(Kind.TERMINATE_FAILED, {"attempt": n, "error": str(exc)})
            continue
        ctl.event(Kind.RECONCILE, {"action": "ended-orphan", "attempt": n, "instance": inst.id})
        done["ended"].append(inst.id)
    return done


def _adopt(ctl: OrphanOwner, inst: Any, n: int) -> None:
    from ..costs import ledger

    offer = _offer_for(ctl, inst)
    usd = offer.price_per_hour_usd if offer is not None else inst.price_per_hour
    start = inst.launched_at.timestamp() if inst.launched_at else time.time()
    ctl.state.add_attempt(ctl.job_id, n, inst.provider, inst.tags[TAG_TOKEN], region=inst.region, zone=inst.zone,
                          instance_type=inst.instance_type, market=inst.market, price=usd, currency="USD")
    ctl.state.update_attempt(ctl.job_id, n, instance_id=inst.id, state="running", start=start)
    if offer is not None:
        ledger.started(ctl.state, ctl.job_id, n, offer, inst.market, ROOT_VOLUME_GB, zone=inst.zone, at=start)
    ctl.event(Kind.RECONCILE, {"action": "adopted-orphan", "attempt": n, "instance": inst.id})
