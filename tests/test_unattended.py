"""The cloud driver (sdcloud.runs.unattended) carries a run whose laptop went away.

The laptop's controller is SIGKILLed mid-run and its host is lost with it (a reclaim while nobody
drives). The function's handler is then called in this process exactly as the platforms call it
(SCF's timer event and dict context; Lambda's scheduler input and context object), from a fresh
$SDCLOUD_HOME that knows nothing but the bucket: it rebuilds the run from its journal, takes the
driver lease, relaunches, and finishes the run. A third machine then sees the whole history.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from servers import agent_processes, wait_until
from sdcloud_agent.store import LocalStore

SCF_TIMER = {"Type": "Timer", "TriggerName": "sdcloud-driver", "Time": "2026-12-02T01:30:00Z", "Message": ""}
SCHEDULER_INPUT = {"sdcloud": "drive"}


class LambdaContext:
    """The two members of Lambda's context object the handler reads."""

    def __init__(self, seconds: float):
        self._end = time.monotonic() + seconds
        self.function_name = "sdcloud-driver"

    def get_remaining_time_in_millis(self) -> int:
        return int(max(0.0, self._end - time.monotonic()) * 1000)


def test_handlers_recognise_each_platforms_event():
    from sdcloud.runs import unattended

    assert unattended._driver_name(SCF_TIMER) == "tencent-scf"
    assert unattended._driver_name(SCHEDULER_INPUT) == "aws-lambda"
    left = unattended._time_left({"time_limit_in_ms": 5000}, time.monotonic())
    assert 4.0 < left() <= 5.0
    assert 9.0 < unattended._time_left(LambdaContext(10), 0.0)() <= 10.0


def test_nothing_live_means_nothing_done(tmp_path, monkeypatch):
    from sdcloud.runs import unattended

    monkeypatch.setenv("SDCLOUD_STORE", (tmp_path / "bucket").as_uri())
    (tmp_path / "bucket").mkdir()
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "fn"))
    assert unattended.handler(SCHEDULER_INPUT, LambdaContext(60)) == {"driver": "aws-lambda", "runs": {}}


@pytest.mark.slow
def test_a_run_whose_laptop_went_away_is_finished_by_the_cloud_driver(tmp_path, monkeypatch, sdcloud_home):
    from sdcloud.runs import unattended

    bucket = tmp_path / "bucket"
    bucket.mkdir()
    url = bucket.as_uri()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SDCLOUD_HOME": str(sdcloud_home)}
    up = subprocess.run([sys.executable, "-m", "sdcloud.cli", "up", "--provider", "local", "--tier", "sd15-lora",
                         "--model", "tiny", "--steps", "16", "--checkpoint-every", "4", "--store", url, "--detach",
                         "--yes", "--json"], capture_output=True, text=True, timeout=300, env=env)
    assert up.returncode == 0, up.stderr
    rid = json.loads(up.stdout)["run"]
    store = LocalStore(bucket)

    def step() -> int:
        try:
            return int(json.loads(store.get(f"runs/{rid}/status.json")).get("step") or 0)
        except Exception:  # noqa: BLE001 - not written yet
            return 0

    wait_until(lambda: step() >= 5, timeout=600, every=0.5)
    from sdcloud.runs.state import StateStore

    laptop = StateStore(sdcloud_home / "state.db")
    os.kill(laptop.get_run(rid)["controller_pid"], signal.SIGKILL)
    for pid in agent_processes(f"SDCLOUD_HOME={sdcloud_home}"):  # the host goes with it: a reclaim
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_until(lambda: not agent_processes(f"SDCLOUD_HOME={sdcloud_home}"), timeout=30)

    # The function, from a home that never saw the run.
    monkeypatch.setenv("SDCLOUD_STORE", url)
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "function-tmp"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("SDCLOUD_DRIVER", raising=False)
    # While the SCF function holds the run, another cloud's driver (or a laptop) leaves it alone.
    first = unattended.handler(SCF_TIMER, {"time_limit_in_ms": 45_000})
    assert first["runs"][rid]["steps"] >= 1
    other = unattended.handler(SCHEDULER_INPUT, LambdaContext(60))
    assert other["runs"][rid] == {"skipped": "driven by tencent-scf"}
    reports = [first, other]
    for _ in range(12):  # the timer's next invocations take their own lease over and carry on
        reports.append(unattended.handler(SCF_TIMER, {"time_limit_in_ms": 120_000}))
        if not store.list("drivers/active/"):
            break
    assert not store.list("drivers/active/"), f"the run is still live after {len(reports)} invocations: {reports}"

    # A third machine sees the whole history.
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "third"))
    seen = subprocess.run([sys.executable, "-m", "sdcloud.cli", "status", rid, "--store", url, "--json"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SDCLOUD_HOME": str(tmp_path / "third")})
    assert seen.returncode == 0, seen.stderr
    st = json.loads(seen.stdout)
    assert st["state"] == "succeeded" and st["step"] == 16
    assert len(st["attempts"]) >= 2 and st["attempts"][-1]["end_reason"] == "succeeded"
    assert st["attempts"][0]["end_reason"] != "succeeded"
    logs = subprocess.run([sys.executable, "-m", "sdcloud.cli", "logs", rid, "--json"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "SDCLOUD_HOME": str(tmp_path / "third")})
    kinds = [json.loads(ln)["kind"] for ln in logs.stdout.splitlines() if ln.strip()]
    assert "driver-took-over" in kinds
