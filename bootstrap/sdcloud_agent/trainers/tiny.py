"""Tiny Stable Diffusion pipelines (SD1.5-, SD2-, SDXL- and SD3-shaped) with random weights, built from small configs.

It lets the builtin trainer (and every test of the agent) run a real diffusers/peft training loop
on a CPU in milliseconds per step, with nothing downloaded. The weights depend only on
``model_seed``, so two processes build bitwise-identical models.

``python -m sdcloud_agent.trainers.tiny OUT`` writes it as a diffusers folder (loadable with
``StableDiffusionPipeline.from_pretrained(OUT, local_files_only=True)``; the sd3 one with
``StableDiffusion3Pipeline``).

Tokenizers are written locally too: CLIP's as a byte-character vocabulary without merges, T5's as
a character Unigram model (the `tokenizers` library) -- nothing is fetched from the hub.
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


def build_t5_tokenizer() -> Any:
    """A T5 tokenizer (SentencePiece-style Unigram over single characters, `</s>` appended, `<pad>`
    id 0 as in T5) built in memory: what SD3's third tokenizer does, without a download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import T5TokenizerFast

    chars = sorted(set(_bytes_to_unicode().values()) - {"\u2581"})
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -1.0)] + [(c, -2.0) for c in chars]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", 1)])
    return T5TokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                           extra_ids=0, model_max_length=MAX_TOKENS)


def _sd3_components(resolution: int, model_seed: int) -> dict[str, Any]:
    """SD3's layout at toy size: an MMDiT transformer on 16-channel latents, two CLIP encoders with
    projections (their hidden states side by side, 16 + 16, pooled 16 + 16) and a T5 encoder whose
    width (32) the CLIP states are padded to, as the pipeline does; the flow-matching scheduler with
    SD3's shift of 3."""
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    out: dict[str, Any] = {"tokenizer": build_tokenizer(), "tokenizer_2": build_tokenizer(),
                           "tokenizer_3": build_t5_tokenizer()}
    tok = out["tokenizer"]
    torch.manual_seed(model_seed)
    out["transformer"] = SD3Transformer2DModel(
        sample_size=resolution // VAE_SCALE, patch_size=2, in_channels=16, out_channels=16, num_layers=2,
        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16,
        pooled_projection_dim=32, pos_embed_max_size=32)
    torch.manual_seed(model_seed + 1)
    out["vae"] = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(16, 32),
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), layers_per_block=1,
        norm_num_groups=8, sample_size=resolution, shift_factor=0.0609, scaling_factor=1.5305,
        use_quant_conv=False, use_post_quant_conv=False)
    for i, name in enumerate(("text_encoder", "text_encoder_2")):
        torch.manual_seed(model_seed + 2 + i)
        out[name] = CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=MAX_TOKENS, projection_dim=16,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    torch.manual_seed(model_seed + 4)
    t5 = out["tokenizer_3"]
    out["text_encoder_3"] = T5EncoderModel(T5Config(
        vocab_size=len(t5), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=t5.pad_token_id, eos_token_id=t5.eos_token_id,
        decoder_start_token_id=t5.pad_token_id))
    out["scheduler"] = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    return out


def build_components(resolution: int = 32, model_seed: int = 0,
                     family: str = "sd15") -> dict[str, Any]:
    """The components of a tiny pipeline of the given family's shape:

    sd15  one CLIP text encoder, epsilon prediction (SD 1.x layout);
    sd2   linear attention projections and v-prediction (SD 2.x layout);
    sdxl  two text encoders (the second with a projection: pooled embeddings), a UNet that takes
          text_embeds and time_ids (``addition_embed_type="text_time"``), cross-attention over
          both encoders' hidden states concatenated (SDXL layout);
    sd3   an MMDiT transformer, three text encoders (T5 among them), a 16-channel VAE and the
          flow-matching scheduler (SD3 / SD3.5 layout).
    """
    import torch
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel

    if family not in FAMILIES:
        raise ValueError(f"tiny model family must be one of {FAMILIES}, not {family!r}")
    if family == "sd3":
        saved = torch.get_rng_state()
        try:
            return _sd3_components(resolution, model_seed)
        finally:
            torch.set_rng_state(saved)
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
        sys.exit("usage: python -m sdcloud_agent.trainers.tiny OUT_DIR [sd15|sd2|sdxl|sd3]")
    print(save_pipeline(Path(sys.argv[1]), family=sys.argv[2] if len(sys.argv) == 3 else "sd15"))
