"""The run controller: a training run's own logic over the fleet's host lifecycle.

The fleet (sdcloud.fleet) chooses offers, launches, watches instances and heartbeats, replaces
reclaimed hosts, cools down zones and sweeps strays. The run decides what the host's status means
(steps, succeeded, failed), when the deadline asks for on-demand, when the budget is spent, and it
accounts for cost. Every transition is written to the state store before its side effect, so a
controller killed at any point and started again (`sdcloud up --name NAME`, or a detached
controller) reconciles and carries on; the host agent resumes from the newest complete checkpoint.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from .. import config
from ..errors import UserError
from ..fleet.candidates import candidates as fleet_candidates
from ..fleet.lifecycle import Fleet, Progress, Timing
from ..offers.catalog import load_catalog
from ..offers.optimizer import Offer, job_hours, rank
from ..offers.tiers import get_tier
from ..costs import ledger as cost_ledger
from ..providers import get_provider
from ..providers.base import LaunchSpec
from ..spot.policy import ON_DEMAND, SPOT, WAIT, get_policy
from . import health_view, hostboot, oom_move
from .spec import RunSpec
from .agent_reports import report_agent_problems
from .state import ACTIVE_RUN_STATES, BATCH, FINAL_RUN_STATES, Attempt, StateStore, run_kind


def new_run_id() -> str:
    return "r-" + secrets.token_hex(4)


def store_url(spec: RunSpec, infra: dict | None) -> dict:
    """Where the run's checkpoints, status and logs live, as the agent's store config."""
    from .store import store_config

    return store_config(spec.provider, spec.store, spec.region, infra)


def _status_key(run_id: str) -> str:
    return f"runs/{run_id}/status.json"


class Controller:
    def __init__(self, state: StateStore, run_id: str, provider=None, emit: Callable[[str, dict], None] | None = None,
                 timing: Timing | None = None, driver: str | None = None):
        self.state = state
        run = state.get_run(run_id)
        if run is None:
            raise UserError(f"no run {run_id!r}; see: sdcloud status")
        if run_kind(run) == BATCH:
            raise UserError(f"{run['id']} is a batch job, not a training run; see: sdcloud batch status {run['id']}")
        self.run_id = run["id"]
        self.spec = RunSpec(**run["spec"])
        self.tier = get_tier(self.spec.tier)
        self.total_steps = run["total_steps"]
        self.provider = provider or get_provider(self.spec.provider)
        self.emit = emit or (lambda kind, data: None)
        self.timing = timing or Timing.for_provider(self.spec.provider)
        self._stop_reason: str | None = None
        self._seen_attempts: set[int] = set()
        self._infra = state.infra(self.spec.provider, self.spec.region or "") or {}
        self.store_conf = store_url(self.spec, self._infra)
        from .store import open_run_store

        self.store = open_run_store(self.store_conf)
        from .journal import Journal

        # The run's history in its bucket, after every step: any machine rebuilds state.db from it.
        self.journal = Journal(state, self.store, self.run_id)
        from .driver import DriverLease

        # Exactly one driver acts on the run at a time (the laptop, its daemon, the cloud function).
        self.lease = DriverLease(self.store, self.run_id, self.timing.poll_seconds, driver)
        self.provider_name = getattr(self.provider, "name", None) or self.spec.provider
        from .training import gpus_used

        offers = fleet_candidates(_Named(self.provider, self.spec.provider), self.tier, self.spec.market,
                                  max_price=self.spec.max_price, region=self.spec.region, job_size=self.total_steps,
                                  events=self.event, gpus_used=gpus_used(self.spec))
        self.fleet = Fleet(self.run_id, self.provider, self.spec.provider, state, offers, get_policy("sdcloud"),
                           self.event, self.timing, spec_market=self.spec.market, max_price=self.spec.max_price)

    @property
    def candidates(self) -> list[Offer]:
        return self.fleet.candidates

    # events
    def event(self, kind: str, data: dict | None = None) -> None:
        data = data or {}
        self.state.event(self.run_id, kind, data)
        self.emit(kind, data)

    def _job_hours(self) -> float:
        rows = [o.row for o in self.candidates if o.row.ondemand_price is not None]
        hours = [h for h in (job_hours(self.tier, r, self.total_steps) for r in rows) if h]
        return min(hours) if hours else 1.0

    # cost
    def attempts(self) -> list[Attempt]:
        return self.state.attempts(self.run_id)

    def cost_so_far(self) -> float:
        return cost_ledger.live_cost_usd(self.state, self.state.get_run(self.run_id))

    def current(self) -> Attempt | None:
        return self.fleet.current()

    # the policy
    def progress(self) -> Progress:
        run = self.state.get_run(self.run_id)
        c = self._job_hours()
        done = c * (run["step"] / self.total_steps if self.total_steps else 0.0)
        return Progress(elapsed_hours=(time.time() - run["created"]) / 3600.0, done_hours=done, job_hours=c,
                        deadline_hours=self.spec.deadline_hours)

    def decide(self, running: Attempt | None) -> tuple[str, Offer | None]:
        if running is None and self._spot_gone():
            # Spot refused every launch in a row while a deadline stands: on-demand, not a failed run.
            od = next((o for o in self.candidates if o.row.ondemand_price is not None), self.candidates[0])
            return ON_DEMAND, Offer(od.row, ON_DEMAND)
        return self.fleet.decide(self.progress(), running)

    def _spot_gone(self) -> bool:
        """A spot run with a deadline whose last MAX_FAILED_LAUNCHES spot launches all failed."""
        from ..fleet.lifecycle import MAX_FAILED_LAUNCHES

        return (self.spec.deadline_hours is not None and self.spec.market != ON_DEMAND
                and self.fleet.failed_launches(SPOT) >= MAX_FAILED_LAUNCHES)

    def _launches_exhausted(self) -> bool:
        """Give up launching: for a spot run with a deadline only when on-demand fails too (spot that
        vanished everywhere sends it on-demand instead, see decide); otherwise the fleet's bound."""
        from ..fleet.lifecycle import MAX_FAILED_LAUNCHES

        if self.spec.deadline_hours is not None and self.spec.market != ON_DEMAND:
            return self.fleet.failed_launches(ON_DEMAND) >= MAX_FAILED_LAUNCHES
        return self.fleet.exhausted()

    # the loop
    def request_stop(self, reason: str = "stopped") -> None:
        self._stop_reason = reason

    def run(self, take_over: bool = False) -> dict:
        """Drive the run to its end here: take the driver lease, then one step a poll."""
        self.lease.acquire_or_refuse(take_over)
        if take_over:
            self.event("driver-took-over", {"driver": self.lease.driver})
        self.state.update_run(self.run_id, controller_pid=os.getpid())
        self.reconcile()
        while not self.guarded_step():
            time.sleep(self.timing.poll_seconds)
        self.finish_driving()
        return summary(self.state, self.run_id)

    def guarded_step(self) -> bool:
        """step(), with a store fault waited out (hostboot.guarded): never the controller's end."""
        return hostboot.guarded(self, self.step)

    def step(self) -> bool:
        """One controller step over the run's state: renew the lease, read, let the policy decide, act
        once, write back (state.db and the bucket's journal). True when this driver is done with the
        run: it ended, it was stopped, or another driver holds the lease now (then it acts no more)."""
        run = self.state.get_run(self.run_id)
        if run["state"] in FINAL_RUN_STATES:
            return True
        if not self.lease.renew():
            self.event("driver-lost", {"driver": self.lease.driver, "holder": (self.lease.holder() or {}).get("worker")})
            return True
        if self._stop_reason:
            self._finish_stop(self._stop_reason)
            return True
        self.heartbeat()
        cur = self.current()
        if cur is None:
            self._start_attempt()
        else:
            self._watch(cur)
        if self.fleet.sweep_due():
            self.sweep_strays()
        self.journal.flush()
        return False

    def hand_over(self) -> None:
        """Leave the run to the cloud driver (sdcloud up --unattended): its journal in the bucket says it
        is live, and no lease is held here, so the function's next invocation takes it."""
        self.event("handed-over", {"to": "the cloud driver"})
        self.journal.flush()

    def finish_driving(self) -> None:
        """After the last step: strays swept and the lease handed back, if this driver still holds it."""
        if self.lease.held:
            self.sweep_strays()
        self.state.update_run(self.run_id, controller_pid=None)
        self.journal.flush()
        self.lease.release()

    def _start_attempt(self) -> None:
        budget = self.spec.budget
        if budget is not None and budget_spent(self.cost_so_far(), budget, self.attempts(), self.timing.poll_seconds):
            self._end_run("stopped", f"budget ${budget:g} spent")
            return
        kind, offer = self.decide(None)
        if self.state.get_run(self.run_id)["state"] in FINAL_RUN_STATES:
            return  # stopped by `down` (from another process) while this step decided: launch nothing
        if kind == WAIT or offer is None:
            self.state.update_run(self.run_id, state="recovering")
            return
        self.state.update_run(self.run_id, state="launching")
        self._launch_offer = offer  # its price bounds the host's lifetime cap (agent config's self_end)
        try:
            inst = self.fleet.launch(kind, offer, self._launch_spec)
        except UserError as exc:
            self._end_run("failed", str(exc))
            raise
        if inst is None:
            if self._launches_exhausted():
                self._end_run("failed", f"{self.fleet.failed_launches()} launches failed (capacity or price); "
                                        f"see: sdcloud logs {self.run_id}")
            elif kind == SPOT and self._spot_gone():
                self.event("spot-unavailable", {"failed_launches": self.fleet.failed_launches(SPOT),
                                                "next": "on-demand, to meet the deadline"})
            return
        self.state.update_run(self.run_id, state="running")
        n = len(self.attempts())
        cost_ledger.started(self.state, self.run_id, n, offer, kind, self._launched_spec.root_volume_gb,
                            zone=inst.zone or offer.row.zone)
        if self.spec.simulate_preemption and n == 1 and hasattr(self.provider, "schedule_reclaim"):
            self.provider.schedule_reclaim(inst.id, self.spec.simulate_preemption, events=lambda k, d: self.event(k, {"attempt": n, **d}))

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

    def model_for_host(self) -> str | None:
        """The base model as the host sees it: a local file or folder is put once in the bucket's
        cache/models/ by its content (sdcloud.runs.models); the host gets its cache reference."""
        from .models import is_local_model, upload_model

        if not is_local_model(self.spec.model, self.spec.provider):
            return self.spec.model
        if not getattr(self, "_model_ref", None):
            self._model_ref = upload_model(self.store, self.spec.model, self.event)
        return self._model_ref

    def _launch_spec(self, n: int) -> LaunchSpec:
        agent = agent_config(self.spec, self.run_id, n, self.total_steps, self.store_conf)
        agent["dataset"] = self.dataset_for_host()
        agent["model"] = self.model_for_host()
        agent["self_end"] = self.self_end_config()
        user_data = ""
        if self.spec.provider in ("aws", "tencent"):
            from .hostboot import cloud_user_data

            user_data = cloud_user_data(self.spec.provider, self.store, agent, self._infra)
        env = {}
        if self.spec.provider == "local":
            # Credentials for an S3 store reach a local host through its environment, never a file.
            env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "TENCENTCLOUD_"))}
        self._launched_spec = LaunchSpec(run_id=self.run_id, attempt=n, user_data=user_data, agent_config=agent,
                                         infra=self._infra, env=env)
        return self._launched_spec

    def self_end_config(self) -> dict:
        """How the host ends itself (sdcloud_agent/selfend.py): the grace, when the run counts as
        unattended, and the figures of its lifetime cap (this host's price, the budget left, the
        deadline, the estimate)."""
        offer = getattr(self, "_launch_offer", None)
        run = self.state.get_run(self.run_id)
        budget_left = None if self.spec.budget is None else max(0.0, self.spec.budget - self.cost_so_far())
        deadline_at = run["created"] + self.spec.deadline_hours * 3600 if self.spec.deadline_hours else None
        return {"provider": self.spec.provider, "grace_s": self_end_grace(self.spec),
                # A few polls without the controller's heartbeat: nobody drives the run.
                "unattended_after_s": UNATTENDED_POLLS * self.timing.poll_seconds,
                "price_per_hour": round(offer.price_per_hour_usd, 6) if offer is not None else None,
                "budget_left": None if budget_left is None else round(budget_left, 4),
                "deadline_at": None if deadline_at is None else round(deadline_at),
                "estimate_hours": round(self._job_hours(), 3), "launched_at": round(time.time(), 1),
                "region": self.spec.region}

    def heartbeat(self) -> None:
        """runs/<id>/controller.json: someone drives this run (the host's `unattended` reads it)."""
        doc = {"time": time.time(), "pid": os.getpid(), "poll_seconds": self.timing.poll_seconds}
        try:
            self.store.put(f"runs/{self.run_id}/controller.json", json.dumps(doc).encode())
        except Exception as exc:  # noqa: BLE001 - a missed heartbeat is not worth dying for
            self.emit("heartbeat-failed", {"error": str(exc)})

    def note_self_end(self, cur: Attempt, status: dict | None) -> float | None:
        """A host that ended itself: one event with its reason; the time its billing stopped."""
        se = (status or {}).get("self_end")
        if not isinstance(se, dict) or status.get("attempt") != cur.n:
            return None
        if not any(e["kind"] == "self-ended" and e["data"].get("attempt") == cur.n for e in self.state.events(self.run_id)):
            self.event("self-ended", {"attempt": cur.n, "reason": se.get("reason"), "action": se.get("action"),
                                      "unattended": bool(se.get("unattended")), "at": se.get("at"),
                                      "error": se.get("error")})
        return float(se["at"]) if se.get("at") and not se.get("error") else None

    def read_status(self, strict: bool = False) -> dict | None:
        """The host's status.json; None when absent. `strict`: a store that cannot be read raises
        (the step is tried again) rather than passing for a host that never reported."""
        from sdcloud_agent.store import NotFound, StoreError

        try:
            return json.loads(self.store.get(_status_key(self.run_id)))
        except (NotFound, ValueError):
            return None
        except (StoreError, OSError):
            if strict:
                raise
            return None

    def _watch(self, cur: Attempt) -> None:
        status = self.read_status(strict=True)
        if status and status.get("attempt") != cur.n:
            status = None
        if status is None:  # a store that refused the host's writes: the host's own copy, where readable
            status = hostboot.host_side_status(self, cur)
        phase = status.get("phase") if status else None
        cost_ledger.observe(self.state, self.run_id, cur, status, sample=lambda: self._price_sample(cur))
        report_agent_problems(self, cur.n, status)
        oom_move.oom_events(self, cur.n, status)
        health_view.note(self, cur.n, status)
        if status and status.get("step") is not None:
            step = int(status["step"])
            if cur.n not in self._seen_attempts and phase in ("training", "saving", "uploading", "succeeded"):
                self._seen_attempts.add(cur.n)
                if cur.n > 1:
                    self._announce_resume(cur, status)
            self.state.update_run(self.run_id, step=step)
            self.emit("progress", {"attempt": cur.n, "phase": phase, "step": step, "total": self.total_steps,
                                   "it_per_s": status.get("it_per_s"), "cost": self.cost_so_far()})
        if self.spec.budget is not None:
            spent = self.cost_so_far()
            self._budget_warnings(spent)
            if budget_spent(spent, self.spec.budget, [cur], self.timing.poll_seconds):
                self.event("budget", {"attempt": cur.n, "budget": self.spec.budget, "spent": round(spent, 4)})
                self._end_attempt(cur, "budget")
                self._end_run("stopped", f"budget ${self.spec.budget:g} reached; checkpoint kept in the bucket")
                return
        if status and status.get("ended_by") == "lifetime-cap" and phase in ("preempted", "failed", "succeeded"):
            # The host saved and ended itself at its cap: not a reclaim, nothing to relaunch.
            self._end_attempt(cur, "lifetime-cap")
            self._end_run("stopped", f"the host's lifetime cap was reached ({status.get('cap')}); checkpoint kept in the bucket")
            return
        if phase == "succeeded":
            self._end_attempt(cur, "succeeded")
            self._end_run("succeeded", None)
            return
        if hostboot.on_failure_cause(self, cur, status):  # a refusal that recurs ends the run; others count
            return
        if hostboot.is_boot_failure(status):  # a bad host or image: the next offer, not the end
            return hostboot.on_boot_failure(self, cur, status)
        if oom_move.is_out_of_memory(status):  # the memory ladder is spent: an offer with more VRAM
            return oom_move.on_out_of_memory(self, cur, status)
        if phase == "failed":
            self._end_attempt(cur, "failed")
            self._end_run("failed", status.get("reason") or "the host agent failed")
            return
        outcome = self.fleet.check(cur, phase, status.get("time") if status else None,
                                   status.get("step") if status else None)
        if outcome in hostboot.COUNTED_OUTCOMES:  # never reported, or its agent failed: counted toward the limit
            self._closed(cur, time.time())
            return hostboot.check_limit(self)
        renew = getattr(self.provider, "renew_credentials", None)
        if outcome == "ok" and renew is not None and cur.instance_id:
            # A box of the user's holds short-lived store keys only: keep them fresh while it trains.
            renew(cur.instance_id, self.run_id, self.store_conf, events=lambda k, d: self.event(k, {"attempt": cur.n, **d}))
        if outcome != "ok":
            self._closed(cur, time.time())
            self.state.update_run(self.run_id, state="recovering")
            hostboot.check_unreported(self)
            return
        if cur.market == SPOT and self.spec.deadline_hours:
            kind, offer = self.decide(cur)
            if kind == ON_DEMAND:
                self.event("deadline-fallback", {"attempt": cur.n, "to": offer.key if offer else None})
                self._end_attempt(cur, "switched")

    def _announce_resume(self, cur: Attempt, status: dict) -> None:
        """Tell where attempt n took up the work: the step it resumed from and the steps redone."""
        resumed = status.get("resumed_from")
        if resumed is None:
            resumed = max(0, int(status["step"]) - 1)
        done_before = self.state.get_run(self.run_id)["step"]
        self.event("resumed", {"attempt": cur.n, "from_step": int(resumed), "lost_steps": max(0, done_before - int(resumed)),
                               "zone": cur.zone, "instance_type": cur.instance_type})

    def _budget_warnings(self, spent: float) -> None:
        """Log once each when the run has spent 50% and 80% of its budget (also across restarts)."""
        from ..costs.budget import warnings_due

        if not hasattr(self, "_budget_logged"):
            self._budget_logged = {e["data"].get("pct") for e in self.state.events(self.run_id) if e["kind"] == "budget-warning"}
        for pct in warnings_due(spent, self.spec.budget, self._budget_logged):
            self._budget_logged.add(pct)
            self.event("budget-warning", {"pct": pct, "budget": self.spec.budget, "spent": round(spent, 4)})

    def _end_attempt(self, cur: Attempt, reason: str) -> None:
        self._closed(cur, self.fleet.end(cur, reason))

    def _closed(self, cur: Attempt, end: float) -> None:
        """Price every item of an ended attempt (AWS spot from its zone's own price history) into the ledger."""
        ended_at = self.note_self_end(cur, self.read_status())
        if ended_at is not None and ended_at < end:
            # The host ended itself: its billing stopped then, not when the controller noticed.
            self.state.update_attempt(self.run_id, cur.n, end=max(ended_at, cur.start or ended_at))
        cost_ledger.closed(self.state, self.run_id, cur.n, self.provider, self.store, events=self.event,
                           heartbeat_s=agent_config(self.spec, self.run_id, cur.n, 0, {})["heartbeat_seconds"],
                           poll_s=self.timing.poll_seconds)

    def _price_sample(self, cur: Attempt) -> list:
        """The current spot price of the attempt's own type and zone (Tencent: its one quote)."""
        from ..costs.pricing import utc

        now = utc(time.time())
        return self.provider.price_history(cur.instance_type, cur.zone, now, now)

    def _end_run(self, state: str, reason: str | None) -> None:
        if state in ("stopped", "failed") and reason and "sdcloud resume" not in reason:
            # Every stop says how to carry on from the durable checkpoint.
            run = self.state.get_run(self.run_id)
            reason += f"; resume with: sdcloud resume {run.get('name') or self.run_id}"
        self.state.update_run(self.run_id, state=state, reason=reason)
        self.event("run-" + state, {"reason": reason} if reason else {})

    def _finish_stop(self, reason: str) -> None:
        cur = self.current()
        if cur is not None:
            self._end_attempt(cur, "stopped")
        self._end_run("stopped", reason)
        self.journal.flush()

    def reconcile(self) -> None:
        """Bring the state store and the provider into agreement after a restart."""
        self.fleet.reconcile(on_end=self._closed)
        self.sweep_strays()

    def sweep_strays(self) -> None:
        """Terminate instances of this run that no open attempt owns (zero leaked instances)."""
        self.fleet.sweep_strays(keep_open=self.state.get_run(self.run_id)["state"] in ACTIVE_RUN_STATES)


class _Named:
    """A provider seen under the name the run chose (test doubles may not carry `name`)."""

    def __init__(self, provider, name: str):
        self._provider, self.name = provider, name

    def __getattr__(self, attr):
        return getattr(self._provider, attr)


def _trainer_args(spec: RunSpec):
    # The tier's flags for the trainer under the user's; a mapping stays a mapping (runs/training.py).
    from .training import trainer_args_for

    return trainer_args_for(spec, get_tier(spec.tier))


UNATTENDED_POLLS = 4


def self_end_grace(spec: RunSpec) -> float:
    """Seconds a finished host waits for the controller: the run's own, else config.toml's, else 10 min."""
    if spec.self_end_grace is not None:
        return float(spec.self_end_grace)
    return config.self_end_grace()


def agent_config(spec: RunSpec, run_id: str, attempt: int, total_steps: int, store_conf: dict) -> dict:
    """The agent's config for one attempt (no secrets: credentials come from the instance role or env)."""
    from .training import resolution_from_model

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
        # The host settles the resolution from the model's config when the user did not give one.
        "resolution_from_model": resolution_from_model(spec),
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
        # The run's own mirrors; the host's region and config.toml add theirs at launch (hostboot.py).
        **({"network": dict(spec.network)} if spec.network else {}),
    }


def summary(state: StateStore, run_id: str) -> dict:
    """The run's state and its cost report: per attempt and in total, with savings against on-demand."""
    run = state.get_run(run_id)
    if run is None:
        raise UserError(f"no run {run_id!r}; see: sdcloud status")
    attempts = state.attempts(run["id"])
    rows = []
    ledger_cost = cost_ledger.attempt_costs_usd(state, run)
    for a in attempts:
        rows.append({"n": a.n, "provider": a.provider, "region": a.region, "zone": a.zone, "instance_type": a.instance_type,
                     "market": a.market, "price": a.price, "hours": round(a.hours, 4),
                     "cost": ledger_cost.get(a.n, round(a.cost, 4)),
                     "instance_id": a.instance_id, "start": a.start, "end": a.end, "end_reason": a.end_reason})
    kind = run_kind(run)
    out = {
        "run": run["id"], "kind": kind, "name": run["name"], "tier": run["tier"],
        "provider": run["spec"].get("provider") or "local", "state": run["state"],
        # A batch job's step is its images done, as its driver last counted them (no store read here).
        "reason": run["reason"], "step": run["step"], "total_steps": run["total_steps"], "attempts": rows,
        # From the cost ledger: every item, open attempts priced up to now (sdcloud cost report has the detail).
        "cost": cost_ledger.summary_cost(state, run),
    }
    if kind == BATCH:
        out["workers"] = run["spec"].get("workers")
        return out
    # The host's latest health verdict and its out-of-memory retries (runs/health_view.py).
    out["health"] = health_view.latest(state, run["id"])
    spec = RunSpec(**run["spec"])
    if spec.provider in ("local", "ssh"):
        try:
            best = rank(get_tier(spec.tier), load_catalog(), market="spot", job_size=run["total_steps"])[0]
            out["best_cloud_offer"] = {k: best.as_dict()[k] for k in ("provider", "region", "instance_type", "gpu", "market",
                                                                       "price_per_hour_usd", "est_hours", "est_cost")}
        except (IndexError, UserError):
            pass
    return out


def budget_spent(spent: float, budget: float, attempts: list, poll_seconds: float) -> bool:
    """Whether the budget leaves less than two polls of the latest host's price: the controller
    stops there, so that the host's save and terminate still fit (the same rule before a launch,
    during an attempt and at a resume)."""
    price = (attempts[-1].price or 0.0) if attempts else 0.0
    return spent + price * 2 * poll_seconds / 3600 >= budget


# What a resume may change in the stored spec: how the run is bought and bounded, not what it trains.
RESUME_SAFE = ("market", "max_price", "region", "deadline_hours", "budget", "steps", "checkpoint_every", "store")
RESUME_FIXED = ("tier", "model", "trainer", "dataset", "provider")


def prepare_resume(state: StateStore, run: dict, overrides: dict) -> dict:
    """Make a stopped or failed run active again with its stored spec, with the safe overrides applied.

    The run keeps its id, bucket prefix and attempts (so the budget counts what was spent); the
    next attempt restores the durable checkpoint. A conflicting tier or model is refused.
    """
    spec = dict(run["spec"])
    for key in RESUME_FIXED:
        given = overrides.get(key)
        if given is not None and str(given) != str(spec.get(key)):
            raise UserError(f"run {run['id']} ({run.get('name') or run['id']}) trains {key} {spec.get(key)!r}; "
                            f"it cannot resume with {key} {given!r} (start a new run with another --name)")
    changed = {k: v for k, v in overrides.items() if k in RESUME_SAFE and v is not None and v != spec.get(k)}
    spec.update(changed)
    total = run["total_steps"]
    if changed.get("steps"):
        if int(changed["steps"]) < run["step"]:
            raise UserError(f"--steps {changed['steps']} is below the {run['step']} steps already done")
        total = int(changed["steps"])
    spent = cost_ledger.live_cost_usd(state, run)
    poll = Timing.for_provider(str(spec.get("provider") or "local")).poll_seconds
    if spec.get("budget") is not None and budget_spent(spent, float(spec["budget"]), state.attempts(run["id"]), poll):
        raise UserError(f"run {run['id']} has already spent ${spent:.4f} of its ${float(spec['budget']):g} budget: "
                        f"resume with a larger one, e.g. --budget {max(spent * 2, spent + 1):.2f}")
    state.update_run(run["id"], spec=json.dumps(spec), total_steps=total, state="recovering", reason=None)
    state.event(run["id"], "resume", {"from_state": run["state"], "step": run["step"], "changed": sorted(changed),
                                      "spent_usd": round(spent, 4)})
    return changed


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
    def emit(kind: str, data: dict) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        print(json.dumps({"time": stamp, "event": kind, **data}, default=str), flush=True)

    ctl = Controller(state, args[0], emit=emit)
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
