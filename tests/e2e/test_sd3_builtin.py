"""The builtin trainer on the sd3 family, end to end: `sdcloud up --provider local --tier sd35m-lora`
with a tiny SD3-shaped diffusers folder and a dataset folder, a simulated reclaim, the resume at the
notice's checkpoint, and `sdcloud pull` giving a LoRA that StableDiffusion3Pipeline.load_lora_weights
takes and that changes the image of a fixed seed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from PIL import Image

from tests.support.fake_sd3_model import tiny_folder

pytestmark = pytest.mark.slow


def sdcloud(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sdcloud.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _dataset(folder):
    folder.mkdir()
    for n in range(3):
        Image.new("RGB", (48, 40), (n * 60, 90, 200)).save(folder / f"toy-{n}.png")
        (folder / f"toy-{n}.txt").write_text(f"a photo of sks toy, number {n}\n")
    return folder


def test_sd35m_lora_survives_a_reclaim_and_pulls_a_lora_the_sd3_pipeline_loads(sdcloud_home, tmp_path):
    import torch
    from diffusers import StableDiffusion3Pipeline
    from safetensors.torch import load_file

    model = tiny_folder()
    # Paced at a step a second so that the notice (8 s after the first attempt's first step) lands
    # mid-run; a folder model runs at full speed otherwise.
    up = sdcloud("up", "--provider", "local", "--tier", "sd35m-lora", "--model", str(model),
                 "--dataset", str(_dataset(tmp_path / "my photos")), "--steps", "24", "--checkpoint-every", "4",
                 "--simulate-preemption", "8", "--trainer-arg", "min-step-seconds=1",
                 "--trainer-arg", "lr=1e-2", "--yes", "--json")
    assert up.returncode == 0, up.stderr[-3000:]
    run = json.loads(up.stdout)
    assert run["state"] == "succeeded" and run["step"] == 24
    assert [a["end_reason"] for a in run["attempts"]] == ["preempted", "succeeded"]
    logs = sdcloud("logs", run["run"]).stdout
    assert "--family sd3" in logs and "--resolution 32" in logs  # the model's own size, not the tier's 1024
    saved = re.search(r"spot reclaim of attempt 1 at step (\d+): the host saved its checkpoint", logs)
    resumed = re.search(r"trainer started at step (\d+) of 24 \(resumed from its checkpoint\)", logs)
    assert saved and resumed and saved.group(1) == resumed.group(1) and 0 < int(saved.group(1)) < 24, logs[-3000:]

    out = tmp_path / "pulled"
    assert sdcloud("pull", run["run"], str(out)).returncode == 0
    weights = load_file(str(out / "pytorch_lora_weights.safetensors"))
    assert weights and all(k.startswith("transformer.") for k in weights)
    assert any(".attn.add_q_proj." in k for k in weights) and any(".attn.to_q." in k for k in weights)
    assert "StableDiffusion3Pipeline" in (out / "README.md").read_text()

    pipe = StableDiffusion3Pipeline.from_pretrained(str(model), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)

    def render():
        return pipe("a photo of sks toy", num_inference_steps=3, height=32, width=32,
                    generator=torch.Generator().manual_seed(7), output_type="np").images[0]

    before = render()
    assert (render() == before).all()  # the seed alone decides the image
    pipe.load_lora_weights(str(out))
    assert abs(render() - before).max() > 1e-3


def test_an_sd3_run_resumed_from_a_checkpoint_ends_bitwise_equal(tmp_path):
    """The flow-matching draws (noise, sigmas) come from the step's seed: resuming at step 3 of 6
    ends with the LoRA the uninterrupted run ends with, bit for bit."""
    from safetensors.torch import load_file

    data = _dataset(tmp_path / "photos")
    common = [sys.executable, "-m", "sdcloud_agent.trainers.builtin", "--model", str(tiny_folder()), "--family", "sd3",
              "--steps", "6", "--lr", "1e-2", "--resolution", "32", "--data-dir", str(data), "--device", "cpu"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    whole = subprocess.run([*common, "--checkpoint-every", "3", "--checkpoint-dir", str(tmp_path / "ck"),
                            "--output", str(tmp_path / "whole")], capture_output=True, text=True, timeout=300, env=env)
    assert whole.returncode == 0, whole.stderr[-2000:]
    resumed = subprocess.run([*common, "--resume-from", str(tmp_path / "ck" / "step-000000003"),
                              "--checkpoint-dir", str(tmp_path / "ck2"), "--output", str(tmp_path / "resumed")],
                             capture_output=True, text=True, timeout=300, env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert '"resumed_from"' in resumed.stdout and "SDCLOUD_STEP {\"step\": 4" in resumed.stdout
    a = load_file(str(tmp_path / "whole" / "pytorch_lora_weights.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "pytorch_lora_weights.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    assert any(a[k].abs().sum() > 0 for k in a if "lora_B" in k), "nothing was learned"
