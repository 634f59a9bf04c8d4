"""The batch job's controller: K worker hosts through the fleet's host lifecycle, fewer as items run out.

The fleet (sdcloud.fleet.lifecycle) chooses offers through the spot policy, launches, notices a
reclaimed host and replaces it in another zone (the reclaimed zone cools down), and sweeps
strays. This module decides how many hosts the job needs now: K while at least K items are open,
one per open item after that, none once every item is done, and then stops them all.
Workers need no signal from here to finish: they leave when nothing is left to claim.

On AWS and Tencent a worker host boots as a training host does: the launch carries the per-run
user-data of sdcloud.runs.driving.hostboot (the agent config with its `batch` section, the agent wheel
uploaded to the job's bucket first), and a failed boot phase, or no boot report within the boot
timeout, ends that host and cools down its offer; N failed boots in a row end the job.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

from ..errors import UserError
from ..events import Kind, batch_ended
from ..fleet.candidates import candidates as fleet_candidates
from ..fleet.lifecycle import Fleet, Progress, Timing
from ..offers.kinds import RunKind
from ..offers.optimizer import job_hours
from ..offers.tiers import get_tier
from ..providers.base import LaunchSpec
from ..providers.traits import Hosts, ProviderTraits, traits
from ..runs.driving import hostboot
from ..runs.driving.owner import Memo
from ..runs.records.state import FINAL_RUN_STATES
from ..runs.records.run_state import ACTIVE_RUN_STATES, RunState
from ..spot.policy import get_policy


class BatchController:
    # A job across clouds (batch/clouds.py): the other clouds' controllers, and where this one's attempt
    # numbers start. Class defaults: a controller built without __init__ (tests) is one cloud's.
    parts: tuple = ()
    _base = 0

    def __init__(self, state: Any, job_id: str, provider: Any = None, timing: Timing | None = None,
                 emit: Callable[[str, dict], None] | None = None, others: dict[str, Any] | None = None,
                 part: tuple[dict, Any] | None = None):
        """`others`: the providers of a job's other clouds by name (tests pass doubles); `part`: the
        spec over the job's and the attempt records of one other cloud's share (batch/clouds.py)."""
        from ..providers import get_provider
        from ..runs.records.store import open_run_store

        self.state = state
        job = state.get_run(job_id)
        if job is None or RunKind.of(job["spec"]) is not RunKind.BATCH:
            raise UserError(f"no batch job {job_id!r}; see: sdcloud batch list")
        self.job_id, self.spec = job["id"], {**job["spec"], **(part[0] if part else {})}
        records: Any = part[1] if part else state
        if self.spec.get("clouds"):  # the home's share of a job across clouds, its own attempts only
            from .clouds import CloudRecords, shares

            self.spec["workers"] = shares(int(self.spec["workers"]), len(self.spec["clouds"]))[0]
            records = CloudRecords(state, self.spec["provider"], 0)
        self._base = getattr(records, "base", 0)  # where this cloud's attempt numbers start
        self.tier = get_tier(self.spec["tier"])
        self.provider_name = self.spec["provider"]
        self.memo = Memo()
        self.provider = provider or get_provider(self.provider_name)
        self.store = open_run_store(self.spec["store"])
        self._infra = state.infra(self.provider_name, self.spec.get("region") or "") or {}
        self.emit = emit or (lambda kind, data: None)
        self.timing = timing or Timing.for_provider(self.provider_name)
        market = "spot" if self.spec.get("market", "spot") == "spot" else "on-demand"
        offers = fleet_candidates(self.provider, self.tier, market,
                                  max_price=self.spec.get("max_price"), region=self.spec.get("region"),
                                  job_size=int(self.spec["images"]), events=self.event)
        if not offers:
            raise UserError(f"no offer on {self.provider_name} fits tier {self.tier.name}")
        self.fleet = Fleet(self.job_id, self.provider, self.provider_name, records, offers, get_policy("sdcloud"),
                           self.event, self.timing, spec_market=None if market == "spot" else market,
                           max_price=self.spec.get("max_price"), on_launched=self._priced)
        self.parts = self._cloud_parts(others or {}, timing) if self.spec.get("clouds") else []

    def _cloud_parts(self, others: dict[str, Any], timing: Timing | None) -> list["BatchController"]:
        """The job's other clouds: one controller each, over that cloud's store, with a relay home."""
        from ..providers.traits import default_region
        from ..runs.records.store import open_run_store
        from .clouds import CloudRecords, Relay, shares

        clouds = self.spec["clouds"]
        share = shares(int(self.state.get_run(self.job_id)["spec"]["workers"]), len(clouds))
        parts = []
        for k, cloud in enumerate(clouds[1:], start=1):
            # Its hosts launch in that cloud's default region, where `infra up` made its stack.
            over = {"provider": cloud, "store": self.spec["cloud_stores"][cloud], "workers": share[k],
                    "region": default_region(cloud), "clouds": []}
            part = BatchController(self.state, self.job_id, provider=others.get(cloud), timing=timing, emit=self.emit,
                                   part=(over, CloudRecords(self.state, cloud, k)))
            part.relay = Relay(self.store, open_run_store(over["store"]), self.spec["prefix"])
            parts.append(part)
        return parts

    @property
    def provider_traits(self) -> ProviderTraits:
        """A cloud's hosts boot from our user-data and report their boot phases to the bucket."""
        return traits(self.provider_name)

    def event(self, kind: Kind, data: dict | None = None) -> None:
        data = data or {}
        self.state.event(self.job_id, kind, data)
        self.emit(kind, data)

    # -- what is left -----------------------------------------------------------------------------

    def items_done(self) -> int:
        return len(self.store.list(f"{self.spec['prefix']}/done/"))

    def _images_done(self) -> int:
        """Images in the done markers, for `status` (the row's step); the last count if the store is unreachable."""
        from ..runs.records.store import StoreError

        try:
            return sum(len(json.loads(self.store.get(o.key))["images"])
                       for o in self.store.list(f"{self.spec['prefix']}/done/"))
        except (StoreError, OSError, ValueError, KeyError):
            return int(self.state.get_run(self.job_id)["step"] or 0)

    def cancelled(self) -> bool:
        """A cancel from any place: the job's row (batch cancel, down) or the bucket's marker."""
        if self.state.get_run(self.job_id)["state"] == RunState.CANCELLED:
            return True
        return self.store.head(f"{self.spec['prefix']}/cancel") is not None

    def wanted_hosts(self, done: int) -> int:
        return max(0, min(int(self.spec["workers"]), int(self.spec["items"]) - done))

    def cost_so_far(self) -> float:
        return sum(a.cost for a in self.state.attempts(self.job_id))  # every cloud's hosts

    def progress(self, done: int) -> Progress:
        rows = [o.row for o in self.fleet.candidates if o.row.ondemand_price is not None]
        hours = [h for h in (job_hours(self.tier, r, int(self.spec["images"])) for r in rows) if h]
        c = min(hours) if hours else 1.0
        run = self.state.get_run(self.job_id)
        return Progress(elapsed_hours=(time.time() - run["created"]) / 3600.0,
                        done_hours=c * done / max(1, int(self.spec["items"])), job_hours=c,
                        deadline_hours=self.spec.get("deadline_hours"))

    # -- what hostboot asks of its driver (sdcloud.runs.driving.owner.RunOwner) -------------------------------

    @property
    def run_id(self) -> str:
        return self.job_id

    def attempts(self) -> list:
        return self.fleet.attempts()

    def end_attempt(self, cur: Any, reason: str) -> None:
        self.fleet.end(cur, reason)

    def set_state(self, state: str) -> None:
        self.state.update_run(self.job_id, state=state)

    def end_run(self, state: str, reason: str | None) -> None:
        """The job ends (N failed boots in a row): step() then stops every host."""
        self.state.update_run(self.job_id, state=state, reason=reason)
        self.event(batch_ended(state), {"reason": reason} if reason else {})

    # -- hosts ------------------------------------------------------------------------------------

    def _priced(self, n: int, offer: Any, market: str, inst: Any, spec: LaunchSpec) -> None:
        """A worker host is up: the cost ledger keeps its launch price and the offer's on-demand list
        price, as a training attempt's, so the job's report prices the same worker hours on demand."""
        from ..costs import ledger

        n = n if n > self._base else n + self._base
        ledger.started(self.state, self.job_id, n, offer, market, spec.root_volume_gb, zone=inst.zone or offer.row.zone)

    def launch_spec(self, n: int) -> LaunchSpec:
        n = n if n > self._base else n + self._base  # another cloud's attempts are numbered apart
        agent = {"run_id": self.job_id, "attempt": n, "tier": self.tier.name, "store": self.spec["store"],
                 "metadata": {"kind": self.provider_traits.host.metadata},
                 "batch": {"job": self.spec["prefix"], "worker_id": f"{self.job_id}-a{n}",
                           "generator": self.spec.get("generator", "diffusers"),
                           "fake_delay": self.spec.get("fake_delay", 0.0), "ttl": 60.0}}
        if self.provider_traits.is_cloud:
            # A worker with nothing left ends its host after the grace if the driver has not; one whose
            # job has no driver (its heartbeat stale, no cloud driver looking) ends after the grace;
            # none outlives its lifetime cap (sdcloud_agent/batch/lifetime.py, docs/batch.md).
            from .. import config
            from ..runs.inputs.agent_config import UNATTENDED_POLLS

            created = self.state.get_run(self.job_id)["created"]
            deadline = self.spec.get("deadline_hours")
            agent["self_end"] = {"provider": self.provider_name, "grace_s": config.self_end_grace(),
                                 "unattended_after_s": UNATTENDED_POLLS * self.timing.poll_seconds,
                                 "deadline_at": round(created + deadline * 3600) if deadline else None,
                                 # The whole job on this one host: a bound on any one worker's share.
                                 "estimate_hours": round(self.progress(0).job_hours, 3),
                                 "launched_at": round(time.time(), 1)}
        user_data = ""
        if self.provider_traits.is_cloud:
            # The training run's boot: the agent config in the user-data, the agent wheel in the bucket.
            user_data = hostboot.cloud_user_data(self.provider_name, self.store, agent, self._infra)
        env = {}
        if self.provider_traits.hosts is Hosts.THIS_MACHINE:
            env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "TENCENTCLOUD_", "SDCLOUD_CPU"))}
        return LaunchSpec(run_id=self.job_id, attempt=n, user_data=user_data, agent_config=agent,
                          infra=self._infra, env=env)

    def boot_report(self, n: int) -> dict | None:
        """The host's boot report (runs/<job>/boot/attempt-<n>.json, one per host), None before its first."""
        from ..runs.records.store import StoreError

        try:
            return json.loads(self.store.get(f"runs/{self.job_id}/boot/attempt-{n}.json"))
        except (StoreError, ValueError, OSError):
            return None

    def _boot_failure(self, n: int, phase: str) -> dict:
        """The failed boot as the status hostboot reads: status.json when it is this host's (the job's
        hosts share that key), else the phase with the end of the host's boot log."""
        from ..runs.records.store import StoreError

        try:
            status = json.loads(self.store.get(f"runs/{self.job_id}/status.json"))
            if status.get("attempt") == n and status.get("boot_phase"):
                return status
        except (StoreError, ValueError, OSError):
            pass
        try:
            tail = "\n".join(self.store.get(f"runs/{self.job_id}/logs/boot-{n}.log").decode(errors="replace")
                             .splitlines()[-40:])
        except (StoreError, OSError):
            tail = ""
        return {"attempt": n, "phase": "failed", "boot_phase": phase,
                "reason": f"boot phase {phase} failed; last lines of the bootstrap log:\n{tail}"}

    def watch(self, cur: Any) -> None:
        """A host that is gone was reclaimed or lost: its item's lease runs out and another worker takes it.
        On the clouds a failed boot phase, or no boot report within the boot timeout, is a failed boot."""
        if not self.provider_traits.is_cloud:
            # A worker whose process failed is not a reclaim: it counts toward the failed-boot limit.
            if self.fleet.check(cur, None, time.time()) in hostboot.COUNTED_OUTCOMES:
                hostboot.check_limit(self)
            return
        report = self.boot_report(cur.n)
        if report and report.get("failed"):
            hostboot.on_boot_failure(self, cur, self._boot_failure(cur.n, report["failed"]))
            return
        # Workers write no heartbeat of their own: a boot report is the sign of life, once.
        outcome = self.fleet.check(cur, None, time.time() if report is not None else None)
        if outcome in hostboot.COUNTED_OUTCOMES:
            hostboot.check_limit(self)
        elif outcome != "ok":  # hosts gone before any boot report, again and again: bounded too
            hostboot.check_unreported(self)

    def ended(self) -> bool:
        """Failed boots in a row, or a cancel: every host stops and nothing is launched again."""
        return self.state.get_run(self.job_id)["state"] in (RunState.FAILED, RunState.CANCELLED)

    def step(self) -> bool:
        """One pass: watch the hosts, resize the pool. True when the job is over (all done or cancelled).
        Across clouds: the relay first, so that each cloud counts what the others finished."""
        for part in self.parts:
            part.relay.step()
        over = self._step_here()
        for part in self.parts:
            part.step()
        return over

    def _step_here(self) -> bool:
        done = self.items_done()
        for cur in self.fleet.open_attempts():
            self.watch(cur)
        if self.ended():  # failed boots in a row: stop every host
            for cur in self.fleet.open_attempts():
                self.fleet.end(cur, "stopped")
            return True
        budget = self.spec.get("budget")
        if budget is not None and not self.cancelled() and self.cost_so_far() >= float(budget):
            # The budget is spent: stop like a cancel (workers stop claiming; finished images stay).
            self.store.put(f"{self.spec['prefix']}/cancel", b"budget reached\n")
            self.event(Kind.BUDGET_REACHED, {"budget_usd": budget, "cost_usd": round(self.cost_so_far(), 4)})
        over = done >= int(self.spec["items"]) or self.cancelled()
        want = 0 if over else self.wanted_hosts(done)
        open_ = self.fleet.open_attempts()
        # Scale down: the newest hosts go first; a worker there mid-item just leaves its lease to expire.
        for cur in sorted(open_, key=lambda a: a.n, reverse=True)[:max(0, len(open_) - want)]:
            self.fleet.end(cur, "done" if over else "scaled-down")
        if want > len(self.fleet.open_attempts()) and self.provider_traits.is_cloud:
            from .orphans import adopt_or_end

            adopt_or_end(self, want)  # a host a dead driver left fills its slot before any launch
        if want > len(self.fleet.open_attempts()):
            self.fleet.keep_alive(want, self.progress(done), self.launch_spec)
        if self.fleet.sweep_due():
            self.fleet.sweep_strays()
        if self.state.get_run(self.job_id)["state"] == RunState.RECOVERING:  # hostboot's word for a lost host
            self.state.update_run(self.job_id, state="running")
        return over

    def _guarded_step(self) -> bool:
        """step(), with a store fault waited out (hostboot.guarded): never the driver's end."""
        return hostboot.guarded(self, self.step)

    def heartbeat(self, driver: str, every_s: float) -> None:
        """runs/<job>/controller.json: who drives the job and how often it looks. A worker reads it
        (sdcloud_agent.batch.host): a job whose driver stopped looking has no driver, and its workers
        end after the grace; the cloud driver looks once a schedule period, so its `every_s` is that."""
        for part in self.parts:  # another cloud's workers read it from their own store
            part.heartbeat(driver, every_s)
        try:
            self.store.put(f"runs/{self.job_id}/controller.json",
                           json.dumps({"time": time.time(), "driver": driver, "every_s": every_s}).encode())
        except Exception as exc:  # noqa: BLE001 - a missed heartbeat is not worth ending the job for
            self.emit(Kind.HEARTBEAT_FAILED, {"error": str(exc)[:200]})

    def finish(self) -> dict[str, Any]:
        """The job is over: every open host ends, the images are counted, the state is final."""
        for part in self.parts:  # the last images come home before they are counted
            part.relay.step()
            for cur in part.fleet.open_attempts():
                part.fleet.end(cur, "done")
        for cur in self.fleet.open_attempts():
            self.fleet.end(cur, "done")
        self.state.update_run(self.job_id, step=self._images_done(), controller_pid=None)
        self._learn_speeds()
        if self.state.get_run(self.job_id)["state"] in ACTIVE_RUN_STATES:
            end = "cancelled" if self.cancelled() else "succeeded"
            self.state.update_run(self.job_id, state=end)
            self.event(batch_ended(end), {})
        return {"job": self.job_id, "state": self.state.get_run(self.job_id)["state"],
                "hosts": len(self.fleet.attempts()), "cost_usd": round(self.cost_so_far(), 6)}

    def _learn_speeds(self) -> None:
        """Each worker host's images/s per GPU, hours and reclaim, kept where `offers` reads them
        (sdcloud/speeds): the figures a batch tier is ranked by next time. Never the job's end."""
        from ..runs.records.store import StoreError
        from ..speeds.observe import batch_rates, learn_batch

        try:
            made = batch_rates([json.loads(self.store.get(o.key))
                                for o in self.store.list(f"{self.spec['prefix']}/done/")])
            gpus = {o.row.instance_type: o.row.gpu for o in self.fleet.candidates}
            model = self.spec.get("model") or ""
            recipe = "" if not model or model == self.tier.base_model else model
            for a in self.fleet.attempts():
                if a.end is None:
                    continue
                learn_batch(self.state, self.job_id, a, made.get(f"{self.job_id}-a{a.n}"), tier=self.tier.name,
                            gpu=gpus.get(a.instance_type or "", ""), recipe=recipe)
        except (StoreError, OSError, ValueError, KeyError):
            pass

    def drive_step(self) -> bool:
        """One step for a driver that comes and goes (the cloud function, one step an invocation):
        the same step as `run`'s, and the job finished here when it is over. True when it is."""
        if self.state.get_run(self.job_id)["state"] in FINAL_RUN_STATES:
            self.finish()
            return True
        if self.state.get_run(self.job_id)["state"] == RunState.PENDING:
            self.state.update_run(self.job_id, state="running")
        over = self._guarded_step()
        if not over and self.fleet.exhausted():
            self.state.update_run(self.job_id, state="failed", reason="no host could be launched")
            over = True
        if over:
            self.finish()
        return over

    def run(self, poll: float | None = None) -> dict[str, Any]:
        self.fleet.reconcile()
        for part in self.parts:
            part.fleet.reconcile()
        if self.state.get_run(self.job_id)["state"] in FINAL_RUN_STATES:
            # Ended already (a cancel before this driver started): stop what is open, launch nothing.
            for cur in self.fleet.open_attempts():
                self.fleet.end(cur, "stopped")
            return {"job": self.job_id, "state": self.state.get_run(self.job_id)["state"],
                    "hosts": len(self.fleet.attempts()), "cost_usd": round(self.cost_so_far(), 6)}
        from .journal import Carried

        # The cloud driver takes the job over if this driver goes; not across clouds (it holds one cloud's keys).
        carried = None if self.parts else Carried.of(self)
        if carried:
            carried.take()
        self.state.update_run(self.job_id, state="running", controller_pid=os.getpid())
        try:
            while True:
                if carried and not carried.held():  # another driver has the job: act no more
                    self.event(Kind.DRIVER_LOST, {"driver": carried.lease.driver,
                                                  "holder": (carried.lease.holder() or {}).get("worker")})
                    self.state.update_run(self.job_id, controller_pid=None)
                    return {"job": self.job_id, "state": self.state.get_run(self.job_id)["state"],
                            "hosts": len(self.fleet.attempts()), "cost_usd": round(self.cost_so_far(), 6)}
                done = self._guarded_step()
                if carried:
                    carried.save()
                if done:
                    break
                self.heartbeat(f"pid {os.getpid()}", self.timing.poll_seconds if poll is None else poll)
                if self.fleet.exhausted():
                    self.state.update_run(self.job_id, state="failed", reason="no host could be launched")
                    break
                time.sleep(self.timing.poll_seconds if poll is None else poll)
            res = self.finish()
            if carried:
                carried.save()
            return res
        finally:
            if carried:
                carried.release()
