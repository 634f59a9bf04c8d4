"""A batch worker host's bounds (sdcloud_agent/batch/lifetime.py): the lifetime cap ends it, a job
whose driver is gone with nobody to take it ends it after the grace, and a job handed to the cloud
driver (which looks once every five minutes) keeps it working between the function's invocations.
The agent's own Worker runs the items; the clock is the test's, so nothing waits for real minutes."""

from __future__ import annotations

import json
import threading
import time

from sdcloud_agent.batch.lifetime import DriverWatch, Lifetime
from sdcloud_agent.batch.worker import Worker, write_job
from sdcloud_agent.selfend import SelfEnd
from sdcloud_agent.store import LocalStore

from tests.support.fake_batch import FakeGenerator

JOB = "batch/b-life0001"


class Clock:
    def __init__(self):
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _job(tmp_path, items: int = 12) -> LocalStore:
    store = LocalStore(tmp_path / "bucket")
    write_job(store, JOB, {"tier": "batch-sd15"}, [
        {"id": f"i{n:07d}", "settings": {"prompt": f"p{n}", "model": "tiny"}, "seeds": [n]} for n in range(items)])
    return store


def _heartbeat(store: LocalStore, at: float, every_s: float) -> None:
    store.put("runs/b-life0001/controller.json", json.dumps({"time": at, "driver": "x", "every_s": every_s}).encode())


def _run(store: LocalStore, se: SelfEnd, clock: Clock, advance: float, rounds: int = 400,
         tick=lambda: None) -> tuple[Worker, Lifetime]:
    """The worker and its lifetime watch, the clock moved `advance` s each look, until the worker ends."""
    w = Worker(store, JOB, FakeGenerator(batch_size=1, delay=0.05), worker_id="w1", ttl=5.0, idle_wait=0.05)
    life = Lifetime(se, DriverWatch(store, "runs/b-life0001", se.unattended_after_s, clock(), clock=clock),
                    w.stop, clock(), clock=clock, every=0.01)
    t = threading.Thread(target=w.run)
    t.start()
    for _ in range(rounds):
        if not t.is_alive():
            break
        reason = life.check()
        if reason:
            life.reason = reason
            w.stop.set()
            break
        clock.t += advance
        tick()
        time.sleep(0.02)
    t.join(30)
    return w, life


def _done(store: LocalStore) -> int:
    return len(store.list(f"{JOB}/done/"))


def test_the_lifetime_cap_ends_the_worker_and_hands_its_item_back(tmp_path):
    store, clock = _job(tmp_path), Clock()
    se = SelfEnd(provider="aws", grace_s=600, estimate_hours=0.01, launched_at=clock())  # cap: 2 x 36 s + 2 h
    w, life = _run(store, se, clock, advance=600.0)
    assert life.reason and life.reason.startswith("lifetime cap reached (twice the estimate"), life.reason
    assert 0 < _done(store) < 12, "it stopped mid-job"
    leases = [json.loads(store.get(o.key)) for o in store.list(f"{JOB}/leases/")]
    assert all(lease["released"] for lease in leases if lease["item"] not in
               {o.key.rsplit("/", 1)[-1].removesuffix(".json") for o in store.list(f"{JOB}/done/")})


def test_a_job_with_no_driver_ends_its_worker_after_the_grace(tmp_path):
    store, clock = _job(tmp_path), Clock()
    _heartbeat(store, clock() - 3600, every_s=5.0)  # the laptop drove it, an hour ago; no cloud driver took it
    se = SelfEnd(provider="aws", grace_s=120, unattended_after_s=20, launched_at=clock())
    w, life = _run(store, se, clock, advance=30.0)
    assert life.reason == "the job has had no driver for 120 s", life.reason
    assert _done(store) < 12


def test_a_job_handed_to_the_cloud_driver_keeps_its_worker_working(tmp_path):
    store, clock = _job(tmp_path), Clock()
    se = SelfEnd(provider="aws", grace_s=120, unattended_after_s=20, launched_at=clock())
    looked = [clock()]

    def invocation() -> None:  # the function looks once every five minutes
        if clock() - looked[0] >= 300:
            looked[0] = clock()
            _heartbeat(store, clock(), every_s=300.0)
    _heartbeat(store, clock(), every_s=300.0)
    w, life = _run(store, se, clock, advance=15.0, tick=invocation)  # minutes pass between two of its looks
    assert life.reason is None and _done(store) == 12, "every item done: the cloud driver drives the job"
    watch = DriverWatch(store, "runs/b-life0001", 20, clock(), clock=clock)
    clock.t += 4 * 300 + 1  # four of its looks missed: the cloud driver is gone too
    assert watch.unattended()
