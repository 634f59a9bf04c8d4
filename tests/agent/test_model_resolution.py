"""The model's own training resolution: the host reads the UNet's sample size and the VAE's scale
factor from the staged model and puts that over the tier's figure (a fallback), unless the user
gave `--trainer-arg resolution=N`. An SD 2.x 768-v model trains at 768, SDXL at 1024, the tiny
test pipeline at 32, whatever the tier says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sdcloud.offers.tiers import get_tier
from sdcloud.runs.driving.controller import agent_config
from sdcloud.runs.inputs.spec import build_spec
from sdcloud.runs.inputs.training import tier_defaults
from sdcloud_agent import resolution


def _configs(root: Path, sample_size, vae_blocks: int, sd2v: bool = False) -> Path:
    """A diffusers folder with only the configs (what the host reads; no weights)."""
    for sub, cfg in (("unet", {"sample_size": sample_size, "cross_attention_dim": 1024 if sd2v else 768}),
                     ("vae", {"block_out_channels": [128, 256, 512, 512][:vae_blocks]}),
                     ("scheduler", {"prediction_type": "v_prediction" if sd2v else "epsilon"})):
        (root / sub).mkdir(parents=True, exist_ok=True)
        name = "scheduler_config.json" if sub == "scheduler" else "config.json"
        (root / sub / name).write_text(json.dumps(cfg))
    return root


def test_the_resolution_is_the_unet_sample_size_times_the_vae_scale_factor(tmp_path):
    # Figures of the published configs: SD 1.5 and SD 2 base 64, SD 2 768-v 96, SDXL 128; four VAE blocks.
    assert resolution.of_model(_configs(tmp_path / "sd15", 64, 4)) == 512
    assert resolution.of_model(_configs(tmp_path / "sd2-768", 96, 4, sd2v=True)) == 768
    assert resolution.of_model(_configs(tmp_path / "sdxl", 128, 4)) == 1024
    assert resolution.of_model(_configs(tmp_path / "listed", [96, 96], 4)) == 768
    # Not a diffusers folder, or one that does not say: None (the tier's figure stays).
    assert resolution.of_model(tmp_path / "nowhere") is None
    assert resolution.of_model("stabilityai/stable-diffusion-2") is None
    single = tmp_path / "m.safetensors"
    single.write_bytes(b"x")
    assert resolution.of_model(single) is None
    assert resolution.of_model(_configs(tmp_path / "odd", "big", 4)) is None


def test_the_tiny_pipeline_says_32(tmp_path):
    from sdcloud_agent.trainers import tiny

    assert resolution.of_model(tiny.save_pipeline(tmp_path / "tiny")) == 32


def test_each_trainer_gets_the_resolution_in_its_own_form():
    assert resolution.with_resolution("kohya", {"resolution": "512,512", "a": 1}, 768) == {"resolution": "768,768", "a": 1}
    assert resolution.with_resolution("diffusers", {"resolution": 512}, 1024) == {"resolution": 1024}
    assert resolution.with_resolution("builtin", {"--resolution": 512}, 32) == {"--resolution": 32}
    assert resolution.with_resolution("builtin", ["--resolution", "512", "--batch-size", "2"], 32) == \
        ["--resolution", "32", "--batch-size", "2"]
    assert resolution.with_resolution("builtin", ["--resolution=512"], 768) == ["--resolution=768"]
    assert resolution.with_resolution("builtin", ["--batch-size", "2"], 768) == ["--batch-size", "2", "--resolution", "768"]


def test_the_control_plane_leaves_the_choice_to_the_host_unless_the_user_made_it(sdcloud_home, tmp_path):
    from PIL import Image

    photos = tmp_path / "photos"
    photos.mkdir()
    Image.new("RGB", (64, 64)).save(photos / "a.png")

    def cfg(**opts):
        spec = build_spec(None, {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1",
                                 "dataset": str(photos), **opts})
        return agent_config(spec, "r1", 1, 10, {"url": "file:///tmp/x"})

    kohya = cfg(trainer="kohya", trainer_arg=["network_module=networks.lora"])
    # The tier's figure still travels: it is the fallback when the model does not say.
    assert kohya["resolution_from_model"] is True and kohya["trainer_args"]["resolution"] == "512,512"
    assert cfg()["resolution_from_model"] is True  # builtin
    mine = cfg(trainer="kohya", trainer_arg=["network_module=networks.lora", "resolution=640,640"])
    assert mine["resolution_from_model"] is False and mine["trainer_args"]["resolution"] == "640,640"
    assert cfg(trainer_arg=["resolution=256"])["resolution_from_model"] is False


def test_an_sd2_768_model_under_kohya_trains_at_768_with_v_parameterization(tmp_path):
    """The sd15-lora tier's kohya flags (512) settled against an SD 2 768-v model's config."""
    from PIL import Image

    from sdcloud_agent.trainers.base import Context
    from sdcloud_agent.trainers.kohya import KohyaTrainer

    model = _configs(tmp_path / "sd2-768", 96, 4, sd2v=True)
    photos = tmp_path / "photos"
    photos.mkdir()
    Image.new("RGB", (64, 64)).save(photos / "a.png")
    args = resolution.settle("kohya", tier_defaults("kohya", get_tier("sd15-lora")), model)
    ctx = Context(steps=10, checkpoint_every=5, model=str(model), workdir=tmp_path / "w",
                  checkpoint_dir=tmp_path / "w" / "ck", output_dir=tmp_path / "w" / "out", dataset=photos,
                  trainer_args={**args, "mixed_precision": "bf16"})
    cmd = KohyaTrainer().command(ctx)
    flags = dict(zip(cmd, cmd[1:]))
    assert flags["--resolution"] == "768,768" and "--v2" in cmd and "--v_parameterization" in cmd
    assert "resolution = [768, 768]" in Path(flags["--dataset_config"]).read_text()


@pytest.mark.slow
def test_a_local_run_of_the_tiny_pipeline_trains_at_its_own_32_px_not_the_tiers_512(tmp_path):
    """The agent end to end: the tier's 512 in trainer_args, the model's config says 32."""
    from sdcloud_agent.trainers import tiny

    model = tiny.save_pipeline(tmp_path / "my-model")
    cfg = {"run_id": "res", "attempt": 1, "trainer": "builtin", "model": str(model),
           "trainer_args": {"family": "sd15", "mode": "lora", "resolution": 512, "batch-size": 1},
           "resolution_from_model": True, "steps": 2, "checkpoint_every": 2,
           "store": {"url": f"file://{tmp_path}/bucket"}, "metadata": {"kind": "none"},
           "workdir": str(tmp_path / "work"), "nvme": False, "require_gpu": False,
           "heartbeat_seconds": 0.5, "poll_seconds": 0.2}
    (tmp_path / "agent.json").write_text(json.dumps(cfg))
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(tmp_path / "agent.json")],
                          env=env, capture_output=True, timeout=600)
    log = (tmp_path / "work" / "attempt-1.log").read_text()
    assert proc.returncode == 0, log[-3000:]
    readmes = list((tmp_path / "bucket").rglob("README.md"))
    assert readmes, log[-2000:]
    text = readmes[0].read_text()
    assert "steps at 32 px" in text, text
    assert "resolution: 32 px from the model's config" in log
