"""The finished LoRA in the two layouts users load.

diffusers   ``pytorch_lora_weights.safetensors``: ``unet.<module>.lora_A/lora_B.weight`` (PEFT
            names), what ``pipe.load_lora_weights(folder)`` reads.
kohya       ``<name>.safetensors``: ``lora_unet_<module with _>.lora_down/lora_up.weight`` and
            ``.alpha`` per module, what A1111, ComfyUI and kohya sd-scripts read. SD1.x/SD2 keep
            the diffusers module names (the layout kohya writes for them); SDXL uses the SGM
            block names (input_blocks / middle_block / output_blocks) that kohya writes for SDXL.
"""

from __future__ import annotations

import re
from typing import Any

_PEFT = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")
_DOWN = re.compile(r"^down_blocks\.(\d+)\.attentions\.(\d+)\.(.+)$")
_UP = re.compile(r"^up_blocks\.(\d+)\.attentions\.(\d+)\.(.+)$")
_MID = re.compile(r"^mid_block\.attentions\.0\.(.+)$")


def sgm_module(module: str, layers_per_block: int) -> str:
    """A diffusers SDXL UNet attention module name in SGM numbering: each down block holds
    layers_per_block (resnet, attention) pairs and a downsampler; each up block one more pair."""
    if m := _DOWN.match(module):
        b, j, rest = int(m.group(1)), int(m.group(2)), m.group(3)
        return f"input_blocks.{1 + b * (layers_per_block + 1) + j}.1.{rest}"
    if m := _UP.match(module):
        b, j, rest = int(m.group(1)), int(m.group(2)), m.group(3)
        return f"output_blocks.{b * (layers_per_block + 1) + j}.1.{rest}"
    if m := _MID.match(module):
        return f"middle_block.1.{m.group(1)}"
    return module


def to_kohya(peft_sd: dict[str, Any], alpha: float, sdxl: bool = False,
             layers_per_block: int = 2) -> dict[str, Any]:
    """PEFT UNet LoRA weights (``<module>.lora_A.weight`` ...) -> kohya keys with alpha."""
    import torch

    out: dict[str, Any] = {}
    for key, value in peft_sd.items():
        m = _PEFT.match(key.removeprefix("unet."))
        if not m:
            raise ValueError(f"not a PEFT LoRA key: {key}")
        module = m.group("module")
        if sdxl:
            module = sgm_module(module, layers_per_block)
        name = "lora_unet_" + module.replace(".", "_")
        out[f"{name}.{'lora_down' if m.group('ab') == 'A' else 'lora_up'}.weight"] = value.contiguous()
        out[f"{name}.alpha"] = torch.tensor(float(alpha))
    return out
