"""Training health that acts, end to end on the local provider: `sdcloud up` with the builtin
trainer's test hooks (a dataset on a slow "network disk", slow saves, a CUDA out-of-memory after a
checkpoint); each verdict leads to its action, the run finishes with the weights of a run that had
none of the trouble, and `sdcloud cost report` gives the minutes lost per cause."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def sdcloud(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sdcloud.cli", *args], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


def _photos(folder: Path, n: int = 4) -> Path:
    from PIL import Image

    folder.mkdir(parents=True)
    for i in range(n):
        Image.new("RGB", (32, 32), (60 * i, 90, 30)).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"a photo of sks {i}")
    return folder


def _weights(run: str, dest: Path) -> dict:
    from safetensors.torch import load_file

    got = sdcloud("pull", run, str(dest))
    assert got.returncode == 0, got.stderr[-2000:]
    (f,) = list(dest.rglob("pytorch_lora_weights.safetensors"))
    return load_file(str(f))


def test_verdicts_act_the_run_finishes_and_the_cost_report_counts_the_minutes_lost(sdcloud_home, tmp_path):
    slow = tmp_path / "netdisk"
    data = _photos(slow / "photos")
    hooks = {"SDCLOUD_TRAINER_READ_DELAY": "0.3", "SDCLOUD_TRAINER_SLOW_DIR": str(slow),
             "SDCLOUD_TRAINER_SAVE_PAUSE": "0.6", "SDCLOUD_TRAINER_OOM_AT": "15:gradient_checkpointing",
             "SDCLOUD_HEALTH_SECONDS": "0.1", "SDCLOUD_HEALTH_ACT_AFTER": "1"}
    up = sdcloud("up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "20",
                 "--checkpoint-every", "2", "--dataset", str(data), "--yes", "--json", env=hooks)
    assert up.returncode == 0, up.stderr[-3000:]
    run = json.loads(up.stdout)["run"]
    logs = sdcloud("logs", run, "-v").stdout
    # io-bound: the dataset moved to the working disk; save-bound: saves half as often; OOM: the ladder.
    assert "io-bound" in logs and "dataset copied from" in logs, logs[-3000:]
    assert "save interval 2 -> 4 steps" in logs
    assert "oom-retry attempt=1 n=1 rung=gradient-checkpointing" in logs
    assert "health-recheck attempt=1 n=1 cause=io-bound still=False" in logs
    status = json.loads(sdcloud("status", run, "--json").stdout)
    assert status["state"] == "succeeded" and status["step"] == 20
    # The cost report: the minutes each cause lost.
    rep = json.loads(sdcloud("cost", "report", run, "--format", "json").stdout)
    lost = rep["runs"][0]["losses"]["minutes"]
    # Saves as the host timed them: each of at least four saves (steps 2, 4, then every 4th) paused 0.6 s.
    assert lost["data_wait"] > 0 and lost["saves"] >= round(4 * 0.6 / 60, 2) and lost["oom_restarts"] > 0, lost
    assert set(lost) == {"data_wait", "throttling", "saves", "oom_restarts", "reclaims", "boots", "sampling"}
    table = sdcloud("cost", "report", run).stdout
    assert "minutes lost: data wait" in " ".join(table.split())
    # The weights are those of a run without the trouble (gradient checkpointing, the rung taken,
    # does not change the arithmetic; the interval and the disk do not either).
    ref = sdcloud("up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "20",
                  "--checkpoint-every", "20", "--dataset", str(_photos(tmp_path / "local" / "photos")), "--yes", "--json")
    assert ref.returncode == 0, ref.stderr[-3000:]
    got, want = _weights(run, tmp_path / "got"), _weights(json.loads(ref.stdout)["run"], tmp_path / "want")
    assert got.keys() == want.keys() and all(got[k].allclose(want[k], atol=1e-6) for k in got)
