"""A paused host of a market whose outbid hosts pause (MarketRules.pauses: Vast.ai), for a fleet.

The fleet asks at each check of a PAUSED instance whether to keep its attempt: spot/pause.py decides
from the owner's progress (work left, deadline), the pauses measured so far, the machine's new
minimum bid and the best other offer. Waiting keeps the attempt (no transfer, the disk billed);
raising the bid asks the provider (capabilities.ChangesBid) and keeps it; a relaunch is a reclaim
with no notice, ended and replaced from the last durable checkpoint as any reclaim is.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..events import Kind
from ..providers.base import PAUSED
from ..providers.capabilities import ChangesBid
from ..spot.pause import PauseChoice, PauseDecision, PauseFacts, decide

UNKNOWN_WORK_HOURS = 1.0  # work left when the owner says nothing of its progress (a batch worker)


class PauseWatch:
    def __init__(self, fleet: Any, progress: Callable[[], Any] | None = None, clock: Callable[[], float] = time.time):
        self.fleet = fleet
        self.progress = progress  # the owner's Progress (elapsed, done, job and deadline hours), when it has one
        self.clock = clock
        self.since: dict[str, float] = {}  # instance -> when its pause was first seen
        self.history: list[float] = []  # the owner's pauses so far, hours
        self.resumed: dict[str, float] = {}  # instance -> when it came back (its heartbeat is old until it reports)
        self._said: dict[str, str] = {}

    def facts(self, inst: Any, paused_hours: float) -> PauseFacts:
        work_left, to_deadline = UNKNOWN_WORK_HOURS, None
        if self.progress is not None:
            p = self.progress()
            work_left = max(0.0, p.job_hours - p.done_hours)
            if p.deadline_hours is not None:
                to_deadline = p.deadline_hours - p.elapsed_hours
        provider = self.fleet.provider
        min_bid = provider.min_bid(inst.id) if isinstance(provider, ChangesBid) else None
        others = [o.price_per_hour_usd for o in self.fleet.candidates]
        bid = float(inst.price_per_hour or 0.0)
        return PauseFacts(paused_hours, work_left, to_deadline, bid, min_bid, self.fleet.max_price,
                          min(others) if others else bid, tuple(self.history))

    def keep(self, cur: Any, inst: Any) -> bool:
        """At a check of `inst`: True to keep the attempt (running, waited for, or its bid raised), False
        when a paused host is to be replaced (the fleet then takes it as a reclaim with no notice)."""
        now = self.clock()
        if inst.state != PAUSED:
            start = self.since.pop(inst.id, None)
            if start is not None:
                self.history.append((now - start) / 3600)
                self.resumed[inst.id] = now
                self.fleet.event(Kind.HOST_RESUMED, {"attempt": cur.n, "instance": inst.id, "paused_s": round(now - start)})
            return True
        start = self.since.setdefault(inst.id, now)
        decision = decide(self.facts(inst, (now - start) / 3600))
        self._say(cur, inst, decision, now - start)
        if decision.choice == PauseChoice.RAISE_BID and decision.new_bid is not None:
            self.fleet.provider.change_bid(inst.id, decision.new_bid)
            return True
        if decision.choice == PauseChoice.WAIT:
            return True
        self.since.pop(inst.id, None)
        self.history.append((now - start) / 3600)
        return False

    def waiting(self, instance_id: str, heartbeat_timeout: float) -> bool:
        """Whether the host's heartbeat is old because of a pause: paused now, or back for less than a timeout."""
        back = self.resumed.get(instance_id)
        return instance_id in self.since or (back is not None and self.clock() - back < heartbeat_timeout)

    def _say(self, cur: Any, inst: Any, d: PauseDecision, paused_s: float) -> None:
        if self._said.get(inst.id) == d.choice:
            return
        self._said[inst.id] = d.choice
        self.fleet.event(Kind.HOST_PAUSED, {"attempt": cur.n, "instance": inst.id, "choice": str(d.choice), "why": d.why,
                                            "paused_s": round(paused_s), "bid": inst.price_per_hour, "new_bid": d.new_bid})
