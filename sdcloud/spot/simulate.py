"""Replay spot availability traces through the spot policies, and the offline optimum beside them.

The model (docs/policies.md has it in full, with the hand-computed cases the tests check):

- Time is a grid of ticks of `gap` hours (the trace's tick). At each tick the policy sees which
  zones have spot now and answers spot (zone) / on-demand / wait for that tick.
- A spot instance runs in tick k only if its zone's value at k is > 0; otherwise it is reclaimed at
  the start of tick k. Progress made before is kept (the job checkpoints).
- Every launch (first start, restart after a reclaim, a move to another zone or market) costs
  `d` hours of no progress, paid at that market's price; a reclaim during those hours loses them.
- The job ends the moment progress reaches C (the last tick is paid pro rata). The deadline is met
  when that moment is <= R. Cost = spot hours x spot price + on-demand hours x on-demand price;
  savings = 1 - cost / (C x on-demand price).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..errors import UserError
from .policy import ON_DEMAND, SPOT, WAIT, Observation, Policy, ZoneView, get_policy, policy_names

OPTIMAL = "optimal"
DP_DTYPE = np.float32
PAPER = dict(job_hours=48.0, restart_hours=0.2, spot_price=0.9731, ondemand_price=3.06)


def all_policy_names() -> list[str]:
    return policy_names() + [OPTIMAL]


@dataclass(frozen=True)
class Trace:
    """One zone's spot availability: avail[k] is True when spot could be had in tick k."""

    key: str
    gap_seconds: int
    avail: np.ndarray  # bool, one value per tick

    @property
    def hours(self) -> float:
        return len(self.avail) * self.gap_seconds / 3600


def load_trace(path: str | Path) -> Trace:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"trace file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"trace file {path} is not readable JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list) or not isinstance(doc.get("metadata"), dict):
        raise UserError(f"trace file {path} must be a JSON object with 'metadata' and a 'data' list")
    gap = doc["metadata"].get("gap_seconds")
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or gap <= 0 or gap != int(gap):
        raise UserError(f"trace file {path}: metadata.gap_seconds must be a positive whole number, got {gap!r}")
    data = doc["data"]
    if not data or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in data):
        raise UserError(f"trace file {path}: 'data' must be a non-empty list of numbers")
    return Trace(path.stem, int(gap), np.asarray(data, dtype=float) > 0)


def coarsen(trace: Trace, tick_seconds: int) -> Trace:
    """A coarser tick: available only when every fine tick inside it is (spot held through it)."""
    if tick_seconds % trace.gap_seconds:
        raise UserError(f"--tick {tick_seconds} must be a multiple of the trace's tick ({trace.gap_seconds} s) for {trace.key}")
    f = tick_seconds // trace.gap_seconds
    n = len(trace.avail) // f
    if n == 0:
        raise UserError(f"trace {trace.key} is shorter than one {tick_seconds} s tick")
    return Trace(trace.key, tick_seconds, trace.avail[: n * f].reshape(n, f).all(axis=1))


def stack(traces: Sequence[Trace]) -> tuple[np.ndarray, int, list[str]]:
    """Zones side by side on one clock: same tick required; the common length is the shortest."""
    if not traces:
        raise UserError("give at least one --trace file")
    gaps = {t.gap_seconds for t in traces}
    if len(gaps) > 1:
        raise UserError(f"traces must share one tick to be replayed together, got {sorted(gaps)} seconds")
    keys = [t.key for t in traces]
    if len(set(keys)) != len(keys):
        raise UserError(f"two traces have the same zone name: {keys}")
    n = min(len(t.avail) for t in traces)
    return np.stack([t.avail[:n] for t in traces]), gaps.pop(), keys


@dataclass(frozen=True)
class Setting:
    job_hours: float
    deadline_hours: float
    restart_hours: float
    spot_price: float = PAPER["spot_price"]
    ondemand_price: float = PAPER["ondemand_price"]

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


@dataclass(frozen=True)
class Outcome:
    """One job replayed from one start point."""

    cost: float
    finish_hours: float
    spot_hours: float
    ondemand_hours: float
    launches: int

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
           setting: Setting, single_zone: bool = False) -> Outcome:
    """Run one job through an online policy from tick `start`; the policy sees only tick k at k."""
    g = gap_seconds / 3600
    c, d = setting.job_hours, setting.restart_hours
    price = {SPOT: setting.spot_price, ON_DEMAND: setting.ondemand_price}
    zones = range(len(keys)) if (policy.multi_zone and not single_zone) else [start_zone]
    views = {z: (ZoneView(keys[z], False, setting.spot_price, setting.ondemand_price),
                 ZoneView(keys[z], True, setting.spot_price, setting.ondemand_price)) for z in zones}
    index = {keys[z]: z for z in zones}
    n_ticks = avail.shape[1]
    obs = Observation(0.0, 0.0, c, setting.deadline_hours, d, None, None, [], g)
    market: str | None = None
    zone: int | None = None
    over = 0.0  # restart hours still to pay on the current instance
    t = p = cost = spot_h = od_h = 0.0
    launches = 0
    # A policy that misses the deadline still finishes (on-demand at the latest); bound the loop anyway.
    limit = ticks_needed(setting, gap_seconds) + math.ceil((c + d) / g) + 2
    for k in range(limit):
        i = start + k
        up = [bool(avail[z, i]) if i < n_ticks else False for z in zones]
        if market == SPOT and not up[zones.index(zone) if len(zones) > 1 else 0]:
            market = None  # reclaimed at the start of this tick
        obs.elapsed, obs.progress, obs.market = t, p, market
        obs.zone = None if zone is None else keys[zone]
        obs.zones = [views[z][u] for z, u in zip(zones, up)]
        act = policy.decide(obs)
        if act.kind == WAIT:
            market = None
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
        if act.kind != market or (act.kind == SPOT and z != zone):
            over = d
            launches += 1
        market, zone = act.kind, z
        used = min(over, g)
        over -= used
        gain = g - used
        if p + gain >= c - 1e-12:
            dt = used + (c - p)
            t += dt
            p = c
        else:
            dt = g
            t += g
            p += gain
        cost += price[market] * dt
        if market == SPOT:
            spot_h += dt
        else:
            od_h += dt
        if p >= c:
            return Outcome(cost, t, spot_h, od_h, launches)
    raise RuntimeError(f"policy {policy.name} did not finish the job within {limit} ticks")


def optimal_costs(windows: np.ndarray, gap_seconds: int, setting: Setting) -> np.ndarray:
    """The least cost that meets the deadline, knowing the future, for a batch of jobs.

    windows: bool (B, Z, K): for each job, each zone it may use, the K ticks of its deadline window.
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
    prices = [setting.spot_price] * z_n + [setting.ondemand_price]
    inf = np.inf
    # Waste cannot exceed the time elapsed: after tick k only the first hi(k) columns can be finite,
    # so the arrays start narrow and widen to w_max + 1.
    # float32: a cent in 1e5 dollars is far below what the figures show, and half the memory traffic.
    idle = np.zeros((b_n, 1), dtype=DP_DTYPE)
    run = [[np.full((b_n, 1), inf, dtype=DP_DTYPE) for _ in rests] for _ in prices]
    best = np.full(b_n, inf)
    waste_s = np.arange(width) * u

    def shifted(a: np.ndarray, n: int, add: float, hi: int) -> np.ndarray:
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
        for m, price in enumerate(prices):
            per_s = price / 3600
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

    def as_dict(self) -> dict:
        return {"policy": self.policy, "mean_savings": float(self.savings.mean()),
                "deadline_met": float(self.met.mean()), "mean_cost": float(self.costs.mean()), "starts": int(len(self.costs))}


def simulate(avail: np.ndarray, keys: Sequence[str], gap_seconds: int, setting: Setting, policies: Iterable[str],
             starts: int = 300, seed: int = 0, single_zone: bool = False) -> list[Summary]:
    """Every policy from the same start points (and start zones); one summary per policy."""
    setting.check()
    names = list(policies)
    known = all_policy_names()
    for name in names:
        if name not in known:
            raise UserError(f"unknown policy {name!r}; choose from: {', '.join(known)}")
    begin, zone0 = choose_starts(avail.shape[1], avail.shape[0], setting, gap_seconds, starts, seed)
    full = setting.job_hours * setting.ondemand_price
    out = []
    for name in names:
        if name == OPTIMAL:
            costs, met = optimal_batch(avail, gap_seconds, setting, begin, zone0, single_zone)
        else:
            policy = get_policy(name)
            runs = [replay(policy, avail, keys, gap_seconds, int(s), int(z), setting, single_zone) for s, z in zip(begin, zone0)]
            costs = np.array([o.cost for o in runs])
            met = np.array([o.deadline_met(setting) for o in runs])
        out.append(Summary(name, 1 - costs / full, met, costs))
    return out


def optimal_batch(avail: np.ndarray, gap_seconds: int, setting: Setting, begin: np.ndarray, zone0: np.ndarray,
                  single_zone: bool, chunk: int = 30) -> tuple[np.ndarray, np.ndarray]:
    span = ticks_needed(setting, gap_seconds)
    if single_zone or avail.shape[0] == 1:
        windows = np.stack([avail[z, s: s + span][None, :] for s, z in zip(begin, zone0)])
    else:
        windows = np.stack([avail[:, s: s + span] for s in begin])
    # Chunks keep the arrays in cache; the result does not depend on the chunk size.
    costs = np.concatenate([optimal_costs(windows[i: i + chunk], gap_seconds, setting) for i in range(0, len(windows), chunk)])
    met = np.isfinite(costs)
    # No schedule meets the deadline: report on-demand from the start, which comes closest.
    fallback = (setting.job_hours + setting.restart_hours) * setting.ondemand_price
    return np.where(met, costs, fallback), met
