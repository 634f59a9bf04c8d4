"""`batch submit --lora FILE`: the file's model family, told from its tensor names (the safetensors
header, read without torch), against the family the batch tier renders with.

A LoRA of another family loads into no layer of the tier's model: the images come out as if without
it and `verify` says ok. A training run's LoRA is checked by its tier (submit.py); a file carries
its family in its names, in either layout a user brings:

- SD3 / SD3.5: the diffusers layout `transformer.<block>...` (StableDiffusion3Pipeline's
  save_lora_weights), kohya's `lora_transformer_...`, or MMDiT's `joint_blocks`;
- SDXL: a second text encoder (`lora_te2_`, `text_encoder_2.`), or a UNet attention block with more
  than one transformer block (`transformer_blocks.1`: SD 1.5 and 2 have one per attention);
- SD 1.5 / 2: the UNet (`unet.`, `lora_unet_`, `down_blocks`) or its text encoder (`lora_te_`,
  `text_encoder.`) without those.

A name list that says none of these is left alone (an unknown layout is not refused); a file with no
tensors, or not a safetensors file at all, is refused.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import UserError

_SD3 = re.compile(r"^transformer\.|lora_transformer_|joint_blocks|context_block")
_SDXL = re.compile(r"lora_te2_|text_encoder_2\.|transformer_blocks[._][1-9]")
_SD15 = re.compile(r"^unet\.|lora_unet_|down_blocks|up_blocks|input_blocks|output_blocks|lora_te_|^text_encoder\.")


def family_of(names: list[str]) -> str | None:
    """sd3, sdxl, sd15 (SD 1.5 or 2) or None, from a LoRA file's tensor names."""
    if any(_SD3.search(n) for n in names):
        return "sd3"
    if any(_SDXL.search(n) for n in names):
        return "sdxl"
    if any(_SD15.search(n) for n in names):
        return "sd15"
    return None


def check_lora_file(path: str, tier: str, want: str, fitting: dict[str, str]) -> None:
    """Refuse (one line) a LoRA file of another family than `want` (tier `tier`'s), naming the batch
    tier of its family (`fitting`: tier by family)."""
    p = Path(path).expanduser()
    if p.suffix.lower() != ".safetensors":
        return  # a .bin or .pt LoRA: its names need torch to read; the worker's load decides
    from sdcloud_agent.trainers.safetensors_keys import names

    try:
        found = names(p)
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        why = str(exc).replace(f"{p}: ", "").removeprefix("not a safetensors file").strip(" ()")
        raise UserError(f"--lora {path}: not a safetensors file" + (f" ({why})" if why else "")) from None
    if not found:
        raise UserError(f"--lora {path}: the file holds no tensors, so no LoRA")
    family = family_of(found)
    if family is None or family == want or (want == "sd15" and family == "sd2"):
        return
    tier_of_it = fitting.get(family)
    raise UserError(f"--lora {path}: an {family} LoRA (by its tensor names), but {tier} renders with {want}"
                    + (f"; use --tier {tier_of_it}" if tier_of_it else "; use a LoRA of that family"))
