"""What a spot policy sees and answers (spot/policy.py): the observation a caller fills at a decision
point, each zone's view, and the action; kept apart so that the policy's rules across clouds
(spot/across.py) read them without the policies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

SPOT = "spot"
ON_DEMAND = "on-demand"
WAIT = "wait"
KINDS = (SPOT, ON_DEMAND, WAIT)
# Float slack for comparisons of hours that are sums of ticks.
EPS = 1e-9


@dataclass(frozen=True, slots=True)
class ZoneView:
    """One zone (or region) the job may run in, as the controller sees it now."""

    key: str
    spot_available: bool
    spot_price: float
    ondemand_price: float
    # The cloud the zone lies in, where a job may use more than one ("" where all are one). A
    # launch in another cloud than the one holding the newest checkpoint is a move (docs/policies.md).
    cloud: str = ""


@dataclass(slots=True)
class Observation:
    """What a controller knows at a decision point.

    `market` is the market of the instance running now, or None when nothing runs (never
    started, waiting, or just reclaimed); `zone` is the zone of that instance, or of the last one
    when nothing runs (None before the first launch). `tick_hours` is how long the answer will
    stand before the next decision (the controller's poll interval); the safety margins use it.
    `spot_refusals` counts the spot launches refused in a row since the last launch that went
    through; `has_deadline` is False when `deadline_hours` only stands in for "none" (then spot
    may be waited for however long it takes).
    """

    elapsed: float
    progress: float
    job_hours: float
    deadline_hours: float
    restart_hours: float
    zone: str | None
    market: str | None
    zones: Sequence[ZoneView]
    tick_hours: float = 0.0
    spot_refusals: int = 0
    has_deadline: bool = True
    # Work a reclaim now would lose: since the last durable checkpoint, where the save at the notice
    # cannot be durable (the simulator's checkpoint model); 0 where the notice save is.
    at_risk: float = 0.0
    # Across clouds: the cloud holding the newest checkpoint (None: one cloud, nothing ever moves),
    # and what a launch in another cloud adds to a restart: the copy's hours and its egress in USD.
    data_cloud: str | None = None
    move_hours: float = 0.0
    move_usd: float = 0.0

    @property
    def time_left(self) -> float:
        return self.deadline_hours - self.elapsed

    @property
    def work_left(self) -> float:
        return self.job_hours - self.progress


@dataclass(frozen=True, slots=True)
class Action:
    kind: str  # "spot", "on-demand" or "wait"
    zone: str | None = None  # the zone to run in (spot: required; on-demand: preferred)


WAIT_ACTION = Action(WAIT)


def crosses(obs: Observation, zone: ZoneView) -> bool:
    """Whether a launch in `zone` moves the job to another cloud (its checkpoint copied there first)."""
    return obs.data_cloud is not None and zone.cloud != obs.data_cloud
