"""Spot policies: at each decision point, run on spot (in which zone), on on-demand, or wait.

One small interface drives both the run controller (`sdcloud up`) and the trace simulator
(`sdcloud simulate`): the caller fills an `Observation` with what it can see now, the policy
answers an `Action`. Every policy here but `sdcloud` is stateless: its answer is a function of the observation
alone, so a controller that crashes and restarts needs to persist nothing for the policy (it
persists progress and the current instance anyway). Online policies never see the future: only
which zones have spot now and the prices.

One exception to "stateless": `sdcloud` remembers since when it has seen spot in each zone
(one number per zone, in the policy object, for the job it serves). Losing it (a controller
restart) only makes it wait one more probe before it leaves on-demand; it never touches the
deadline guarantee, which rests on the observation alone.

Every policy but `on-demand` shares one more rule (`spot_gone`): while a deadline stands, spot that
refused SPOT_REFUSALS launches in a row (capacity or price, wherever it was tried) sends the next
launch on-demand instead of waiting for it. The controller counts the refusals into the
observation; the simulator replays them where a trace carries them (`refused`).

Units are hours and USD per hour. The accounting the simulator applies to these decisions is in
docs/policies.md.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import UserError

# What a policy sees and answers (spot/observation.py); callers import these names from here.
from .observation import (EPS, KINDS, ON_DEMAND, SPOT, WAIT, WAIT_ACTION, Action, Observation, ZoneView,  # noqa: F401
                          crosses)
from . import across

# Spot launches refused in a row after which a job with a deadline goes on-demand (the fleet's bound
# on failed launches, sdcloud.fleet.lifecycle.MAX_FAILED_LAUNCHES: a run without a deadline ends there).
SPOT_REFUSALS = 12


class Policy:
    """Base class. `multi_zone` False: the policy keeps to the zone it started in."""

    name = "policy"
    multi_zone = False
    one_cloud = False  # True: keeps to the zones of the cloud the job's data starts in


    def decide(self, obs: Observation) -> Action:  # pragma: no cover - interface
        raise NotImplementedError


def _home(obs: Observation) -> str | None:
    """The zone to keep to: the current (or last) one, else the first one offered."""
    if obs.zone is not None:
        return obs.zone
    return obs.zones[0].key if obs.zones else None


def _spot_here(obs: Observation) -> bool:
    key = _home(obs)
    return any(z.key == key and z.spot_available for z in obs.zones)


def _on_demand(obs: Observation) -> Action:
    return Action(ON_DEMAND, _home(obs))


def spot_gone(obs: Observation) -> bool:
    """Nothing runs, a deadline stands, and spot refused the last SPOT_REFUSALS launches in a row:
    spot is not coming back soon enough to wait for, so the next launch is on-demand."""
    return obs.market is None and spot_gone_after(obs.spot_refusals, obs.has_deadline)


def spot_gone_after(refusals: int, has_deadline: bool) -> bool:
    """Whether `refusals` spot launches refused in a row send the next launch on-demand (the
    controller asks it to say so after a refusal)."""
    return has_deadline and refusals >= SPOT_REFUSALS


def dry_here(obs: Observation) -> bool:
    """Across clouds (obs.data_cloud set), nothing runs and the checkpoint's cloud refused the last
    SPOT_REFUSALS spot launches in a row, deadline or none: a time to weigh the other cloud's spot."""
    return obs.data_cloud is not None and obs.market is None and obs.spot_refusals >= SPOT_REFUSALS


# The answer when spot is gone: on-demand in the first zone offered (the caller's first candidate).
SPOT_GONE_ACTION = Action(ON_DEMAND)


class OnDemand(Policy):
    """The reference: on-demand from start to end."""

    name = "on-demand"

    def decide(self, obs: Observation) -> Action:
        return _on_demand(obs)


class Greedy(Policy):
    """Spot whenever the home zone has it, else wait; on-demand for good once the time left is
    less than the work left + 2 restarts."""

    name = "greedy"

    def decide(self, obs: Observation) -> Action:
        if spot_gone(obs):
            return SPOT_GONE_ACTION
        if obs.market == ON_DEMAND or obs.time_left < obs.work_left + 2 * obs.restart_hours - EPS:
            return _on_demand(obs)
        if _spot_here(obs):
            return Action(SPOT, _home(obs))
        return WAIT_ACTION


class UniformProgress(Policy):
    """Uniform Progress (Wu et al., "Can't Be Late", NSDI'24), single zone.

    Expected progress ep(t) = C t / R. Take spot whenever it is available; when no spot runs and
    progress is behind ep(t), go on-demand; leave on-demand only for an available spot and only once
    progress >= ep(t + 2d). Safety net: on-demand for good once time left < work left + 2d.
    """

    name = "uniform-progress"

    def decide(self, obs: Observation) -> Action:
        if spot_gone(obs):
            return SPOT_GONE_ACTION
        c, r, d, t, p = obs.job_hours, obs.deadline_hours, obs.restart_hours, obs.elapsed, obs.progress
        if obs.time_left < obs.work_left + 2 * d - EPS:
            return _on_demand(obs)
        spot = _spot_here(obs)
        if obs.market == ON_DEMAND:
            if spot and p >= c * (t + 2 * d) / r - EPS:
                return Action(SPOT, _home(obs))
            return _on_demand(obs)
        if spot:
            return Action(SPOT, _home(obs))
        if p < c * t / r - EPS:
            return _on_demand(obs)
        return WAIT_ACTION


class SdcloudUP(Policy):
    """sdcloud's previous policy, kept for comparison: Uniform Progress over every zone offered,
    with a tight safety net.

    - Spot counts as available when any zone has it now. A running spot instance stays where it is
      (a hop costs a restart); after a reclaim the job moves to the cheapest zone with spot now
      (the last zone first on a tie) instead of waiting for its own zone to come back.
    - Pacing as Uniform Progress: wait only while progress is at or ahead of ep(t) = C t / R; go
      on-demand when behind; leave on-demand for spot once progress >= ep(t + 2d).
    - Safety net: gamble on spot (or wait) for one more tick only while, even if that tick brings
      nothing, on-demand could still finish: time left >= work left + d + max(d, tick). Otherwise
      on-demand for good. The paper's 2d holds the deadline only while the tick is <= d; this
      holds it for any poll interval. (A net of d + tick alone, looser for short ticks, was tried
      and measured slightly worse than 2d on the shared traces, so 2d stays the floor.)
    """

    name = "sdcloud-up"
    multi_zone = True

    def decide(self, obs: Observation) -> Action:
        if spot_gone(obs):
            return SPOT_GONE_ACTION
        c, r, d, t, p = obs.job_hours, obs.deadline_hours, obs.restart_hours, obs.elapsed, obs.progress
        if obs.time_left < obs.work_left + max(2 * d, d + obs.tick_hours) - EPS:
            return _on_demand(obs)
        open_zones = [z for z in obs.zones if z.spot_available]
        if obs.market == SPOT and any(z.key == obs.zone for z in open_zones):
            return Action(SPOT, obs.zone)
        if obs.market == ON_DEMAND:
            if open_zones and p >= c * (t + 2 * d) / r - EPS:
                return Action(SPOT, self._pick(open_zones, obs.zone))
            return _on_demand(obs)
        if open_zones:
            return Action(SPOT, self._pick(open_zones, obs.zone))
        if p < c * t / r - EPS:
            return _on_demand(obs)
        return WAIT_ACTION

    @staticmethod
    def _pick(open_zones: Sequence[ZoneView], last: str | None) -> str:
        # Cheapest spot now; the last zone wins a tie (its data and image are warm), then list order.
        return min(open_zones, key=lambda z: (z.spot_price, z.key != last)).key


class Sdcloud(Policy):
    """sdcloud's policy: spend the slack on waiting for spot, not on on-demand, while it is ample.

    slack = time left - work left: the hours that may still be lost (waiting, restarts) and the
    deadline met. S = R - C is the slack at the start. net = max(2d, d + tick).

    1. Safety net: slack < net -> on-demand (for good: on-demand loses no slack after its launch).
    2. A running spot instance whose zone still has spot stays (a hop costs a restart), unless
       another zone's spot is so much cheaper that HOP_HOURS of work there repay two restarts,
       has lasted the probe of rule 6, and slack >= reserve + d spares the restart.
    3. reserve = min(S (R - t) / R, BETA (C - p)): the slack kept back for later outages. The
       first term is Uniform Progress's line; the cap says a job never needs to hold back more
       than BETA hours per hour of work left, so a job with ample slack waits out outages that
       Uniform Progress pays on-demand for.
    4. No instance, no spot anywhere: wait while slack >= reserve, else on-demand.
    5. No instance, spot somewhere: launch spot in the cheapest zone that has it.
    6. On on-demand: back to spot only in a zone that has had spot for at least PROBE x max(d, tick)
       (a spot run that has just begun is the likeliest to end before it repays two restarts),
       and only while slack >= reserve - RETURN x d x C / R. (Uniform Progress leaves
       on-demand at reserve + 2 d C / R; a return is work done on spot instead of on-demand,
       not slack burnt, so it may dip a little below the waiting line.)

    Across clouds (Observation.data_cloud set): a zone of another cloud than the one holding the
    newest checkpoint is a move, a restart that also costs the copy's hours and its egress
    (spot/across.py). Another cloud's spot is taken where on-demand would be (rule 4 past the
    reserve, rule 6 from on-demand, or spot refused SPOT_REFUSALS times in the checkpoint's cloud)
    and HOP_HOURS of work there repay the move, or at a later launch where finishing there is
    MOVE_MARGIN cheaper, the move paid; the on-demand fallback and a hop stay in their cloud.

    Where the save at a reclaim notice cannot be durable (Observation.at_risk > 0), the work at
    risk counts as lost already: slack = time left - work left - at risk.

    Rules 2-6 only act while slack >= net, and a tick loses at most one tick of slack (the worst
    case: it brings no progress at all), so the next decision still has slack >= net - tick >= d:
    enough for an on-demand launch, which then loses no more and finishes by the deadline. That
    holds for any tick length (docs/policies.md); a reclaim that takes the work at risk lowers
    that slack by nothing (work left grows by what at risk loses). BETA, PROBE and RETURN were tuned on the shared
    traces with bench/policy.py; nothing in the rule knows which trace it replays.
    """

    name = "sdcloud"
    multi_zone = True
    BETA = 0.25
    PROBE = 1.0
    RETURN = 1.5
    HOP_HOURS = 4.0
    # How much cheaper the other cloud's spot must make the rest of the job to move for price alone.
    MOVE_MARGIN: float | None = 0.10

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget what was seen: a new job."""
        self._last: float | None = None
        self._up_since: dict[str, float] = {}

    def _observe(self, obs: Observation) -> None:
        # One note per zone: the elapsed hour spot was first seen in its current run.
        if self._last is not None and obs.elapsed < self._last - EPS:
            self.reset()  # time went backwards: another job
        self._last = obs.elapsed
        for z in obs.zones:
            if z.spot_available:
                self._up_since.setdefault(z.key, obs.elapsed)
            else:
                self._up_since.pop(z.key, None)

    def reserve(self, obs: Observation) -> float:
        c, r, t = obs.job_hours, obs.deadline_hours, obs.elapsed
        return min((r - c) * max(0.0, r - t) / r, self.BETA * obs.work_left)

    def decide(self, obs: Observation) -> Action:
        d, t, tick = obs.restart_hours, obs.elapsed, obs.tick_hours
        net = max(2 * d, d + tick)
        # Work at risk counts as lost already: a reclaim takes it, and then the argument below holds.
        slack = obs.time_left - obs.work_left - obs.at_risk
        if spot_gone(obs) or dry_here(obs):
            away = self._away(obs, slack, net)
            if away is not None:
                return away
            if spot_gone(obs):
                return SPOT_GONE_ACTION
        self._observe(obs)
        if slack < net - EPS:
            return self._on_demand(obs)
        open_zones = [z for z in obs.zones if z.spot_available]
        near = [z for z in open_zones if not crosses(obs, z)]  # the cloud holding the checkpoint
        reserve = self.reserve(obs)
        cheaper = self._cheaper_away(obs, near, open_zones, slack, net)
        if cheaper is not None:
            return cheaper
        if obs.market == SPOT and any(z.key == obs.zone for z in open_zones):
            return Action(SPOT, self._hop(obs, open_zones, slack, reserve))
        if obs.market == ON_DEMAND:
            probe = self.PROBE * max(d, tick)
            ripe = [z for z in open_zones if t - self._up_since.get(z.key, t) >= probe - EPS]
            bar = reserve - self.RETURN * d * obs.job_hours / obs.deadline_hours - EPS
            ripe_near = [z for z in ripe if not crosses(obs, z)]
            if ripe_near and slack >= bar:
                return Action(SPOT, Sdcloud._pick(ripe_near, obs.zone))
            far = self._far(obs, ripe, self._here_ondemand(obs))
            if far and slack - obs.move_hours >= bar:
                return Action(SPOT, Sdcloud._pick(far, obs.zone))
            return self._on_demand(obs)
        if near:
            return Action(SPOT, Sdcloud._pick(near, obs.zone))
        # Spot in another cloud where on-demand would be due, if the move repays itself and the slack
        # after its restart and copy still holds the net; taken one tick before that stops holding.
        far = self._far(obs, open_zones, self._on_demand_price(obs))
        after = slack - d - obs.move_hours
        movable = bool(far) and after >= net - EPS
        if slack >= reserve - EPS and not (movable and after < net + tick - EPS):
            return WAIT_ACTION
        if movable:
            return Action(SPOT, Sdcloud._pick(far, obs.zone))
        return self._on_demand(obs)

    # The rules across clouds (spot/across.py), with this policy's figures.
    def _away(self, obs: Observation, slack: float, net: float) -> Action | None:
        return across.away(obs, slack, net, self.HOP_HOURS)

    def _cheaper_away(self, obs: Observation, near: Sequence[ZoneView], open_zones: Sequence[ZoneView],
                      slack: float, net: float) -> Action | None:
        return across.cheaper_away(obs, near, open_zones, slack, net, self.MOVE_MARGIN)

    def _far(self, obs: Observation, zones: Sequence[ZoneView], instead: float) -> list[ZoneView]:
        return across.far_zones(obs, zones, instead, self.HOP_HOURS)

    _here_ondemand = staticmethod(across.here_ondemand)
    _on_demand_price = staticmethod(across.on_demand_price)

    def _hop(self, obs: Observation, open_zones: Sequence[ZoneView], slack: float, reserve: float) -> str:
        """The zone to run spot in while spot runs in obs.zone: stay, unless another zone is so much
        cheaper that HOP_HOURS of work there repay two restarts (the hop and, likely, one more),
        its spot has lasted the probe, and the slack spares the restart."""
        here = next(z for z in open_zones if z.key == obs.zone)
        open_zones = [z for z in open_zones if z.cloud == here.cloud]  # a running host never moves cloud
        d, t = obs.restart_hours, obs.elapsed
        if not self.HOP_HOURS or slack < reserve + d:
            return here.key
        probe = self.PROBE * max(d, obs.tick_hours)
        best = min(open_zones, key=lambda z: (z.spot_price, z.key != obs.zone))
        hours = min(obs.work_left, self.HOP_HOURS)
        if (best.key != here.key and t - self._up_since.get(best.key, t) >= probe - EPS
                and (here.spot_price - best.spot_price) * hours > 2 * d * best.spot_price):
            return best.key
        return here.key

    @staticmethod
    def _pick(open_zones: Sequence[ZoneView], last: str | None) -> str:
        # Cheapest spot now; the last zone wins a tie (its data and image are warm), then list order.
        return min(open_zones, key=lambda z: (z.spot_price, z.key != last)).key

    @staticmethod
    def _on_demand(obs: Observation) -> Action:
        # A running on-demand instance stays; otherwise the cheapest on-demand zone, the last one on a
        # tie, in the cloud holding the checkpoint: the fallback never pays a move (the deadline's net).
        if obs.market == ON_DEMAND or not obs.zones:
            return _on_demand(obs)
        home = _home(obs)
        pool = [z for z in obs.zones if not crosses(obs, z)] or obs.zones
        return Action(ON_DEMAND, min(pool, key=lambda z: (z.ondemand_price, z.key != home)).key)


class SdcloudOneCloud(Sdcloud):
    """sdcloud kept to the cloud its data starts in (its home store's), with on-demand there as its
    fallback: the reference a job allowed to move between clouds is measured against."""

    name = "sdcloud-one-cloud"
    one_cloud = True


POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in (OnDemand, Greedy, UniformProgress, Sdcloud, SdcloudUP,
                                                               SdcloudOneCloud)}
DEFAULT_POLICY = Sdcloud.name


def policy_names() -> list[str]:
    return list(POLICIES)


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise UserError(f"unknown policy {name!r}; choose from: {', '.join(POLICIES)}") from None
