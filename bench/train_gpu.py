"""Benchmark: peak VRAM and speed of each training tier's memory recipe on this machine's GPU.

    python bench/train_gpu.py [--tiers sd15-lora,sdxl-lora] [--steps 10] [--warmup 3]

It builds the full-size SD 1.5 and SDXL UNets from their published configs with random weights
(nothing is downloaded), and for each tier (family, mode, resolution, batch size from
sdcloud/data/tiers.toml) runs every recipe of sdcloud_agent/trainers/recipes.py the way the
builtin trainer does: latents and text embeddings cached (random tensors of the real shapes, the
encoders are not on the GPU), LoRA rank 4 on the attention projections or the full UNet, bf16 on
compute capability >= 8 else fp16 with a scaler. One line per recipe:

  train_gpu tier=<t> recipe=<ckpt,optimizer,batch x accum> peak_vram_gb=<x> it_per_s=<y>
            floor_gb=<tier min_vram_gb> floor_source="<what the floor cites>"

and for each tier, the recipe the builtin trainer would choose on this GPU as the line that records
it (`speeds: sdcloud speeds add --gpu G --tier T --rate R ...`; with --record it is recorded here).

Without a CUDA GPU it prints why and exits 1.
"""

from __future__ import annotations

import argparse
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bootstrap"))

# The published UNet configs (stable-diffusion-v1-5 and stable-diffusion-xl-base-1.0 unet/config.json).
SD15_UNET = dict(sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
                 block_out_channels=(320, 640, 1280, 1280), cross_attention_dim=768, attention_head_dim=8,
                 down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
                 up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3)
SDXL_UNET = dict(sample_size=128, in_channels=4, out_channels=4, layers_per_block=2,
                 block_out_channels=(320, 640, 1280), transformer_layers_per_block=(1, 2, 10),
                 attention_head_dim=(5, 10, 20), cross_attention_dim=2048, use_linear_projection=True,
                 addition_embed_type="text_time", addition_time_embed_dim=256,
                 projection_class_embeddings_input_dim=2816,
                 down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                 up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"))
TOKENS = 77


def tiers() -> dict:
    return tomllib.loads((ROOT / "sdcloud" / "data" / "tiers.toml").read_text())["tiers"]


def run_recipe(torch, tier: dict, recipe, steps: int, warmup: int) -> tuple[float, float]:
    from diffusers import UNet2DConditionModel

    from sdcloud_agent.trainers.builtin import LORA_TARGETS, auto_precision, make_optimizer

    dev = torch.device("cuda")
    sdxl = tier["family"] == "sdxl"
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    unet = UNet2DConditionModel(**(SDXL_UNET if sdxl else SD15_UNET)).to(dev)
    if tier["mode"] == "lora":
        from peft import LoraConfig

        unet.requires_grad_(False)
        # Frozen base weights in half precision, as a LoRA run keeps them; the adapter in fp32.
        unet.to(torch.bfloat16 if auto_precision(torch, dev) == "bf16" else torch.float16)
        unet.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian", target_modules=LORA_TARGETS))
    params = [p for p in unet.parameters() if p.requires_grad]
    for p in params:
        p.data = p.data.float()
    if recipe.gradient_checkpointing:
        unet.enable_gradient_checkpointing()
    unet.train()
    args = argparse.Namespace(optimizer=recipe.optimizer, lr=1e-4)
    opt = make_optimizer(args, params, dev)
    mp = auto_precision(torch, dev)
    dtype = torch.bfloat16 if mp == "bf16" else torch.float16
    scaler = torch.amp.GradScaler("cuda") if mp == "fp16" else None
    per_step = int(tier["batch_size"])
    batch = max(d for d in range(1, recipe.max_batch + 1) if per_step % d == 0)
    accum = per_step // batch
    lat = tier["resolution"] // 8
    width = 2048 if sdxl else 768

    def step() -> None:
        for _ in range(accum):
            x = torch.randn(batch, 4, lat, lat, device=dev)
            t = torch.randint(0, 1000, (batch,), device=dev)
            enc = torch.randn(batch, TOKENS, width, device=dev)
            kw = {}
            if sdxl:
                kw["added_cond_kwargs"] = {"text_embeds": torch.randn(batch, 1280, device=dev),
                                           "time_ids": torch.tensor([[1024, 1024, 0, 0, 1024, 1024]] * batch,
                                                                    device=dev, dtype=torch.float32)}
            with torch.autocast("cuda", dtype=dtype):
                pred = unet(x, t, enc, **kw).sample
            loss = torch.nn.functional.mse_loss(pred.float(), x) / accum
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    rate = steps / (time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**30
    del unet, opt, params
    return peak, rate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiers", default="sd15-lora,sdxl-lora,sd15-dreambooth,sdxl-dreambooth")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--record", action="store_true", help="Record each tier's figure with sdcloud speeds add.")
    p.add_argument("--smoke", action="store_true", help="a quick form for the test suite: sd15-lora, 1 step")
    a = p.parse_args(argv)
    if a.smoke:
        a.tiers, a.steps, a.warmup = "sd15-lora", 1, 0
    try:
        import torch
    except ImportError:
        print("train_gpu: torch is not installed; nothing measured", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("train_gpu: needs a CUDA GPU (torch.cuda.is_available() is False on this machine); "
              "nothing measured. Run it on a GPU host: python bench/train_gpu.py", file=sys.stderr)
        return 1
    from sdcloud_agent.trainers import recipes

    name = torch.cuda.get_device_name(0)
    cap = ".".join(map(str, torch.cuda.get_device_capability(0)))
    print(f"train_gpu gpu={name!r} capability={cap} usable_gb={recipes.usable_vram_gb(torch, 0):.1f}")
    import speed_lines

    all_tiers = tiers()
    usable = recipes.usable_vram_gb(torch, 0)
    for tname in a.tiers.split(","):
        tier = all_tiers[tname]
        fam = "sd15" if tier["family"] == "sd2" else tier["family"]
        chosen = recipes.choose(tier["family"], tier["mode"], tier["resolution"], usable)
        for _need, recipe in recipes.TABLE[(fam, tier["mode"])]:
            rate = 0.0
            try:
                peak, rate = run_recipe(torch, tier, recipe, a.steps, a.warmup)
                got = f"peak_vram_gb={peak:.2f} it_per_s={rate:.3f}"
            except torch.cuda.OutOfMemoryError:
                got = "peak_vram_gb=OOM it_per_s=0"
            except Exception as exc:  # noqa: BLE001 - e.g. bitsandbytes missing: say so, go on
                got = f"error={type(exc).__name__}:{str(exc)[:80]!r}"
            torch.cuda.empty_cache()
            src = tier.get("sources", {}).get("min_vram_gb", "")
            print(f"train_gpu tier={tname} recipe={recipe.describe().replace(' ', '_')} {got} "
                  f"floor_gb={tier['min_vram_gb']} floor_source={src!r}", flush=True)
            if recipe == chosen and rate > 0:  # the recipe the builtin trainer runs here: the tier's figure
                speed_lines.emit(name, tname, rate, f"bench/train_gpu.py ({recipe.describe()}, step only)",
                                 a.record, trainer="builtin")
    return 0


if __name__ == "__main__":
    sys.exit(main())
