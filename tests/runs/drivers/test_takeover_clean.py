"""Taking a run over from another machine is one clean hand-over (docs/runs.md).

Two sdcloud homes that share nothing but the run's bucket: the first drives a run on the local
provider with a background controller; the second takes it with `watch RUN --drive`, drives it a
while, then Ctrl-C hands it to a background controller of its own. The first machine's host is
adopted through the bucket (its heartbeat, its lease, its checkpoints): it is never declared gone,
no second host is launched beside it, and the run finishes `succeeded` at its last step with no
reclaim in its cost report. And `down` from the second machine ends the host that trains: the
first machine's, which only the bucket reaches from there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.support.server_seaweed import wait_until


def _env(home) -> dict:
    return {**os.environ, "SDCLOUD_HOME": str(home), "HF_HUB_OFFLINE": "1"}


def sdcloud(home, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sdcloud.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(home))


def _hosts(marker: str) -> list[int]:
    """Pids of host agents (`sdcloud_agent run`, not their trainers) whose environment holds `marker`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if b"sdcloud_agent" in cmd and b"run" in cmd and marker.encode() in environ:
            pids.append(int(entry))
    return pids


def _journal(store, rid: str) -> tuple[dict, list[dict]]:
    run = json.loads(store.get(f"runs/{rid}/journal/run.json"))
    events = [e for o in sorted(store.list(f"runs/{rid}/journal/events/"), key=lambda o: o.key)
              for e in json.loads(store.get(o.key))]
    return run, events


@pytest.mark.slow
def test_watch_drive_from_a_second_machine_adopts_the_host_and_the_run_succeeds(tmp_path, sdcloud_home):
    from sdcloud_agent import manifest
    from sdcloud_agent.store import open_store

    bucket = tmp_path / "shared-bucket"
    bucket.mkdir()
    url = bucket.as_uri()
    store = open_store({"url": url})
    first, second = sdcloud_home, tmp_path / "second-machine"
    steps = 60
    up = sdcloud(first, "up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", str(steps),
                 "--checkpoint-every", "4", "--trainer-arg", "min-step-seconds=0.25", "--store", url, "--detach",
                 "--yes", "--json")
    assert up.returncode == 0, up.stderr
    rid = json.loads(up.stdout)["run"]

    most, stop_sampling = [0], threading.Event()

    def sample() -> None:  # how many hosts of this test are up at once, all along
        while not stop_sampling.is_set():
            most[0] = max(most[0], len(_hosts(str(tmp_path))))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    def durable() -> int:
        newest = manifest.newest_complete(store, f"runs/{rid}")
        return newest.step if newest else 0

    try:
        wait_until(lambda: durable() >= 4, timeout=300, every=0.5)
        seen = sdcloud(second, "status", rid, "--store", url, "--json")
        assert seen.returncode == 0, seen.stderr
        watching = subprocess.Popen([sys.executable, "-m", "sdcloud.cli", "watch", rid, "--drive"], env=_env(second),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: json.loads(store.get(f"runs/{rid}/leases/driver.json")).get("pid") == watching.pid,
                       timeout=120, every=0.3)
            taken = durable()
            wait_until(lambda: durable() >= taken + 8, timeout=120, every=0.5)  # it drives for a while
            assert watching.poll() is None, watching.communicate()
            watching.send_signal(signal.SIGINT)
            out, err = watching.communicate(timeout=60)
        finally:
            if watching.poll() is None:
                watching.kill()
        assert watching.returncode == 130, (out, err)  # EXIT_INTERRUPTED: handed back, not stopped
        assert "took the run over" in err, err
        assert "the host is gone" not in err and "reclaim" not in err, err

        wait_until(lambda: _journal(store, rid)[0]["run"]["state"] not in ("running", "launching", "recovering",
                                                                            "pending"), timeout=300, every=0.5)
        run, events = _journal(store, rid)
    finally:
        stop_sampling.set()
        sampler.join(timeout=5)
        sdcloud(second, "down", rid, timeout=120)
        sdcloud(first, "down", rid, timeout=120)
    kinds = [e["kind"] for e in events]
    assert run["run"]["state"] == "succeeded", (run["run"], kinds)
    assert run["run"]["step"] == steps
    assert most[0] == 1, f"{most[0]} hosts were up at once"
    assert "reclaimed" not in kinds and "host-lost" not in kinds and "boot-failed" not in kinds, kinds
    assert len(run["attempts"]) == 1 and run["attempts"][0]["end_reason"] == "succeeded", run["attempts"]

    # Both machines see the same end; the cost report counts no reclaim.
    assert sdcloud(second, "status", rid, "--json").returncode == 0
    report = sdcloud(second, "cost", "report", rid, "--format", "json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["totals"]["reclaims"] == 0, report.stdout


@pytest.mark.slow
def test_down_from_the_second_machine_ends_the_host_the_first_one_launched(tmp_path, sdcloud_home):
    from sdcloud_agent import manifest
    from sdcloud_agent.store import open_store

    bucket = tmp_path / "shared-bucket"
    bucket.mkdir()
    url = bucket.as_uri()
    store = open_store({"url": url})
    first, second = sdcloud_home, tmp_path / "second-machine"
    up = sdcloud(first, "up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "400",
                 "--checkpoint-every", "4", "--trainer-arg", "min-step-seconds=0.25", "--store", url, "--detach",
                 "--yes", "--json")
    assert up.returncode == 0, up.stderr
    rid = json.loads(up.stdout)["run"]

    def durable() -> int:
        newest = manifest.newest_complete(store, f"runs/{rid}")
        return newest.step if newest else 0

    try:
        wait_until(lambda: durable() >= 4, timeout=300, every=0.5)
        [host] = wait_until(lambda: _hosts(str(first)), timeout=30)
        assert sdcloud(second, "status", rid, "--store", url).returncode == 0
        watching = subprocess.Popen([sys.executable, "-m", "sdcloud.cli", "watch", rid, "--drive"], env=_env(second),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: json.loads(store.get(f"runs/{rid}/leases/driver.json")).get("pid") == watching.pid,
                       timeout=60, every=0.3)
            time.sleep(3)
            watching.send_signal(signal.SIGINT)
            watching.communicate(timeout=60)
        finally:
            if watching.poll() is None:
                watching.kill()
        down = sdcloud(second, "down", rid, timeout=240)
        assert down.returncode == 0, down.stderr
        assert "stopped" in down.stdout, down.stdout
        wait_until(lambda: host not in _hosts(str(first)), timeout=30)
        run, events = _journal(store, rid)
    finally:
        sdcloud(second, "down", rid, timeout=120)
        sdcloud(first, "down", rid, timeout=120)
    kinds = [e["kind"] for e in events]
    assert run["run"]["state"] == "stopped", run["run"]
    assert "reclaimed" not in kinds and "host-lost" not in kinds, kinds
    [attempt] = run["attempts"]
    assert attempt["end_reason"] == "stopped"
    assert run["run"]["step"] == durable(), "the run's step is its host's last durable checkpoint"
    status = json.loads(store.get(f"runs/{rid}/status.json"))
    assert status["phase"] == "preempted" and status["ended_by"] == "driver", status
    assert attempt["end"] <= status["time"] + 1.0, "closed at the host's own end"
