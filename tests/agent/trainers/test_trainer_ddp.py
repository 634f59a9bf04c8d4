"""The builtin trainer as two data-parallel processes (gloo on CPU, started by torchrun as
`accelerate launch` starts them on GPUs): it trains, stops on SIGTERM with one checkpoint, and
the resumed run ends bitwise equal to an uninterrupted two-process run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.agent.trainers.test_trainer_builtin import assert_same_weights

pytestmark = pytest.mark.slow  # two processes per run on a busy 2-core machine: about a minute

STEPS = 12


def launch(tmp: Path, out: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    for var in ("SDCLOUD_RESUME_FROM", "SDCLOUD_CHECKPOINT_DIR", "SDCLOUD_OUTPUT_DIR"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "sdcloud_agent.trainers.builtin", "--model", "tiny", "--steps", str(STEPS), "--synthetic", "6",
           "--batch-size", "1", "--seed", "5", "--device", "cpu", "--checkpoint-dir", str(tmp / "ckpt"),
           "--output", str(tmp / out), *extra]
    return subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=open(tmp / f"{out}.err", "wb"),
                            text=True, start_new_session=True)


def lines(proc: subprocess.Popen, timeout: float = 300) -> list[tuple[str, dict]]:
    out, _ = proc.communicate(timeout=timeout)
    return [(ln.split(" ", 1)[0], json.loads(ln.split(" ", 1)[1])) for ln in out.splitlines() if ln.startswith("SDCLOUD_")]


def lora(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "pytorch_lora_weights.safetensors"))


def test_two_gloo_processes_train_stop_and_resume_exactly(tmp_path):
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    ref = launch(ref_dir, "out")
    events = lines(ref)
    assert ref.returncode == 0, (ref_dir / "out.err").read_text()[-3000:]
    steps = [p["step"] for k, p in events if k == "SDCLOUD_STEP"]
    assert steps == list(range(1, STEPS + 1))  # one protocol stream: rank 0's

    first = launch(tmp_path, "first", "--min-step-seconds", "0.5")
    deadline = time.monotonic() + 300
    while not list((tmp_path / "ckpt").glob("step-*")) and time.monotonic() < deadline:
        time.sleep(0.2)  # nothing saved yet; wait until training is under way
        if first.poll() is not None:
            break
        if (tmp_path / "first.err").read_text(errors="replace").count("ready in") >= 2:
            time.sleep(1.5)
            os.kill(first.pid, signal.SIGTERM)  # the launcher passes it to both ranks
            break
    events = lines(first)
    ckpts = [p["step"] for k, p in events if k == "SDCLOUD_CHECKPOINT"]
    assert len(ckpts) == 1 and 0 < ckpts[0] < STEPS, ((tmp_path / "first.err").read_text()[-3000:], events)

    second = launch(tmp_path, "resumed", "--resume-from", "latest")
    events = lines(second)
    assert second.returncode == 0, (tmp_path / "resumed.err").read_text()[-3000:]
    assert [p["step"] for k, p in events if k == "SDCLOUD_STEP"] == list(range(ckpts[0] + 1, STEPS + 1))
    assert_same_weights(lora(tmp_path / "resumed"), lora(ref_dir / "out"))
