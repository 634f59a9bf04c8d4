"""GPU benchmark: images/s of sdcloud's batch generator for SD1.5 (512 px, 30 steps) and SDXL (1024 px,
30 steps), full-size architectures built from the published model configs with random weights (no
download; random weights run the same arithmetic as trained ones).

    python bench/batch_gpu.py [--family sd15,sdxl] [--images 16] [--compile]

Without CUDA it says so and exits 3. Anchors for the same GPU class (diffusers' fast-inference
figures on an A100-80GB): SDXL about 0.39 images/s with bf16, SDPA and torch.compile; SD1.5 about
2 images/s. Last line: batch_gpu gpu=<name> sd15_ips=<x> sdxl_ips=<y>
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bootstrap"))

ANCHORS = {"sd15": ("about 2 images/s on an A100 (diffusers, fp16, SDPA)", 2.0),
           "sdxl": ("about 0.39 images/s on an A100 (diffusers fast-inference guide: bf16, SDPA, compile)", 0.39)}


def _vae():
    from diffusers import AutoencoderKL

    # Both families share the published 4-channel KL autoencoder shape.
    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(128, 256, 512, 512),
                         down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                         layers_per_block=2, norm_num_groups=32, sample_size=512)


def _clip(hidden: int, layers: int, heads: int, inter: int, act: str, projection: bool, tok):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(vocab_size=49408, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, max_position_embeddings=77, hidden_act=act,
                         projection_dim=hidden if projection else 768, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(cfg)


def build(family: str, dtype):
    from diffusers import (EulerDiscreteScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline,
                           UNet2DConditionModel)

    from sdcloud_agent.trainers.tiny import build_tokenizer

    tok = build_tokenizer()  # any CLIP-style tokenizer: the cost is in the networks, not the vocabulary
    sched = EulerDiscreteScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                                   beta_schedule="scaled_linear", steps_offset=1)
    if family == "sd15":
        unet = UNet2DConditionModel(sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
                                    block_out_channels=(320, 640, 1280, 1280), cross_attention_dim=768,
                                    attention_head_dim=8,
                                    down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
                                    up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3)
        te = _clip(768, 12, 12, 3072, "quick_gelu", False, tok)
        pipe = StableDiffusionPipeline(vae=_vae(), text_encoder=te, tokenizer=tok, unet=unet, scheduler=sched,
                                       safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    else:
        unet = UNet2DConditionModel(sample_size=128, in_channels=4, out_channels=4, layers_per_block=2,
                                    block_out_channels=(320, 640, 1280), cross_attention_dim=2048,
                                    attention_head_dim=(5, 10, 20), transformer_layers_per_block=(1, 2, 10),
                                    use_linear_projection=True, addition_embed_type="text_time",
                                    addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816,
                                    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                                    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"))
        te1 = _clip(768, 12, 12, 3072, "quick_gelu", False, tok)
        te2 = _clip(1280, 32, 20, 5120, "gelu", True, tok)
        pipe = StableDiffusionXLPipeline(vae=_vae(), text_encoder=te1, text_encoder_2=te2, tokenizer=tok,
                                         tokenizer_2=tok, unet=unet, scheduler=sched)
    return pipe.to("cuda", dtype)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", default="sd15,sdxl")
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--record", action="store_true", help="Record each figure with sdcloud speeds add.")
    ap.add_argument("--smoke", action="store_true", help="a quick form for the test suite: SD1.5, 1 image")
    args = ap.parse_args()
    if args.smoke:
        args.family, args.images = "sd15", 1
    import torch

    if not torch.cuda.is_available():
        print("batch_gpu: no CUDA device here; run this on a GPU host (nothing measured)", file=sys.stderr)
        return 3
    from sdcloud_agent.batch.generate import DiffusersGenerator, choose_dtype

    dtype = choose_dtype(torch, "cuda")
    gpu = torch.cuda.get_device_name(0)
    figures = {}
    for family in args.family.split(","):
        size = 512 if family == "sd15" else 1024
        gen = DiffusersGenerator(build(family, dtype), family, "cuda", compile_unet=args.compile)
        settings = {"prompt": "a studio photo of a red sneaker", "negative_prompt": "", "steps": 30, "guidance": 7.5,
                    "width": size, "height": size, "scheduler": "euler"}
        gen._size_batch(size, size)
        bs = gen.batch_size
        gen.generate(settings, list(range(bs)), threading.Event())  # warm-up (and compile)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        made = 0
        while made < args.images:
            made += len(gen.generate(settings, list(range(made, made + bs)), threading.Event()))
        torch.cuda.synchronize()
        ips = made / (time.perf_counter() - t0)
        figures[family] = ips
        print(f"{family}: {ips:.3f} images/s at {size} px, 30 steps, batch {bs}, {str(dtype).split('.')[-1]} on {gpu}"
              f"  (anchor: {ANCHORS[family][0]})")
        del gen
        torch.cuda.empty_cache()
    print(f"batch_gpu gpu={gpu.replace(' ', '_')} " + " ".join(f"{k}_ips={v:.3f}" for k, v in figures.items()))
    import speed_lines

    for family, ips in figures.items():  # the batch tiers are 30 sampling steps at the family's size
        speed_lines.emit(gpu, f"batch-{family}", ips, "bench/batch_gpu.py (30 steps)", args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
