"""A paused host: wait for it, raise its bid, or relaunch elsewhere (docs/policies.md, "Pauses").

On a marketplace whose outbid hosts pause instead of ending (MarketRules.pauses: Vast.ai), a reclaim
comes with no notice and is not final: the host keeps its disk (billed) and resumes on the same
machine when its bid wins again, perhaps hours later. The choice, one object for the controller's
fleet (fleet/pauses.py) and the replay below:

  expected wait  = the mean of the run's measured pauses (PRIOR_PAUSE_HOURS before it has any):
                   pauses are taken as memoryless, so a pause that has lasted long is expected to
                   last as long again as the mean, not to be nearly over;
  can wait       = no deadline, or the slack (hours to the deadline less the work left and a restart)
                   covers the expected wait; and the pause is younger than the patience
                   (PATIENCE_PAUSES x the expected wait, at most MAX_WAIT_HOURS): a host that never
                   comes back is not waited for without a limit;
  raise the bid  = when it cannot wait and a bid over the machine's new minimum fits --max-price,
                   if the extra $/h over the work left costs less than a relaunch:
                   (raised - bid) x hours left  <  restart hours x price elsewhere + (price elsewhere - bid) x hours left;
  relaunch       = otherwise: end the paused host and start another from the last durable checkpoint.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Sequence

# Before a run has seen a pause of its own: an hour (assumption; Vast.ai publishes no outbid statistics,
# so the measured pauses take over from the first one: docs/policies.md).
PRIOR_PAUSE_HOURS = 1.0
PATIENCE_PAUSES = 2.0  # wait at most this many expected pauses
MAX_WAIT_HOURS = 6.0  # ...and never longer than this for one pause
RESTART_HOURS = 0.2  # a new host to its first step (offers/optimizer.py RESTART_HOURS)


class PauseChoice(StrEnum):
    WAIT = "wait"
    RAISE_BID = "raise-bid"
    RELAUNCH = "relaunch"


@dataclass(frozen=True)
class PauseFacts:
    """What the controller knows of one paused host, in hours and USD per hour."""

    paused_hours: float  # how long this pause has lasted
    work_left_hours: float  # at the measured rate
    hours_to_deadline: float | None  # None: no deadline
    bid: float  # the host's bid now
    min_bid: float | None  # the machine's minimum bid now (None: not known: no raise)
    max_price: float | None  # the user's --max-price (None: no cap)
    relaunch_price: float  # $/h of the best other offer
    history_hours: Sequence[float] = field(default_factory=tuple)  # earlier pauses of the run, measured
    restart_hours: float = RESTART_HOURS
    at_risk_hours: float = 0.0  # work since the last durable checkpoint, lost by a relaunch
    bid_margin: float = 0.15


@dataclass(frozen=True)
class PauseDecision:
    choice: PauseChoice
    why: str
    new_bid: float | None = None


def expected_pause_hours(history: Sequence[float]) -> float:
    return statistics.fmean(history) if history else PRIOR_PAUSE_HOURS


def patience_hours(history: Sequence[float]) -> float:
    return min(MAX_WAIT_HOURS, PATIENCE_PAUSES * expected_pause_hours(history))


def decide(f: PauseFacts) -> PauseDecision:
    expect = expected_pause_hours(f.history_hours)
    slack = None if f.hours_to_deadline is None else f.hours_to_deadline - f.work_left_hours - f.restart_hours
    patience = patience_hours(f.history_hours)
    if slack is not None and slack < expect:
        why = f"slack {slack:.2f} h is less than the expected pause {expect:.2f} h"
    elif f.paused_hours >= patience:
        why = f"paused {f.paused_hours:.2f} h, past the patience of {patience:.2f} h"
    else:
        return PauseDecision(PauseChoice.WAIT, f"expected pause {expect:.2f} h; slack "
                             + ("unbounded (no deadline)" if slack is None else f"{slack:.2f} h"))
    relaunch_usd = ((f.restart_hours + f.at_risk_hours) * f.relaunch_price
                    + (f.relaunch_price - f.bid) * f.work_left_hours)
    if f.min_bid is not None:
        new_bid = round(max(f.min_bid, f.bid) * (1 + f.bid_margin), 4)
        if f.max_price is None or new_bid <= f.max_price + 1e-9:
            raise_usd = (new_bid - f.bid) * f.work_left_hours
            if raise_usd <= relaunch_usd:
                return PauseDecision(PauseChoice.RAISE_BID, f"{why}; a bid of ${new_bid:g}/h costs ${raise_usd:.3f} more, "
                                     f"a relaunch ${relaunch_usd:.3f}", new_bid)
            why += f"; raising to ${new_bid:g}/h (${raise_usd:.3f}) costs more than a relaunch (${relaunch_usd:.3f})"
        else:
            why += f"; the winning bid ${new_bid:g}/h is above --max-price ${f.max_price:g}/h"
    return PauseDecision(PauseChoice.RELAUNCH, why)


# --- replay: the policy against always waiting and always relaunching, on pause periods ---------------

@dataclass(frozen=True)
class Replay:
    name: str
    hours: float  # wall-clock hours to finish
    cost: float  # USD
    met_deadline: bool


def replay(pauses: Sequence[tuple[float, float]], work_hours: float, bid: float, relaunch_price: float,
           deadline_hours: float | None, choose: str = "policy", disk_usd_per_hour: float = 0.01,
           margin: float = 0.15, max_price: float | None = None, restart_hours: float = RESTART_HOURS,
           checkpoint_hours: float = 0.25) -> Replay:
    """Finish `work_hours` of work on one machine whose outbid pauses are `pauses` ((start in hours of work
    done, length in wall hours)), deciding at each pause by `choose`: "policy" (decide(), asked when the
    pause begins and again when its patience runs out), "wait" or "relaunch".

    Model (docs/policies.md, "Pauses"): a wait pays the disk; a raise ends this pause at once and pays
    the raised bid from then on, the outbidder's bid taken as just over ours (later pauses still come:
    the trace does not say what bid would have kept the machine); a relaunch moves to an offer at
    `relaunch_price` that is not paused (on demand, or a calmer machine), after a restart and half a
    checkpoint interval of lost work. Bounded: one decision or two per pause, len(pauses) pauses."""
    clock, done, cost, price, history = 0.0, 0.0, 0.0, bid, []

    def finish(extra_hours: float, at_price: float) -> Replay:
        hours = clock + extra_hours
        return Replay(choose, hours, cost + extra_hours * at_price, deadline_hours is None or hours <= deadline_hours + 1e-9)

    def ask(paused: float) -> PauseDecision:
        left = work_hours - done
        return decide(PauseFacts(paused, left, None if deadline_hours is None else deadline_hours - clock, price,
                                 price * 1.0001, max_price, relaunch_price, tuple(history), restart_hours,
                                 checkpoint_hours / 2, margin))

    for start, length in sorted(pauses):
        if start >= work_hours:
            break
        clock, cost, done = clock + (start - done), cost + (start - done) * price, start
        if choose == "wait":
            d = PauseDecision(PauseChoice.WAIT, "always")
        elif choose == "relaunch":
            d = PauseDecision(PauseChoice.RELAUNCH, "always")
        else:
            d = ask(0.0)
            if d.choice == PauseChoice.WAIT and length > patience_hours(history):
                waited = patience_hours(history)
                clock, cost = clock + waited, cost + waited * disk_usd_per_hour
                d, length = ask(waited), length - waited
                history.append(waited)
        if d.choice == PauseChoice.WAIT:
            clock, cost = clock + length, cost + length * disk_usd_per_hour
            history.append(length)
        elif d.choice == PauseChoice.RAISE_BID and d.new_bid is not None:
            price = d.new_bid
        else:
            return finish(work_hours - done + restart_hours + checkpoint_hours / 2, relaunch_price)
    return finish(work_hours - done, price)


# --- a trace read as pause periods (`sdcloud simulate --pauses`) -------------------------------------

def pauses_of(avail: Sequence[bool], gap_seconds: float, start: int = 0, work_hours: float = 0.0) -> list[tuple[float, float]]:
    """One machine's pauses from an availability trace read from tick `start` (wrapping round): each run of
    unavailable ticks is a pause (start in hours of work done, length in wall hours), until `work_hours`
    of available ticks have passed (at most two laps of the trace: a trace with no availability ends)."""
    n, tick = len(avail), gap_seconds / 3600
    out: list[tuple[float, float]] = []
    done, paused, k = 0.0, 0.0, 0
    while k < 2 * n and (work_hours <= 0 or done < work_hours):
        if avail[(start + k) % n]:
            if paused:
                out.append((done, paused))
                paused = 0.0
            done += tick
        else:
            paused += tick
        k += 1
    if paused:
        out.append((done, paused))
    return out


def compare(traces: Sequence, work_hours: float, deadline_hours: float | None, bid: float, relaunch_price: float,
            restart_hours: float = RESTART_HOURS, starts: int = 100, seed: int = 0) -> list[dict]:
    """The pause policy against always waiting and always relaunching, over `starts` random start points
    of each trace (the same points for every choice): mean hours, mean USD, deadlines met."""
    import numpy as np

    rng = np.random.default_rng(seed)
    points = [(t, int(rng.integers(0, len(t.avail)))) for t in traces for _ in range(max(1, starts // max(1, len(traces))))]
    rows = []
    for choose in ("policy", "wait", "relaunch"):
        runs = [replay(pauses_of(t.avail, t.gap_seconds, s, work_hours), work_hours, bid, relaunch_price, deadline_hours,
                       choose, restart_hours=restart_hours) for t, s in points]
        rows.append({"choice": "sdcloud" if choose == "policy" else f"always-{choose}",
                     "mean_hours": round(float(np.mean([r.hours for r in runs])), 3),
                     "mean_usd": round(float(np.mean([r.cost for r in runs])), 4),
                     "deadline_met_pct": round(100.0 * sum(r.met_deadline for r in runs) / len(runs), 1),
                     "runs": len(runs)})
    return rows
