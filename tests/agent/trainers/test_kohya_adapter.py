"""The kohya adapter on a fake sd-scripts network trainer that does upstream's step arithmetic:
a resume past an epoch boundary keeps the run's global step in folder names, uploads, progress and
the final step; a run that "succeeds" without its model fails; required flags are known."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from sdcloud_agent import manifest as mf
from sdcloud_agent.store import open_store
from sdcloud_agent.trainers.base import Context
from sdcloud_agent.trainers.kohya import KohyaTrainer

from tests.support import SUPPORT
from tests.e2e.test_agent_e2e import AwsMetadataServer
from tests.e2e.test_agent_e2e import _config, _start_agent

FAKE_KOHYA = str(SUPPORT / "fake_kohya.py")
TRUE = re.compile(r"TRUESTEP (\d+)")


def _images(folder: Path, n: int) -> Path:
    from PIL import Image

    folder.mkdir(parents=True)
    for i in range(n):
        Image.new("RGB", (40, 32), (50 * i, 20, 200)).save(folder / f"{i}.png")
    return folder


def test_resume_past_an_epoch_boundary_keeps_the_global_step(tmp_path):
    data = _images(tmp_path / "photos", 6)  # batch 1: an epoch is 6 steps
    meta = AwsMetadataServer().start()
    store_cfg = {"url": f"file://{tmp_path}/bucket"}
    store = open_store(store_cfg)
    steps, every = 30, 5
    args = {"launcher": [sys.executable, FAKE_KOHYA], "script": "sdxl_train_network.py",
            "network_module": "networks.lora", "resolution": "1024,1024"}
    logs = []
    try:
        for attempt in (1, 2):
            meta.reset()
            cfg = _config(tmp_path, attempt, store_cfg, meta.base_url, trainer="kohya", trainer_args=args,
                          steps=steps, every=every, dataset=str(data), keep_checkpoints=20)
            proc = _start_agent(cfg, {"FAKE_STEP_SECONDS": "0.1"})
            log = tmp_path / f"work-{attempt}" / f"attempt-{attempt}.log"
            while attempt == 1 and proc.poll() is None:
                text = log.read_text(errors="replace") if log.exists() else ""
                if any(int(n) >= 13 for n in TRUE.findall(text)):
                    meta.announce(120)
                    break
                time.sleep(0.02)
            _, err = proc.communicate(timeout=120)
            logs.append(log.read_text(errors="replace"))
            assert proc.returncode == (3 if attempt == 1 else 0), err.decode()[-3000:]
            if attempt == 1:
                # It waited for a periodic checkpoint; 10, 15, 20 or 25 are all past an epoch boundary.
                resumed = mf.newest_complete(store, "runs/e2e").step
                assert resumed in (10, 15, 20, 25)
    finally:
        meta.stop()
    second = [int(n) for n in TRUE.findall(logs[1])]
    assert second[0] == resumed + 1 and second[-1] == steps, "kohya trained past the run's last step"
    # Kohya restarted its count within the epoch (e.g. 15 -> 3) and saved at its own multiples of
    # 5: each is uploaded under the run's step (e.g. kohya's 5 -> 17), never at or below `resumed`.
    start = resumed % 6
    expected = [k + resumed - start for k in range(start + 1, steps - resumed + start + 1) if k % every == 0]
    done = mf.complete_steps(store, "runs/e2e")
    assert [s for s in done if s > resumed] == expected and expected, (resumed, done)
    for s in expected:  # each uploaded state is the one kohya saved at that true step
        (m,) = [m for m in [mf.read(store, "runs/e2e", s)] if m]
        assert m.name.endswith(f"-step{s - resumed + start:08d}-state")
    status = json.loads(store.get("runs/e2e/status.json"))
    assert status["phase"] == "succeeded" and status["step"] == steps
    assert store.head("runs/e2e/artifacts/sdcloud.safetensors") is not None
    toml = (tmp_path / "work-2" / "kohya_dataset.toml").read_text()
    assert "num_repeats = 1" in toml and 'caption_extension = ".txt"' in toml


def test_exit_zero_without_a_model_fails_the_attempt(tmp_path):
    flat = _images(tmp_path / "flat", 3)  # images directly in train_data_dir: kohya finds no data
    args = {"launcher": [sys.executable, FAKE_KOHYA], "script": "train_network.py",
            "network_module": "networks.lora", "train_data_dir": str(flat), "resolution": "512,512"}
    cfg = _config(tmp_path, 1, {"url": f"file://{tmp_path}/bucket"}, "", kind="none", trainer="kohya",
                  trainer_args=args, steps=10, every=5)
    proc = _start_agent(cfg, {})
    proc.communicate(timeout=120)
    assert proc.returncode == 1
    status = json.loads((tmp_path / "bucket/runs/e2e/status.json").read_text())
    assert status["phase"] == "failed" and "without writing its model" in status["reason"]
    assert "No data found" in status["reason"]


def test_only_the_training_bar_counts_and_required_flags(tmp_path):
    t = KohyaTrainer()
    ctx = Context(steps=100, checkpoint_every=10, model="m", workdir=tmp_path, checkpoint_dir=tmp_path / "ck",
                  output_dir=tmp_path / "out", trainer_args={"network_module": "networks.lora"})
    t.command(ctx)
    assert t.parse_line("loading captions: 100%|##| 50/50 [00:00<00:00, 99.0it/s]") is None
    assert t.parse_line("caching latents: 40%|#| 20/50 [00:02<00:03, 9.1it/s]") is None
    assert t.parse_line("steps:  10%|#| 10/100 [00:10<01:30, 1.00it/s, avr_loss=0.1]")["step"] == 10
    assert t.missing_flags({"script": "sdxl_train_network.py"}, has_dataset=True) == ["network_module", "resolution"]
    assert t.missing_flags({"script": "sdxl_train.py", "resolution": "1024"}, has_dataset=False) == ["dataset_config"]


@pytest.mark.slow
def test_a_model_in_the_bucket_is_staged_for_the_trainer(tmp_path):
    """--model file://.../models/sdxl/ (a diffusers folder in the bucket): the agent copies it to
    local disk and the builtin trainer trains from it (tiny SDXL, 2 steps)."""
    import shutil

    from sdcloud_agent.trainers import tiny

    bucket = tmp_path / "bucket"
    tiny.save_pipeline(bucket / "models" / "xl", family="sdxl")
    cfg = _config(tmp_path, 1, {"url": f"file://{bucket}"}, "", kind="none", trainer="builtin",
                  trainer_args={"synthetic": 2, "device": "cpu", "family": "sdxl", "resolution": 32}, steps=2, every=2,
                  model=f"file://{bucket}/models/xl")
    proc = _start_agent(cfg, {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert (tmp_path / "work-1" / "model" / "unet" / "config.json").is_file()
    store = open_store(f"file://{bucket}")
    assert store.head("runs/e2e/artifacts/lora_kohya.safetensors") is not None
    shutil.rmtree(tmp_path / "work-1", ignore_errors=True)


# -- the flags the model and the GPU need, checked against the pinned sd-scripts parsers -----------

def _kohya_cmd(tmp_path: Path, args: dict, model: str = "m", cap: float | None = 7.5, monkeypatch=None) -> list[str]:
    from sdcloud_agent import gpu

    monkeypatch.setattr(gpu, "compute_capability", lambda: cap)
    ctx = Context(steps=100, checkpoint_every=10, model=model, workdir=tmp_path, checkpoint_dir=tmp_path / "ck",
                  output_dir=tmp_path / "out", trainer_args=dict(args))
    return KohyaTrainer().command(ctx)


def _flags(cmd: list[str]) -> dict[str, str | bool]:
    """{--flag: value or True} of the script's part of a command line."""
    at = next(i for i, a in enumerate(cmd) if a.endswith(".py"))
    out: dict[str, str | bool] = {}
    rest = cmd[at + 1:]
    for i, a in enumerate(rest):
        if a.startswith("--"):
            nxt = rest[i + 1] if i + 1 < len(rest) else None
            out[a] = True if nxt is None or nxt.startswith("--") else nxt
    return out


def _sd2_v_model(root: Path) -> Path:
    """A diffusers folder shaped like stabilityai/stable-diffusion-2-1 (768-v): configs only."""
    (root / "unet").mkdir(parents=True)
    (root / "scheduler").mkdir()
    (root / "unet" / "config.json").write_text(json.dumps({"cross_attention_dim": 1024, "sample_size": 96}))
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps({"prediction_type": "v_prediction"}))
    return root


def test_sdxl_under_fp16_keeps_its_vae_in_fp32(tmp_path, monkeypatch):
    """A V100 (7.0) or T4 (7.5) settles "auto" to fp16: SDXL's VAE must run in fp32 there."""
    args = {"script": "sdxl_train_network.py", "network_module": "networks.lora", "mixed_precision": "auto"}
    flags = _flags(_kohya_cmd(tmp_path, args, cap=7.0, monkeypatch=monkeypatch))
    assert flags["--mixed_precision"] == "fp16" and flags["--no_half_vae"] is True and flags["--sdpa"] is True
    flags = _flags(_kohya_cmd(tmp_path, args, cap=8.6, monkeypatch=monkeypatch))
    assert flags["--mixed_precision"] == "bf16" and "--no_half_vae" not in flags


def test_an_sd2_v_model_trains_with_v2_and_v_parameterization(tmp_path, monkeypatch):
    model = _sd2_v_model(tmp_path / "sd21")
    args = {"script": "train_network.py", "network_module": "networks.lora", "mixed_precision": "auto"}
    flags = _flags(_kohya_cmd(tmp_path, args, model=str(model), monkeypatch=monkeypatch))
    assert flags["--v2"] is True and flags["--v_parameterization"] is True
    # SD 1.5 (768-wide text encoder) and SD 2 base (epsilon) get neither.
    (model / "scheduler" / "scheduler_config.json").write_text(json.dumps({"prediction_type": "epsilon"}))
    flags = _flags(_kohya_cmd(tmp_path, args, model=str(model), monkeypatch=monkeypatch))
    assert "--v2" not in flags and "--v_parameterization" not in flags


def test_the_users_attention_choice_wins_over_sdpa(tmp_path, monkeypatch):
    args = {"script": "train_network.py", "network_module": "networks.lora", "xformers": True}
    flags = _flags(_kohya_cmd(tmp_path, args, monkeypatch=monkeypatch))
    assert flags["--xformers"] is True and "--sdpa" not in flags


def _tier_names() -> list[str]:
    from sdcloud.offers.tiers import all_tiers

    return list(all_tiers())


@pytest.mark.parametrize("tier_name", _tier_names())
@pytest.mark.parametrize("cap,sd2v", [(7.0, False), (8.9, False), (7.5, True)], ids=["fp16", "bf16", "sd2-v-fp16"])
def test_every_tiers_kohya_command_is_accepted_by_the_pinned_parsers(tmp_path, monkeypatch, tier_name, cap, sd2v):
    """Flag by flag, against the option table read from the pinned sd-scripts' argparse calls
    (data/trainer-options.json: source URL and commit recorded there), on fp16 and bf16 GPUs and
    with an SD 2 v-prediction model."""
    from sdcloud.offers.tiers import get_tier
    from sdcloud.runs.inputs.training import tier_defaults
    from sdcloud_agent.trainers import options

    tier = get_tier(tier_name)
    args = tier_defaults("kohya", tier)
    model = _sd2_v_model(tmp_path / "sd2v") if sd2v else "m"
    cmd = _kohya_cmd(tmp_path, args, model=str(model), cap=cap, monkeypatch=monkeypatch)
    script = next(a for a in cmd if a.endswith(".py"))
    accepted = options.script_options("kohya", script)
    assert accepted is not None, script
    assert options.table()["kohya"]["commit"] == "ae72efb92babe89ff8e70f057e42db68440e8d61"
    for flag, value in _flags(cmd).items():
        assert flag in accepted, f"{Path(script).name} has no {flag}"
        kind = accepted[flag]
        assert (value is True) == (kind == "flag"), (flag, value, kind)
    flags = _flags(cmd)
    sdxl = Path(script).name.startswith("sdxl_")
    assert ("--no_half_vae" in flags) == (sdxl and cap < 8), flags
    sd3 = Path(script).name.startswith("sd3_")  # an SD3 script takes no SD 2 flags
    assert ("--v_parameterization" in flags) == ("--v2" in flags) == (sd2v and not sdxl and not sd3), flags
    assert "--sdpa" in flags


def test_kohya_venv_installs_the_headless_opencv(tmp_path):
    from sdcloud_agent import scripts

    (tmp_path / "requirements.txt").write_text("accelerate==1.6.0\nopencv-python==4.10.0.84\n"
                                               "opencv-python-headless==1\n-e .\n")
    req = scripts.requirements(tmp_path)
    assert "opencv-python-headless==4.10.0.84" in req.splitlines()
    assert not any(ln.startswith("opencv-python==") for ln in req.splitlines()) and "-e ." not in req
