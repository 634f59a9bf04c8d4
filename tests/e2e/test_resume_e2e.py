"""Stopped runs continue: Ctrl-C, `sdcloud down` and a spent budget each leave a run that
`sdcloud resume NAME` (or `sdcloud up --name NAME`) carries on under the same run id, from the
durable checkpoint, to `succeeded`. And a controller killed with SIGKILL is noticed by status/watch.
The local provider: real agent processes, the builtin trainer on the tiny model."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.support.server_seaweed import agent_processes as running_agents, wait_until

pytestmark = pytest.mark.slow
STEP = re.compile(r'SDCLOUD_STEP (\{.*\})')


def sdcloud(*args: str, timeout: float = 600, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sdcloud.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=cwd)


# Ctrl-C as a terminal delivers it: a suite started in the background of a non-interactive shell
# (`bash .ci/run &`) inherits SIGINT ignored, and Python then leaves it ignored in every child.
_WITH_CTRL_C = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "sys.argv[0] = 'sdcloud'; runpy.run_module('sdcloud.cli', run_name='__main__')")


def start(*args: str, cwd=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _WITH_CTRL_C, *args], env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)




def durable_step(home, run_id: str) -> int:
    from sdcloud_agent import manifest
    from sdcloud_agent.store import open_store

    newest = manifest.newest_complete(open_store((home / "bucket").as_uri()), f"runs/{run_id}")
    return newest.step if newest else 0


def first_trained_step(home, run_id: str, attempt: int) -> int:
    log = (home / "bucket" / "runs" / run_id / "logs" / f"attempt-{attempt}.log").read_text(errors="replace")
    return json.loads(STEP.search(log).group(1))["step"]


def step_of(name: str) -> int:
    from sdcloud.runs.records.state import StateStore

    run = StateStore().get_run(name)
    return run["step"] if run else 0


def check_resumed(home, name: str, stopped_at: int, proc: subprocess.CompletedProcess, run_id: str) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["run"] == run_id and out["state"] == "succeeded" and out["step"] == out["total_steps"]
    last = out["attempts"][-1]["n"]
    # The next attempt's trainer started right after the durable checkpoint: nothing redone, nothing skipped.
    assert first_trained_step(home, run_id, last) == stopped_at + 1
    assert not running_agents(f"SDCLOUD_HOME={home}")
    return out


def test_ctrl_c_then_resume_by_name(sdcloud_home):
    name = "cc"
    proc = start("up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "30", "--name", name)
    wait_until(lambda: step_of(name) >= 4)
    assert step_of(name) < 30, "the run finished before the test could interrupt it"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    st = json.loads(sdcloud("status", name, "--json").stdout)
    assert st["state"] == "stopped" and f"sdcloud resume {name}" in st["reason"]
    stopped_at = durable_step(sdcloud_home, st["run"])
    assert stopped_at >= 4
    out = check_resumed(sdcloud_home, name, stopped_at, sdcloud("resume", name, "--json"), st["run"])
    assert len(out["attempts"]) == 2


def test_down_then_up_with_the_same_name_continues(sdcloud_home):
    name = "dn"
    args = ["up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "30", "--name", name]
    run_id = json.loads(sdcloud(*args, "--detach", "--json").stdout)["run"]
    wait_until(lambda: step_of(name) >= 4)
    assert sdcloud("down", name).returncode == 0
    stopped_at = durable_step(sdcloud_home, run_id)
    check_resumed(sdcloud_home, name, stopped_at, sdcloud(*args, "--json"), run_id)


def test_budget_stop_then_resume_with_a_larger_budget_counts_both_attempts(sdcloud_home):
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    # The local host at $72/h: two cents every second, so that a small budget runs out mid-run.
    (sdcloud_home / "config.toml").write_text("[local]\nprice_per_hour = 72\n")
    name = "bu"
    first = sdcloud("up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "40", "--name", name,
                    "--budget", "0.3", "--json")
    assert first.returncode == 1, first.stderr[-2000:]
    out = json.loads(first.stdout)
    assert out["state"] == "stopped" and "budget" in out["reason"] and "sdcloud resume bu" in out["reason"]
    spent_first = out["cost"]["total"]
    # It stopped near the budget: the host bills on while it saves and is terminated (seconds; more on
    # a loaded machine), so allow a minute of the local host's price past it.
    assert 0.15 < spent_first < 0.3 + 72 / 60
    again = sdcloud("resume", name, "--json")
    assert again.returncode == 2 and "budget" in again.stderr  # spent: it needs a larger one
    stopped_at = durable_step(sdcloud_home, out["run"])
    done = check_resumed(sdcloud_home, name, stopped_at, sdcloud("resume", name, "--budget", "5", "--json"), out["run"])
    # The budget counts both attempts: the total is their sum, and more than the first alone.
    assert abs(done["cost"]["total"] - sum(a["cost"] for a in done["attempts"])) < 1e-3  # both rounded to 4 places
    assert done["cost"]["total"] > spent_first and len(done["attempts"]) == 2


def test_a_killed_controller_is_noticed_by_status_and_watch(sdcloud_home):
    from sdcloud.runs.records.state import StateStore

    name = "k9"
    run_id = json.loads(sdcloud("up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "300",
                                "--name", name, "--detach", "--json").stdout)["run"]
    wait_until(lambda: step_of(name) >= 2)
    os.kill(StateStore().get_run(run_id)["controller_pid"], signal.SIGKILL)
    time.sleep(0.5)
    st = sdcloud("status", name)
    assert "no controller" in st.stdout and f"sdcloud resume {name}" in st.stdout and f"sdcloud down {name}" in st.stdout
    began = time.time()
    watch = sdcloud("watch", name, "--interval", "0.5", timeout=60)
    assert watch.returncode == 4 and "no controller" in watch.stderr
    assert time.time() - began < 15
    assert sdcloud("down", name).returncode == 0  # the orphaned host is stopped
    assert not running_agents(f"SDCLOUD_HOME={sdcloud_home}")


def test_relative_dataset_from_another_directory_and_piped_progress(sdcloud_home, tmp_path):
    from PIL import Image

    work = tmp_path / "project"
    (work / "photos").mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (64, 64), (60 * i, 90, 200)).save(work / "photos" / f"p{i}.png")
    proc = sdcloud("up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "6",
                   "--dataset", "./photos", "--json", cwd=work)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    from sdcloud.runs.records.state import StateStore

    assert StateStore().get_run(out["run"])["spec"]["dataset"] == str((work / "photos").resolve())
    quiet = sdcloud("up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "6", cwd=work)
    assert quiet.returncode == 0
    assert re.search(r"step \d+/6", quiet.stderr), "a piped run printed no progress line"
