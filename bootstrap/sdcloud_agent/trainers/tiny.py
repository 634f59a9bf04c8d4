"""A tiny Stable Diffusion pipeline with random weights, built from small configs.

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


def build_components(resolution: int = 32, model_seed: int = 0) -> dict[str, Any]:
    """unet, vae, text_encoder, tokenizer, scheduler of a tiny SD-1.x-shaped pipeline."""
    import torch
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    tokenizer = build_tokenizer()
    # Seed the global generator only for the duration of construction; restore it afterwards
    # so that building the model does not change what the caller's seeding produces.
    saved = torch.get_rng_state()
    try:
        torch.manual_seed(model_seed)
        unet = UNet2DConditionModel(
            sample_size=resolution // VAE_SCALE, in_channels=4, out_channels=4,
            block_out_channels=(32, 64), layers_per_block=1,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=32, attention_head_dim=8, norm_num_groups=32)
        torch.manual_seed(model_seed + 1)
        vae = AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64),
            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), layers_per_block=1,
            norm_num_groups=32, sample_size=resolution)
        torch.manual_seed(model_seed + 2)
        text_encoder = CLIPTextModel(CLIPTextConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=MAX_TOKENS, projection_dim=32,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id))
    finally:
        torch.set_rng_state(saved)
    scheduler = DDPMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                              beta_schedule="scaled_linear", clip_sample=False,
                              steps_offset=1)
    return {"unet": unet, "vae": vae, "text_encoder": text_encoder, "tokenizer": tokenizer,
            "scheduler": scheduler}


def save_pipeline(out: Path, resolution: int = 32, model_seed: int = 0) -> Path:
    """Write the tiny pipeline as a local diffusers folder."""
    from diffusers import StableDiffusionPipeline

    c = build_components(resolution, model_seed)
    pipe = StableDiffusionPipeline(**c, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.save_pretrained(str(out), safe_serialization=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m sdcloud_agent.trainers.tiny OUT_DIR")
    print(save_pipeline(Path(sys.argv[1])))
