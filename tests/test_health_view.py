"""The host's health and its out-of-memory retries as `sdcloud status` and `watch` show them
(sdcloud/runs/health_view.py): recorded by the controller from status.json, read by the summary."""

from __future__ import annotations

import json

from sdcloud.runs import health_view
from sdcloud.runs.owner import Memo

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
    from sdcloud.runs.spec import RunSpec
    from sdcloud.runs.state import StateStore

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
    from sdcloud.runs.progress_view import plain

    assert plain("oom-retry", {"attempt": 2, "n": 1, "rung": "gradient-checkpointing", "resume_step": 40,
                               "change": "gradient checkpointing on", "peak_gb": 14.9}) == (
        "attempt 2: out of GPU memory; restarted on the same host from step 40 with rung 1 "
        "gradient-checkpointing (gradient checkpointing on, peak 14.9 GB)")
    assert plain("health", {"attempt": 2, **IO_BOUND}).startswith("attempt 2: health: io-bound: GPU 23%, data wait 64%")
    assert "moving to more VRAM: g5.xlarge (22 GiB)" in plain(
        "out-of-memory", {"attempt": 1, "offer": "aws/us-east-1/a/g4dn.xlarge", "next": ["g5.xlarge (22 GiB)"]})


def test_status_json_says_unknown_with_nulls_before_sampling_and_no_verdict_after_an_exit(sdcloud_home, capsys):
    from sdcloud.cli import main
    from sdcloud.runs.spec import RunSpec
    from sdcloud.runs.state import StateStore
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
