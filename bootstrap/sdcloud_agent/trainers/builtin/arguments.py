"""The trainer's flags. Pure (no torch): the control plane checks `--trainer-arg` with the same
parser before launch (sdcloud/runs/inputs/preflight.py).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    """The trainer's flags. Pure (no torch): the control plane checks `--trainer-arg` with it
    before launch (sdcloud/runs/inputs/preflight.py)."""
    env = os.environ
    p = argparse.ArgumentParser(
        prog="python -m sdcloud_agent.trainers.builtin",
        description="LoRA / DreamBooth trainer for Stable Diffusion that survives spot reclaims.")
    p.add_argument("--model", default="tiny",
                   help="tiny / tiny-sd15 / tiny-sd2 / tiny-sdxl / tiny-sd3 (random tiny pipelines, for tests), a "
                        "local diffusers folder, a single-file .safetensors checkpoint or a hub id")
    p.add_argument("--family", default="auto",
                   help="the family the model must be: sd15, sd2, sdxl, sd3 or a comma list such as "
                        "sd15,sd2 (exit 2 otherwise); for plain 'tiny', the first one")
    p.add_argument("--model-config", default=None,
                   help="single-file checkpoints: a diffusers folder or hub id with the configs")
    p.add_argument("--prediction-type", choices=["auto", "epsilon", "v_prediction"], default="auto",
                   help="auto: the model's scheduler config (SD2 768 models are v_prediction)")
    p.add_argument("--mode", choices=["lora", "dreambooth"], default="lora")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="images (png/jpg/webp) with optional same-name .txt captions")
    p.add_argument("--synthetic", type=int, default=None, metavar="N",
                   help="train on N generated images (the default, with N=8, without --data-dir)")
    p.add_argument("--instance-prompt", default="a photo of sks",
                   help="caption for images that have no .txt")
    p.add_argument("--resolution", type=int, default=None,
                   help="training resolution: the side of a square, or the area (side^2) of the "
                        "aspect-ratio buckets (default 32 for tiny, 1024 for SDXL, 512 otherwise)")
    p.add_argument("--buckets", action=argparse.BooleanOptionalAction, default=None,
                   help="aspect-ratio buckets instead of square centre crops (default: on for SDXL)")
    p.add_argument("--steps", type=int, required=True, help="total optimizer steps (global)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--grad-accum", type=int, default=None,
                   help="micro-batches of --batch-size per optimizer step (default: the memory recipe's, else 1)")
    p.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                   help="recompute UNet activations in the backward pass (less VRAM, ~25%% slower; "
                        "default: the memory recipe's)")
    p.add_argument("--optimizer", choices=["adamw", "adamw8bit", "adafactor"], default=None,
                   help="adamw8bit needs bitsandbytes and CUDA (default: the memory recipe's, else adamw)")
    p.add_argument("--optimizer-change", action="store_true",
                   help="resume from a checkpoint saved with another --optimizer: keep its weights, "
                        "LR schedule and RNG, start the new optimizer's state afresh (the agent's "
                        "out-of-memory ladder uses it; otherwise such a resume is refused)")
    p.add_argument("--memory-recipe", choices=["auto", "off"], default="auto",
                   help="auto: on CUDA, pick gradient checkpointing, the optimizer and the micro-batch "
                        "from the GPU's usable VRAM (trainers/recipes.py); flags given win")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--lr-scheduler", default="constant",
                   choices=["constant", "constant_with_warmup", "linear", "cosine"])
    p.add_argument("--lr-warmup-steps", type=int, default=0)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--rank", type=int, default=4, help="LoRA rank (alpha = rank)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mixed-precision", choices=["auto", "no", "fp16", "bf16"], default="auto",
                   help="auto: bf16 on compute capability >= 8 (A10G, A100, L4, H100), fp16 with a "
                        "loss scaler below (T4, V100), no on CPU")
    p.add_argument("--validation-prompt", action="extend", nargs="+", default=[], metavar="TEXT",
                   help="render this prompt (fixed seed) into samples/ of every checkpoint; repeatable")
    p.add_argument("--validation-steps", type=int, default=20,
                   help="sampling steps of the validation images")
    p.add_argument("--sample-every", type=int, default=0, metavar="K",
                   help="render the validation prompts only into checkpoints whose step is a multiple of K, and "
                        "the last (0: every checkpoint)")
    p.add_argument("--sample-seed", type=int, default=None, metavar="SEED",
                   help="the first validation prompt's seed; prompt i renders with SEED+i (default: --seed)")
    p.add_argument("--weighting-scheme", choices=["logit_normal", "none", "sigma_sqrt", "mode", "cosmap"],
                   default="logit_normal",
                   help="sd3 only: where sigma is drawn and how the error is weighted, the diffusers SD3 "
                        "scripts' --weighting_scheme choices (none: uniform draw, unit weights); "
                        "logit_normal is the SD3 paper's")
    p.add_argument("--precondition-outputs", action=argparse.BooleanOptionalAction, default=False,
                   help="sd3 only: the error taken on the latent (the diffusers SD3 scripts' default, "
                        "which weights the velocity error by sigma squared), not on the velocity")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--min-step-seconds", type=float, default=0.0, metavar="S",
                   help="pace: let each step take at least S seconds (demos of the tiny model, so a "
                        "person can watch a reclaim land mid-run); 0 = full speed")
    p.add_argument("--checkpoint-dir", type=Path,
                   default=Path(env.get("SDCLOUD_CHECKPOINT_DIR") or "checkpoints"))
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="K",
                   help="save every K global steps (0: only on signals and at the end)")
    p.add_argument("--keep-checkpoints", type=int, default=0, metavar="N",
                   help="delete all but the newest N checkpoints after each save (0: keep all)")
    p.add_argument("--resume-from", default=env.get("SDCLOUD_RESUME_FROM") or None,
                   help="a step-* checkpoint folder, a folder of them (newest complete one), or "
                        "'latest' (newest in --checkpoint-dir; start fresh when there is none)")
    p.add_argument("--output", type=Path, default=Path(env.get("SDCLOUD_OUTPUT_DIR") or "output"),
                   help="where the final weights go")
    return p


def parse_args(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The flags, parsed and checked together (`parser`: one whose error() raises, for a check)."""
    p = parser or build_parser()
    a = p.parse_args(argv)
    if a.steps < 1:
        p.error("--steps must be >= 1")
    if (a.batch_size < 1 or a.rank < 1 or (a.grad_accum or 1) < 1 or a.checkpoint_every < 0
            or a.keep_checkpoints < 0 or a.sample_every < 0):
        p.error("--batch-size, --grad-accum and --rank must be >= 1; --checkpoint-every, "
                "--keep-checkpoints >= 0")
    families = [f for f in a.family.split(",") if f] if a.family != "auto" else []
    if any(f not in ("sd15", "sd2", "sdxl", "sd3") for f in families):
        p.error(f"--family must be auto or a comma list of sd15, sd2, sdxl, sd3, got {a.family!r}")
    a.families = families
    if a.resolution is None:
        a.resolution = 32 if a.model.startswith("tiny") else (1024 if families[:1] in (["sdxl"], ["sd3"]) else 512)
    if a.resolution % 8:
        p.error("--resolution must be a multiple of 8")
    if a.data_dir is None and a.synthetic is None:
        a.synthetic = 8
    if a.data_dir is not None and a.synthetic is not None:
        p.error("--data-dir and --synthetic are exclusive")
    return a
