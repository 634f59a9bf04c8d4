"""Training health (sdcloud_agent/health.py): recorded nvidia-smi outputs parsed and judged, and a
local run with a slow dataset reader judged io-bound, a normal one healthy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sdcloud_agent import health

from tests.support import DATA as TEST_DATA

DATA = TEST_DATA / "nvidia-smi-q"


def _rec(name: str) -> list[health.GpuSample]:
    return health.parse_smi((DATA / name).read_text())


def test_recorded_query_reports_parse_into_samples():
    (cap,) = _rec("ollama-6163-sw-power-cap.txt")
    assert cap.reasons == ["power cap"] and cap.temp_c == 77 and not cap.idle
    (clk,) = _rec("k8s-device-plugin-331-clocks-power.txt")
    assert (clk.sm_mhz, clk.sm_max_mhz, clk.power_w, clk.power_limit_w) == (1480, 1911, 60.06, 250)
    (calm,) = _rec("nvidia-docker-1090-not-active.txt")  # the older "Clocks Throttle Reasons" name
    assert calm.reasons == [] and (calm.mem_used_mib, calm.mem_total_mib) == (523, 4046)
    (idle,) = _rec("kubeflow-68-idle.txt")
    assert idle.idle and idle.reasons == []


@pytest.mark.parametrize("name, power, limit, util, reasons, sm_pct", [
    ("g5-a10g-550-power-cap.txt", 296.42, 300.0, 100, ["power cap"], 77.2),  # the average draw
    ("p5-h100-580-busy.txt", 612.35, 700.0, 98, [], 100.0),
    ("g4dn-t4-580-instant-only.txt", 69.54, 70.0, 100, ["power cap"], 78.3),  # no average: the instant draw
])
def test_r550_and_r580_reports_give_power_and_its_limit(name, power, limit, util, reasons, sm_pct):
    (g,) = _rec(name)
    assert (g.power_w, g.power_limit_w, g.util, g.reasons) == (power, limit, util, reasons)
    assert round(100 * g.sm_mhz / g.sm_max_mhz, 1) == sm_pct and g.mem_total_mib is not None
    v = health.judge([g] * 3, _steps(5, 1.0, 0.0), 0, 5)
    assert v.figures["power_w"] == round(power, 1) and v.figures["power_limit_w"] == limit
    assert v.verdict == ("throttled" if reasons else "healthy")


def test_recorded_tables_parse_every_gpu():
    p40 = _rec("caffe-364-p40-table.txt")
    assert [g.util for g in p40] == [99, 100, 82] and [g.temp_c for g in p40] == [62, 75, 69]
    host = health.combine(p40)
    assert host.util == pytest.approx(93.67, abs=0.01) and host.power_w == 72 and host.mem_used_mib == 4383


def _steps(n: int, step_s: float, wait_s: float | None):
    return [(step_s, wait_s)] * n


def test_a_starved_gpu_waiting_for_data_is_io_bound():
    idle_gpu = _rec("deepracer-58-idle-table.txt") * 6  # 0% busy
    v = health.judge(idle_gpu, _steps(20, 1.0, 0.6), save_s=0, wall_s=20)
    assert v.verdict == "io-bound"
    assert v.figures["gpu_util"] == 0 and v.figures["data_wait_pct"] == 60
    assert "GPU 0% busy while the trainer waits for data 60%" in v.why


def test_a_busy_gpu_with_some_data_wait_is_healthy():
    busy = [health.combine(_rec("caffe-364-p40-table.txt"))] * 6
    v = health.judge(busy, _steps(20, 1.0, 0.4), save_s=0, wall_s=20)
    assert v.verdict == "healthy" and v.figures["gpu_util"] == pytest.approx(93.7, abs=0.1)
    a100 = [health.combine(_rec("spark-8-a100-table.txt"))] * 6
    assert health.judge(a100, _steps(20, 0.5, 0.01), 0, 10).verdict == "healthy"


def test_a_power_cap_in_a_third_of_the_samples_is_throttled_and_idle_is_not():
    samples = _rec("ollama-6163-sw-power-cap.txt") * 2 + _rec("openclip-703-sw-power-cap.txt") \
        + _rec("nvidia-docker-1090-not-active.txt") * 6
    v = health.judge(samples, _steps(10, 1.0, 0.0), 0, 10)
    assert v.verdict == "throttled" and v.figures["throttle_reasons"] == ["power cap"]
    assert v.figures["throttle_pct"] == pytest.approx(33.3, abs=0.1) and v.figures["temp_c"] == 77
    # One sample in ten is below the threshold; an idle GPU's clock drop is no slowdown.
    few = _rec("ollama-6163-sw-power-cap.txt") + _rec("nvidia-docker-1090-not-active.txt") * 9
    assert health.judge(few, _steps(10, 1.0, 0.0), 0, 10).verdict == "healthy"
    assert health.judge(_rec("kubeflow-68-idle.txt") * 5, _steps(10, 1.0, 0.0), 0, 10).verdict == "healthy"


def test_the_sm_clock_against_its_max_is_a_figure_of_the_verdict():
    v = health.judge(_rec("k8s-device-plugin-331-clocks-power.txt"), [], 0, 0)
    assert v.figures["sm_clock_pct"] == pytest.approx(77.4, abs=0.1) and v.figures["power_w"] == 60.1


def test_saves_taking_a_fifth_of_the_wall_time_are_save_bound():
    v = health.judge([], _steps(50, 1.0, 0.0), save_s=20, wall_s=100)
    assert v.verdict == "save-bound" and v.figures["save_pct"] == 20
    assert health.judge([], _steps(50, 1.0, 0.0), save_s=5, wall_s=100).verdict == "healthy"


def test_monitor_reads_the_trainers_lines_and_the_gpu_with_a_controlled_clock():
    now = [100.0]
    text = (DATA / "spark-8-a100-table.txt").read_text()
    m = health.Monitor(use_gpu=True, run_smi=lambda: text, clock=lambda: now[0])
    for i in range(1, 11):
        now[0] += 1.0
        m.feed_line(f'SDCLOUD_STEP {{"step": {i}, "step_s": 1.0, "data_wait_s": 0.05}}', {"step": i})
        m.sample()
    m.feed_line('SDCLOUD_CHECKPOINT {"step": 10, "path": "/x", "save_s": 0.5}')
    s = m.summary()
    assert s["verdict"] == "healthy" and s["data_wait_pct"] == 5 and s["gpu_util"] == 86.5
    assert s["save_pct"] == 5.0 and s["saves"] == 1
    assert s["peak_mem_gb"] == pytest.approx(32.93, abs=0.01) and s["samples"] == 10
    # An external trainer's rate: step time known, data wait not.
    ext = health.Monitor(use_gpu=False, clock=lambda: now[0])
    ext.feed_line("steps:  5%| 5/100 [00:01<00:19, 4.0it/s]", {"step": 5, "it_per_s": 4.0})
    assert ext.summary()["step_s"] == 0.25 and ext.summary()["data_wait_pct"] is None


def test_the_attempts_seconds_in_saves_and_data_wait_outlive_a_restart_of_the_trainer():
    now = [0.0]
    m = health.Monitor(use_gpu=False, clock=lambda: now[0])
    assert m.summary()["save_seconds"] == 0 and m.summary()["data_wait_seconds"] is None  # not said yet
    for i in range(1, 5):
        now[0] += 1.0
        m.feed_line(f'SDCLOUD_STEP {{"step": {i}, "step_s": 1.0, "data_wait_s": 0.25}}')
    m.feed_line('SDCLOUD_CHECKPOINT {"step": 4, "path": "/x", "save_s": 0.75}')
    m.reset()  # a health action restarted the trainer: judged afresh, the attempt's totals kept
    m.feed_line('SDCLOUD_STEP {"step": 5, "step_s": 1.0, "data_wait_s": 0.5}')
    m.feed_line('SDCLOUD_CHECKPOINT {"step": 5, "path": "/x", "save_s": 1.5}')
    s = m.summary()
    assert s["saves"] == 1 and s["steps"] == 1  # the window: the new start only
    assert s["save_seconds"] == 2.25 and s["data_wait_seconds"] == 1.5


def test_no_nvidia_smi_means_no_gpu_samples():
    m = health.Monitor(use_gpu=False)
    m.sample()
    assert m.summary()["gpu_samples"] == 0 and m.summary()["verdict"] == "unknown"
    for i in range(health.MIN_STEPS):
        m.feed_line(f'SDCLOUD_STEP {{"step": {i + 1}, "step_s": 1.0, "data_wait_s": 0.0}}')
    assert m.summary()["verdict"] == "healthy" and m.summary()["gpu_util"] is None


def test_no_verdict_without_evidence_and_none_after_the_trainer_exited():
    now = [0.0]
    text = (DATA / "spark-8-a100-table.txt").read_text()
    m = health.Monitor(use_gpu=True, run_smi=lambda: text, clock=lambda: now[0])
    s = m.summary()  # just booted: nothing sampled, every figure null
    assert s["verdict"] == "unknown" and "0 of 5 steps, 0 of 3 GPU samples" in s["why"]
    assert s["gpu_util"] is None and s["data_wait_pct"] is None and s["power_w"] is None
    for i in range(1, 6):  # enough steps, but a GPU host needs its GPU samples too
        now[0] += 1.0
        m.feed_line(f'SDCLOUD_STEP {{"step": {i}, "step_s": 1.0, "data_wait_s": 0.0}}')
    m.sample()
    assert m.summary()["verdict"] == "unknown"
    m.sample(), m.sample()
    assert m.summary()["verdict"] == "healthy"
    m.set_exit(3)
    s = m.summary()
    assert s["verdict"] is None and s["trainer_exit"] == 3 and "exited with code 3" in s["why"]
    assert s["last_verdict"] == "healthy"
    m.set_pid(1234)  # restarted (an out-of-memory rung): judged again
    assert m.summary()["verdict"] == "healthy" and m.summary()["trainer_exit"] is None


# -- local runs: the builtin trainer, once with a slow dataset reader ----------------------------

def _run(tmp: Path, env: dict) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = {"run_id": "h", "attempt": 1, "trainer": "builtin", "model": "tiny",
           "trainer_args": {}, "steps": 6, "checkpoint_every": 3, "keep_checkpoints": 2,
           "store": {"url": f"file://{tmp}/bucket"}, "metadata": {"kind": "none"},
           "workdir": str(tmp / "work"), "nvme": False, "require_gpu": False,
           "heartbeat_seconds": 0.5, "poll_seconds": 0.2}
    (tmp / "agent.json").write_text(json.dumps(cfg))
    env = {**os.environ, "SDCLOUD_HEALTH_SECONDS": "0.2", **env}
    env["PATH"] = "/usr/bin:/bin"  # no nvidia-smi: the sampler uses the trainer's own figures
    proc = subprocess.run([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(tmp / "agent.json")],
                          env=env, capture_output=True, timeout=600)
    status = json.loads((tmp / "bucket/runs/h/status.json").read_text())
    assert proc.returncode == 0, (tmp / "work/attempt-1.log").read_text()[-3000:]
    assert status["health"]["verdict"] is None and status["health"]["trainer_exit"] == 0
    return {**status["health"], "verdict": status["health"]["last_verdict"]}


@pytest.mark.slow
def test_local_run_with_a_slow_dataset_reader_is_io_bound_and_a_normal_one_healthy(tmp_path):
    slow = _run(tmp_path / "slow", {"SDCLOUD_TRAINER_READ_DELAY": "4"})
    assert slow["verdict"] == "io-bound", json.dumps(slow)
    assert slow["data_wait_pct"] >= 50 and slow["gpu_util"] is None
    normal = _run(tmp_path / "normal", {})
    assert normal["verdict"] == "healthy", json.dumps(normal)
    assert normal["data_wait_pct"] < 30 and normal["steps"] > 0
