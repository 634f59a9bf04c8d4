"""The host lifecycle (sdcloud.fleet) on its own: N hosts kept alive, reclaimed ones replaced in
another zone, and zone cooldowns that outlive the controller that recorded them."""

from __future__ import annotations

import itertools
from datetime import datetime, timezone

from sdcloud.fleet.candidates import zone_key
from sdcloud.fleet.lifecycle import Fleet, Progress, Timing
from sdcloud.providers.base import RUNNING, TAG_TOKEN, TERMINATED, Instance
from sdcloud.runs.driving.controller import Controller
from sdcloud.runs.records.state import StateStore
from sdcloud.spot.policy import get_policy

ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]


class CloudDouble:
    """An in-process cloud with three zones: launches always succeed; `reclaim(id)` takes one away."""

    name = "aws"

    def __init__(self):
        self.instances: dict[str, Instance] = {}
        self.ids = itertools.count(1)

    def zones(self, region):
        return ZONES

    def launch(self, offer, spec, market, max_price, events=None):
        inst = Instance("aws", f"i-{next(self.ids):04d}", offer.row.region, offer.row.zone, offer.row.instance_type,
                        market, RUNNING, launched_at=datetime.now(timezone.utc), tags=spec.tags)
        self.instances[inst.id] = inst
        return inst

    def describe(self, ids, region=None):
        return [self.instances[i] for i in ids if i in self.instances]

    def terminate(self, ids, region=None):
        for i in ids:
            if i in self.instances:
                self.instances[i].state = TERMINATED

    def find_tagged(self, run_id, regions=None):
        return [i for i in self.instances.values() if i.live and i.tags.get("sdcloud:run") == run_id]

    def reclaim(self, instance_id):
        self.instances[instance_id].state = TERMINATED

    def live(self):
        return [i for i in self.instances.values() if i.live]


def _run(state: StateStore, run_id: str = "r-cool0001") -> str:
    spec = {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1", "model": "tiny", "steps": 100,
            "market": "spot", "store": "file:///tmp/sdcloud-fleet-test-bucket"}
    state.create_run(run_id, "sd15-lora", spec, 100)
    return run_id


def test_a_reclaimed_zone_stays_cooled_down_after_the_controller_restarts(sdcloud_home):
    cloud = CloudDouble()
    state = StateStore()
    run_id = _run(state)
    first = Controller(state, run_id, provider=cloud)
    first._start_attempt()
    a1 = first.current()
    assert a1 is not None and a1.instance_id
    cloud.reclaim(a1.instance_id)
    first._watch(a1)  # sees the reclaim: attempt ended, zone cooled down
    reclaimed_zone = first.attempts()[0].zone
    assert first.attempts()[0].end_reason == "preempted"
    del first  # the controller dies here; nothing it held in memory survives

    again = Controller(StateStore(), run_id, provider=cloud)
    again.reconcile()
    again._start_attempt()
    a2 = again.current()
    assert a2.n == 2
    assert a2.zone != reclaimed_zone, "a restarted controller went straight back to the reclaimed zone"
    assert a2.instance_type == a1.instance_type  # same offer, only the zone differs
    cooled = StateStore().zone_cooldowns()
    assert f"aws/us-east-1/{reclaimed_zone}/{a1.instance_type}" in cooled


def test_the_same_first_choice_without_a_cooldown(sdcloud_home):
    # The control for the test above: with no reclaim recorded, the next launch takes the same zone.
    cloud = CloudDouble()
    state = StateStore()
    run_id = _run(state, "r-cool0002")
    ctl = Controller(state, run_id, provider=cloud)
    ctl._start_attempt()
    a1 = ctl.current()
    ctl.fleet.end(a1, "stopped")
    ctl._start_attempt()
    assert ctl.current().zone == a1.zone


def test_fleet_keeps_n_hosts_alive_and_replaces_a_reclaimed_one_elsewhere(sdcloud_home):
    cloud = CloudDouble()
    state = StateStore()
    run_id = _run(state, "r-fleet003")
    ctl = Controller(state, run_id, provider=cloud)  # for its candidates and launch specs
    events = []
    fleet = Fleet(run_id, cloud, "aws", state, ctl.candidates, get_policy("sdcloud"),
                  lambda k, d: events.append((k, d)), Timing(poll_seconds=1, boot_timeout=60, heartbeat_timeout=60),
                  spec_market="spot")
    progress = Progress(elapsed_hours=0.0, done_hours=0.0, job_hours=1.0, deadline_hours=None)
    fleet.keep_alive(3, progress, ctl.launching.launch_spec)
    assert len(cloud.live()) == 3 and len(fleet.open_attempts()) == 3
    fleet.keep_alive(3, progress, ctl.launching.launch_spec)  # already 3: launches nothing
    assert len(cloud.instances) == 3
    victim = fleet.open_attempts()[0]
    cloud.reclaim(victim.instance_id)
    now = __import__("time").time()
    outcomes = [fleet.check(a, "training", now) for a in fleet.open_attempts()]
    assert sorted(outcomes) == ["ok", "ok", "preempted"]
    fleet.keep_alive(3, progress, ctl.launching.launch_spec)
    live = cloud.live()
    assert len(live) == 3
    replacement = max(live, key=lambda i: i.id)
    assert replacement.zone != victim.zone
    assert {i.tags[TAG_TOKEN] for i in live} == {a.token for a in fleet.open_attempts()}
    # Strays (a live instance no open attempt owns) are swept.
    fleet.end(fleet.open_attempts()[0], "stopped")
    cloud.instances["i-9999"] = Instance("aws", "i-9999", "us-east-1", ZONES[0], "g5.xlarge", "spot", RUNNING,
                                         tags={"sdcloud:run": run_id, TAG_TOKEN: "nobody"})
    fleet.sweep_strays()
    assert cloud.instances["i-9999"].state == TERMINATED
    assert len(cloud.live()) == 2
    assert zone_key(ctl.candidates[0]).startswith("aws/us-east-1/")


def test_an_instance_unknown_here_is_kept_while_its_heartbeat_is_fresh_and_never_counted_a_reclaim(sdcloud_home):
    """A host that another machine launched is not in this machine's provider (a local host of that
    machine): with a fresh heartbeat in the bucket it is adopted, not declared gone; once its heartbeat
    stops it is lost, never a spot reclaim that nobody announced."""
    import time

    cloud = CloudDouble()
    state = StateStore()
    run_id = _run(state, "r-fleet004")
    ctl = Controller(state, run_id, provider=cloud)
    events = []
    fleet = Fleet(run_id, cloud, "aws", state, ctl.candidates, get_policy("sdcloud"),
                  lambda k, d: events.append((k, d)), Timing(poll_seconds=1, boot_timeout=60, heartbeat_timeout=60),
                  spec_market="spot")
    progress = Progress(elapsed_hours=0.0, done_hours=0.0, job_hours=1.0, deadline_hours=None)
    fleet.keep_alive(1, progress, ctl.launching.launch_spec)
    [cur] = fleet.open_attempts()
    assert cur.market == "spot"
    del cloud.instances[cur.instance_id]  # launched by the other machine: unknown here
    events.clear()
    fleet = Fleet(run_id, cloud, "aws", state, ctl.candidates, get_policy("sdcloud"),  # the second machine's
                  lambda k, d: events.append((k, d)), Timing(poll_seconds=1, boot_timeout=60, heartbeat_timeout=60),
                  spec_market="spot")
    assert fleet.check(cur, "training", time.time() - 5) == "ok"
    assert fleet.open_attempts() and events == [], events
    assert fleet.check(cur, "training", time.time() - 120) == "lost"
    assert [k for k, _ in events if k in ("reclaimed", "host-lost")] == ["host-lost"], events
    assert state.attempts(run_id)[0].end_reason == "lost"


def test_an_instance_this_fleet_saw_that_vanished_is_gone_at_once(sdcloud_home):
    """The control: a spot instance this fleet launched and the cloud no longer shows is a reclaim."""
    import time

    cloud = CloudDouble()
    state = StateStore()
    run_id = _run(state, "r-fleet005")
    ctl = Controller(state, run_id, provider=cloud)
    fleet = Fleet(run_id, cloud, "aws", state, ctl.candidates, get_policy("sdcloud"), lambda k, d: None,
                  Timing(poll_seconds=1, boot_timeout=60, heartbeat_timeout=60), spec_market="spot")
    fleet.keep_alive(1, Progress(0.0, 0.0, 1.0, None), ctl.launching.launch_spec)
    [cur] = fleet.open_attempts()
    del cloud.instances[cur.instance_id]
    assert fleet.check(cur, "training", time.time() - 5) == "preempted"
