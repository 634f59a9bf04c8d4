"""The run controller: a training run's own logic over the fleet's host lifecycle.

The fleet (sdcloud.fleet) chooses offers, launches, watches instances and heartbeats, replaces
reclaimed hosts, cools down zones and sweeps strays. The run decides what the host's status means
(steps, succeeded, failed), when the deadline asks for on-demand or another cloud (the spot policy
decides, spot refused everywhere included), when the budget is spent, and it accounts for cost. Where
the run is (its cloud, zone, capacity kind and the store of its newest checkpoint) is its `placement`,
changed in one place, `place` (placement.py). Every
transition is written to the state store before its side effect, so a controller killed at any
point and started again (`sdcloud up --name NAME`, or a detached controller) reconciles and
carries on; the host agent resumes from the newest complete checkpoint.

It holds its helpers, not mixes them in: `launching` (what a launch carries), `host` (status.json,
self-ends, the heartbeat), `row` (the run's row, read once a step: run_row.py), `clouds` (the run's
clouds: placement.py), each reading it through a small protocol; watching (one look at the running
attempt), hostboot, oom_move, health_view and agent_reports act through the owner contract (owner.py).
A host is told runs/inputs/agent_config.py.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
from typing import Any, Callable

from ... import config
from ...costs import ledger as cost_ledger
from ...errors import UserError
from ...events import Kind, run_ended
from ...fleet.candidates import candidates as fleet_candidates
from ...fleet.lifecycle import MAX_FAILED_LAUNCHES, Fleet, Progress, Timing
from ...offers.kinds import RunKind
from ...offers.groups import job_hours_on
from ...offers.optimizer import Offer
from ...providers import get_provider
from ...providers.capabilities import Closable
from ...spot.policy import ON_DEMAND, SPOT, WAIT, get_policy, spot_gone_after
from ..inputs import hub_access, staging as inputs
from ..inputs.spec import RunPlan, RunSpec
from ..records import stop_request as stop_requests
from ..records.lease import DriverLease, Guarded
from ..records.state import ACTIVE_RUN_STATES, FINAL_RUN_STATES, RESUMABLE_RUN_STATES, Attempt, RunState, StateStore, run_kind
from ..records.summary import summary
from . import hostboot, lessons, remote_end, watching
from . import cloud_move
from .placement import Clouds, Home, Placement, across, carry, dataset_in
from ..inputs.agent_config import UNATTENDED_POLLS, agent_config, self_end_grace
from .background import controller_alive, detach
from .budget_watch import budget_spent
from .host_status import HostStatus
from .launching import LaunchInputs
from .owner import Memo
from .run_row import RunRow

# Names that commands/ and the tests import from here (their homes are the modules above).
__all__ = ["ACTIVE_RUN_STATES", "Controller", "Timing", "UNATTENDED_POLLS", "agent_config", "budget_spent",
           "controller_alive", "detach", "main", "new_run_id", "self_end_grace", "store_url", "summary"]


def new_run_id() -> str:
    return "r-" + secrets.token_hex(4)


def store_url(spec: RunSpec, infra: dict | None) -> dict:
    """Where the run's checkpoints, status and logs live, as the agent's store config."""
    from ..records.store import store_config

    return store_config(spec.provider, spec.store, spec.region, infra)


class Controller:
    """A training run's driver; it holds `launching` (launching.py) and `host` (host_status.py)."""
    def __init__(self, state: StateStore, run_id: str, provider=None, emit: Callable[[Kind, dict], None] | None = None,
                 timing: Timing | None = None, driver: str | None = None, clouds: dict[str, Any] | None = None,
                 lease: DriverLease | None = None):
        self.state = state
        run = state.get_run(run_id)
        if run is None:
            raise UserError(f"no run {run_id!r}; see: sdcloud status")
        if run_kind(run) is RunKind.BATCH:
            raise UserError(f"{run['id']} is a batch job, not a training run; see: sdcloud batch status {run['id']}")
        self.run_id = run["id"]
        self.plan = RunPlan.of_run(run)  # its Tier and its provider's traits, resolved once and carried
        self.spec, self.tier, self.row = self.plan.spec, self.plan.tier, RunRow(state, self.run_id)
        self.total_steps = run["total_steps"]
        # The config.toml sections the run recorded when it was made (runs/inputs/staging.py): a driver
        # elsewhere (the cloud function's empty home) acts under the run's settings, not its own.
        self._inputs: dict | None = None
        self.run_settings = inputs.recorded_settings(state, self.run_id)
        with config.run_settings(self.run_settings):
            self.provider = provider or get_provider(self.spec.provider)
        self.emit = emit or (lambda kind, data: None)
        self.timing = timing or Timing.for_provider(self.spec.provider)
        self.memo = Memo.read_back(state, self.run_id)  # the resumes already announced
        self._stop_reason: str | None = None
        self._infra = state.infra(self.spec.provider, self.spec.region or "") or {}
        from ..records.journal import Journal
        from ..records.store import open_run_store
        from ..records.store_of import run_store_conf

        # The spec's and stack's bucket, or the URL this machine reached the run by (status --store).
        self.store_conf = run_store_conf(self.spec, self._infra, self.run_id)
        self.store = open_run_store(self.store_conf)
        # The run's history in its bucket, after every step: any machine rebuilds state.db from it.
        self.journal = Journal(state, self.store, self.run_id)
        # Exactly one driver acts on the run at a time (the laptop, its daemon, the cloud function). A lease
        # taken before (the cloud driver's) makes every launch and terminate conditional on still holding it.
        self._guarded = lease is not None
        self.lease = lease or DriverLease(self.store, self.run_id, self.timing.poll_seconds, driver)
        self.journal.lease = self.lease  # a driver that lost the run writes no more of it to the bucket
        self.launching = LaunchInputs(self)
        self.host = HostStatus(self)
        # Across clouds (`--provider aws,tencent`): the home store keeps the journal, launches follow the
        # placement (runs/driving/placement.py); `clouds` gives the other clouds' providers (made when asked).
        home = Home(self.spec, self._infra, self.store_conf, self.store)
        self.clouds = Clouds(state, self.run_id, home, self.tier, {**(clouds or {}), self.spec.provider: self.provider})
        self.placement = Placement(self.spec.provider, None, None, self.store_conf)
        self.policy = get_policy("sdcloud")  # one for the run's life: it remembers since when spot is up
        self.fleet = self._fleet()
        last = next(reversed(state.attempts(self.run_id)), None)
        if last is not None:  # a controller started again (after a move too) carries on where the run went
            here = last.provider if last.provider in self.clouds.names else self.placement.cloud
            self.place(here, last.zone, last.market)

    @property
    def candidates(self) -> list[Offer]:
        return self.fleet.candidates

    # where the run is (runs/driving/placement.py)
    def _offers(self, provider: Any, name: str, spec: RunSpec, plan: RunPlan) -> list[Offer]:
        from ..inputs.training import gpus_used

        return fleet_candidates(provider, self.tier, spec.market, name=name, max_price=plan.max_price,
                                region=spec.region, job_size=self.total_steps, events=self.event,
                                gpus_used=gpus_used(spec), book=lessons.run_book(self), nodes=spec.nodes)

    def _fleet(self) -> Fleet:
        """The fleet of the placement's cloud, the run's other clouds' candidates beside its own."""
        offers = self._offers(self.provider, self.spec.provider, self.spec, self.plan)
        provider = Guarded(self.provider, self.lease) if self._guarded else self.provider
        return Fleet(self.run_id, provider, self.spec.provider, self.state, offers, self.policy, self.event,
                     self.timing, spec_market=self.spec.market, max_price=self.plan.max_price,
                     elsewhere=self.clouds.elsewhere(self.spec.provider, self._offers), progress=self.progress,
                     tier=self.tier)

    def place(self, cloud: str, zone: str | None = None, market: str | None = None) -> None:
        """The one place the run's placement changes: a launch's zone and market, or another cloud (a
        move landed, or a controller started again after one), where its launches, host status and fleet
        then follow it; the journal, lease and stop requests stay in the home store."""
        moved = cloud != self.placement.cloud
        if moved:
            bound = self.clouds.binding(cloud)
            self.provider, self.spec, self.plan, self._infra = bound.provider, bound.spec, bound.plan, bound.infra
            self.store_conf, self.store = bound.store_conf, bound.store
            if self._inputs is not None:
                dataset = dataset_in(self.clouds.home.store_conf, self.store_conf, self._inputs.get("dataset"))
                self._inputs = dict(self._inputs, dataset=dataset)
        self.placement = Placement(cloud, zone, market, self.store_conf)
        if moved:
            self.fleet = self._fleet()

    def _move(self, dst: str, offer: Offer) -> bool:
        """The policy chose a zone of cloud `dst`: carry the run's checkpoint and inputs there, then place
        the run there. False when the copy did not land: nothing launches this step; the next one decides
        again (a copy sends only what is missing), and after MAX_MOVE_FAILURES `dst` is no candidate."""
        why = f"the spot policy chose {offer.key} ({offer.market})"
        if carry(self.clouds, self.placement.cloud, dst, self.ensure_inputs(), self.event, why):
            self.place(dst)
            return True
        self.fleet = self._fleet()
        return False

    def _settle_copy(self) -> None:
        """A move's copy by the last host (its report in this cloud's store): its egress in the ledger."""
        cloud_move.settle_host_copy(self.state, self.run_id, self.store, self.placement.cloud, self.clouds.home.cloud,
                                    self.clouds.store)

    # events
    def event(self, kind: Kind, data: dict | None = None) -> None:
        data = data or {}
        self.state.event(self.run_id, kind, data)
        self.emit(kind, data)

    @property
    def infra(self) -> dict:  # the stack's outputs for the run's provider and region ({} without one)
        return self._infra

    def expected_job_hours(self) -> float:
        rows = [o.row for o in self.candidates if o.row.ondemand_price is not None]
        hours = [h for h in (job_hours_on(self.tier, r, self.total_steps, self.spec.nodes, book=lessons.run_book(self))
                             for r in rows) if h]  # a group's (--nodes N) with its speed-up (offers/groups.py)
        return min(hours) if hours else 1.0

    # cost
    def attempts(self) -> list[Attempt]:
        return self.state.attempts(self.run_id)

    def cost_so_far(self) -> float:
        return cost_ledger.live_cost_usd(self.state, self.row.get())

    def set_state(self, state: RunState) -> None:  # the owner contract's write of the run's state
        self.row.update(state=state)

    def current(self) -> Attempt | None:
        return self.fleet.current()

    # the policy
    def progress(self) -> Progress:
        run = self.row.get()
        c = self.expected_job_hours()
        done = c * (run["step"] / self.total_steps if self.total_steps else 0.0)
        planned = Progress(elapsed_hours=(time.time() - run["created"]) / 3600.0, done_hours=done, job_hours=c,
                           deadline_hours=self.spec.deadline_hours)
        # Once an attempt is warm, the work left is what its measured rate says (speeds/replan.py).
        return lessons.replan(self.state, self.run_id, planned, int(run["step"]), self.total_steps)

    def decide(self, running: Attempt | None) -> tuple[str, Offer | None]:
        # The spot launches refused in a row (in the placement's cloud) count toward the policy's "spot is
        # gone" rule; across clouds the policy is told where the checkpoint is and what a move adds.
        moves = across(self.clouds, self.placement, self._inputs, len(self.attempts()))
        return self.fleet.decide(self.progress(), running, spot_refusals=self.fleet.failed_launches(SPOT), across=moves)

    def _launches_exhausted(self) -> bool:
        """Give up launching: for a spot run with a deadline only when on-demand fails too (spot that
        vanished everywhere sends it on-demand instead, see spot.policy.spot_gone); otherwise the fleet's bound."""
        if self.spec.deadline_hours is not None and self.spec.market != ON_DEMAND:
            return self.fleet.failed_launches(ON_DEMAND) >= MAX_FAILED_LAUNCHES
        return self.fleet.exhausted()

    # the loop
    def request_stop(self, reason: str = "stopped") -> None:
        self._stop_reason = reason

    # the run's inputs in its bucket (runs/inputs/staging.py)
    def ensure_inputs(self, drive: str | None = None) -> dict:
        """The run's inputs as its hosts read them, with its settings: staged here when the run has
        no record yet (or the user resumed it on the machine that staged it), else the bucket's record."""
        if self._inputs is None or drive is not None:
            self._inputs = (inputs.stage(self, drive) if drive is not None or inputs.needs_staging(self.state, self.run_id)
                            else hub_access.taken_up(self.store, self.run_id, self.row.get()["state"],
                                                 inputs.recorded(self.state, self.run_id)[0]))
            self.run_settings = self._inputs.get("settings")
        return self._inputs

    def _stop_requested(self) -> dict | None:
        """A stop asked through the bucket (sdcloud down on a machine that does not drive the run)."""
        since = max((e["time"] for e in self.state.events(self.run_id) if e["kind"] == Kind.RESUME), default=0.0)
        return stop_requests.requested(self.clouds.home.store, self.run_id, since)

    def run(self, take_over: bool = False) -> dict:
        """Drive the run to its end here: take the driver lease, then one step a poll."""
        self.lease.acquire_or_refuse(take_over)
        if take_over:
            self.event(Kind.DRIVER_TOOK_OVER, {"driver": self.lease.driver})
        self.row.update(controller_pid=os.getpid())
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
        with config.run_settings(self.run_settings), self.row.step() as run:
            return self._step(run)

    def _step(self, run: dict) -> bool:
        if run["state"] in FINAL_RUN_STATES:
            return True
        if not self.lease.renew():
            self.event(Kind.DRIVER_LOST, {"driver": self.lease.driver, "holder": (self.lease.holder() or {}).get("worker")})
            return True
        asked = None if self._stop_reason else self._stop_requested()
        if asked is not None:
            self.event(Kind.STOP_REQUESTED, {"by": asked.get("by"), "reason": asked.get("reason"),
                                             "holder": self.lease.driver})
        if self._stop_reason or asked is not None:
            self.finish_stop(self._stop_reason or str(asked.get("reason") or "stopped by sdcloud down"))
            if asked is not None:
                stop_requests.clear(self.clouds.home.store, self.run_id)
            return True
        self.host.heartbeat()
        cur = self.current()
        if cur is None:
            self._start_attempt()
        else:
            self._watch(cur)
        if self.fleet.sweep_due():
            self.sweep_strays()
        self.journal.flush()
        return False

    def hand_over(self, stage: bool = True) -> None:
        """Leave the run to the cloud driver (sdcloud up --unattended): its inputs are put in the bucket
        first (`stage`; a hand-back from `watch --drive` keeps the record), then its journal in the bucket
        says it is live, and no lease is held here, so the function's next invocation takes it."""
        if stage:
            self.ensure_inputs(drive="cloud")
        self.event(Kind.HANDED_OVER, {"to": "the cloud driver"})
        self.journal.flush()

    def finish_driving(self) -> None:
        """After the last step: strays swept and the lease handed back, if this driver still holds it."""
        if self.lease.held:
            self.sweep_strays()
            self._settle_copy()
        self.row.update(controller_pid=None)
        self.journal.flush()
        self.lease.release()

    def _start_attempt(self) -> None:
        budget = self.spec.budget
        if budget is not None and budget_spent(self.cost_so_far(), budget, self.attempts(), self.timing.poll_seconds):
            self.end_run(RunState.STOPPED, f"budget ${budget:g} spent")
            return
        self._settle_copy()
        kind, offer = self.decide(None)
        if self.row.fresh()["state"] in FINAL_RUN_STATES:
            return  # stopped by `down` (from another process) while this step decided: launch nothing
        dst = self.fleet.cloud_of(offer) if offer is not None and kind != WAIT else None
        if kind == WAIT or offer is None or (dst is not None and not self._move(dst, offer)):
            self.row.update(state=RunState.RECOVERING)
            return
        self.row.update(state=RunState.LAUNCHING)
        self.memo.launch_offer = offer  # its price bounds the host's lifetime cap (agent config's self_end)
        try:
            inst = self.fleet.launch(kind, offer, self.launching.launch_spec)
        except UserError as exc:
            self.end_run(RunState.FAILED, str(exc))
            raise
        if inst is None:
            if self._launches_exhausted():
                self.end_run(RunState.FAILED, f"{self.fleet.failed_launches()} launches failed (capacity or price); "
                                              f"see: sdcloud logs {self.run_id}")
            elif kind == SPOT and spot_gone_after(self.fleet.failed_launches(SPOT), self.spec.deadline_hours is not None):
                self.event(Kind.SPOT_UNAVAILABLE, {"failed_launches": self.fleet.failed_launches(SPOT),
                                                   "next": "on-demand, to meet the deadline"})
            return
        self.row.update(state=RunState.RUNNING)
        self.place(self.placement.cloud, inst.zone or offer.row.zone, kind)
        n = len(self.attempts())
        cost_ledger.started(self.state, self.run_id, n, offer, kind, self.memo.launched_spec.root_volume_gb,
                            zone=inst.zone or offer.row.zone)

    def _watch(self, cur: Attempt) -> None:
        watching.watch(self, cur)  # the running attempt's status, recorded and acted on once (watching.py)

    def end_attempt(self, cur: Attempt, reason: str, said: str | None = None) -> None:
        """End the attempt's host for `reason` (`said`: the stop's own words, for `logs`) and price it; a host only
        the bucket reaches (another machine's) is asked to save and end there, and closed at its own end."""
        self.close_attempt(cur, self.fleet.end(cur, reason, at=remote_end.ask_host(self, cur, reason)), (reason, said))

    def close_attempt(self, cur: Attempt, end: float, ended_for: tuple[str, str | None] | None = None) -> None:
        """Price an ended attempt into the ledger (`ended_for`: (reason, words) when this driver ended it)."""
        ended_at = self.host.note_self_end(cur, status := self.host.read_status(), ended_for)
        self.host.settle_step(cur, status, ended_for)
        if ended_at is not None and ended_at < end:
            # The host ended itself: its billing stopped then, not when the controller noticed.
            self.state.update_attempt(self.run_id, cur.n, end=max(ended_at, cur.start or ended_at))
        cost_ledger.closed(self.state, self.run_id, cur.n, self.provider, self.store, events=self.event,
                           heartbeat_s=self.plan.traits.host.heartbeat_seconds,
                           poll_s=self.timing.poll_seconds)
        lessons.learn_attempt(self, cur)  # its steady rate, start-up and reclaim (sdcloud speeds)

    def end_run(self, state: RunState, reason: str | None) -> None:
        """End the run in `state` (succeeded, failed, stopped) with one line of `reason`."""
        if state in RESUMABLE_RUN_STATES and reason and "sdcloud resume" not in reason:
            # Every stop says how to carry on from the durable checkpoint.
            run = self.row.get()
            reason += f"; resume with: sdcloud resume {run.get('name') or self.run_id}"
        self.row.update(state=state, reason=reason)
        self.event(run_ended(state), {"reason": reason} if reason else {})
        # A secret ends with its run, whatever its end.
        hub_access.drop_at_end(self.state, self.run_id, (self.store, self.clouds.home.store))

    def finish_stop(self, reason: str) -> None:
        """Stop the run now (sdcloud down, a signal): its host ended, the run stopped, the journal written."""
        with config.run_settings(self.run_settings):
            cur = self.current()
            if cur is not None:
                self.end_attempt(cur, "stopped", reason)
            self.end_run(RunState.STOPPED, reason)
            self.journal.flush()

    def reconcile(self) -> None:
        """Bring the state store and the provider into agreement after a restart; a driver that takes up
        the run has its inputs in the bucket first (staged here, or the record a driver before it made)."""
        if self.row.get()["state"] in ACTIVE_RUN_STATES:
            self.ensure_inputs()
        with config.run_settings(self.run_settings):
            self.fleet.reconcile(on_end=self.close_attempt)
            self.sweep_strays()

    def sweep_strays(self) -> None:
        """Terminate instances of this run that no open attempt owns (zero leaked instances)."""
        self.fleet.sweep_strays(keep_open=self.row.get()["state"] in ACTIVE_RUN_STATES)


def main(argv: list[str] | None = None) -> int:
    """`python -m sdcloud.runs.driving.controller RUN_ID`: drive a run in the background (sdcloud up --detach)."""
    args = argv if argv is not None else sys.argv[1:]
    state = StateStore()
    def emit(kind: Kind, data: dict) -> None:
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
        if isinstance(ctl.provider, Closable):
            ctl.provider.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
