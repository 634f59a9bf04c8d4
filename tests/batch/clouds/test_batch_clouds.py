"""A batch job across clouds (sdcloud/batch/clouds.py): workers of two clouds, each in its own
cloud's store, and every image in the home store exactly once through the relay."""

from __future__ import annotations

import threading
import time

import pytest
from sdcloud_agent.batch import layout
from sdcloud_agent.batch.verify import verify
from sdcloud_agent.batch.worker import Worker, write_job
from sdcloud_agent.store import LocalStore

from sdcloud.batch.clouds import ATTEMPTS_APART, CloudRecords, Relay, shares
from tests.batch.test_batch_protocol import _items
from tests.support.fake_batch import FakeGenerator

JOB = "batch/b-clouds01"


def _pool(store, prefix: str, n: int, name: str) -> list[tuple[Worker, threading.Thread]]:
    out = []
    for i in range(n):
        w = Worker(store, prefix, FakeGenerator(delay=0.02), worker_id=f"{name}-w{i}", ttl=5.0, idle_wait=0.05)
        t = threading.Thread(target=w.run, daemon=True)
        t.start()
        out.append((w, t))
    return out


def test_workers_in_two_clouds_put_every_image_home_exactly_once(tmp_path):
    home, other = LocalStore(tmp_path / "home"), LocalStore(tmp_path / "other")
    write_job(home, JOB, {"tier": "batch-sd15"}, _items(40, 2))
    relay = Relay(home, other, JOB)
    relay.seed()
    relay.seed()  # a second seed changes nothing
    pools = _pool(home, JOB, 2, "home") + _pool(other, JOB, 2, "other")
    moved = {"markers_out": 0, "markers_home": 0, "images_home": 0}
    deadline = time.monotonic() + 20
    while len(home.list(f"{JOB}/done/")) < 40 and time.monotonic() < deadline:
        for k, v in relay.step().items():
            moved[k] += v
        time.sleep(0.05)
    for k, v in relay.step().items():
        moved[k] += v
    for w, t in pools:
        t.join(10)
        assert not t.is_alive()
    v = verify(home, JOB)
    assert v.ok and v.items_done == 40 and v.images_present == 80 and not v.stray_images, v.as_dict()
    # Both clouds worked: the other cloud's markers and images came home through the relay.
    assert moved["markers_home"] > 0 and moved["images_home"] > 0
    others = [m for m in (home.get(o.key) for o in home.list(f"{JOB}/done/")) if b'"other-w' in m]
    assert len(others) == moved["markers_home"]


def test_an_item_done_in_both_clouds_lands_home_once(tmp_path):
    home, other = LocalStore(tmp_path / "home"), LocalStore(tmp_path / "other")
    items = _items(1, 3)
    write_job(home, JOB, {}, items)
    relay = Relay(home, other, JOB)
    relay.seed()
    # The same item finished in both clouds before the relay looked (a worker in each).
    for store, name in ((home, "home-w"), (other, "other-w")):
        Worker(store, JOB, FakeGenerator(), worker_id=name, ttl=5.0, idle_wait=0.01).run()
    before = {o.key: home.get(o.key) for o in home.list(f"{JOB}/")}
    moved = relay.step()
    assert moved == {"markers_out": 0, "markers_home": 0, "images_home": 0}
    assert {o.key: home.get(o.key) for o in home.list(f"{JOB}/")} == before  # nothing written home
    assert verify(home, JOB).ok


def test_a_cancel_at_home_reaches_the_other_clouds_workers(tmp_path):
    home, other = LocalStore(tmp_path / "home"), LocalStore(tmp_path / "other")
    write_job(home, JOB, {}, _items(3))
    relay = Relay(home, other, JOB)
    relay.seed()
    home.put(layout.cancel_key(JOB), b"cancelled\n")
    relay.step()
    stats = Worker(other, JOB, FakeGenerator(), worker_id="other-w", ttl=5.0).run()
    assert stats.items_done == 0 and other.head(layout.cancel_key(JOB)) is not None


def test_each_clouds_fleet_sees_its_own_attempts_numbered_apart(sdcloud_home):
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    state.create_run("b-clouds02", "batch-sd15", {"kind": "batch"}, 10)
    home, other = CloudRecords(state, "aws", 0), CloudRecords(state, "tencent", 1)
    home.add_attempt("b-clouds02", len(home.attempts("b-clouds02")) + 1, "aws", "t1")
    other.add_attempt("b-clouds02", len(other.attempts("b-clouds02")) + 1, "tencent", "t2")
    other.update_attempt("b-clouds02", 1, state="running")
    assert [a.n for a in home.attempts("b-clouds02")] == [1]
    (a,) = other.attempts("b-clouds02")
    assert a.n == ATTEMPTS_APART + 1 and a.state == "running"
    other.update_attempt("b-clouds02", a.n, state="ended")  # the fleet passes a stored number back as it is
    assert other.attempts("b-clouds02")[0].state == "ended"


@pytest.mark.parametrize("workers,clouds,want", [(4, 2, [2, 2]), (3, 2, [2, 1]), (1, 2, [1, 1])])
def test_workers_are_shared_between_the_clouds(workers, clouds, want):
    assert shares(workers, clouds) == want
