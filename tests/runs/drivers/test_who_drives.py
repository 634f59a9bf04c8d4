"""`status` and `watch` on a second machine say who drives a run, from the driver lease in its bucket
(runs/driver.holder): another machine, the cloud function (which invocation), or nobody since its
lease lapsed, instead of "no controller" beside a run that another driver carries."""

from __future__ import annotations

import json
import threading
import time

from sdcloud_agent.store import LocalStore


def _a_run_in_its_bucket(tmp_path, rid: str = "r-whod0001"):
    from sdcloud.runs.records.journal import Journal
    from sdcloud.runs.records.state import StateStore

    bucket = tmp_path / "bucket"
    first = StateStore(tmp_path / "first-machine.db")
    first.create_run(rid, "sd15-lora", {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1",
                                        "model": "tiny", "steps": 10, "market": "spot",
                                        "store": bucket.as_uri()}, 10)
    first.update_run(rid, state="running", step=3)
    Journal(first, LocalStore(bucket), rid).flush()
    return first, LocalStore(bucket), bucket.as_uri(), rid


def test_status_on_a_second_machine_says_who_drives(tmp_path, capsys, sdcloud_home, monkeypatch):
    from sdcloud.cli import main
    from sdcloud.runs.records import lease as drv

    _, store, url, rid = _a_run_in_its_bucket(tmp_path)
    laptop = drv.DriverLease(store, rid, 5.0, "laptop-a:4242")
    assert laptop.acquire()
    assert main(["status", rid, "--store", url]) == 0
    out = capsys.readouterr().out
    assert "driven by sdcloud on laptop-a (pid 4242)" in out and "no controller" not in out, out
    assert main(["status", rid, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["controller"] == "alive" and st["driver"]["kind"] == "machine" and st["driver"]["live"]
    assert main(["status", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["controller"] == "ok" and row["driver"]["worker"] == "laptop-a:4242"

    # The laptop went away; an invocation of the cloud function took the run and parked it.
    now = time.time() + drv.MIN_LEASE_SECONDS + 1
    fn = drv.DriverLease(store, rid, 5.0, drv.invocation_id("aws-lambda", "req-7"), clock=lambda: now)
    assert fn.acquire() and fn.park()
    monkeypatch.setattr(time, "time", lambda: now + 1)
    assert main(["status", rid]) == 0
    out = capsys.readouterr().out
    assert "driven by the cloud function aws-lambda (invocation req-7): between invocations" in out, out
    assert "no controller" not in out

    # Its lease lapsed and no invocation came: nobody drives it, and the note says what to do.
    monkeypatch.setattr(time, "time", lambda: now + drv.MIN_LEASE_SECONDS + 30)
    assert main(["status", rid]) == 0
    out = capsys.readouterr().out
    assert "nobody drives run" in out and "the cloud function aws-lambda" in out and "no controller" in out, out
    assert main(["status", rid, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["controller"] == "none" and st["driver"]["live"] is False


def test_watch_on_a_second_machine_follows_a_run_another_machine_drives(tmp_path, capsys, sdcloud_home,
                                                                      monkeypatch):
    from sdcloud.cli import main
    from sdcloud.commands import watch as watch_cmd
    from sdcloud.runs.records import lease as drv
    from sdcloud.runs.records.journal import Journal

    first, store, url, rid = _a_run_in_its_bucket(tmp_path, "r-whod0002")
    laptop = drv.DriverLease(store, rid, 5.0, "laptop-a:4242")
    assert laptop.acquire()
    assert main(["status", rid, "--store", url]) == 0
    capsys.readouterr()
    monkeypatch.setattr(watch_cmd, "ELSEWHERE_SECONDS", 0.2)

    def the_first_machine_finishes() -> None:
        time.sleep(1.5)
        assert laptop.renew()
        first.update_run(rid, state="succeeded", step=10)
        first.event(rid, "run-succeeded", {})
        Journal(first, store, rid).flush()

    t = threading.Thread(target=the_first_machine_finishes)
    t.start()
    try:
        rc = main(["watch", rid, "--interval", "0.2"])
    finally:
        t.join()
    err = capsys.readouterr().err
    assert rc == 0, err
    assert err.count("driven by sdcloud on laptop-a (pid 4242)") == 1, err
    assert "no controller" not in err


def test_a_lease_handed_back_is_not_aged_from_zero(tmp_path):
    """A released lease keeps no expiry (0 in its body): `status` says it was handed back, never that it
    lapsed some 1.8 billion seconds ago; a lapsed one is aged on the one clock that wrote it."""
    from sdcloud.runs.records import lease as drv

    _, store, _, rid = _a_run_in_its_bucket(tmp_path, "r-whod0003")
    laptop = drv.DriverLease(store, rid, 5.0, "laptop-a:4242")
    assert laptop.acquire()
    laptop.release()
    h = drv.holder(store, rid)
    line = drv.driving_line(h, rid)
    assert not h.live and h.expires_in == 0 and h.released
    assert line == f"nobody drives run {rid}: sdcloud on laptop-a (pid 4242) handed it back", line
    now = time.time()
    other = drv.DriverLease(store, rid, 5.0, "laptop-b:7", clock=lambda: now)
    assert other.acquire()
    later = drv.holder(store, rid, now=now + other.ttl + 30)
    assert "lapsed 30 s ago" in drv.driving_line(later, rid)


def test_status_and_watch_read_the_bucket_again_without_store(tmp_path, capsys, sdcloud_home):
    """Once reached by `status RUN --store URL`, every later `status RUN` shows what the run's driver
    wrote to its bucket since, without --store again."""
    from sdcloud.cli import main
    from sdcloud.runs.records.journal import Journal

    first, store, url, rid = _a_run_in_its_bucket(tmp_path, "r-whod0004")
    assert main(["status", rid, "--store", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 3
    first.update_run(rid, step=7)
    Journal(first, store, rid).flush()
    assert main(["status", rid, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 7
    first.update_run(rid, state="succeeded", step=10)
    Journal(first, store, rid).flush()
    assert main(["watch", rid, "--interval", "0.1"]) == 0
    assert "10/10" in capsys.readouterr().out
