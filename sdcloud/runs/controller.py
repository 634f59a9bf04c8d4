"""The run controller: choose, launch, watch, recover from reclaims, finish, and account.

State discipline: every transition is written to the state store before its side effect (the
attempt row before the launch call, `terminating` with its reason before the terminate call), so a
controller killed at any point and started again (`sdcloud up --name NAME`, or a detached
controller) reconciles: it adopts the live instance of the open attempt, terminates strays, and
carries on. The host agent resumes from the newest complete checkpoint in the bucket.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import config
from ..offers.catalog import CatalogRow, load_catalog
from ..errors import UserError
from ..offers.optimizer import RESTART_HOURS, Estimate, Offer, job_hours, rank
from ..spot.policy import ON_DEMAND, SPOT, WAIT, Observation, ZoneView, get_policy
from ..providers import get_provider
from ..providers.base import TAG_TOKEN, CapacityError, LaunchSpec, PriceTooLowError, ProviderError
from .spec import RunSpec
from .state import ACTIVE_RUN_STATES, FINAL_RUN_STATES, Attempt, StateStore
from ..offers.tiers import get_tier

# How long a zone counts as "no spot now" after a reclaim or a capacity error there.
COOLDOWN_SECONDS = 1800
# The local host is always there again after a simulated reclaim.
LOCAL_COOLDOWN_SECONDS = 0
STRAY_SWEEP_SECONDS = 30
# Without a deadline the policy still needs one: a month, far beyond any job here.
NO_DEADLINE_HOURS = 24 * 30.0


@dataclass
class Timing:
    poll_seconds: float
    boot_timeout: float  # launch to first heartbeat
    heartbeat_timeout: float  # heartbeat older than this = host lost

    @classmethod
    def for_provider(cls, provider: str) -> "Timing":
        if provider == "local":
            return cls(poll_seconds=1.0, boot_timeout=300.0, heartbeat_timeout=90.0)
        if provider == "ssh":  # no image to boot: a lost box shows soon
            return cls(poll_seconds=2.0, boot_timeout=600.0, heartbeat_timeout=120.0)
        return cls(poll_seconds=5.0, boot_timeout=1800.0, heartbeat_timeout=600.0)


def crash_point(name: str) -> None:
    """Fault injection for the crash tests: SDCLOUD_CRASH_AT=<name> kills this controller with SIGKILL here."""
    if os.environ.get("SDCLOUD_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def new_run_id() -> str:
    return "r-" + secrets.token_hex(4)


def store_url(spec: RunSpec, infra: dict | None) -> dict:
    """Where the run's checkpoints, status and logs live, as the agent's store config."""
    if spec.store:
        conf = {"url": spec.store}
        endpoint = os.environ.get("SDCLOUD_STORE_ENDPOINT")
        if endpoint:
            conf["endpoint_url"] = endpoint
        return conf
    if spec.provider in ("local", "ssh"):
        return {"url": (config.home() / "bucket").resolve().as_uri()}
    if infra and infra.get("bucket"):
        conf = {"url": f"s3://{infra['bucket']}/{infra.get('prefix', 'sdcloud')}"}
        for key in ("endpoint_url", "region", "addressing_style"):
            if infra.get(key):
                conf[key] = infra[key]
        if spec.provider == "tencent":
            # COS through its S3 endpoint; the host signs with its CVM role's temporary keys.
            conf.update({"endpoint_url": infra.get("endpoint") or infra.get("endpoint_url")
                         or f"https://cos.{infra.get('region') or spec.region}.myqcloud.com",
                         "region": infra.get("region") or spec.region, "addressing_style": "virtual",
                         "credentials": "tencent-cvm-role"})
        return conf
    raise UserError(f"no bucket for provider {spec.provider}: run `sdcloud infra up --provider {spec.provider}` or pass --store s3://BUCKET/PREFIX")


def _status_key(run_id: str) -> str:
    return f"runs/{run_id}/status.json"


class Controller:
    def __init__(self, state: StateStore, run_id: str, provider=None, emit: Callable[[str, dict], None] | None = None,
                 timing: Timing | None = None):
        self.state = state
        run = state.get_run(run_id)
        if run is None:
            raise UserError(f"no run {run_id!r}; see: sdcloud status")
        self.run_id = run["id"]
        self.spec = RunSpec(**run["spec"])
        self.tier = get_tier(self.spec.tier)
        self.total_steps = run["total_steps"]
        self.provider = provider or get_provider(self.spec.provider)
        self.emit = emit or (lambda kind, data: None)
        self.timing = timing or Timing.for_provider(self.spec.provider)
        self.policy = get_policy("sdcloud")
        self.cooldown: dict[str, float] = {}
        self._stop_reason: str | None = None
        self._last_sweep = 0.0
        self._infra = state.infra(self.spec.provider, self.spec.region or "") or {}
        self.store_conf = store_url(self.spec, self._infra)
        from .store import open_run_store

        self.store = open_run_store(self.store_conf)
        self.candidates = self._candidates()

    # events
    def event(self, kind: str, data: dict | None = None) -> None:
        data = data or {}
        self.state.event(self.run_id, kind, data)
        self.emit(kind, data)

    # offers
    def _candidates(self) -> list[Estimate | Offer]:
        if self.spec.provider in ("local", "ssh"):
            return list(self.provider.offers(self.tier, self.spec.market))
        from .training import gpus_used

        ranked = rank(self.tier, load_catalog([self.spec.provider]), market=None, max_price=self.spec.max_price,
                      provider=self.spec.provider, region=self.spec.region, job_size=self.total_steps,
                      gpus_used=gpus_used(self.spec))
        spot = [e for e in ranked if e.offer.market == SPOT][:6]
        ondemand = [e for e in ranked if e.offer.market == ON_DEMAND][:2]
        return self._per_zone([e.offer for e in (spot + ondemand)])

    def _per_zone(self, offers: list[Offer]) -> list[Offer]:
        """Split region-wide offers into one per zone, so that a reclaim cools down one zone, not the region."""
        zones_of = getattr(self.provider, "zones", None)
        if zones_of is None:
            return offers
        out: list[Offer] = []
        cache: dict[str, list[str]] = {}
        for offer in offers:
            r = offer.row
            if r.zone:
                out.append(offer)
                continue
            if r.region not in cache:
                try:
                    cache[r.region] = list(zones_of(r.region))
                except (ProviderError, UserError, OSError) as exc:
                    self.event("zones-unknown", {"region": r.region, "error": str(exc)})
                    cache[r.region] = []
            zones = cache[r.region] or [""]
            out += [Offer(CatalogRow(**{**r.as_dict(), "zone": z}), offer.market) for z in zones]
        return out

    def _by_key(self, key: str | None, market: str) -> Offer | None:
        for offer in self.candidates:
            if offer.row.instance_type and self._zone_key(offer) == key:
                return Offer(offer.row, market)
        return None

    @staticmethod
    def _zone_key(offer: Offer) -> str:
        r = offer.row
        return f"{r.provider}/{r.region}/{r.zone or '*'}/{r.instance_type}"

    def _job_hours(self) -> float:
        rows = [o.row for o in self.candidates if o.row.ondemand_price is not None]
        hours = [h for h in (job_hours(self.tier, r, self.total_steps) for r in rows) if h]
        return min(hours) if hours else 1.0

    # cost
    def attempts(self) -> list[Attempt]:
        return self.state.attempts(self.run_id)

    def cost_so_far(self) -> float:
        return sum(a.cost for a in self.attempts())

    def current(self) -> Attempt | None:
        open_ = [a for a in self.attempts() if a.state != "ended"]
        return open_[-1] if open_ else None

    # the policy
    def decide(self, running: Attempt | None) -> tuple[str, Offer | None]:
        keys = []
        seen = set()
        for o in self.candidates:
            k = self._zone_key(o)
            if k not in seen:
                seen.add(k)
                keys.append(o)
        if self.spec.market == ON_DEMAND:
            best = next((o for o in self.candidates if o.market == ON_DEMAND), None) or self.candidates[0]
            return ON_DEMAND, Offer(best.row, ON_DEMAND)
        now = time.time()
        zones = [ZoneView(self._zone_key(o), self.cooldown.get(self._zone_key(o), 0) <= now and o.row.spot_price is not None,
                          o.row.spot_price if o.row.spot_price is not None else float("inf"),
                          o.row.ondemand_price if o.row.ondemand_price is not None else float("inf")) for o in keys]
        run = self.state.get_run(self.run_id)
        c = self._job_hours()
        progress = c * (run["step"] / self.total_steps if self.total_steps else 0.0)
        last = self.attempts()[-1] if self.attempts() else None
        obs = Observation(
            elapsed=(now - run["created"]) / 3600.0, progress=progress, job_hours=c,
            deadline_hours=self.spec.deadline_hours or NO_DEADLINE_HOURS, restart_hours=RESTART_HOURS,
            zone=(f"{last.provider}/{last.region}/{last.zone or '*'}/{last.instance_type}" if last else None),
            market=running.market if running else None, zones=zones, tick_hours=self.timing.poll_seconds / 3600.0)
        action = self.policy.decide(obs)
        if action.kind == WAIT:
            return WAIT, None
        key = action.zone or zones[0].key
        offer = self._by_key(key, action.kind)
        if offer is None or (action.kind == ON_DEMAND and offer.row.ondemand_price is None):
            od = next((o for o in self.candidates if o.row.ondemand_price is not None), self.candidates[0])
            offer = Offer(od.row, action.kind)
        return action.kind, offer

    # the loop
    def request_stop(self, reason: str = "stopped") -> None:
        self._stop_reason = reason

    def run(self) -> dict:
        self.state.update_run(self.run_id, controller_pid=os.getpid())
        self.reconcile()
        while True:
            run = self.state.get_run(self.run_id)
            if run["state"] in FINAL_RUN_STATES:
                break
            if self._stop_reason:
                self._finish_stop(self._stop_reason)
                break
            cur = self.current()
            if cur is None:
                self._start_attempt()
            else:
                self._watch(cur)
            if time.time() - self._last_sweep > STRAY_SWEEP_SECONDS:
                self.sweep_strays()
            time.sleep(self.timing.poll_seconds)
        self.sweep_strays()
        self.state.update_run(self.run_id, controller_pid=None)
        return summary(self.state, self.run_id)

    def _start_attempt(self) -> None:
        budget = self.spec.budget
        if budget is not None and self.cost_so_far() >= budget:
            self._end_run("stopped", f"budget ${budget:g} spent")
            return
        kind, offer = self.decide(None)
        if kind == WAIT or offer is None:
            self.state.update_run(self.run_id, state="recovering")
            return
        n = len(self.attempts()) + 1
        usd = offer.price_per_hour_usd
        spec = self._launch_spec(n)
        # The attempt is written before the launch: a crash in between is reconciled by its token.
        self.state.add_attempt(self.run_id, n, offer.row.provider, spec.token, region=offer.row.region, zone=offer.row.zone,
                               instance_type=offer.row.instance_type, market=kind, price=usd, currency="USD")
        self.state.update_run(self.run_id, state="launching")
        self.event("launching", {"attempt": n, "offer": offer.key, "market": kind, "price_usd": round(usd, 4)})
        crash_point("after-offer")
        try:
            inst = self.provider.launch(offer, spec, kind, self.spec.max_price, events=lambda k, d: self.event(k, {"attempt": n, **d}))
        except (CapacityError, PriceTooLowError) as exc:
            self.state.update_attempt(self.run_id, n, state="ended", end=time.time(), end_reason="launch-failed")
            self.cooldown[self._zone_key(offer)] = time.time() + self._cooldown_seconds()
            self.event("launch-failed", {"attempt": n, "offer": offer.key, "error": str(exc)})
            self._give_up_if_nothing_left()
            return
        except UserError as exc:
            self.state.update_attempt(self.run_id, n, state="ended", end=time.time(), end_reason="launch-failed")
            self._end_run("failed", str(exc))
            raise
        except ProviderError as exc:
            self.state.update_attempt(self.run_id, n, state="ended", end=time.time(), end_reason="launch-failed")
            self.event("launch-failed", {"attempt": n, "offer": offer.key, "error": str(exc)})
            return
        crash_point("after-launch")
        self.state.update_attempt(self.run_id, n, instance_id=inst.id, zone=inst.zone or offer.row.zone, state="running",
                                  start=time.time())
        self.state.update_run(self.run_id, state="running")
        self.event("launched", {"attempt": n, "instance": inst.id, "zone": inst.zone, "adopted": inst.adopted})
        if self.spec.simulate_preemption and n == 1 and hasattr(self.provider, "schedule_reclaim"):
            self.provider.schedule_reclaim(inst.id, self.spec.simulate_preemption, events=lambda k, d: self.event(k, {"attempt": n, **d}))

    def _cooldown_seconds(self) -> float:
        return LOCAL_COOLDOWN_SECONDS if self.spec.provider in ("local", "ssh") else COOLDOWN_SECONDS

    def _give_up_if_nothing_left(self) -> None:
        failed = [a for a in self.attempts() if a.end_reason == "launch-failed"]
        if len(failed) >= 12:
            self._end_run("failed", f"{len(failed)} launches failed (capacity or price); see: sdcloud logs {self.run_id}")

    def dataset_for_host(self) -> str | None:
        """The dataset as the host sees it: a local folder is uploaded once to the run's bucket."""
        ds = self.spec.dataset
        if not ds or "://" in ds or self.spec.provider == "local":
            return ds
        if getattr(self, "_dataset_url", None):
            return self._dataset_url
        root = Path(ds).expanduser()
        prefix = f"runs/{self.run_id}/dataset"
        have = {o.key: o.size for o in self.store.list(prefix + "/")}
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        start, sent, size = time.time(), 0, 0
        for f in files:
            key = f"{prefix}/{f.relative_to(root).as_posix() if root.is_dir() else f.name}"
            if have.get(key) != f.stat().st_size:  # a restarted controller sends only what is missing
                self.store.put_file(key, f)
                sent, size = sent + 1, size + f.stat().st_size
        self.event("dataset-uploaded", {"files": len(files), "sent": sent, "mb": round(size / 1e6, 2),
                                        "seconds": round(time.time() - start, 2)})
        self._dataset_url = self.store_conf["url"].rstrip("/") + "/" + prefix
        return self._dataset_url

    def _launch_spec(self, n: int) -> LaunchSpec:
        agent = agent_config(self.spec, self.run_id, n, self.total_steps, self.store_conf)
        agent["dataset"] = self.dataset_for_host()
        user_data = ""
        if self.spec.provider in ("aws", "tencent"):
            from sdcloud_agent.userdata import render_user_data

            user_data = render_user_data(agent, agent_source=os.environ.get("SDCLOUD_AGENT_SOURCE", "sdcloud"))
        env = {}
        if self.spec.provider == "local":
            # Credentials for an S3 store reach a local host through its environment, never a file.
            env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "TENCENTCLOUD_"))}
        return LaunchSpec(run_id=self.run_id, attempt=n, user_data=user_data, agent_config=agent, infra=self._infra, env=env)

    def read_status(self) -> dict | None:
        from sdcloud_agent.store import StoreError

        try:
            return json.loads(self.store.get(_status_key(self.run_id)))
        except (StoreError, ValueError, OSError):
            return None

    def _watch(self, cur: Attempt) -> None:
        status = self.read_status()
        if status and status.get("attempt") != cur.n:
            status = None
        phase = status.get("phase") if status else None
        if status and status.get("step") is not None:
            step = int(status["step"])
            self.state.update_run(self.run_id, step=step)
            self.emit("progress", {"attempt": cur.n, "phase": phase, "step": step, "total": self.total_steps,
                                   "it_per_s": status.get("it_per_s"), "cost": self.cost_so_far()})
        if self.spec.budget is not None:
            price = cur.price or 0.0
            if self.cost_so_far() + price * 2 * self.timing.poll_seconds / 3600 >= self.spec.budget:
                self.event("budget", {"attempt": cur.n, "budget": self.spec.budget, "spent": round(self.cost_so_far(), 4)})
                self._end_attempt(cur, "budget")
                self._end_run("stopped", f"budget ${self.spec.budget:g} reached; checkpoint kept in the bucket")
                return
        if phase == "succeeded":
            self._end_attempt(cur, "succeeded")
            self._end_run("succeeded", None)
            return
        if phase == "failed":
            self._end_attempt(cur, "failed")
            self._end_run("failed", status.get("reason") or "the host agent failed")
            return
        inst = next(iter(self.provider.describe([cur.instance_id], region=cur.region)), None) if cur.instance_id else None
        gone = inst is None or not inst.live
        if phase == "preempted" or gone:
            reason = "preempted" if (phase == "preempted" or cur.market == SPOT) else "lost"
            self.event("reclaimed" if reason == "preempted" else "host-lost",
                       {"attempt": cur.n, "instance": cur.instance_id, "phase": phase, "step": status.get("step") if status else None})
            self._end_attempt(cur, reason)
            self.cooldown[f"{cur.provider}/{cur.region}/{cur.zone or '*'}/{cur.instance_type}"] = time.time() + self._cooldown_seconds()
            self.state.update_run(self.run_id, state="recovering")
            return
        age = time.time() - (status["time"] if status and status.get("time") else (cur.start or time.time()))
        limit = self.timing.heartbeat_timeout if status else self.timing.boot_timeout
        if age > limit:
            self.event("host-lost", {"attempt": cur.n, "instance": cur.instance_id, "heartbeat_age_s": round(age)})
            self._end_attempt(cur, "lost")
            self.state.update_run(self.run_id, state="recovering")
            return
        if cur.market == SPOT and self.spec.deadline_hours:
            kind, offer = self.decide(cur)
            if kind == ON_DEMAND:
                self.event("deadline-fallback", {"attempt": cur.n, "to": offer.key if offer else None})
                self._end_attempt(cur, "switched")

    def _end_attempt(self, cur: Attempt, reason: str) -> None:
        # Mark first, then terminate: a crash in between is finished by reconcile().
        self.state.update_attempt(self.run_id, cur.n, state="terminating", end_reason=reason)
        if cur.instance_id:
            try:
                self.provider.terminate([cur.instance_id], region=cur.region)
            except ProviderError as exc:
                self.event("terminate-failed", {"attempt": cur.n, "error": str(exc)})
        end = time.time()
        self.state.update_attempt(self.run_id, cur.n, state="ended", end=end)
        self._price_from_history(cur, end)

    def _price_from_history(self, cur: Attempt, end: float) -> None:
        """Re-price a spot attempt from its zone's price history over its own hours (AWS keeps one)."""
        history = getattr(self.provider, "price_history", None)
        if cur.market != SPOT or cur.provider != "aws" or history is None or not cur.start or not cur.zone:
            return
        from ..costs.pricing import time_weighted_price, utc

        try:
            points = history(cur.instance_type, cur.zone, utc(cur.start - 3600), utc(end))
        except (ProviderError, UserError, OSError) as exc:
            self.event("price-history-failed", {"attempt": cur.n, "error": str(exc)})
            return
        for at, price in points:
            self.state.add_price_sample("aws", cur.region or "", cur.zone, cur.instance_type or "", SPOT, price, "USD",
                                        at=at.timestamp())
        mean = time_weighted_price(points, utc(cur.start), utc(end))
        if mean is not None:
            self.state.update_attempt(self.run_id, cur.n, price=mean)
            self.event("repriced", {"attempt": cur.n, "price_usd": round(mean, 5), "samples": len(points)})

    def _end_run(self, state: str, reason: str | None) -> None:
        self.state.update_run(self.run_id, state=state, reason=reason)
        self.event("run-" + state, {"reason": reason} if reason else {})

    def _finish_stop(self, reason: str) -> None:
        cur = self.current()
        if cur is not None:
            self._end_attempt(cur, "stopped")
        self._end_run("stopped", reason)

    def reconcile(self) -> None:
        """Bring the state store and the provider into agreement after a restart."""
        for a in self.attempts():
            if a.state == "ended":
                continue
            if a.state == "terminating":
                self.event("reconcile", {"attempt": a.n, "action": "finish-terminate"})
                self._end_attempt(a, a.end_reason or "stopped")
                continue
            if a.instance_id is None:
                found = [i for i in self.provider.find_tagged(self.run_id) if i.tags.get(TAG_TOKEN) == a.token]
                if found:
                    inst = found[0]
                    self.state.update_attempt(self.run_id, a.n, instance_id=inst.id, zone=inst.zone, state="running",
                                              start=inst.launched_at.timestamp() if inst.launched_at else time.time())
                    self.event("reconcile", {"attempt": a.n, "action": "adopted", "instance": inst.id})
                else:
                    self.state.update_attempt(self.run_id, a.n, state="ended", end=time.time(), end_reason="launch-failed")
                    self.event("reconcile", {"attempt": a.n, "action": "no-instance"})
                continue
            inst = next(iter(self.provider.describe([a.instance_id], region=a.region)), None)
            if inst is not None and inst.live:
                self.event("reconcile", {"attempt": a.n, "action": "resumed-watch", "instance": a.instance_id})
        self.sweep_strays()

    def sweep_strays(self) -> None:
        """Terminate instances of this run that no open attempt owns (zero leaked instances)."""
        self._last_sweep = time.time()
        cur = self.current()
        keep = {cur.token} if cur and self.state.get_run(self.run_id)["state"] in ACTIVE_RUN_STATES else set()
        try:
            strays = [i for i in self.provider.find_tagged(self.run_id) if i.tags.get(TAG_TOKEN) not in keep]
        except ProviderError as exc:
            self.event("sweep-failed", {"error": str(exc)})
            return
        if strays:
            self.event("strays", {"instances": [i.id for i in strays]})
            self.provider.terminate([i.id for i in strays], region=strays[0].region)


def _trainer_args(spec: RunSpec):
    # The tier's flags for the trainer under the user's; a mapping stays a mapping (runs/training.py).
    from .training import trainer_args_for

    return trainer_args_for(spec, get_tier(spec.tier))


def agent_config(spec: RunSpec, run_id: str, attempt: int, total_steps: int, store_conf: dict) -> dict:
    """The agent's config for one attempt (no secrets: credentials come from the instance role or env)."""
    tier = get_tier(spec.tier)
    local = spec.provider == "local"
    return {
        "run_id": run_id,
        "attempt": attempt,
        "tier": tier.name,
        "min_vram_gb": tier.min_vram_gb,
        "rec_vram_gb": tier.rec_vram_gb,
        "trainer": spec.trainer,
        "trainer_args": _trainer_args(spec),
        "model": spec.model,
        "steps": total_steps,
        "checkpoint_every": spec.checkpoint_every or max(1, min(500, total_steps // 8 or 1)),
        "keep_checkpoints": 3,
        "store": store_conf,
        "dataset": spec.dataset,
        "nvme": not local and spec.provider != "ssh",
        "require_gpu": not local and spec.provider != "ssh",
        # Which reclaim notice the host watches; the local provider points it at its own endpoint.
        "metadata": {"kind": spec.provider if spec.provider in ("aws", "tencent") else "none"},
        "heartbeat_seconds": 2 if local else 10,
        "poll_seconds": 1 if local else 5,
    }


def summary(state: StateStore, run_id: str) -> dict:
    """The run's state and its cost report: per attempt and in total, with savings against on-demand."""
    run = state.get_run(run_id)
    if run is None:
        raise UserError(f"no run {run_id!r}; see: sdcloud status")
    spec = RunSpec(**run["spec"])
    attempts = state.attempts(run["id"])
    catalog = None
    rows = []
    total = ondemand_equiv = 0.0
    for a in attempts:
        od_price = a.price
        if a.market == SPOT and a.provider in ("aws", "tencent"):
            catalog = catalog or load_catalog([a.provider])
            row = next((r for r in catalog.rows if r.region == a.region and r.instance_type == a.instance_type), None)
            if row is not None and row.ondemand_price is not None:
                od_price = row.ondemand_price * config.usd_per(row.currency)
        total += a.cost
        ondemand_equiv += (od_price or 0.0) * a.hours
        rows.append({"n": a.n, "provider": a.provider, "region": a.region, "zone": a.zone, "instance_type": a.instance_type,
                     "market": a.market, "price": a.price, "hours": round(a.hours, 4), "cost": round(a.cost, 4),
                     "instance_id": a.instance_id, "start": a.start, "end": a.end, "end_reason": a.end_reason})
    out = {
        "run": run["id"], "name": run["name"], "tier": run["tier"], "provider": spec.provider, "state": run["state"],
        "reason": run["reason"], "step": run["step"], "total_steps": run["total_steps"], "attempts": rows,
        "cost": {"total": round(total, 4), "currency": "USD", "ondemand_equivalent": round(ondemand_equiv, 4),
                 "savings": round(ondemand_equiv - total, 4),
                 "savings_pct": round(100 * (1 - total / ondemand_equiv), 1) if ondemand_equiv > 0 else None},
    }
    if spec.provider in ("local", "ssh"):
        try:
            best = rank(get_tier(spec.tier), load_catalog(), market="spot", job_size=run["total_steps"])[0]
            out["best_cloud_offer"] = {k: best.as_dict()[k] for k in ("provider", "region", "instance_type", "gpu", "market",
                                                                       "price_per_hour_usd", "est_hours", "est_cost")}
        except (IndexError, UserError):
            pass
    return out


def controller_alive(run: dict) -> bool:
    pid = run.get("controller_pid")
    if not pid or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
        with open(f"/proc/{pid}/stat") as f:
            zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        return not zombie and (b"sdcloud" in cmd)
    except OSError:
        return False


def detach(run_id: str) -> int:
    """Start the controller for `run_id` in the background; its log goes to $SDCLOUD_HOME/runs/<id>.log."""
    log_dir = config.home() / "runs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"{run_id}.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "sdcloud.runs.controller", run_id], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    return proc.pid


def main(argv: list[str] | None = None) -> int:
    """`python -m sdcloud.runs.controller RUN_ID`: drive a run in the background (sdcloud up --detach)."""
    args = argv if argv is not None else sys.argv[1:]
    state = StateStore()
    ctl = Controller(state, args[0], emit=lambda k, d: print(json.dumps({"event": k, **d}, default=str), flush=True))
    signal.signal(signal.SIGTERM, lambda *_: ctl.request_stop("stopped by sdcloud down"))
    try:
        ctl.run()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        close = getattr(ctl.provider, "close", None)
        if close:
            close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
