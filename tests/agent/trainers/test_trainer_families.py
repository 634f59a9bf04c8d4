"""The builtin trainer on SDXL- and SD2-shaped tiny models (random weights, small configs, CPU):
both text encoders, pooled embeddings and time ids, aspect buckets, v-prediction, LoRA and
DreamBooth; interrupted by SIGTERM and resumed to the same bits; the exported LoRA in both layouts
loads into the matching pipeline with diffusers and changes its image."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest


from sdcloud_agent.trainers import builtin, lora_export, models, tiny

from tests.agent.trainers.test_trainer_builtin import Run, assert_same_weights

STEPS = 10


def mixed_aspect_dataset(folder: Path) -> Path:
    """Five images of different shapes (portrait, landscape, square), two with captions, one in a
    subfolder: the documented layout."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1)
    (folder / "sub").mkdir(parents=True)
    for i, (h, w) in enumerate([(64, 32), (30, 60), (40, 40), (50, 36), (36, 72)]):
        where = folder / "sub" if i == 4 else folder
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(where / f"{i}.png")
    (folder / "0.txt").write_text("a photo of sks toy, portrait\n")
    (folder / "sub" / "4.txt").write_text("a photo of sks toy, wide\n")
    return folder


def args_for(tmp: Path, model: str, data: Path, *extra: str, out: str = "out") -> list[str]:
    return ["--model", model, "--steps", str(STEPS), "--data-dir", str(data), "--batch-size", "2",
            "--resolution", "32", "--seed", "3", "--lr", "1e-3", "--checkpoint-dir", str(tmp / "ckpt"),
            "--output", str(tmp / out), *extra]


def interrupted_then_resumed(tmp: Path, argv: list[str]) -> tuple[Run, Run]:
    first = Run(tmp, *argv)
    first.wait_for("STEP", lambda p: p["step"] >= 2)
    os.killpg(first.proc.pid, signal.SIGTERM)
    assert first.finish() == 143, first.stderr()
    (ckpt,) = first.of("CHECKPOINT")
    assert ckpt["step"] < STEPS, "the signal arrived after training ended"
    second = Run(tmp, *argv, "--resume-from", "latest", "--output", str(tmp / "resumed"))
    assert second.finish() == 0, second.stderr()
    assert second.steps() == list(range(ckpt["step"] + 1, STEPS + 1))
    return first, second


def load(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def image(family: str, lora_dir: Path | None = None, weight_name: str | None = None):
    import torch

    pipe = models.pipeline(tiny.build_components(family=family))
    pipe.set_progress_bar_config(disable=True)
    if lora_dir is not None:
        pipe.load_lora_weights(str(lora_dir), weight_name=weight_name)
    return pipe("a photo of sks toy", num_inference_steps=2, height=32, width=32, output_type="np",
                generator=torch.Generator().manual_seed(0)).images[0]


@pytest.fixture(scope="module")
def sdxl_lora(tmp_path_factory) -> Path:
    """An uninterrupted SDXL LoRA run on mixed-aspect images (buckets are on for SDXL)."""
    tmp = tmp_path_factory.mktemp("sdxl")
    data = mixed_aspect_dataset(tmp / "data")
    run = Run(tmp, *args_for(tmp / "ref", "tiny-sdxl", data, "--checkpoint-every", "5"))
    assert run.finish() == 0, run.stderr()
    return tmp


@pytest.mark.slow  # a few trainer processes: about 20-40 s each on a busy 2-core machine
def test_sdxl_lora_uses_buckets_pooled_embeds_and_time_ids_and_resumes_exactly(sdxl_lora, tmp_path):
    ref = sdxl_lora / "ref"
    state = json.loads((ref / "ckpt" / f"step-{STEPS:09d}" / "trainer_state.json").read_text())
    assert state["family"] == "sdxl"
    log = next(sdxl_lora.glob("stderr-*")).read_text()
    # The images went to several aspect buckets (portrait, landscape, square latents).
    buckets = log.split("buckets=")[1].split(" trainable")[0]
    assert buckets.count("(") >= 3, log[-2000:]
    data = sdxl_lora / "data"
    interrupted_then_resumed(tmp_path, args_for(tmp_path, "tiny-sdxl", data))
    for name in (builtin.DIFFUSERS_LORA, builtin.KOHYA_LORA):
        assert_same_weights(load(tmp_path / "resumed" / name), load(ref / "out" / name))


@pytest.mark.slow
@pytest.mark.parametrize("weight_name", [builtin.DIFFUSERS_LORA, builtin.KOHYA_LORA])
def test_sdxl_lora_loads_in_diffusers_in_both_formats_and_changes_the_image(sdxl_lora, weight_name):
    out = sdxl_lora / "ref" / "out"
    base = image("sdxl")
    tuned = image("sdxl", out, weight_name)
    assert abs(tuned - base).max() > 1e-4
    if weight_name == builtin.KOHYA_LORA:
        keys = load(out / weight_name)
        # SDXL's kohya layout: SGM block names, an alpha per module.
        assert all(k.startswith("lora_unet_") for k in keys)
        assert any("_input_blocks_" in k for k in keys) and not any("down_blocks" in k for k in keys)
        assert all(float(v) == 4.0 for k, v in keys.items() if k.endswith(".alpha"))
        # The same LoRA both ways: the same image.
        assert abs(tuned - image("sdxl", out, builtin.DIFFUSERS_LORA)).max() == 0
    readme = (out / "README.md").read_text()
    assert "StableDiffusionXLPipeline" in readme and "ComfyUI" in readme and "AUTOMATIC1111" in readme


@pytest.mark.slow  # a few trainer processes: about 20-40 s each on a busy 2-core machine
def test_sd2_vprediction_dreambooth_resumes_exactly_and_saves_a_pipeline(tmp_path):
    data = mixed_aspect_dataset(tmp_path / "data")
    ref = Run(tmp_path, *args_for(tmp_path / "r", "tiny-sd2", data, "--mode", "dreambooth",
                                  "--checkpoint-every", "4"))
    assert ref.finish() == 0, ref.stderr()
    interrupted_then_resumed(tmp_path, args_for(tmp_path, "tiny-sd2", data, "--mode", "dreambooth"))

    def unet(folder: Path) -> dict:
        (f,) = (folder / "unet").glob("*.safetensors")
        return load(f)

    assert_same_weights(unet(tmp_path / "resumed"), unet(tmp_path / "r" / "out"))
    cfg = json.loads((tmp_path / "resumed" / "scheduler" / "scheduler_config.json").read_text())
    assert cfg["prediction_type"] == "v_prediction"
    assert models.folder_family(tmp_path / "resumed") == "sd2"


@pytest.mark.slow  # a few trainer processes: about 20-40 s each on a busy 2-core machine
def test_sd15_kohya_lora_loads_and_a_wrong_family_is_refused(tmp_path):
    data = mixed_aspect_dataset(tmp_path / "data")
    run = Run(tmp_path, *args_for(tmp_path, "tiny", data, "--steps", "3"))
    assert run.finish() == 0, run.stderr()
    keys = load(tmp_path / "out" / builtin.KOHYA_LORA)
    assert any(k.startswith("lora_unet_down_blocks_0_attentions_0_") for k in keys)
    base = image("sd15")
    assert abs(image("sd15", tmp_path / "out", builtin.KOHYA_LORA) - base).max() > 1e-4
    # An SD1.5 folder where an SDXL model is asked for: exit 2, one line, nothing trained.
    model = tiny.save_pipeline(tmp_path / "sd15-model")
    bad = Run(tmp_path, "--model", str(model), "--family", "sdxl", "--steps", "2",
              "--checkpoint-dir", str(tmp_path / "bad"))
    assert bad.finish() == 2 and bad.steps() == []
    assert "sd15 model" in bad.stderr()


@pytest.mark.slow  # a few trainer processes: about 20-40 s each on a busy 2-core machine
def test_validation_images_do_not_change_training(sdxl_lora, tmp_path):
    data = sdxl_lora / "data"
    run = Run(tmp_path, *args_for(tmp_path, "tiny-sdxl", data, "--checkpoint-every", "5",
                                  "--validation-prompt", "a photo of sks toy",
                                  "--validation-prompt", "sks toy on a beach", "--validation-steps", "2"))
    assert run.finish() == 0, run.stderr()
    for c in run.of("CHECKPOINT"):
        names = json.loads((Path(c["path"]) / "trainer_state.json").read_text())["files"]
        assert {"sample-00.png", "sample-01.png"} <= set(names)
    ref = sdxl_lora / "ref" / "out"
    assert_same_weights(load(tmp_path / "out" / builtin.DIFFUSERS_LORA), load(ref / builtin.DIFFUSERS_LORA))


@pytest.mark.slow  # a few trainer processes: about 20-40 s each on a busy 2-core machine
def test_grad_accumulation_and_adafactor_resume_exactly(tmp_path):
    data = mixed_aspect_dataset(tmp_path / "data")
    extra = ("--grad-accum", "2", "--optimizer", "adafactor", "--gradient-checkpointing")
    ref = Run(tmp_path, *args_for(tmp_path / "r", "tiny", data, *extra))
    assert ref.finish() == 0, ref.stderr()
    interrupted_then_resumed(tmp_path, args_for(tmp_path, "tiny", data, *extra))
    assert_same_weights(load(tmp_path / "resumed" / builtin.DIFFUSERS_LORA),
                        load(tmp_path / "r" / "out" / builtin.DIFFUSERS_LORA))


def test_buckets_cover_the_area_at_model_multiples():
    b = builtin.make_buckets(1024, 64)
    assert (1024, 1024) in b and (832, 1216) in b and (1216, 832) in b
    assert all(w % 64 == 0 and h % 64 == 0 and w * h <= 1024 * 1024 for w, h in b)


def test_sgm_names_follow_the_sdxl_block_layout():
    # SDXL: 2 (resnet, attention) pairs per down block plus a downsampler; 3 per up block.
    assert lora_export.sgm_module("down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q", 2) \
        == "input_blocks.4.1.transformer_blocks.0.attn1.to_q"
    assert lora_export.sgm_module("up_blocks.0.attentions.2.x", 2) == "output_blocks.2.1.x"
    assert lora_export.sgm_module("mid_block.attentions.0.x", 2) == "middle_block.1.x"


def test_memory_recipe_follows_usable_vram():
    from sdcloud_agent.trainers import recipes

    # SDXL LoRA at 1024: a 16 GB card (T4-class) needs checkpointing and 8-bit AdamW, 24 GB
    # (A10G) checkpointing only, 80 GB none; at 512 px the same card needs less.
    assert recipes.choose("sdxl", "lora", 1024, 14.5) == recipes.Recipe(True, "adamw8bit", 1)
    assert recipes.choose("sdxl", "lora", 1024, 22.5) == recipes.Recipe(True, "adamw", 2)
    assert recipes.choose("sdxl", "lora", 1024, 78.0) == recipes.Recipe(False, "adamw", 4)
    assert recipes.choose("sdxl", "lora", 512, 14.5) == recipes.Recipe(False, "adamw", 4)
    # Full-UNet SDXL on 24 GB: Adafactor; SD2 follows SD1.5's table.
    assert recipes.choose("sdxl", "dreambooth", 1024, 22.5).optimizer == "adafactor"
    assert recipes.choose("sd2", "lora", 512, 10.0) == recipes.choose("sd15", "lora", 512, 10.0)
