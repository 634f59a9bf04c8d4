"""A LoRA file on the tiny pipeline: loaded by the batch generator, it changes the images; the image
keys name the LoRA by content."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")


def _lora_file(tmp_path):
    from diffusers import StableDiffusionPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from sdcloud_agent.trainers import tiny

    c = tiny.build_components()
    unet = c["unet"]
    unet.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                                target_modules=["to_k", "to_q", "to_v", "to_out.0"]))
    with torch.no_grad():
        for name, p in unet.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # a strong, non-zero update: the images must change
    from diffusers.utils import convert_state_dict_to_diffusers

    StableDiffusionPipeline.save_lora_weights(tmp_path, unet_lora_layers=convert_state_dict_to_diffusers(
        get_peft_model_state_dict(unet)))
    return tmp_path / "pytorch_lora_weights.safetensors"


def test_lora_changes_the_images_and_its_identity_is_its_content(tmp_path):
    from sdcloud.batch.jobs import lora_identity
    from sdcloud_agent.batch.generate import DiffusersGenerator

    lora = _lora_file(tmp_path)
    settings = {"prompt": "a red cube", "negative_prompt": "", "steps": 2, "guidance": 5.0, "width": 64,
                "height": 64, "scheduler": "ddim"}
    plain = DiffusersGenerator.from_job({"model": "tiny", "tier": "batch-sd15"}).generate(settings, [1], threading.Event())
    with_lora = DiffusersGenerator.from_job({"model": "tiny", "tier": "batch-sd15", "lora": str(lora)}).generate(
        settings, [1], threading.Event())
    assert plain[0] != with_lora[0], "the LoRA was not applied"
    copy = tmp_path / "renamed" / lora.name
    copy.parent.mkdir()
    copy.write_bytes(lora.read_bytes())
    assert lora_identity(str(copy)) == lora_identity(str(lora)) and "@sha256:" in lora_identity(str(lora))
