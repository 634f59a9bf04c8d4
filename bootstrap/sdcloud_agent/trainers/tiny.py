"""Tiny Stable Diffusion pipelines (SD1.5-, SD2- and SDXL-shaped) with random weights, built from small configs.

It lets the builtin trainer (and every test of the agent) run a real diffusers/peft training loop
on a CPU in milliseconds per step, with nothing downloaded. The weights depend only on
``model_seed``, so two processes build bitwise-identical models.

``python -m sdcloud_agent.trainers.tiny OUT`` writes it as a diffusers folder (loadable with
``StableDiffusionPipeline.from_pretrained(OUT, local_files_only=True)``).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from .families import FAMILIES, pipeline

# Latent down-sampling factor of the tiny VAE (two encoder blocks -> one down-sample).
VAE_SCALE = 2
MAX_TOKENS = 77


def _bytes_to_unicode() -> dict[int, str]:
    """The byte -> printable-character table that CLIP's byte-level BPE uses."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def write_tokenizer_files(folder: Path) -> None:
    """A CLIP vocabulary of single byte-characters and no merges: every word splits into
    characters. Enough to tokenize any caption deterministically without a download."""
    chars = list(_bytes_to_unicode().values())
    vocab: dict[str, int] = {}
    for c in chars:
        vocab[c] = len(vocab)
    for c in chars:
        vocab[c + "</w>"] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")


def build_tokenizer() -> Any:
    from transformers import CLIPTokenizer

    with tempfile.TemporaryDirectory(prefix="sdcloud-tiny-tok-") as tmp:
        write_tokenizer_files(Path(tmp))
        # from_pretrained reads vocab.json/merges.txt in transformers 4 and 5 alike (the
        # constructor's arguments changed between them).
        return CLIPTokenizer.from_pretrained(tmp, model_max_length=MAX_TOKENS,
                                             local_files_only=True)


def _text_encoder(tokenizer: Any, projection: bool = False) -> Any:
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cls = CLIPTextModelWithProjection if projection else CLIPTextModel
    return cls(CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=MAX_TOKENS, projection_dim=32,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id))


def build_components(resolution: int = 32, model_seed: int = 0,
                     family: str = "sd15") -> dict[str, Any]:
    """The components of a tiny pipeline of the given family's shape:

    sd15  one CLIP text encoder, epsilon prediction (SD 1.x layout);
    sd2   linear attention projections and v-prediction (SD 2.x layout);
    sdxl  two text encoders (the second with a projection: pooled embeddings), a UNet that takes
          text_embeds and time_ids (``addition_embed_type="text_time"``), cross-attention over
          both encoders' hidden states concatenated (SDXL layout).
    """
    import torch
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel

    if family not in FAMILIES:
        raise ValueError(f"tiny model family must be one of {FAMILIES}, not {family!r}")
    tokenizer = build_tokenizer()
    # Seed the global generator only for the duration of construction; restore it afterwards
    # so that building the model does not change what the caller's seeding produces.
    saved = torch.get_rng_state()
    out: dict[str, Any] = {"tokenizer": tokenizer}
    try:
        torch.manual_seed(model_seed)
        unet_kw: dict[str, Any] = dict(
            sample_size=resolution // VAE_SCALE, in_channels=4, out_channels=4,
            block_out_channels=(32, 64), layers_per_block=1,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=32, attention_head_dim=8, norm_num_groups=32)
        if family == "sd2":
            unet_kw.update(use_linear_projection=True)
        if family == "sdxl":
            # SDXL's conditioning: 6 time ids embedded to 8 each, plus the 32-wide pooled text
            # embedding of the second encoder; cross-attention width = 32 + 32.
            unet_kw.update(use_linear_projection=True, addition_embed_type="text_time",
                           addition_time_embed_dim=8, projection_class_embeddings_input_dim=6 * 8 + 32,
                           cross_attention_dim=64,
                           down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                           up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"))
        out["unet"] = UNet2DConditionModel(**unet_kw)
        torch.manual_seed(model_seed + 1)
        out["vae"] = AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64),
            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), layers_per_block=1,
            norm_num_groups=32, sample_size=resolution)
        torch.manual_seed(model_seed + 2)
        out["text_encoder"] = _text_encoder(tokenizer)
        if family == "sdxl":
            torch.manual_seed(model_seed + 3)
            out["text_encoder_2"] = _text_encoder(tokenizer, projection=True)
            out["tokenizer_2"] = build_tokenizer()
    finally:
        torch.set_rng_state(saved)
    out["scheduler"] = DDPMScheduler(
        num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
        clip_sample=False, steps_offset=1,
        prediction_type="v_prediction" if family == "sd2" else "epsilon")
    return out


def save_pipeline(out: Path, resolution: int = 32, model_seed: int = 0,
                  family: str = "sd15") -> Path:
    """Write the tiny pipeline as a local diffusers folder."""
    pipeline(build_components(resolution, model_seed, family)).save_pretrained(
        str(out), safe_serialization=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m sdcloud_agent.trainers.tiny OUT_DIR [sd15|sd2|sdxl]")
    print(save_pipeline(Path(sys.argv[1]), family=sys.argv[2] if len(sys.argv) == 3 else "sd15"))
