"""One look at a run's running attempt (the controller's step while a host works): what its host
reports, priced and recorded, and what that report ends (the attempt, the run) or leaves to the fleet.

The controller (runs/driving/controller.py) calls `watch` once a step; what it reads of the controller is
WatchOwner, the owner contract (owner.py) with the run's own parts.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

from ...costs import ledger as cost_ledger
from ...events import Kind
from ...offers.optimizer import Offer
from ...providers.capabilities import RenewsHostCredentials
from ...spot.policy import ON_DEMAND, SPOT
from ..records.run_state import RunState
from ..records.state import Attempt
from . import health_view, hostboot, oom_move, simulated_reclaim
from .agent_reports import report_agent_problems
from .budget_watch import budget_spent, budget_warnings
from .host_status import HostStatus
from .owner import RunOwner, steps_before
from .run_row import RunRow

# The phases in which a host's step is its training's (a resume is announced at the first of them).
TRAINING_PHASES = ("training", "saving", "uploading", "succeeded")


class WatchOwner(RunOwner, Protocol):
    """What `watch` reads of the controller beyond the owner contract."""

    provider: Any
    host: HostStatus
    row: RunRow
    total_steps: int
    store_conf: dict
    emit: Callable[[Kind, dict], None]

    def cost_so_far(self) -> float: ...

    def decide(self, running: Attempt | None) -> tuple[str, Offer | None]: ...

    def close_attempt(self, cur: Attempt, end: float, ended_for: tuple[str, str | None] | None = None) -> None: ...


def watch(ctl: WatchOwner, cur: Attempt) -> None:
    """Read attempt `cur`'s status, record what it says, and act on it once."""
    status = ctl.host.read_status(strict=True)
    if status and status.get("attempt") != cur.n:
        status = None
    if status is None:  # a store that refused the host's writes: the host's own copy, where readable
        status = hostboot.host_side_status(ctl.provider, cur)
    phase = status.get("phase") if status else None
    cost_ledger.observe(ctl.state, ctl.run_id, cur, status, sample=lambda: price_sample(ctl.provider, cur))
    report_agent_problems(ctl, cur.n, status)
    oom_move.oom_events(ctl, cur.n, status)
    health_view.note(ctl, cur.n, status)
    if oom_move.weigh_throttle(ctl, cur, status, total_steps=ctl.total_steps, every=ctl.spec.checkpoint_every):
        return  # moving off a throttled GPU: the next attempt launches elsewhere
    if status and status.get("step") is not None:
        _progress(ctl, cur, status, phase)
    if _ended_by_budget_or_cap(ctl, cur, status, phase):
        return
    if phase == "succeeded":
        ctl.end_attempt(cur, "succeeded")
        ctl.end_run(RunState.SUCCEEDED, None)
        return
    if hostboot.on_failure_cause(ctl, cur, status):  # a refusal that recurs ends the run; others count
        return
    if hostboot.is_boot_failure(status):  # a bad host or image: the next offer, not the end
        return hostboot.on_boot_failure(ctl, cur, status)
    if oom_move.is_out_of_memory(status):  # the memory ladder is spent: an offer with more VRAM
        return oom_move.on_out_of_memory(ctl, cur, status)
    if phase == "failed":
        ctl.end_attempt(cur, "failed")
        ctl.end_run(RunState.FAILED, status.get("reason") or "the host agent failed")
        return
    _keep_or_replace(ctl, cur, status, phase)


def _progress(ctl: WatchOwner, cur: Attempt, status: dict, phase: str | None) -> None:
    step = int(status["step"])
    if cur.n not in ctl.memo.seen_attempts and phase in TRAINING_PHASES:
        ctl.memo.seen_attempts.add(cur.n)
        if cur.n > 1:
            announce_resume(ctl, cur, status)
    simulated_reclaim.on_progress(ctl, ctl.provider, cur, step)
    ctl.row.update(step=step)
    ctl.emit(Kind.PROGRESS, {"attempt": cur.n, "phase": phase, "step": step, "total": ctl.total_steps,
                             "it_per_s": status.get("it_per_s"), "cost": ctl.cost_so_far()})


def _ended_by_budget_or_cap(ctl: WatchOwner, cur: Attempt, status: dict | None, phase: str | None) -> bool:
    """The run's budget spent, or the host ended itself at its lifetime cap: the run stops (True)."""
    budget = ctl.spec.budget
    if budget is not None:
        spent = ctl.cost_so_far()
        budget_warnings(ctl, spent)
        if budget_spent(spent, budget, [cur], ctl.timing.poll_seconds):
            ctl.event(Kind.BUDGET_REACHED, {"attempt": cur.n, "budget": budget, "spent": round(spent, 4)})
            ctl.end_attempt(cur, "budget")
            ctl.end_run(RunState.STOPPED, f"budget ${budget:g} reached; checkpoint kept in the bucket")
            return True
    if status and status.get("ended_by") == "lifetime-cap" and phase in ("preempted", "failed", "succeeded"):
        # The host saved and ended itself at its cap: not a reclaim, nothing to relaunch.
        ctl.end_attempt(cur, "lifetime-cap")
        ctl.end_run(RunState.STOPPED,
                    f"the host's lifetime cap was reached ({status.get('cap')}); checkpoint kept in the bucket")
        return True
    return False


def _keep_or_replace(ctl: WatchOwner, cur: Attempt, status: dict | None, phase: str | None) -> None:
    """The fleet's check of a host that neither finished nor failed: kept (its keys renewed, the deadline
    weighed), or closed for the next attempt to replace it."""
    outcome = ctl.fleet.check(cur, phase, status.get("time") if status else None,
                              status.get("step") if status else None)
    if outcome in hostboot.COUNTED_OUTCOMES:  # never reported, or its agent failed: counted toward the limit
        ctl.close_attempt(cur, time.time())
        return hostboot.check_limit(ctl)
    if outcome == "ok" and isinstance(ctl.provider, RenewsHostCredentials) and cur.instance_id:
        # A box of the user's holds short-lived store keys only: keep them fresh while it trains.
        ctl.provider.renew_credentials(cur.instance_id, ctl.run_id, ctl.store_conf,
                                       events=lambda k, d: ctl.event(k, {"attempt": cur.n, **d}))
    if outcome != "ok":
        ctl.close_attempt(cur, time.time())
        ctl.set_state(RunState.RECOVERING)
        hostboot.check_unreported(ctl)
        return
    if cur.market == SPOT and ctl.spec.deadline_hours:
        kind, offer = ctl.decide(cur)
        if kind == ON_DEMAND:
            ctl.event(Kind.DEADLINE_FALLBACK, {"attempt": cur.n, "to": offer.key if offer else None})
            ctl.end_attempt(cur, "switched")


def announce_resume(ctl: WatchOwner, cur: Attempt, status: dict) -> None:
    """Tell where attempt n took up the work: the step it resumed from and the steps redone."""
    resumed = status.get("resumed_from")
    if resumed is None:
        resumed = max(0, int(status["step"]) - 1)
    done_before = steps_before(ctl.state, ctl.row.get(), cur.n)  # as far as the attempts before got
    ctl.event(Kind.RESUMED, {"attempt": cur.n, "from_step": int(resumed),
                             "lost_steps": max(0, done_before - int(resumed)), "zone": cur.zone,
                             "instance_type": cur.instance_type})


def price_sample(provider: Any, cur: Attempt) -> list:
    """The current spot price of the attempt's own type and zone (Tencent: its one quote)."""
    from ...costs.pricing import utc

    return provider.price_history(cur.instance_type, cur.zone, (now := utc(time.time())), now)
