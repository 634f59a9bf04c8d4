"""kohya's sd3_train_network.py and the diffusers SD3 scripts for the sd3 tiers: the flags the tiers
give them, checked against the pinned parsers; kohya's single-file layout (the checkpoint and the
encoders' own files) fetched from an SD3 repository and handed to the script; a kohya run (its fake,
tests/support/fake_kohya.py) on an sd3 tier saving at a reclaim notice and resuming at that step."""

from __future__ import annotations

import json
import sys
import time

import pytest

from sdcloud_agent import manifest as mf
from tests.agent.trainers.test_kohya_adapter import FAKE_KOHYA, TRUE, _flags, _images, _kohya_cmd
from tests.runs.test_sd3_models import SD35_LARGE


def test_kohya_fetches_the_single_file_and_one_t5():
    from sdcloud_agent.trainers.models import single_file_selection

    wanted = single_file_selection(SD35_LARGE)
    assert wanted == ["sd3.5_large.safetensors", "text_encoders/clip_l.safetensors",
                      "text_encoders/clip_g.safetensors", "text_encoders/t5xxl_fp16.safetensors"]
    assert not [f for f in wanted if f.startswith(("transformer/", "text_encoder_3/"))]


def test_the_sd35_lora_tiers_kohya_command_points_at_the_single_file_and_encoders(tmp_path, monkeypatch):
    from sdcloud.offers.tiers import get_tier
    from sdcloud.runs.inputs.training import tier_defaults
    from sdcloud_agent.trainers import options

    model = tmp_path / "sd35m"
    (model / "text_encoders").mkdir(parents=True)
    for f in ("sd3.5_medium.safetensors", "text_encoders/clip_l.safetensors", "text_encoders/clip_g.safetensors",
              "text_encoders/t5xxl_fp16.safetensors"):
        (model / f).write_bytes(b"x")
    args = tier_defaults("kohya", get_tier("sd35m-lora"))
    assert args["script"] == "sd3_train_network.py" and args["network_module"] == "networks.lora_sd3"
    cmd = _kohya_cmd(tmp_path, args, model=str(model), cap=7.5, monkeypatch=monkeypatch)
    flags = _flags(cmd)
    assert flags["--pretrained_model_name_or_path"] == str(model / "sd3.5_medium.safetensors")
    assert flags["--t5xxl"] == str(model / "text_encoders" / "t5xxl_fp16.safetensors")
    assert flags["--clip_l"].endswith("clip_l.safetensors") and flags["--clip_g"].endswith("clip_g.safetensors")
    assert "--cache_text_encoder_outputs" in flags and "--network_train_unet_only" in flags
    assert "--no_half_vae" not in flags and "--v2" not in flags
    accepted = options.script_options("kohya", "sd3_train_network.py")
    assert accepted and all(f in accepted for f in flags), [f for f in flags if f not in accepted]
    # DreamBooth of the whole transformer: kohya's sd3_train.py, no network flags.
    db = tier_defaults("kohya", get_tier("sd35m-dreambooth"))
    assert db["script"] == "sd3_train.py" and "network_module" not in db
    assert tier_defaults("diffusers", get_tier("sd35m-lora"))["script"] == "train_dreambooth_lora_sd3.py"
    assert tier_defaults("diffusers", get_tier("sd35m-dreambooth"))["script"] == "train_dreambooth_sd3.py"


def test_kohya_on_an_sd3_tier_saves_at_the_notice_and_resumes_there(tmp_path):
    from sdcloud_agent.store import open_store
    from tests.e2e.test_agent_e2e import AwsMetadataServer, _config, _start_agent

    data = _images(tmp_path / "photos", 4)
    meta = AwsMetadataServer().start()
    store_cfg = {"url": f"file://{tmp_path}/bucket"}
    store = open_store(store_cfg)
    args = {"launcher": [sys.executable, FAKE_KOHYA], "script": "sd3_train_network.py",
            "network_module": "networks.lora_sd3", "cache_text_encoder_outputs": True, "resolution": "1024,1024"}
    logs, saved = [], None
    try:
        for attempt in (1, 2):
            meta.reset()
            cfg = _config(tmp_path, attempt, store_cfg, meta.base_url, trainer="kohya", trainer_args=args,
                          steps=16, every=4, dataset=str(data), keep_checkpoints=20)
            proc = _start_agent(cfg, {"FAKE_STEP_SECONDS": "0.1"})
            log = tmp_path / f"work-{attempt}" / f"attempt-{attempt}.log"
            while attempt == 1 and proc.poll() is None:
                text = log.read_text(errors="replace") if log.exists() else ""
                if any(int(n) >= 6 for n in TRUE.findall(text)):
                    meta.announce(120)
                    break
                time.sleep(0.02)
            _, err = proc.communicate(timeout=120)
            logs.append(log.read_text(errors="replace"))
            assert proc.returncode == (3 if attempt == 1 else 0), err.decode()[-3000:]
            if attempt == 1:
                saved = mf.newest_complete(store, "runs/e2e").step  # what the notice's save left
                assert 6 <= saved < 16
    finally:
        meta.stop()
    assert "sd3_train_network.py" in logs[0] and "networks.lora_sd3" in logs[0]
    second = [int(n) for n in TRUE.findall(logs[1])]
    assert second[0] == saved + 1 and second[-1] == 16, (saved, second)
    status = json.loads(store.get("runs/e2e/status.json"))
    assert status["phase"] == "succeeded" and status["step"] == 16
    assert store.head("runs/e2e/artifacts/sdcloud.safetensors") is not None


def test_both_diffusers_sd3_scripts_get_the_captions(tmp_path):
    """train_dreambooth_lora_sd3.py and train_dreambooth_sd3.py read captions from an imagefolder
    (--dataset_name with --caption_column, their DreamBoothDataset), as the SDXL LoRA script does:
    the DreamBooth tier trains on the user's captions too, not on the instance prompt alone."""
    from sdcloud.offers.tiers import get_tier
    from sdcloud.runs.inputs.training import tier_defaults
    from sdcloud_agent.trainers.base import Context
    from sdcloud_agent.trainers.diffusers import DiffusersTrainer

    data = _images(tmp_path / "photos", 2)
    (data / "0.txt").write_text("a photo of sks toy on a table")
    for tier in ("sd35m-lora", "sd35m-dreambooth"):
        args = {**tier_defaults("diffusers", get_tier(tier)), "instance_prompt": "a photo of sks toy"}
        ctx = Context(steps=10, checkpoint_every=5, model="m", workdir=tmp_path / tier, checkpoint_dir=tmp_path / "ck",
                      output_dir=tmp_path / "out", dataset=data, trainer_args=args)
        cmd = DiffusersTrainer().command(ctx)
        assert args["script"] in " ".join(cmd)
        assert cmd[cmd.index("--caption_column") + 1] == "text" and "--instance_data_dir" not in cmd, (tier, cmd)
        folder = cmd[cmd.index("--dataset_name") + 1]
        rows = [json.loads(line) for line in (tmp_path / tier / "imagefolder" / "metadata.jsonl").read_text().splitlines()]
        assert folder == str(tmp_path / tier / "imagefolder")
        assert sorted(r["text"] for r in rows) == ["a photo of sks toy", "a photo of sks toy on a table"], (tier, rows)


def test_every_script_a_tier_launches_is_in_the_options_table():
    """The flags of whatever script a tier runs (kohya's and diffusers', SD3's included) are checked
    before launch: a script missing from trainer-options.json would pass any flag unchecked."""
    from sdcloud.offers.tiers import all_tiers
    from sdcloud.runs.inputs.training import DIFFUSERS_SCRIPTS, KOHYA_SCRIPTS, tier_defaults
    from sdcloud_agent.trainers import options

    for trainer, scripts in (("kohya", KOHYA_SCRIPTS), ("diffusers", DIFFUSERS_SCRIPTS)):
        missing = [s for s in scripts.values() if options.script_options(trainer, s) is None]
        assert missing == [], (trainer, missing)
        for tier in (t for t in all_tiers().values() if t.kind == "train"):
            assert options.script_options(trainer, tier_defaults(trainer, tier)["script"]) is not None, tier.name
    sd3_db = options.script_options("diffusers", "train_dreambooth_sd3.py")
    assert {"--dataset_name", "--caption_column", "--instance_prompt", "--precondition_outputs"} <= set(sd3_db)


def test_a_misspelt_flag_for_a_diffusers_sd3_script_is_refused_before_launch():
    from sdcloud.errors import UserError
    from sdcloud.offers.tiers import get_tier
    from sdcloud.runs.inputs.preflight import check_script_args
    from sdcloud.runs.inputs.spec import RunSpec

    for tier in ("sd35m-lora", "sd35m-dreambooth"):
        spec = RunSpec(tier=tier, trainer="diffusers", dataset="/d", model="m",
                       trainer_args={"instance_prompt": "a sks toy", "weigting_scheme": "cosmap"})
        with pytest.raises(UserError, match="has no flag --weigting_scheme; did you mean --weighting_scheme"):
            check_script_args(spec, get_tier(tier))
        spec = RunSpec(tier=tier, trainer="diffusers", dataset="/d", model="m",
                       trainer_args={"instance_prompt": "a sks toy", "weighting_scheme": "uniform"})
        with pytest.raises(UserError, match="must be one of sigma_sqrt, logit_normal, mode, cosmap"):
            check_script_args(spec, get_tier(tier))
        ok = RunSpec(tier=tier, trainer="diffusers", dataset="/d", model="m",
                     trainer_args={"instance_prompt": "a sks toy", "weighting_scheme": "cosmap"})
        check_script_args(ok, get_tier(tier))


def test_the_diffusers_sd3_script_is_reclaimed_and_resumes_at_its_checkpoint(tmp_path):
    """train_dreambooth_lora_sd3.py (its fake, tests/support/fake_host.py: no save on a signal) with the
    tier's flags and a dataset: the agent waits for its next checkpoint after the notice, and the
    next attempt resumes there (`--resume_from_checkpoint latest`) with the global step kept."""
    from sdcloud.offers.tiers import get_tier
    from sdcloud.runs.inputs.training import tier_defaults
    from sdcloud_agent import manifest as mf
    from sdcloud_agent.store import open_store
    from tests.e2e.test_agent_e2e import FAKE, FAKESTEP, AwsMetadataServer, _config, _start_agent

    data = _images(tmp_path / "photos", 2)
    meta = AwsMetadataServer().start()
    store_cfg = {"url": f"file://{tmp_path}/bucket"}
    store = open_store(store_cfg)
    args = {**tier_defaults("diffusers", get_tier("sd35m-lora")), "launcher": [sys.executable, FAKE],
            "instance_prompt": "a photo of sks toy", "checkpoints_total_limit": 1}
    args.pop("mixed_precision")  # "auto" is settled from a GPU; this host has none
    seen, logs, kept = [], [], None
    try:
        for attempt in (1, 2):
            meta.reset()
            cfg = _config(tmp_path, attempt, store_cfg, meta.base_url, trainer="diffusers", trainer_args=args,
                          steps=12, every=4, dataset=str(data))
            proc = _start_agent(cfg, {"FAKE_STEP_SECONDS": "0.1"})
            log = tmp_path / f"work-{attempt}" / f"attempt-{attempt}.log"
            while attempt == 1 and proc.poll() is None:
                text = log.read_text(errors="replace") if log.exists() else ""
                if any(int(n) >= 2 for n in FAKESTEP.findall(text)):
                    meta.announce(120)
                    break
                time.sleep(0.02)
            _, err = proc.communicate(timeout=120)
            logs.append(log.read_text(errors="replace"))
            seen.append([int(n) for n in FAKESTEP.findall(logs[-1])])
            assert proc.returncode == (3 if attempt == 1 else 0), err.decode()[-3000:]
            if attempt == 1:
                kept = mf.newest_complete(store, "runs/e2e")
    finally:
        meta.stop()
    assert "train_dreambooth_lora_sd3.py" in logs[0] and "--caption_column" in logs[0]
    # The notice came at step 2: the first save after it (step 4) or a later one, if the trainer ran
    # on while that save went up, is the newest complete checkpoint in the bucket, no later than the
    # last step trained; the next attempt starts on the step after it.
    assert kept is not None and kept.step % 4 == 0 and 4 <= kept.step <= seen[0][-1], (kept, seen)
    assert seen[1][0] == kept.step + 1 and seen[1][-1] == 12, (kept, seen)
    assert json.loads(store.get("runs/e2e/status.json"))["phase"] == "succeeded"
