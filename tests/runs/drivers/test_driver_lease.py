"""The run's driver lease (sdcloud.runs.records.lease): each invocation of the cloud function is a driver of its
own, a parked lease passes to the function's next invocation only, racing claimers have one winner on
both store dialects (compare-and-swap, and COS's one object per term, whose old terms are deleted),
a driver that lost the lease launches and ends nothing, and `holder` says who drives."""

from __future__ import annotations

import threading

import pytest

from sdcloud.runs.records import lease as drv
from sdcloud_agent.store import LocalStore


class CosLike(LocalStore):
    """A bucket without compare-and-swap, as COS is (it ignores If-Match on PUT): put_if_match refused."""

    compare_and_swap = False

    def put_if_match(self, key, data, etag):
        raise AssertionError("COS has no compare-and-swap: the lease must not ask for it")


@pytest.fixture(params=["cas", "cos"])
def store(request, tmp_path):
    return LocalStore(tmp_path / "bucket") if request.param == "cas" else CosLike(tmp_path / "bucket")


def test_an_invocation_does_not_take_the_live_lease_of_another_invocation(store):
    now = [1000.0]
    clock = lambda: now[0]  # noqa: E731
    first = drv.DriverLease(store, "r-1", 5.0, drv.invocation_id("aws-lambda", "req-1"), clock=clock)
    second = drv.DriverLease(store, "r-1", 5.0, drv.invocation_id("aws-lambda", "req-2"), clock=clock)
    laptop = drv.DriverLease(store, "r-1", 5.0, "laptop:4242", clock=clock)
    assert first.acquire()
    assert not second.acquire(), "the same function's other invocation is another driver"
    assert not laptop.acquire()
    assert first.park(until_next=300)  # done with the run, live until its function's next tick is due
    assert drv.holder(store, "r-1", now=now[0]).expires_in == pytest.approx(300 + drv.MIN_LEASE_SECONDS)
    now[0] += 300  # the next tick
    assert not laptop.acquire(), "a parked lease keeps other drivers out"
    assert second.acquire() and second.previous["worker"] == "aws-lambda:req-1"
    assert not first.renew(), "a parked lease is not held any more by the invocation that parked it"
    held = drv.holder(store, "r-1", now=now[0])
    assert held.kind == drv.FUNCTION and held.function == "aws-lambda" and held.invocation == "req-2" and held.live
    assert "the cloud function aws-lambda (invocation req-2)" in drv.driving_line(held, "r-1")
    now[0] += drv.MIN_LEASE_SECONDS + 1
    assert not drv.holder(store, "r-1", now=now[0]).live, "lapsed: nobody drives it"
    assert "nobody drives run r-1" in drv.driving_line(drv.holder(store, "r-1", now=now[0]), "r-1")
    assert laptop.acquire()
    held = drv.holder(store, "r-1", now=now[0])
    assert held.kind == drv.MACHINE and held.host == "laptop" and held.pid == 4242


def test_three_invocations_racing_for_a_parked_lease_have_one_winner(store):
    previous = drv.DriverLease(store, "r-2", 5.0, drv.invocation_id("tencent-scf", "tick-0"))
    assert previous.acquire() and previous.park()
    for tick in range(1, 6):
        racers = [drv.DriverLease(store, "r-2", 5.0, drv.invocation_id("tencent-scf", f"tick-{tick}-{i}"))
                  for i in range(3)]
        won: list[drv.DriverLease] = []
        gate = threading.Barrier(3)

        def claim(lease: drv.DriverLease) -> None:
            gate.wait()
            if lease.acquire():
                won.append(lease)

        threads = [threading.Thread(target=claim, args=(r,)) for r in racers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1, [r.driver for r in won]
        assert won[0].park()
    if isinstance(store, CosLike):
        # One object per term on COS; the terms before the current one are gone (no ~288 a day).
        keys = sorted(o.key for o in store.list("runs/r-2/leases/"))
        assert keys == ["runs/r-2/leases/driver.json", f"runs/r-2/leases/driver.json.{won[0]._leases._latest('driver')}"]


def test_a_holder_of_an_old_cos_term_finds_it_lost_after_its_object_was_deleted(tmp_path):
    store = CosLike(tmp_path / "bucket")
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    old = drv.DriverLease(store, "r-3", 5.0, "laptop-a:1", clock=clock)
    assert old.acquire()
    for n in range(4):  # the run changes hands four times while laptop-a sleeps
        now[0] += drv.MIN_LEASE_SECONDS + 1
        assert drv.DriverLease(store, "r-3", 5.0, drv.invocation_id("aws-lambda"), clock=clock).acquire()
    assert len(store.list("runs/r-3/leases/")) == 2
    assert not old.renew(), "its term's object is gone and a later term exists: it lost the run"


def test_a_driver_that_lost_the_lease_launches_and_ends_nothing(tmp_path):
    store = LocalStore(tmp_path / "bucket")
    calls = []

    class Cloud:
        def launch(self, *a, **kw):
            calls.append("launch")

        def terminate(self, *a, **kw):
            calls.append("terminate")

        def describe(self, ids, region=None):
            return []

    mine = drv.DriverLease(store, "r-4", 5.0, "laptop-a:1")
    assert mine.acquire()
    guarded = drv.Guarded(Cloud(), mine)
    guarded.launch()
    assert guarded.describe(["i-1"]) == [] and calls == ["launch"]
    assert drv.DriverLease(store, "r-4", 5.0, "laptop-b:2").acquire(take_over=True)
    with pytest.raises(drv.LeaseLost):
        guarded.terminate(["i-1"])
    with pytest.raises(drv.LeaseLost):
        guarded.launch()
    assert calls == ["launch"], "nothing acted after the lease was lost"


def test_the_background_controller_says_it_is_one(tmp_path, monkeypatch):
    """`sdcloud up --detach` runs `python -m sdcloud.runs.driving.controller`: its lease says it is the daemon."""
    import sys
    import types
    from importlib.machinery import ModuleSpec

    store = LocalStore(tmp_path / "bucket")
    daemon_main = types.ModuleType("__main__")
    daemon_main.__spec__ = ModuleSpec("sdcloud.runs.driving.controller", None)
    monkeypatch.setitem(sys.modules, "__main__", daemon_main)
    assert drv.DriverLease(store, "r-5", 5.0, "laptop-a:77").acquire()
    monkeypatch.undo()
    held = drv.holder(store, "r-5")
    assert held.kind == drv.DAEMON and held.live
    assert drv.driving_line(held, "r-5").startswith("driven by a background controller on laptop-a (pid 77)")
