"""The sd3 family (SD3, SD3.5 Medium / Large / Large Turbo) known to the model resolver on both
sides: diffusers folders by their config, single files by their MMDiT tensors, hub ids, the hub
files training needs, and a model of another family refused before launch."""

from __future__ import annotations

import json
import shutil

import pytest

from sdcloud.cli import main
from sdcloud_agent import resolution
from sdcloud_agent.trainers import models

from tests.support.fake_sd3_model import tiny_folder


def test_a_tiny_sd3_folder_is_sd3_by_its_transformer_config(tmp_path):
    folder = tiny_folder()
    assert json.loads((folder / "transformer" / "config.json").read_text())["_class_name"] == "SD3Transformer2DModel"
    assert models.detect_family(str(folder)) == "sd3"
    # The pipeline's class alone says it too (a folder whose transformer config is elsewhere).
    only_index = tmp_path / "index-only"
    only_index.mkdir()
    shutil.copy(folder / "model_index.json", only_index)
    assert json.loads((only_index / "model_index.json").read_text())["_class_name"] == "StableDiffusion3Pipeline"
    assert models.folder_family(only_index) == "sd3"
    # The agent reads its own resolution from the transformer: 16 latent px x a VAE scale of 2.
    assert resolution.of_model(folder) == 32


def test_a_transformer_of_another_model_is_refused_by_name(tmp_path):
    flux = tmp_path / "flux"
    (flux / "transformer").mkdir(parents=True)
    (flux / "transformer" / "config.json").write_text(json.dumps({"_class_name": "FluxTransformer2DModel"}))
    (flux / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline"}))
    with pytest.raises(models.ModelError, match="FluxTransformer2DModel.*not a family sdcloud trains"):
        models.detect_family(str(flux))


def test_an_sd3_single_file_is_told_by_its_mmdit_blocks(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    z = np.zeros(2, np.float32)
    full = tmp_path / "sd3.5_medium.safetensors"  # the layout of the hub's single-file checkpoints
    save_file({"model.diffusion_model.joint_blocks.0.x_block.attn.qkv.weight": z,
               "text_encoders.clip_l.transformer.text_model.final_layer_norm.weight": z,
               "first_stage_model.decoder.conv_in.weight": z}, str(full))
    assert models.detect_family(str(full)) == "sd3"
    sdxl = tmp_path / "xl.safetensors"
    save_file({"conditioner.embedders.1.model.x": z, "model.diffusion_model.input_blocks.0.0.weight": z}, str(sdxl))
    assert models.detect_family(str(sdxl)) == "sdxl"


@pytest.mark.parametrize("hub_id", ["stabilityai/stable-diffusion-3-medium-diffusers",
                                    "stabilityai/stable-diffusion-3.5-medium", "stabilityai/stable-diffusion-3.5-large",
                                    "stabilityai/stable-diffusion-3.5-large-turbo", "someone/my-sd3.5-style-finetune"])
def test_sd3_hub_ids(hub_id, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert models.detect_family(hub_id) == "sd3"


# stabilityai/stable-diffusion-3.5-large as its hub page lists it (sizes left out: the rule is by name).
SD35_LARGE = [
    "model_index.json", "scheduler/scheduler_config.json", "sd3.5_large.safetensors",
    "text_encoder/config.json", "text_encoder/model.safetensors",
    "text_encoder_2/config.json", "text_encoder_2/model.safetensors",
    "text_encoder_3/config.json", "text_encoder_3/model-00001-of-00002.safetensors",
    "text_encoder_3/model-00002-of-00002.safetensors", "text_encoder_3/model.safetensors.index.json",
    "text_encoders/README.md", "text_encoders/clip_g.safetensors", "text_encoders/clip_l.safetensors",
    "text_encoders/t5xxl_fp16.safetensors", "text_encoders/t5xxl_fp8_e4m3fn.safetensors",
    "tokenizer/merges.txt", "tokenizer/special_tokens_map.json", "tokenizer/tokenizer_config.json", "tokenizer/vocab.json",
    "tokenizer_2/merges.txt", "tokenizer_2/special_tokens_map.json", "tokenizer_2/tokenizer_config.json",
    "tokenizer_2/vocab.json", "tokenizer_3/special_tokens_map.json", "tokenizer_3/spiece.model",
    "tokenizer_3/tokenizer.json", "tokenizer_3/tokenizer_config.json",
    "transformer/config.json", "transformer/diffusion_pytorch_model-00001-of-00002.safetensors",
    "transformer/diffusion_pytorch_model-00002-of-00002.safetensors",
    "transformer/diffusion_pytorch_model.safetensors.index.json",
    "vae/config.json", "vae/diffusion_pytorch_model.safetensors",
    "LICENSE.md", "README.md", "SD3.5L_example_workflow.json", "mmdit.png", "sd3.5_large_demo.png"]
SD3_COMPONENTS = ["scheduler", "text_encoder", "text_encoder_2", "text_encoder_3", "tokenizer", "tokenizer_2",
                  "tokenizer_3", "transformer", "vae"]


def test_the_hub_fetch_of_sd35_large_takes_the_pipelines_files_once():
    wanted, renames = models.hub_selection(SD35_LARGE, SD3_COMPONENTS)
    assert not renames
    # No single-file copy, no second set of encoders (text_encoders/ holds T5 twice, fp16 and fp8).
    assert "sd3.5_large.safetensors" not in wanted
    assert not [f for f in wanted if f.startswith("text_encoders/")]
    assert {f for f in wanted if f.startswith("text_encoder_3/")} == {
        "text_encoder_3/config.json", "text_encoder_3/model-00001-of-00002.safetensors",
        "text_encoder_3/model-00002-of-00002.safetensors", "text_encoder_3/model.safetensors.index.json"}
    assert "tokenizer_3/spiece.model" in wanted and "tokenizer_3/tokenizer.json" in wanted
    assert "transformer/diffusion_pytorch_model.safetensors.index.json" in wanted
    assert {f.split("/")[0] for f in wanted if "/" in f} == set(SD3_COMPONENTS)


def _up(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["up", *args])
    return code, capsys.readouterr().err


def test_a_model_of_another_family_is_refused_before_launch(capsys, sdcloud_home, tmp_path):
    from sdcloud_agent.trainers import tiny

    sdxl = tiny.save_pipeline(tmp_path / "xl", family="sdxl")
    code, err = _up(capsys, "--tier", "sd35m-lora", "--model", str(sdxl))
    assert code == 2 and err.count("\n") == 1, err
    assert "is an sdxl model but tier sd35m-lora trains sd3" in err
    code, err = _up(capsys, "--tier", "sdxl-lora", "--model", str(tiny_folder()))
    assert code == 2 and err.count("\n") == 1 and "is an sd3 model but tier sdxl-lora trains sdxl" in err, err
    code, err = _up(capsys, "--tier", "sd15-lora", "--model", "tiny-sd3")
    assert code == 2 and "is an sd3 model" in err, err
    assert not (sdcloud_home / "local" / "hosts").exists()


def test_the_agent_loads_the_folder_as_sd3():
    c = models.load_components(str(tiny_folder()))
    assert models.family_of(c) == "sd3"
    assert type(c["transformer"]).__name__ == "SD3Transformer2DModel"
    assert type(c["text_encoder_3"]).__name__ == "T5EncoderModel" and c["vae"].config.latent_channels == 16
    assert type(c["scheduler"]).__name__ == "FlowMatchEulerDiscreteScheduler"
