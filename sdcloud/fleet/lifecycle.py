"""One host-lifecycle loop: keep N hosts alive through the spot policy, for a run (N = 1) or a batch job (N = K).

State discipline (the owner's controller relies on it): every transition is written to the state store
before its side effect. The attempt row is written before the launch call, `terminating` with its
reason before the terminate call. So a controller killed at any point and started again reconciles:
it adopts the live instance of an open attempt by its `sdcloud:token` tag, finishes interrupted
terminations and terminates strays. Zone cooldowns live in the state store too, so a restarted
controller does not go straight back to the zone that was just reclaimed.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from .. import config
from ..errors import UserError
from ..events import Kind
from ..offers.optimizer import RESTART_HOURS, Offer
from ..offers.tiers import Tier
from ..offers.groups import group_price
from ..providers.base import FAILED, PAUSED, TAG_TOKEN, CapacityError, LaunchSpec, PriceTooLowError, ProviderError
from ..providers.groups import SweepsGroupLeftovers, adopt_found, has_group, nodes_of
from ..providers.traits import names, traits
from ..spot.policy import ON_DEMAND, SPOT, WAIT, Observation, Policy, ZoneView
from .candidates import attempt_zone_key, zone_key
from .pauses import PauseWatch

# How long a zone counts as "no spot now" after a reclaim or a capacity error there is each
# provider's own figure (traits(name).timing.cooldown_seconds): a cloud's zone stays cool for half
# an hour, the local host and a box of the user's are always there again at once.
STRAY_SWEEP_SECONDS = 30
# Launches that failed (capacity or price) before a fleet gives up on its owner.
MAX_FAILED_LAUNCHES = 12
# Without a deadline the policy still needs one: a month, far beyond any job here.
NO_DEADLINE_HOURS = 24 * 30.0

Events = Callable[[str, dict], None]
# Called once a host is up: (attempt n, the offer, its market, the instance, its launch spec). The
# batch controller records the host's prices in the cost ledger here (a run's controller does so itself).
Launched = Callable[[int, Offer, str, Any, LaunchSpec], None]


def crash_point(name: str) -> None:
    """Fault injection for the crash tests: SDCLOUD_CRASH_AT=<name> kills this controller with SIGKILL here."""
    if os.environ.get("SDCLOUD_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class Timing:
    poll_seconds: float
    boot_timeout: float  # launch to first heartbeat
    heartbeat_timeout: float  # heartbeat older than this = host lost

    @classmethod
    def for_provider(cls, provider: str) -> "Timing":
        """The provider's declared timings (providers/<name>/__init__.py), as a value the caller may adjust."""
        t = traits(provider).timing
        return cls(poll_seconds=t.poll_seconds, boot_timeout=t.boot_timeout, heartbeat_timeout=t.heartbeat_timeout)


@dataclass
class Progress:
    """Where the owner stands, in the policy's units (hours of work on the fastest on-demand candidate)."""
    elapsed_hours: float
    done_hours: float
    job_hours: float
    deadline_hours: float | None


@dataclass(frozen=True)
class Across:
    """A run across clouds, as its policy is told (spot/policy.py, Observation): the cloud holding the
    newest checkpoint, and what a launch in another cloud adds to a restart (the copy's hours, its egress)."""
    data_cloud: str
    move_hours: float
    move_usd: float


class Records(Protocol):
    """What a fleet needs of the state store (runs.records.state.StateStore provides it)."""

    def attempts(self, owner_id: str) -> list[Any]: ...
    def add_attempt(self, owner_id: str, n: int, provider: str, token: str, **fields: Any) -> None: ...
    def update_attempt(self, owner_id: str, n: int, **fields: Any) -> None: ...
    def zone_cooldowns(self, now: float | None = None) -> dict[str, float]: ...
    def set_zone_cooldown(self, key: str, until: float, reason: str, owner_id: str | None = None) -> None: ...


class Fleet:
    """Launches, watches, replaces and reaps the hosts of one owner (its id tags every instance)."""

    # What one reclaim costs the policy before the host trains again: what runs measured for the
    # owner's tier on this provider (offers/optimizer.restart_of), else the assumption. Read once.
    _restart: float | None = None
    tier: Tier | None = None  # the owner's tier where it holds one (a run's controller), else read from its row

    @property
    def restart_hours(self) -> float:
        if self._restart is None:
            self._restart = RESTART_HOURS
            try:
                from ..offers.optimizer import restart_of
                from ..offers.tiers import get_tier
                from ..speeds.book import load_book

                # The owner's tier as it holds it (a run's controller), else from its row: once a fleet.
                tier = self.tier or get_tier(self.records.get_run(self.owner_id)["tier"])
                self._restart = restart_of(tier, self.provider_name, load_book(self.records))[0]
            except Exception:  # noqa: BLE001 - records without speeds (another cloud's share): the assumption
                pass
        return self._restart

    def __init__(self, owner_id: str, provider: Any, provider_name: str, records: Records, candidates: Sequence[Offer],
                 policy: Policy, events: Events, timing: Timing, spec_market: str | None = None,
                 max_price: float | None = None, on_launched: Launched | None = None, elsewhere: Sequence[Offer] = (),
                 progress: Callable[[], Progress] | None = None, tier: Tier | None = None):
        self.owner_id = owner_id
        self.tier = tier
        self.provider = provider
        self.provider_name = provider_name
        self.records = records
        self.candidates = list(candidates)
        # Across clouds: the candidates of the owner's other clouds, which the policy weighs as moves
        # (a launch there is the owner's to make, after it moved: Fleet.cloud_of says which cloud).
        self.elsewhere = list(elsewhere)
        self.policy = policy
        self.event = events
        self.timing = timing
        self.market = spec_market
        self.max_price = max_price
        self.on_launched = on_launched
        self._last_sweep = 0.0
        # Instances this fleet's provider has shown it (launched or described): one of them missing
        # later is gone; one it never saw (another machine's local host) is judged by its heartbeat.
        self._seen: set[str] = set()
        # A market whose outbid hosts pause (Vast.ai): wait, raise the bid or relaunch (fleet/pauses.py).
        # The owner's `progress` (deadline, work left) is what the pause policy decides from.
        self.pauses: PauseWatch | None = None
        if provider_name in names() and traits(provider_name).market.pauses:
            self.pauses = PauseWatch(self, progress)

    # attempts
    def attempts(self) -> list[Any]:
        return self.records.attempts(self.owner_id)

    def open_attempts(self) -> list[Any]:
        return [a for a in self.attempts() if a.state != "ended"]

    def current(self) -> Any | None:
        open_ = self.open_attempts()
        return open_[-1] if open_ else None

    # cooldowns
    def cooldown_seconds(self) -> float:
        return traits(self.provider_name).timing.cooldown_seconds

    def cool_down(self, key: str, reason: str) -> None:
        seconds = self.cooldown_seconds()
        if seconds > 0:
            self.records.set_zone_cooldown(key, time.time() + seconds, reason, self.owner_id)

    def zone_views(self, now: float, across: bool = True) -> list[ZoneView]:
        """Each candidate zone as the policy sees it; the other clouds' only where the policy is told of moves."""
        cooled = self.records.zone_cooldowns(now)
        seen: set[str] = set()
        views = []
        pairs = [(o, self.provider_name) for o in self.candidates]
        pairs += [(o, o.row.provider) for o in self.elsewhere] if across else []
        for o, cloud in pairs:
            k = zone_key(o)
            if k in seen:
                continue
            seen.add(k)
            # In USD, as the policy compares them: across clouds a zone's prices may be in yuan.
            usd = config.usd_per(o.row.currency)
            views.append(ZoneView(k, cooled.get(k, 0) <= now and o.row.spot_price is not None,
                                  o.row.spot_price * usd if o.row.spot_price is not None else float("inf"),
                                  o.row.ondemand_price * usd if o.row.ondemand_price is not None else float("inf"),
                                  cloud))
        return views

    def _by_key(self, key: str | None, market: str) -> Offer | None:
        for offer in self.candidates + self.elsewhere:
            if offer.row.instance_type and zone_key(offer) == key:
                return Offer(offer.row, market)
        return None

    def cloud_of(self, offer: Offer) -> str | None:
        """The other cloud an offer the policy chose lies in (a move), None where it is this fleet's own."""
        key = zone_key(offer)
        if any(zone_key(o) == key for o in self.candidates):
            return None
        return next((o.row.provider for o in self.elsewhere if zone_key(o) == key), None)

    # the policy
    def decide(self, progress: Progress, running: Any | None, spot_refusals: int = 0,
               across: Across | None = None) -> tuple[str, Offer | None]:
        if self.market == ON_DEMAND:
            best = next((o for o in self.candidates if o.market == ON_DEMAND), None) or self.candidates[0]
            return ON_DEMAND, Offer(best.row, ON_DEMAND)
        now = time.time()
        zones = self.zone_views(now, across=across is not None)
        attempts = self.attempts()
        last = attempts[-1] if attempts else None
        obs = Observation(
            elapsed=progress.elapsed_hours, progress=progress.done_hours, job_hours=progress.job_hours,
            deadline_hours=progress.deadline_hours or NO_DEADLINE_HOURS, restart_hours=self.restart_hours,
            zone=attempt_zone_key(last.provider, last.region, last.zone, last.instance_type) if last else None,
            market=running.market if running else None, zones=zones, tick_hours=self.timing.poll_seconds / 3600.0,
            spot_refusals=spot_refusals, has_deadline=progress.deadline_hours is not None)
        if across is not None and self.elsewhere:
            obs.data_cloud, obs.move_hours, obs.move_usd = across.data_cloud, across.move_hours, across.move_usd
        action = self.policy.decide(obs)
        if action.kind == WAIT:
            return WAIT, None
        key = action.zone or zones[0].key
        offer = self._by_key(key, action.kind)
        if offer is None or (action.kind == ON_DEMAND and offer.row.ondemand_price is None):
            od = next((o for o in self.candidates if o.row.ondemand_price is not None), self.candidates[0])
            offer = Offer(od.row, action.kind)
        return action.kind, offer

    # launch
    def launch(self, kind: str, offer: Offer, spec_for: Callable[[int], LaunchSpec]) -> Any | None:
        """Write the attempt, launch it, record the instance. None when the launch failed (and was reported).

        A UserError (bad credentials, a quota) ends the attempt and propagates: the owner stops.
        """
        n = len(self.attempts()) + 1
        spec = spec_for(n)
        usd = group_price(offer.price_per_hour_usd, nodes_of(spec)) or 0.0  # a multi-node group is priced as one unit
        # The attempt is written before the launch: a crash in between is reconciled by its token.
        self.records.add_attempt(self.owner_id, n, offer.row.provider, spec.token, region=offer.row.region,
                                 zone=offer.row.zone, instance_type=offer.row.instance_type, market=kind, price=usd,
                                 currency="USD")
        self.event(Kind.LAUNCHING, {"attempt": n, "offer": offer.key, "market": kind, "price_usd": round(usd, 4)})
        crash_point("after-offer")
        try:
            inst = self.provider.launch(offer, spec, kind, self.max_price,
                                        events=lambda k, d: self.event(k, {"attempt": n, **d}))
        except (CapacityError, PriceTooLowError) as exc:
            self._launch_failed(n)
            self.cool_down(zone_key(offer), "capacity")
            self.event(Kind.LAUNCH_FAILED, {"attempt": n, "offer": offer.key, "error": str(exc)})
            return None
        except UserError:
            self._launch_failed(n)
            raise
        except ProviderError as exc:
            self._launch_failed(n)
            self.event(Kind.LAUNCH_FAILED, {"attempt": n, "offer": offer.key, "error": str(exc)})
            return None
        crash_point("after-launch")
        self._seen.add(inst.id)
        self.records.update_attempt(self.owner_id, n, instance_id=inst.id, zone=inst.zone or offer.row.zone,
                                    state="running", start=time.time())
        self.event(Kind.LAUNCHED, {"attempt": n, "instance": inst.id, "zone": inst.zone, "adopted": inst.adopted})
        if self.on_launched is not None:
            self.on_launched(n, offer, kind, inst, spec)
        return inst

    def _launch_failed(self, n: int) -> None:
        self.records.update_attempt(self.owner_id, n, state="ended", end=time.time(), end_reason="launch-failed")

    def failed_launches(self, market: str | None = None) -> int:
        """Launches that failed (capacity or price), in a row at the end of the attempts; of one market
        when given. A launch that went through starts the count again, and so does a move to another
        cloud: the refusals of the cloud the run left are not this fleet's."""
        n = 0
        for a in reversed(self.attempts()):
            if a.end_reason != "launch-failed" or a.provider != self.provider_name:
                break
            n += market is None or a.market == market
        return n

    def exhausted(self) -> bool:
        return self.failed_launches() >= MAX_FAILED_LAUNCHES

    # watch
    def check(self, cur: Any, phase: str | None, heartbeat: float | None, step: int | None = None) -> str:
        """'ok', or why the host is gone: 'preempted', 'lost', 'host-failed' (its agent's process
        failed), or 'boot-timeout' when it never reported (the attempt is then ended; a reclaimed or
        unbootable offer's zone is cooled down).

        Only a reclaim notice (the agent's `preempted`) or an instance the cloud took back counts as
        a reclaim: a host whose agent failed is a failure that the owner counts toward its
        failed-boot limit, so that no cause relaunches without a bound."""
        inst = (next(iter(self.provider.describe([cur.instance_id], region=cur.region)), None)
                if cur.instance_id else None)
        if inst is not None:
            self._seen.add(inst.id)
        # The provider here never knew the instance (another machine launched it: a local host of
        # that machine): it is adopted through the bucket, judged by its heartbeat there (or its boot
        # time), never declared gone for being absent here.
        unknown = inst is None and phase != "preempted" and cur.instance_id not in self._seen
        # A paused host (outbid, no notice) is kept while the pause policy waits or raises the bid; else reclaimed.
        paused_out = inst is not None and (inst.state == PAUSED if self.pauses is None else not self.pauses.keep(cur, inst))
        gone = not unknown and (inst is None or not inst.live or paused_out)
        if gone and phase != "preempted" and inst is not None and inst.state == FAILED:
            self.event(Kind.HOST_FAILED, {"attempt": cur.n, "instance": cur.instance_id, "phase": phase,
                                          "state": inst.state})
            self.end(cur, "host-failed")
            self.cool_down(attempt_zone_key(cur.provider, cur.region, cur.zone, cur.instance_type), "host-failed")
            return "host-failed"
        if phase == "preempted" or gone:
            # A reclaim where one was announced: the host's notice, or the cloud's word that the spot
            # instance it showed is no more (one never seen here, whose heartbeat stopped, is lost below).
            reason = "preempted" if (phase == "preempted" or cur.market == SPOT) else "lost"
            # `reported`: whether the host ever wrote a heartbeat. Hosts that vanish before they
            # report, attempt after attempt, are bounded too (hostboot.check_unreported).
            self.event(Kind.RECLAIMED if reason == "preempted" else Kind.HOST_LOST,
                       {"attempt": cur.n, "instance": cur.instance_id, "phase": phase, "step": step,
                        "reported": heartbeat is not None or phase == "preempted"})
            self.end(cur, reason)
            self.cool_down(attempt_zone_key(cur.provider, cur.region, cur.zone, cur.instance_type), reason)
            return reason
        age = time.time() - (heartbeat if heartbeat else (cur.start or time.time()))
        limit = self.timing.heartbeat_timeout if heartbeat else self.timing.boot_timeout
        if inst is not None and self.pauses is not None and self.pauses.waiting(inst.id, limit):
            return "ok"  # its heartbeat stopped with the pause: not lost
        if age > limit:
            self.event(Kind.HOST_LOST, {"attempt": cur.n, "instance": cur.instance_id, "heartbeat_age_s": round(age)})
            if heartbeat:
                self.end(cur, "lost")
                return "lost"
            self.end(cur, "boot-timeout")
            self.cool_down(attempt_zone_key(cur.provider, cur.region, cur.zone, cur.instance_type), "boot-timeout")
            return "boot-timeout"
        return "ok"

    def end(self, cur: Any, reason: str, at: float | None = None) -> float:
        """Mark, then terminate: a crash in between is finished by reconcile(). Returns the end time:
        now, or `at` when the host's own end is known and earlier (it ended itself, asked to)."""
        self.records.update_attempt(self.owner_id, cur.n, state="terminating", end_reason=reason)
        if cur.instance_id:
            try:
                self.provider.terminate([cur.instance_id], region=cur.region)
            except ProviderError as exc:
                self.event(Kind.TERMINATE_FAILED, {"attempt": cur.n, "error": str(exc)})
        end = time.time() if at is None else min(at, time.time())
        self.records.update_attempt(self.owner_id, cur.n, state="ended", end=end)
        return end

    # after a restart
    def reconcile(self, on_end: Callable[[Any, float], None] | None = None) -> None:
        """Bring the state store and the provider into agreement after a restart."""
        for a in self.attempts():
            if a.state == "ended":
                continue
            if a.state == "terminating":
                self.event(Kind.RECONCILE, {"attempt": a.n, "action": "finish-terminate"})
                end = self.end(a, a.end_reason or "stopped")
                if on_end:
                    on_end(a, end)
                continue
            if a.instance_id is None:
                found = [i for i in self.provider.find_tagged(self.owner_id) if i.tags.get(TAG_TOKEN) == a.token]
                inst = adopt_found(found) if found else None  # a group's hosts as one (providers/groups.py)
                if inst is not None and not inst.live:  # a group whose launch was cut short: its hosts end
                    self.provider.terminate([inst.id], region=a.region)
                    inst = None
                if inst is not None:
                    self.records.update_attempt(self.owner_id, a.n, instance_id=inst.id, zone=inst.zone,
                                                state="running",
                                                start=inst.launched_at.timestamp() if inst.launched_at else time.time())
                    self.event(Kind.RECONCILE, {"attempt": a.n, "action": "adopted", "instance": inst.id})
                else:
                    self._launch_failed(a.n)
                    self.event(Kind.RECONCILE, {"attempt": a.n, "action": "no-instance"})
                continue
            inst = next(iter(self.provider.describe([a.instance_id], region=a.region)), None)
            if inst is not None:
                self._seen.add(inst.id)
            if inst is not None and inst.live:
                self.event(Kind.RECONCILE, {"attempt": a.n, "action": "resumed-watch", "instance": a.instance_id})

    def sweep_due(self) -> bool:
        return time.time() - self._last_sweep > STRAY_SWEEP_SECONDS

    def sweep_strays(self, keep_open: bool = True) -> None:
        """Terminate instances of this owner that no open attempt owns (zero leaked instances)."""
        self._last_sweep = time.time()
        keep = {a.token for a in self.open_attempts()} if keep_open else set()
        try:
            strays = [i for i in self.provider.find_tagged(self.owner_id) if i.tags.get(TAG_TOKEN) not in keep]
        except ProviderError as exc:
            self.event(Kind.SWEEP_FAILED, {"error": str(exc)})
            return
        if strays:
            self.event(Kind.STRAYS, {"instances": [i.id for i in strays]})
            self.provider.terminate([i.id for i in strays], region=strays[0].region)
        if not keep_open:
            self.sweep_group_leftovers()

    def sweep_group_leftovers(self) -> None:
        """The run is over: what its groups left beside their hosts (AWS: a placement group whose hosts
        were still shutting down when the group ended) deleted now, by whoever drives it (the laptop or
        the cloud driver), rather than left for `sdcloud gc`. A provider without such leftovers: nothing."""
        groups = [a for a in self.attempts() if a.instance_id and has_group([a.instance_id])]
        if not groups or not isinstance(self.provider, SweepsGroupLeftovers):
            return
        regions = sorted({a.region for a in groups if a.region})
        self.provider.sweep_group_leftovers(regions or None, lambda run: run != self.owner_id)

    # N hosts
    def keep_alive(self, hosts: int, progress: Progress, spec_for: Callable[[int], LaunchSpec]) -> list[Any]:
        """Launch until `hosts` attempts are open (or the policy says wait). Returns the instances launched."""
        launched = []
        for _ in range(max(0, hosts - len(self.open_attempts()))):
            kind, offer = self.decide(progress, None)
            if kind == WAIT or offer is None:
                break
            inst = self.launch(kind, offer, spec_for)
            if inst is not None:
                launched.append(inst)
        return launched
