"""A run's record in its bucket only moves forward (runs/records/journal.py, docs/runs.md "Who drives a run").

A machine whose view of a run is older than the bucket's (another machine drove the run on, or ended
it) takes the bucket's record instead of writing its own, whether it learns so from the sequence
number it last saw or from the compare-and-swap that refuses its write. The end-to-end case is the
one users met: home C starts a run and detaches, home D takes it over and stops it with `down`, and
a plain `status` from C must not put step 8 "running" back over D's stopped record.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from sdcloud.runs.records import journal
from sdcloud.runs.records.state import StateStore
from sdcloud_agent.store import LocalStore
from tests.support.server_seaweed import wait_until


def _a_run(state: StateStore, rid: str = "r-0000beef") -> str:
    state.create_run(rid, "sd15-lora", {"tier": "sd15-lora", "provider": "local"}, 100, name="shared")
    state.add_attempt(rid, 1, "local", "tok1", instance_type="local", market="on-demand", price=0.0,
                      currency="USD", instance_id="h-1", start=1000.0)
    state.update_run(rid, state="running", step=8)
    return rid


def _record(store, rid: str) -> dict:
    return json.loads(store.get(f"runs/{rid}/journal/run.json"))


def test_each_write_carries_a_higher_sequence_number_and_its_writer(tmp_path):
    state = StateStore(tmp_path / "c.db")
    store = LocalStore(tmp_path / "bucket")
    rid = _a_run(state)
    j = journal.Journal(state, store, rid, clock=lambda: 0.0)
    j.flush()
    first = _record(store, rid)
    state.update_run(rid, step=9)
    j.flush()
    second = _record(store, rid)
    assert second["seq"] == first["seq"] + 1 and second["run"]["step"] == 9
    assert second["written_by"] == journal.writer_name()
    assert journal.seen(state, rid)["seq"] == second["seq"]


def test_a_stale_view_takes_the_bucket_record_instead_of_writing(tmp_path):
    c, d = StateStore(tmp_path / "c.db"), StateStore(tmp_path / "d.db")
    store = LocalStore(tmp_path / "bucket")
    rid = _a_run(c)
    journal.Journal(c, store, rid, clock=lambda: 0.0).flush()
    journal.restore(d, store, rid)
    d.update_run(rid, step=33, state="stopped", reason="stopped by sdcloud down")
    journal.Journal(d, store, rid, clock=lambda: 0.0).flush()
    newest = _record(store, rid)
    # C still believes step 8, running, and ends the run from that view (its status once did).
    c.update_run(rid, state="stopped", reason="its host ended itself (grace)", controller_pid=4242)
    c.event(rid, "run-stopped", {"reason": "its host ended itself (grace)"})
    journal.Journal(c, store, rid, clock=lambda: 0.0).flush()
    assert _record(store, rid) == newest, "the bucket's record did not go back"
    assert c.get_run(rid)["step"] == 33 and c.get_run(rid)["reason"] == "stopped by sdcloud down"
    assert c.get_run(rid)["controller_pid"] == 4242, "this machine's own field stays this machine's"
    sent = [e for o in store.list(f"runs/{rid}/journal/events/") for e in json.loads(store.get(o.key))]
    assert not any("ended itself" in json.dumps(e) for e in sent), "the stale view's events stay here"


def test_a_state_db_that_never_saw_the_record_does_not_write_an_earlier_step(tmp_path):
    c, d = StateStore(tmp_path / "c.db"), StateStore(tmp_path / "d.db")
    store = LocalStore(tmp_path / "bucket")
    rid = _a_run(d)
    d.update_run(rid, step=40)
    journal.Journal(d, store, rid, clock=lambda: 0.0).flush()
    _a_run(c)  # the same run, known here at step 8 without ever reading the bucket (an older sdcloud's copy)
    journal.Journal(c, store, rid, clock=lambda: 0.0).flush()
    assert _record(store, rid)["run"]["step"] == 40
    assert c.get_run(rid)["step"] == 40


def test_a_write_that_loses_the_compare_and_swap_takes_the_winner(tmp_path):
    """Two writers read the same record; the one whose If-Match comes second is refused, and reads again."""
    c = StateStore(tmp_path / "c.db")
    store = LocalStore(tmp_path / "bucket")
    rid = _a_run(c)
    j = journal.Journal(c, store, rid, clock=lambda: 0.0)
    j.flush()
    key = f"runs/{rid}/journal/run.json"
    real = store.put_if_match

    def racing(k, data, etag):  # another driver's write lands between our read and our write
        doc = _record(store, rid)
        doc["seq"] += 5
        doc["run"]["step"] = 50
        doc["written_by"] = "other-host:77"
        real(k, json.dumps(doc).encode(), etag)
        return real(k, data, etag)

    store.put_if_match = racing
    c.update_run(rid, step=12)
    j.flush()
    assert _record(store, rid)["run"]["step"] == 50
    assert c.get_run(rid)["step"] == 50 and journal.seen(c, rid)["written_by"] == "other-host:77"
    assert key


def test_restore_keeps_this_machines_rows_when_the_bucket_is_no_newer(tmp_path):
    """A step that could not reach the bucket leaves this machine newer than it: a refresh keeps it."""
    c = StateStore(tmp_path / "c.db")
    store = LocalStore(tmp_path / "bucket")
    rid = _a_run(c)
    journal.Journal(c, store, rid, clock=lambda: 0.0).flush()
    c.update_run(rid, step=20)  # not written yet (the journal was deferred)
    assert journal.restore(c, store, rid)["step"] == 20
    other = StateStore(tmp_path / "other.db")
    assert journal.restore(other, store, rid)["step"] == 8, "a machine that never saw it takes the bucket's"


def test_a_record_without_sequence_numbers_is_read_and_continued(tmp_path):
    """A record an older sdcloud wrote (no `seq`) is restored, and the next write numbers it 1."""
    c = StateStore(tmp_path / "c.db")
    store = LocalStore(tmp_path / "bucket")
    rid = _a_run(c)
    snap = journal.snapshot(c, rid)
    store.put(f"runs/{rid}/journal/run.json", json.dumps(snap, default=str).encode())
    d = StateStore(tmp_path / "d.db")
    assert journal.restore(d, store, rid)["step"] == 8
    d.update_run(rid, step=10)
    journal.Journal(d, store, rid, clock=lambda: 0.0).flush()
    assert _record(store, rid)["seq"] == 1 and _record(store, rid)["run"]["step"] == 10


def test_status_says_whose_record_it_shows(tmp_path, sdcloud_home, capsys):
    from sdcloud.cli import main

    bucket = tmp_path / "bucket"
    store = LocalStore(bucket)
    d = StateStore(tmp_path / "d.db")
    rid = _a_run(d)
    spec = {"tier": "sd15-lora", "provider": "local", "store": bucket.as_uri()}
    d.update_run(rid, spec=json.dumps(spec), step=33, state="stopped", reason="stopped by sdcloud down")
    journal.Journal(d, store, rid, clock=lambda: 0.0).flush()
    assert main(["status", rid, "--store", bucket.as_uri()]) in (0, None)
    out = capsys.readouterr().out
    assert "shown as the run's bucket records it" in out and "written by sdcloud on" in out, out
    assert "step 33/" in out
    assert main(["status", rid]) in (0, None)
    assert "shown as the run's bucket records it" not in capsys.readouterr().out, "said once, when read"


def _env(home) -> dict:
    return {**os.environ, "SDCLOUD_HOME": str(home), "HF_HUB_OFFLINE": "1"}


def sdcloud(home, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sdcloud.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(home))


@pytest.mark.slow
def test_a_stale_status_never_puts_an_older_record_back(tmp_path, sdcloud_home):
    """Homes C, D and E share one bucket: C starts and detaches, D takes over and stops the run, C runs
    a plain `status`, E reads the run from the bucket. The record keeps D's step and state, and C's
    `resume` says and continues from that step."""
    from sdcloud_agent import manifest

    bucket = tmp_path / "shared-bucket"
    bucket.mkdir()
    url = bucket.as_uri()
    store = LocalStore(bucket)
    c, d, e = sdcloud_home, tmp_path / "home-d", tmp_path / "home-e"
    up = sdcloud(c, "up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "400",
                 "--checkpoint-every", "4", "--trainer-arg", "min-step-seconds=0.25", "--store", url, "--detach",
                 "--yes", "--json")
    assert up.returncode == 0, up.stderr
    rid = json.loads(up.stdout)["run"]

    def durable() -> int:
        newest = manifest.newest_complete(store, f"runs/{rid}")
        return newest.step if newest else 0

    try:
        wait_until(lambda: durable() >= 4, timeout=300, every=0.5)
        assert sdcloud(d, "status", rid, "--store", url).returncode == 0
        watching = subprocess.Popen([sys.executable, "-m", "sdcloud.cli", "watch", rid, "--drive"], env=_env(d),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: json.loads(store.get(f"runs/{rid}/leases/driver.json")).get("pid") == watching.pid,
                       timeout=120, every=0.3)
            taken = durable()
            wait_until(lambda: durable() >= taken + 4, timeout=120, every=0.5)
            watching.send_signal(signal.SIGINT)
            watching.communicate(timeout=60)
        finally:
            if watching.poll() is None:
                watching.kill()
        down = sdcloud(d, "down", rid, timeout=240)
        assert down.returncode == 0, down.stderr
        after_down = _record(store, rid)
        assert after_down["run"]["state"] == "stopped", after_down["run"]
        step = after_down["run"]["step"]
        assert step >= taken + 4

        seen = sdcloud(c, "status", rid)
        assert seen.returncode == 0, seen.stderr
        record = _record(store, rid)
        assert record["run"]["state"] == "stopped" and record["run"]["step"] == step, record["run"]
        assert record["seq"] == after_down["seq"], "a plain status wrote nothing"
        assert f"step {step}/" in seen.stdout and "stopped by you (sdcloud down)" in seen.stdout, seen.stdout
        other = sdcloud(e, "status", rid, "--store", url, "--json")
        assert json.loads(other.stdout)["step"] == step and json.loads(other.stdout)["state"] == "stopped"

        resumed = sdcloud(c, "resume", rid, "--detach")
        assert resumed.returncode == 0, resumed.stderr
        assert f"from step {durable()}" in resumed.stderr + resumed.stdout, resumed.stderr
        wait_until(lambda: any(ev["kind"] == "resumed" for o in store.list(f"runs/{rid}/journal/events/")
                               for ev in json.loads(store.get(o.key))), timeout=240, every=0.5)
        [ev] = [ev for o in store.list(f"runs/{rid}/journal/events/") for ev in json.loads(store.get(o.key))
                if ev["kind"] == "resumed"]
        assert ev["data"]["from_step"] == step, ev
    finally:
        sdcloud(c, "down", rid, timeout=120)
        sdcloud(d, "down", rid, timeout=120)
