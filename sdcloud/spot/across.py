"""The `sdcloud` policy's rules across clouds (spot/policy.py, Sdcloud): where a launch in another
cloud than the one holding the newest checkpoint (a move: a restart that also copies the checkpoint
and pays the source's egress) is taken. docs/policies.md, "Across clouds", has them with their figures.

- `far_zones`: another cloud's spot repays a move where HOP_HOURS of work there, against what the job
  would pay instead, save more than the move's egress and its restart and copy hours.
- `away`: spot refused SPOT_REFUSALS times in a row in the checkpoint's cloud sends the job to the
  other cloud's spot (with a deadline, where it repays against on-demand and the slack allows).
- `cheaper_away`: at a later launch, the other cloud's spot MOVE_MARGIN cheaper to finish on, the move paid.
"""

from __future__ import annotations

from typing import Sequence

from .observation import EPS, SPOT, Action, Observation, ZoneView, crosses


def pick(open_zones: Sequence[ZoneView], last: str | None) -> str:
    """Cheapest spot now; the last zone wins a tie (its data and image are warm), then list order."""
    return min(open_zones, key=lambda z: (z.spot_price, z.key != last)).key


def far_zones(obs: Observation, zones: Sequence[ZoneView], instead: float, hop_hours: float) -> list[ZoneView]:
    """Zones with spot in another cloud whose move repays itself: `hop_hours` of work (or what is
    left) there, against `instead` USD per hour, save more than the move's egress and its
    restart and copy hours paid at that spot price."""
    hours = min(obs.work_left, hop_hours)
    launch = obs.restart_hours + obs.move_hours
    return [z for z in zones
            if crosses(obs, z) and (instead - z.spot_price) * hours > obs.move_usd + launch * z.spot_price]


def on_demand_price(obs: Observation) -> float:
    """The on-demand price the job would pay now: the least in the checkpoint's cloud."""
    pool = [z for z in obs.zones if not crosses(obs, z)] or list(obs.zones)
    return min((z.ondemand_price for z in pool), default=0.0)


def here_ondemand(obs: Observation) -> float:
    """The on-demand price of the zone the job runs (or last ran) in, else the least it would pay."""
    here = next((z for z in obs.zones if z.key == obs.zone), None)
    return here.ondemand_price if here is not None else on_demand_price(obs)


def away(obs: Observation, slack: float, net: float, hop_hours: float) -> Action | None:
    """Spot refused SPOT_REFUSALS times in a row in the checkpoint's cloud: the other cloud's spot
    instead. With a deadline it stands in for on-demand here: taken where the move repays itself
    against that and the slack after its restart and copy holds the net. Without one it stands in
    for launching into the refusals until the fleet gives up: the cheapest spot there is taken."""
    if obs.data_cloud is None or obs.market is not None:
        return None
    open_far = [z for z in obs.zones if z.spot_available and crosses(obs, z)]
    far = far_zones(obs, open_far, on_demand_price(obs), hop_hours) if obs.has_deadline else open_far
    if not far or (obs.has_deadline and slack - obs.restart_hours - obs.move_hours < net - EPS):
        return None
    return Action(SPOT, pick(far, obs.zone))


def cheaper_away(obs: Observation, near: Sequence[ZoneView], open_zones: Sequence[ZoneView], slack: float,
                 net: float, margin: float | None) -> Action | None:
    """Nothing runs and spot is open in the checkpoint's cloud: move anyway when finishing the work
    left on the other cloud's spot, its restart, copy and egress paid, is `margin` cheaper than
    finishing here (a move is a restart with more at stake: a copy, a cold cache; a near tie stays).
    `margin` None: never for price alone (the rule measured against it in docs/policies.md). Not at
    the job's first launch (obs.zone None): that one is in the home cloud the user named first."""
    if margin is None or obs.data_cloud is None or obs.market is not None or obs.zone is None or not near:
        return None
    far = [z for z in open_zones if crosses(obs, z)]
    if not far or slack - obs.restart_hours - obs.move_hours < net - EPS:
        return None
    here, there = min(z.spot_price for z in near), pick(far, obs.zone)
    best = next(z for z in far if z.key == there)
    work, d = obs.work_left, obs.restart_hours
    if best.spot_price * (work + d + obs.move_hours) + obs.move_usd < here * (work + d) * (1.0 - margin):
        return Action(SPOT, there)
    return None
