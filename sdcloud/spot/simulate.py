"""Replay spot availability traces through the spot policies, and the offline optimum beside them.

The model (docs/policies.md has it in full, with the hand-computed cases the tests check):

- Time is a grid of ticks of `gap` hours (the trace's tick). At each tick the policy sees which
  zones have spot now and answers spot (zone) / on-demand / wait for that tick.
- A spot instance runs in tick k only if its zone's value at k is > 0; otherwise it is reclaimed at
  the start of tick k. Progress made before is kept (the job checkpoints).
- Every launch (first start, restart after a reclaim, a move to another zone or market) costs
  `d` hours of no progress, paid at that market's price; a reclaim during those hours loses them.
- The job ends the moment progress reaches C (the last tick is paid pro rata). The deadline is met
  when that moment is <= R. Cost = the sum over ticks of hours x the price of the market run in
  that tick: a zone's own spot price series where its trace carries one (else the flat spot
  price), the on-demand price of the zone's region; savings = 1 - cost / (C x the least on-demand
  price among the zones the job may use).
- Saves that may not be durable (Setting.notice_hours given): where a save takes longer than the
  reclaim notice (save_hours > notice_hours), a reclaim loses the work since the last durable
  periodic checkpoint (taken on spot every checkpoint_hours of work, each costing save_hours of
  no progress, paid; on-demand is never reclaimed and takes none). A stop the policy chooses (a move,
  a wait) saves with no notice to beat, so it loses nothing. Without notice_hours (the default) the
  save at the notice is always durable.
- A trace may carry `refused` (one value per tick): a spot launch there in a tick whose value is > 0
  is refused (no capacity) and the tick passes with nothing run; the policy sees the refusals in a
  row (Observation.spot_refusals), as the controller counts them. The optimum never launches into a
  refusal it would know of, so it ignores them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from ..errors import UserError
from .saves import work_with_saves
from .policy import ON_DEMAND, SPOT, WAIT, Observation, Policy, SdcloudOneCloud, ZoneView, get_policy, policy_names
# The traces' side, kept importable from here (commands/simulate.py, bench/ and the tests use these names).
from .traces import (Trace, coarsen, load_trace, ondemand_by_zone, ondemand_for, region_of, stack, stack_prices,  # noqa: F401
                     stack_refused, stretch_series, with_prices)

OPTIMAL = "optimal"
ONE_CLOUD = SdcloudOneCloud.name  # the reference for moves between clouds (commands/simulate.py)
DP_DTYPE = np.float32
PAPER = dict(job_hours=48.0, restart_hours=0.2, spot_price=0.9731, ondemand_price=3.06)


def all_policy_names() -> list[str]:
    return policy_names() + [OPTIMAL]


@dataclass(frozen=True)
class Setting:
    job_hours: float
    deadline_hours: float
    restart_hours: float
    spot_price: float = PAPER["spot_price"]
    ondemand_price: float = PAPER["ondemand_price"]
    # The checkpoint model (docs/policies.md "Checkpoints spaced by risk"): None keeps the save at
    # the notice durable, as before; else a save of save_hours longer than notice_hours is not, and
    # periodic checkpoints every checkpoint_hours of work (None: none) bound what a reclaim loses.
    save_hours: float = 0.0
    notice_hours: float | None = None
    checkpoint_hours: float | None = None
    # Across clouds: what a launch in another cloud than the checkpoint's adds (the copy's hours, paid
    # as restart hours; its egress, USD, paid at the launch).
    move_hours: float = 0.0
    move_usd: float = 0.0

    @property
    def notice_save_lost(self) -> bool:
        """A reclaim loses the work since the last periodic checkpoint: the save cannot beat the notice."""
        return self.notice_hours is not None and self.save_hours > self.notice_hours

    def check(self) -> None:
        c, r, d = self.job_hours, self.deadline_hours, self.restart_hours
        for name, v in (("--job-hours", c), ("--deadline-hours", r), ("--restart-hours", d),
                        ("--spot-price", self.spot_price), ("--ondemand-price", self.ondemand_price)):
            if not math.isfinite(v):
                raise UserError(f"{name} must be a finite number, got {v}")
        if c <= 0:
            raise UserError(f"--job-hours must be more than 0, got {c:g}")
        if d < 0:
            raise UserError(f"--restart-hours must be 0 or more, got {d:g}")
        if r < c + d:
            raise UserError(f"impossible deadline: {r:g} h is less than the job ({c:g} h) plus one start ({d:g} h)")
        if self.spot_price < 0 or self.ondemand_price <= 0:
            raise UserError("prices must be positive (spot may be 0)")
        if self.save_hours < 0 or (self.notice_hours is not None and self.notice_hours < 0):
            raise UserError("save and notice times must be 0 or more")
        if not (self.move_hours >= 0 and self.move_usd >= 0):
            raise UserError("--move-hours and --move-usd must be 0 or more")
        if self.checkpoint_hours is not None and not self.checkpoint_hours > 0:
            raise UserError(f"the checkpoint interval must be more than 0, got {self.checkpoint_hours:g}")


@dataclass(frozen=True)
class Outcome:
    """One job replayed from one start point."""

    cost: float
    finish_hours: float
    spot_hours: float
    ondemand_hours: float
    launches: int
    reclaims: int = 0
    lost_hours: float = 0.0  # work lost at reclaims (saves not durable within the notice)
    moves: int = 0  # launches in another cloud than the checkpoint's

    def deadline_met(self, setting: Setting) -> bool:
        return self.finish_hours <= setting.deadline_hours + 1e-9


def ticks_needed(setting: Setting, gap_seconds: int) -> int:
    return math.ceil(setting.deadline_hours * 3600 / gap_seconds - 1e-9)


def choose_starts(n_ticks: int, n_zones: int, setting: Setting, gap_seconds: int, starts: int, seed: int):
    """Random start ticks (the whole deadline window inside the trace) and start zones."""
    span = ticks_needed(setting, gap_seconds)
    last = n_ticks - span
    if last < 0:
        raise UserError(f"the traces cover {n_ticks * gap_seconds / 3600:.1f} h, less than the deadline window "
                        f"of {setting.deadline_hours:g} h")
    if starts <= 0:
        raise UserError(f"--starts must be at least 1, got {starts}")
    rng = np.random.default_rng(seed)
    return rng.integers(0, last + 1, size=starts), rng.integers(0, n_zones, size=starts)


def replay(policy: Policy, avail: np.ndarray, keys: Sequence[str], gap_seconds: int, start: int, start_zone: int,
           setting: Setting, single_zone: bool = False, spot_prices: np.ndarray | None = None,
           ondemand_prices: np.ndarray | None = None, refused: np.ndarray | None = None,
           clouds: Sequence[str] | None = None, log: list | None = None) -> Outcome:
    """Run one job through an online policy from tick `start`; the policy sees only tick k at k.

    spot_prices (zones x ticks) and ondemand_prices (one per zone) price each zone by its own
    figures; without them every zone has the setting's flat prices. A policy sees tick k's prices
    at k, and every hour (restarts included) is paid at the price of the market it runs in.
    refused (zones x ticks): a spot launch there and then is refused; the tick passes unpaid.
    With setting.notice_save_lost, a reclaim loses the work since the last durable checkpoint.
    clouds (one per zone): the job's data starts in the first zone's cloud; a launch in another
    cloud costs setting.move_hours more restart and setting.move_usd, and the data is there from
    that launch on (it is copied before the launch, as `up` copies it). `log`: where given, each
    launch tried is appended as (tick index from `start`, market, zone key, whether it moved,
    whether it was refused): the decisions a run driven along the same trace makes (tests)."""
    g = gap_seconds / 3600
    c, d = setting.job_hours, setting.restart_hours
    lossy = setting.notice_save_lost
    every = setting.checkpoint_hours if lossy and setting.checkpoint_hours else math.inf
    durable = saving = 0.0  # progress a reclaim cannot take; save hours left of a periodic checkpoint
    reclaims, lost = 0, 0.0
    zones = list(range(len(keys))) if (policy.multi_zone and not single_zone) else [start_zone]
    cl = list(clouds) if clouds is not None else [""] * len(keys)
    data = cl[0]  # the cloud holding the newest checkpoint: the home store's at the start
    if policy.one_cloud:
        zones = [z for z in zones if cl[z] == data] or zones
    od = np.full(len(keys), setting.ondemand_price) if ondemand_prices is None else np.asarray(ondemand_prices, float)
    views = {z: (ZoneView(keys[z], False, setting.spot_price, float(od[z]), cl[z]),
                 ZoneView(keys[z], True, setting.spot_price, float(od[z]), cl[z])) for z in zones}
    if hasattr(policy, "reset"):
        policy.reset()  # a policy that learns from what it saw starts every job afresh
    index = {keys[z]: z for z in zones}
    n_ticks = avail.shape[1]
    obs = Observation(0.0, 0.0, c, setting.deadline_hours, d, None, None, [], g,
                      move_hours=setting.move_hours, move_usd=setting.move_usd)
    many = len(set(cl)) > 1
    moves = 0
    market: str | None = None
    zone: int | None = None
    over = 0.0  # restart hours still to pay on the current instance
    t = p = cost = spot_h = od_h = 0.0
    launches = refusals = 0
    # A policy that misses the deadline still finishes (on-demand at the latest); bound the loop anyway.
    limit = ticks_needed(setting, gap_seconds) + math.ceil((c + d) / g) + 2
    if refused is not None:
        limit += int(refused.any(axis=0).sum())  # a refused launch is a tick with nothing run
    for k in range(limit):
        i = start + k
        up = [bool(avail[z, i]) if i < n_ticks else False for z in zones]
        if market == SPOT and not up[zones.index(zone) if len(zones) > 1 else 0]:
            market = None  # reclaimed at the start of this tick
            reclaims += 1
            if lossy:
                lost += p - durable
                p, saving = durable, 0.0
        obs.elapsed, obs.progress, obs.market, obs.spot_refusals = t, p, market, refusals
        obs.at_risk = p - durable if lossy and market == SPOT else 0.0
        obs.zone = None if zone is None else keys[zone]
        obs.data_cloud = data if many else None
        if spot_prices is None:
            obs.zones = [views[z][u] for z, u in zip(zones, up)]
        else:
            j = min(i, n_ticks - 1)
            obs.zones = [ZoneView(keys[z], u, float(spot_prices[z, j]), float(od[z]), cl[z]) for z, u in zip(zones, up)]
        act = policy.decide(obs)
        if act.kind == WAIT:
            market = None
            durable, saving = p, 0.0  # a stop the policy chose saves without a notice to beat
            t += g
            continue
        if act.kind == SPOT:
            z = index.get(act.zone)  # type: ignore[arg-type]
            if z is None or not (i < n_ticks and avail[z, i]):
                raise RuntimeError(f"policy {policy.name} chose spot in {act.zone}, which has no spot now")
        elif act.kind == ON_DEMAND:
            z = index.get(act.zone, zone if zone is not None else zones[0])  # type: ignore[arg-type]
            if market == ON_DEMAND:
                z = zone  # on-demand does not move
        else:
            raise RuntimeError(f"policy {policy.name} answered an unknown action {act.kind!r}")
        kind = act.kind
        if kind != market or (kind == SPOT and z != zone):
            # A move: the checkpoint is copied to that cloud first (its egress paid), then the launch; the
            # copy's hours are the launch's restart. As the controller does (runs/driving/placement.py).
            moving = cl[z] != data
            no_room = kind == SPOT and refused is not None and i < n_ticks and bool(refused[z, i])
            if log is not None and (market is None or not no_room):
                log.append((k, kind, keys[z], moving, no_room))
            if no_room:
                if market is None:  # nothing runs this tick, and nothing is paid but a copy made for it
                    if moving:
                        cost += setting.move_usd
                        moves += 1
                        data, refusals = cl[z], 0  # the refusals counted are the checkpoint's cloud's
                    refusals += 1  # no capacity there now
                    zone = z
                    t += g
                    continue
                refusals += 1
                kind, z = market, zone  # the host that runs keeps running (and nothing is copied)
            else:
                refusals = 0
                over = d
                launches += 1
                if moving:
                    over += setting.move_hours
                    cost += setting.move_usd
                    moves += 1
                    data = cl[z]
                durable, saving = p, 0.0  # the host left (or nothing ran): the work so far is saved
        market, zone = kind, z
        used = min(over, g)
        over -= used
        if every == math.inf or market != SPOT:  # on-demand is never reclaimed: no periodic saves there
            gain = g - used
            if p + gain >= c - 1e-12:
                dt = used + (c - p)
                t += dt
                p = c
            else:
                dt = g
                t += g
                p += gain
        else:
            p, durable, saving, spent = work_with_saves(p, durable, saving, g - used, c, every, setting.save_hours)
            dt = used + spent
            t += dt
        if market == SPOT:
            cost += (setting.spot_price if spot_prices is None else float(spot_prices[z, min(i, n_ticks - 1)])) * dt
        else:
            cost += float(od[z]) * dt
        if market == SPOT:
            spot_h += dt
        else:
            od_h += dt
        if p >= c:
            return Outcome(cost, t, spot_h, od_h, launches, reclaims, lost, moves)
    raise RuntimeError(f"policy {policy.name} did not finish the job within {limit} ticks")


def optimal_costs(windows: np.ndarray, gap_seconds: int, setting: Setting, price_windows: np.ndarray | None = None,
                  ondemand: np.ndarray | None = None) -> np.ndarray:
    """The least cost that meets the deadline, knowing the future, for a batch of jobs.

    windows: bool (B, Z, K): for each job, each zone it may use, the K ticks of its deadline window.
    price_windows (B, Z, K): spot USD/h of each zone in each tick (default: the flat spot price).
    ondemand (B,): the least on-demand price among the job's zones (default: the flat one). One
    on-demand market at that price is exact: on-demand never fails, so the optimum never runs or
    moves to a dearer on-demand region.
    Dynamic programming on the tick grid in (market, restart left, waste) where waste = elapsed -
    progress: the deadline is met iff the final waste <= R - C, so waste past that is dropped, and
    a tick of work moves no state along the waste axis. Exact for the model above when d is a whole
    number of seconds. Returns inf where no schedule meets the deadline.
    """
    b_n, z_n, k_n = windows.shape
    g = int(gap_seconds)
    d = int(round(setting.restart_hours * 3600))
    c = setting.job_hours * 3600
    u = math.gcd(g, d) if d else g
    w_max = int(math.floor((setting.deadline_hours * 3600 - c) / u + 1e-9))
    if w_max < 0:
        return np.full(b_n, np.inf)
    width = w_max + 1
    rests = [d - j * g for j in range(1, d // g + 1) if d - j * g > 0] + [0]
    r_index = {r: i for i, r in enumerate(rests)}
    # Per-job prices as (B, 1) columns, so that they broadcast over the waste axis.
    od_col = (np.full((b_n, 1), setting.ondemand_price) if ondemand is None
              else np.asarray(ondemand, float).reshape(b_n, 1)).astype(DP_DTYPE)
    flat_spot = np.full((b_n, 1), setting.spot_price, dtype=DP_DTYPE)
    prices = list(range(z_n + 1))  # markets: the zones' spot, then on-demand
    inf = np.inf
    # Waste cannot exceed the time elapsed: after tick k only the first hi(k) columns can be finite,
    # so the arrays start narrow and widen to w_max + 1.
    # float32: a cent in 1e5 dollars is far below what the figures show, and half the memory traffic.
    idle = np.zeros((b_n, 1), dtype=DP_DTYPE)
    run = [[np.full((b_n, 1), inf, dtype=DP_DTYPE) for _ in rests] for _ in prices]
    best = np.full(b_n, inf)
    waste_s = np.arange(width) * u

    def shifted(a: np.ndarray, n: int, add: float | np.ndarray, hi: int) -> np.ndarray:
        out = np.empty((b_n, hi), dtype=DP_DTYPE)
        m = max(0, min(a.shape[1], hi - n))
        out[:, : min(n, hi)] = inf
        out[:, n + m:] = inf
        if m > 0:
            np.add(a[:, :m], add, out=out[:, n: n + m])
        return out

    for k in range(k_n):
        t = k * g
        hi = min(width, (t + g) // u + 1)
        low = idle
        for states in run:
            for a in states:
                low = np.minimum(low, a)
        new_idle = shifted(low, g // u, 0.0, hi)
        new_run = []
        for m in prices:
            if m == z_n:
                col = od_col
            else:
                col = flat_spot if price_windows is None else price_windows[:, m, k].reshape(b_n, 1).astype(DP_DTYPE)
            per_s = col / 3600
            targets: list[np.ndarray | None] = [None] * len(rests)
            sources = [(low, d)] + [(run[m][i], r) for i, r in enumerate(rests)]
            for src, r in sources:
                used = min(r, g)
                gain = g - used
                out = shifted(src, used // u, per_s * g, hi)
                # Jobs that reach C within this tick end here, paying only the part they used.
                w_fin = math.floor((t + gain - c) / u + 1e-9)
                if gain > 0 and w_fin >= 0:
                    top = min(w_fin, w_max - used // u, src.shape[1] - 1)
                    if top >= 0:
                        fin = src[:, : top + 1] + per_s * (used + c - t + waste_s[: top + 1])
                        if m < z_n:
                            fin = np.where(windows[:, m, k][:, None], fin, inf)
                        np.minimum(best, fin.min(axis=1), out=best)
                    out[:, : min(w_fin + used // u + 1, hi)] = inf
                i = r_index[r - used]
                targets[i] = out if targets[i] is None else np.minimum(targets[i], out)
            if m < z_n:  # spot: only where this zone has spot in tick k
                shut = ~windows[:, m, k]
                for a in targets:
                    if a is not None:
                        a[shut] = inf
            new_run.append([a if a is not None else np.full((b_n, hi), inf, dtype=DP_DTYPE) for a in targets])
        idle, run = new_idle, new_run
    return best


@dataclass
class Summary:
    policy: str
    savings: np.ndarray
    met: np.ndarray
    costs: np.ndarray
    moves: np.ndarray | None = None  # moves between clouds per job, where there are clouds

    def as_dict(self) -> dict:
        return {"policy": self.policy, "mean_savings": float(self.savings.mean()),
                "deadline_met": float(self.met.mean()), "mean_cost": float(self.costs.mean()), "starts": int(len(self.costs)),
                **({} if self.moves is None else {"jobs_moved": int((self.moves > 0).sum()), "moves": int(self.moves.sum())})}


def simulate(avail: np.ndarray, keys: Sequence[str], gap_seconds: int, setting: Setting, policies: Iterable[str],
             starts: int = 300, seed: int = 0, single_zone: bool = False, spot_prices: np.ndarray | None = None,
             ondemand_prices: np.ndarray | None = None, refused: np.ndarray | None = None,
             clouds: Sequence[str] | None = None) -> list[Summary]:
    """Every policy from the same start points (and start zones); one summary per policy.
    clouds (one per zone, several distinct): moves priced by the setting; the optimum knows no moves.

    With per-zone prices, savings are against on-demand all through at the least on-demand price
    among the zones each job may use (its own zone in single-zone mode)."""
    setting.check()
    names = list(policies)
    known = all_policy_names()
    for name in names:
        if name not in known:
            raise UserError(f"unknown policy {name!r}; choose from: {', '.join(known)}")
    if OPTIMAL in names and clouds is not None and len(set(clouds)) > 1:
        raise UserError("the optimal policy does not price moves between clouds; leave it out with more than one cloud")
    begin, zone0 = choose_starts(avail.shape[1], avail.shape[0], setting, gap_seconds, starts, seed)
    od = np.full(len(keys), setting.ondemand_price) if ondemand_prices is None else np.asarray(ondemand_prices, float)
    full = setting.job_hours * (od[zone0] if single_zone or len(keys) == 1 else np.full(len(begin), od.min()))
    out = []
    for name in names:
        if name == OPTIMAL:
            costs, met = optimal_batch(avail, gap_seconds, setting, begin, zone0, single_zone, spot_prices=spot_prices,
                                       ondemand_prices=ondemand_prices)
        else:
            policy = get_policy(name)
            runs = [replay(policy, avail, keys, gap_seconds, int(s), int(z), setting, single_zone, spot_prices,
                           ondemand_prices, refused, clouds) for s, z in zip(begin, zone0)]
            costs = np.array([o.cost for o in runs])
            met = np.array([o.deadline_met(setting) for o in runs])
            moves = np.array([o.moves for o in runs]) if clouds is not None else None
        out.append(Summary(name, 1 - costs / full, met, costs, moves if name != OPTIMAL else None))
    return out


def optimal_batch(avail: np.ndarray, gap_seconds: int, setting: Setting, begin: np.ndarray, zone0: np.ndarray,
                  single_zone: bool, chunk: int = 30, spot_prices: np.ndarray | None = None,
                  ondemand_prices: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    span = ticks_needed(setting, gap_seconds)
    od = np.full(avail.shape[0], setting.ondemand_price) if ondemand_prices is None else np.asarray(ondemand_prices, float)
    sp = None if spot_prices is None else np.asarray(spot_prices, float)
    if single_zone or avail.shape[0] == 1:
        windows = np.stack([avail[z, s: s + span][None, :] for s, z in zip(begin, zone0)])
        pw = None if sp is None else np.stack([sp[z, s: s + span][None, :] for s, z in zip(begin, zone0)])
        od_b = od[np.asarray(zone0, int)]
    else:
        windows = np.stack([avail[:, s: s + span] for s in begin])
        pw = None if sp is None else np.stack([sp[:, s: s + span] for s in begin])
        od_b = np.full(len(begin), od.min())
    # Chunks keep the arrays in cache; the result does not depend on the chunk size.
    costs = np.concatenate([optimal_costs(windows[i: i + chunk], gap_seconds, setting,
                                          None if pw is None else pw[i: i + chunk], od_b[i: i + chunk])
                            for i in range(0, len(windows), chunk)])
    met = np.isfinite(costs)
    # No schedule meets the deadline: report on-demand from the start, which comes closest.
    fallback = (setting.job_hours + setting.restart_hours) * od_b
    return np.where(met, costs, fallback), met
