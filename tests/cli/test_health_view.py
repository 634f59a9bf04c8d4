"""The host's health and its out-of-memory retries as `sdcloud status` and `watch` show them
(sdcloud/runs/driving/health_view.py): recorded by the controller from status.json, read by the summary."""

from __future__ import annotations

import json

import pytest

from sdcloud.runs.driving import health_view
from sdcloud.runs.driving.owner import Memo

from tests.support import DATA, SUPPORT

IO_BOUND = {"verdict": "io-bound", "why": "GPU 23% busy while the trainer waits for data 64% of each step",
            "gpu_util": 23.0, "data_wait_pct": 64.0, "throttle_pct": 0.0, "throttle_reasons": [], "samples": 9}


class _Ctrl:
    def __init__(self):
        self.events = []
        self.memo = Memo()

    def event(self, kind, data):
        self.events.append((kind, data))


def test_a_health_event_when_the_verdict_changes_and_once_a_minute_while_it_holds():
    c = _Ctrl()
    health_view.note(c, 1, {"health": IO_BOUND}, now=1000.0)
    health_view.note(c, 1, {"health": IO_BOUND}, now=1030.0)  # the same verdict, 30 s on: nothing
    health_view.note(c, 1, {"health": {**IO_BOUND, "verdict": "healthy"}}, now=1031.0)
    health_view.note(c, 1, {"health": {**IO_BOUND, "verdict": "healthy"}}, now=1092.0)
    health_view.note(c, 1, {}, now=1200.0)  # no health in status.json: nothing
    assert [d["verdict"] for _, d in c.events] == ["io-bound", "healthy", "healthy"]
    assert c.events[0][1]["data_wait_pct"] == 64.0 and c.events[0][1]["attempt"] == 1


def test_the_health_line_names_gpu_data_wait_throttling_and_oom_retries():
    line = health_view.line({**IO_BOUND, "oom_retries": 1})
    assert line == ("health: io-bound: GPU 23%, data wait 64%, no throttling, 1 OOM retry "
                    "(GPU 23% busy while the trainer waits for data 64% of each step)")
    thr = health_view.line({"verdict": "throttled", "why": "power cap active in 33% of the GPU samples",
                            "gpu_util": 97.0, "data_wait_pct": None, "throttle_pct": 33.3,
                            "throttle_reasons": ["power cap"], "oom_retries": 0})
    assert "throttled by power cap 33% of the time" in thr and "data wait unknown" in thr and "0 OOM retries" in thr


def test_status_shows_the_health_line_and_status_json_carries_it(sdcloud_home, capsys):
    from sdcloud.cli import main
    from sdcloud.runs.inputs.spec import RunSpec
    from sdcloud.runs.records.state import StateStore

    st = StateStore()
    st.create_run("r-0000heal", "sd15-lora", RunSpec(tier="sd15-lora", provider="local").as_dict(), 100)
    st.update_run("r-0000heal", state="running", step=40)
    st.event("r-0000heal", "oom-retry", {"attempt": 1, "n": 1, "rung": "gradient-checkpointing",
                                         "change": "gradient checkpointing on", "peak_gb": 14.9, "resume_step": 40})
    st.event("r-0000heal", "health", {"attempt": 1, **IO_BOUND})
    assert main(["status", "r-0000heal"]) == 0
    out = capsys.readouterr().out
    assert "health: io-bound: GPU 23%, data wait 64%, no throttling, 1 OOM retry" in out
    assert main(["status", "r-0000heal", "--json"]) == 0
    summ = json.loads(capsys.readouterr().out)
    assert summ["health"]["verdict"] == "io-bound" and summ["health"]["oom_retries"] == 1
    assert summ["health"]["data_wait_pct"] == 64.0


def test_watch_tells_each_rung_and_verdict_in_plain_words():
    from sdcloud.verbs.progress_view import plain

    assert plain("oom-retry", {"attempt": 2, "n": 1, "rung": "gradient-checkpointing", "resume_step": 40,
                               "change": "gradient checkpointing on", "peak_gb": 14.9}) == (
        "attempt 2: out of GPU memory; restarted on the same host from step 40 with rung 1 "
        "gradient-checkpointing (gradient checkpointing on, peak 14.9 GB)")
    assert plain("health", {"attempt": 2, **IO_BOUND}).startswith("attempt 2: health: io-bound: GPU 23%, data wait 64%")
    assert "moving to more VRAM: g5.xlarge (22 GiB)" in plain(
        "out-of-memory", {"attempt": 1, "offer": "aws/us-east-1/a/g4dn.xlarge", "next": ["g5.xlarge (22 GiB)"]})


def test_status_json_says_unknown_with_nulls_before_sampling_and_no_verdict_after_an_exit(sdcloud_home, capsys):
    from sdcloud.cli import main
    from sdcloud.runs.inputs.spec import RunSpec
    from sdcloud.runs.records.state import StateStore
    from sdcloud_agent import health

    st = StateStore()
    booted = health.Monitor(use_gpu=True, run_smi=lambda: "").summary()  # what a host 1 s after boot reports
    exited = health.Monitor(use_gpu=False)
    exited.set_exit(3)  # a trainer that exited at once
    for rid, summary in (("r-00000new", booted), ("r-000exit3", exited.summary())):
        st.create_run(rid, "sd15-lora", RunSpec(tier="sd15-lora", provider="local").as_dict(), 100)
        st.update_run(rid, state="running", step=0)
        c = _Ctrl()
        health_view.note(c, 1, {"health": summary}, now=1.0)
        for kind, data in c.events:
            st.event(rid, kind, data)
    assert main(["status", "r-00000new", "--json"]) == 0
    h = json.loads(capsys.readouterr().out)["health"]
    assert h["verdict"] == "unknown" and "not enough evidence" in h["why"]
    for k in ("gpu_util", "data_wait_pct", "power_w", "power_limit_w", "temp_c", "throttle_pct", "read_mb_s"):
        assert k in h and h[k] is None, k
    assert main(["status", "r-000exit3"]) == 0
    assert "health: no verdict: the trainer exited with code 3, 0 OOM retries" in capsys.readouterr().out
    assert main(["status", "r-000exit3", "--json"]) == 0
    h = json.loads(capsys.readouterr().out)["health"]
    assert h["verdict"] is None and h["trainer_exit"] == 3 and h["gpu_util"] is None and h["last_verdict"] == "unknown"
    # A trainer that finished its work is not shown as a run without a verdict.
    assert health_view.line({"verdict": None, "trainer_exit": 0, "oom_retries": 1}) == \
        "health: the trainer finished (exit 0), 1 OOM retry"


def test_each_health_action_and_its_recheck_is_one_event_in_plain_words():
    c = _Ctrl()
    act = {"n": 1, "cause": "io-bound", "changes": ["dataset copied from /mnt/efs/photos to the working disk /nvme"],
           "why_not": None, "before": {"data_wait_pct": 64.0, "gpu_util": 23.0, "read_mb_s": 3.1, "step_s": 1.6},
           "step": 40, "resume_step": 40}
    health_view.note(c, 1, {"health_actions": [act]}, now=1.0)
    health_view.note(c, 1, {"health_actions": [act]}, now=2.0)  # the same action again: no second event
    done = {**act, "after": {"data_wait_pct": 4.0, "gpu_util": 91.0, "read_mb_s": 40.2, "step_s": 0.6},
            "after_verdict": "healthy", "still": False}
    health_view.note(c, 1, {"health_actions": [done]}, now=3.0)
    assert [k for k, _ in c.events] == ["health-action", "health-recheck"]
    from sdcloud.verbs.progress_view import plain

    said = [plain(k, d) for k, d in c.events]
    assert said[0] == ("attempt 1: io-bound (data wait 64%, GPU 23%, 1.6 s a step): dataset copied from "
                       "/mnt/efs/photos to the working disk /nvme; the trainer restarts from its newest checkpoint")
    assert said[1].startswith("attempt 1: no longer io-bound: healthy (data wait 4%, GPU 91%")
    still = {**done, "still": True, "after_verdict": "io-bound", "n": 2}
    health_view.note(c, 2, {"health_actions": [still]}, now=4.0)
    assert plain(*c.events[-1]).endswith("the dataset reads at 40.2 MB/s")


def _throttled_status(tmp_path, smi: str) -> dict:
    """status.json of a real agent run whose GPU samples come from a recorded report."""
    import os
    import subprocess
    import sys

    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(3):
        (photos / f"{i}.png").write_bytes(b"png")
    cfg = {"run_id": "thr", "attempt": 1, "trainer": "kohya", "steps": 30, "checkpoint_every": 10,
           "trainer_args": {"launcher": [sys.executable, str(SUPPORT / "fake_kohya.py")], "script": "sdxl_train_network.py",
                            "network_module": "networks.lora", "resolution": "64,64"},
           "store": {"url": f"file://{tmp_path}/bucket"}, "metadata": {"kind": "none"}, "dataset": str(photos),
           "workdir": str(tmp_path / "work"), "nvme": False, "require_gpu": False,
           "heartbeat_seconds": 0.2, "poll_seconds": 0.2}
    (tmp_path / "agent.json").write_text(json.dumps(cfg))
    env = {**os.environ, "FAKE_STEP_SECONDS": "0.1", "SDCLOUD_HEALTH_SECONDS": "0.05",
           "SDCLOUD_HEALTH_SMI_FILE": str(DATA / "nvidia-smi-q" / smi)}
    proc = subprocess.run([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(tmp_path / "agent.json")],
                          env=env, capture_output=True, timeout=300)
    assert proc.returncode == 0, (tmp_path / "work/attempt-1.log").read_text()[-2000:]
    return json.loads((tmp_path / "bucket/runs/thr/status.json").read_text())


def test_a_throttled_cloud_host_is_moved_and_a_local_one_says_why_not(tmp_path):
    from types import SimpleNamespace

    from sdcloud.runs.driving import oom_move

    # A recorded power-capped A10G report (R550 layout) as the GPU source of a real agent run.
    status = _throttled_status(tmp_path, "g5-a10g-550-power-cap.txt")
    h = status["health"]
    assert h["last_verdict"] == "throttled" and h["throttle_reasons"] == ["power cap"]
    assert h["power_w"] == 296.4 and h["power_limit_w"] == 300.0 and h["sm_clock_pct"] == pytest.approx(77.2, abs=0.1)
    # The controller reads it mid-run (the verdict, not the exit): weigh a move, once per attempt.
    running = {**status, "step": 200, "health": {**h, "verdict": "throttled"}}

    class Ctrl(_Ctrl):
        def __init__(self):
            super().__init__()
            self.fleet = SimpleNamespace(cooled=[], cool_down=lambda k, r: self.fleet.cooled.append((k, r)))
            self.ended, self.run_id = [], "r"
            self.state = SimpleNamespace(update_run=lambda rid, **f: self.events.append(("update_run", f)))

        def set_state(self, state):
            self.state.update_run(self.run_id, state=state)

        def end_attempt(self, cur, reason):
            self.ended.append(reason)

    cur = SimpleNamespace(n=1, provider="aws", region="us-east-1", zone="us-east-1a", instance_type="g5.xlarge",
                          price=0.40)
    c = Ctrl()
    assert oom_move.weigh_throttle(c, cur, running, total_steps=50_000, every=100)
    assert c.ended == ["throttled"] and c.fleet.cooled == [("aws/us-east-1/us-east-1a/g5.xlarge", "throttled")]
    (ev,) = [d for k, d in c.events if k == "throttle-move"]
    assert ev["moved"] and ev["move_min"] < ev["stay_min"] and ev["move_cost"] < ev["stay_cost"]
    assert not oom_move.weigh_throttle(c, cur, running, total_steps=50_000, every=100)  # once per attempt
    # Near the end the restart costs more than the throttling: it stays and says so.
    c2 = Ctrl()
    assert not oom_move.weigh_throttle(c2, cur, {**running, "step": 49_990}, total_steps=50_000, every=100)
    (ev2,) = [d for k, d in c2.events if k == "throttle-move"]
    assert not ev2["moved"] and ev2["why"].startswith("staying:") and not c2.ended
    # On this machine there is nowhere to move.
    c3 = Ctrl()
    local = SimpleNamespace(**{**vars(cur), "provider": "local"})
    assert not oom_move.weigh_throttle(c3, local, running, total_steps=50_000, every=100)
    assert "no other host" in [d for k, d in c3.events if k == "throttle-move"][0]["why"]
