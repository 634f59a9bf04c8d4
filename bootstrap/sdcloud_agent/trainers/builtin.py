"""sdcloud's builtin Stable Diffusion trainer: LoRA (default) or DreamBooth (full UNet fine-tune)
of SD 1.x, SD 2.x (v-prediction included) and SDXL models (models.py), with the memory recipe of
the GPU (recipes.py), one process per GPU when launched data-parallel (Dist below).

    python -m sdcloud_agent.trainers.builtin --model tiny --steps 100 --checkpoint-every 20 ...

The contract with the host agent (the agent runs this as a child in its own process group and
talks to it through nothing else; docs/trainer-builtin.md has the long form):

Flags        see ``--help``. Environment defaults: ``SDCLOUD_CHECKPOINT_DIR`` (--checkpoint-dir),
             ``SDCLOUD_RESUME_FROM`` (--resume-from), ``SDCLOUD_OUTPUT_DIR`` (--output).
stdout       only protocol lines, each ``SDCLOUD_<KIND> <one-line JSON>``, flushed at once:
               START       {"step", "total_steps", "resumed_from"}   once, before the first step
               STEP        {"step", "loss", "lr", "it_per_s"}         after every optimizer step
               CHECKPOINT  {"step", "path"}      after a checkpoint folder is complete (renamed)
               DONE        {"step", "output"}    after the final weights are written
             Everything else (logs, library warnings) goes to stderr.
Signals      SIGTERM / SIGINT: finish the current optimizer step, save a checkpoint, print its
             line, exit 143 (SIGINT: 130). SIGUSR1: same save, then keep training.
             Handlers only set flags; the loop acts on them between steps, so a checkpoint never
             holds a half-updated state.
Checkpoints  ``<checkpoint-dir>/step-<global_step:09d>/`` holding weights (safetensors),
             optimizer.pt, scheduler.pt, rng.json, rng.safetensors and trainer_state.json
             (written last). Built in ``.tmp-step-*`` and renamed into place after fsync, so a
             ``step-*`` folder is always complete; ``.tmp-*`` folders are garbage.
Resume       ``--resume-from CKPT|DIR|latest`` restores weights, optimizer, LR schedule and RNG
             and trains global steps last+1..N. The data order and the noise of step s depend only
             on (seed, s), so an interrupted-and-resumed run ends with the same weights as an
             uninterrupted one.
Exit codes   0 done, 143 stopped by SIGTERM (checkpoint saved), 130 by SIGINT, 2 bad usage or
             an unusable checkpoint, 1 any other failure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_SIGTERM, EXIT_SIGINT = 143, 130
CHECKPOINT_RE = re.compile(r"^step-(\d{9})$")
TMP_PREFIX = ".tmp-step-"
STATE_FILE = "trainer_state.json"
IMAGE_EXTS = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}
LORA_TARGETS = ["to_k", "to_q", "to_v", "to_out.0"]
# Test hook: seconds to sleep inside a checkpoint save, after the weights are written and before
# trainer_state.json, so a test can kill -9 the process mid-save. Never set it in production.
SAVE_PAUSE_ENV = "SDCLOUD_TRAINER_SAVE_PAUSE"
# Test hook: "STEP:FLAG" raises torch.cuda.OutOfMemoryError at global step STEP unless FLAG (an
# attribute of the parsed flags, e.g. gradient_checkpointing) is on: the agent's OOM ladder
# (sdcloud_agent/oom.py) is driven by it without a GPU. Never set it in production.
OOM_AT_ENV = "SDCLOUD_TRAINER_OOM_AT"
# Test hook: seconds each sample's read takes (a slow dataset disk), counted as data wait.
READ_DELAY_ENV = "SDCLOUD_TRAINER_READ_DELAY"


class UsageError(Exception):
    """Bad flags or an unusable checkpoint: exit 2 with one line on stderr."""


class Stopped(Exception):
    """SIGTERM/SIGINT before training started: nothing new to save."""


_protocol = sys.stdout  # replaced by reserve_stdout() in main()


def reserve_stdout() -> None:
    """Keep stdout for protocol lines only: protocol writes go to a duplicate of fd 1, and fd 1
    itself (Python prints, C libraries, tqdm misconfigured to stdout) now points at stderr."""
    global _protocol
    sys.stdout.flush()
    _protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def emit(kind: str, payload: dict[str, Any]) -> None:
    if DIST.rank:  # in a multi-process run only rank 0 speaks the protocol
        return
    _protocol.write(f"SDCLOUD_{kind} {json.dumps(payload, separators=(', ', ': '))}\n")
    _protocol.flush()


def log(msg: str) -> None:
    print(f"[sdcloud-builtin] {msg}", file=sys.stderr, flush=True)


class Dist:
    """Data-parallel training across processes (one per GPU; gloo processes on a CPU), started by
    `accelerate launch` or torchrun, which set RANK / WORLD_SIZE / LOCAL_RANK. Every rank holds the
    same weights (same seeded init, the same summed gradients each step); a step's samples are
    split between ranks; rank 0 alone writes checkpoints, the output and protocol lines. Stop and
    save requests are agreed by all ranks after each step, so all stop at the same step."""

    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE") or 1)
        self.rank = int(os.environ.get("RANK") or 0)
        self.local_rank = int(os.environ.get("LOCAL_RANK") or 0)
        self.torch: Any = None

    @property
    def on(self) -> bool:
        return self.world > 1

    def init(self, torch: Any, device_type: str) -> None:
        if self.on and not torch.distributed.is_initialized():
            self.torch = torch
            torch.distributed.init_process_group("nccl" if device_type == "cuda" else "gloo")

    def any(self, flag: bool) -> bool:
        if not self.on:
            return flag
        t = self.torch.tensor([1 if flag else 0])
        self.torch.distributed.all_reduce(t, op=self.torch.distributed.ReduceOp.MAX)
        return bool(t.item())

    def sum_(self, tensor: Any) -> None:
        if self.on:
            self.torch.distributed.all_reduce(tensor, op=self.torch.distributed.ReduceOp.SUM)

    def barrier(self) -> None:
        if self.on:
            self.torch.distributed.barrier()

    def close(self) -> None:
        if self.on and self.torch is not None and self.torch.distributed.is_initialized():
            self.torch.distributed.destroy_process_group()


DIST = Dist()


class Signals:
    """Flags set by signal handlers; the training loop polls them between optimizer steps."""

    def __init__(self) -> None:
        self.stop: int | None = None  # the signal number that asked us to stop
        self.save = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGUSR1, self._on_save)

    def _on_stop(self, signum: int, _frame: Any) -> None:
        self.stop = self.stop or signum

    def _on_save(self, _signum: int, _frame: Any) -> None:
        self.save = True

    def exit_code(self) -> int:
        return EXIT_SIGINT if self.stop == signal.SIGINT else EXIT_SIGTERM

    def wait(self, seconds: float) -> None:
        """Sleep up to `seconds`, waking early when a signal asks to stop or save."""
        end = time.monotonic() + seconds
        while not (self.stop or self.save) and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.05))


# ---------------------------------------------------------------------------------------------
# Flags

def build_parser() -> argparse.ArgumentParser:
    """The trainer's flags. Pure (no torch): the control plane checks `--trainer-arg` with it
    before launch (sdcloud/runs/preflight.py)."""
    env = os.environ
    p = argparse.ArgumentParser(
        prog="python -m sdcloud_agent.trainers.builtin",
        description="LoRA / DreamBooth trainer for Stable Diffusion that survives spot reclaims.")
    p.add_argument("--model", default="tiny",
                   help="tiny / tiny-sd15 / tiny-sd2 / tiny-sdxl (random tiny pipelines, for tests), a "
                        "local diffusers folder, a single-file .safetensors checkpoint or a hub id")
    p.add_argument("--family", default="auto",
                   help="the family the model must be: sd15, sd2, sdxl or a comma list such as "
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
            or a.keep_checkpoints < 0):
        p.error("--batch-size, --grad-accum and --rank must be >= 1; --checkpoint-every, "
                "--keep-checkpoints >= 0")
    families = [f for f in a.family.split(",") if f] if a.family != "auto" else []
    if any(f not in ("sd15", "sd2", "sdxl") for f in families):
        p.error(f"--family must be auto or a comma list of sd15, sd2, sdxl, got {a.family!r}")
    a.families = families
    if a.resolution is None:
        a.resolution = 32 if a.model.startswith("tiny") else (1024 if families[:1] == ["sdxl"] else 512)
    if a.resolution % 8:
        p.error("--resolution must be a multiple of 8")
    if a.data_dir is None and a.synthetic is None:
        a.synthetic = 8
    if a.data_dir is not None and a.synthetic is not None:
        p.error("--data-dir and --synthetic are exclusive")
    return a


# ---------------------------------------------------------------------------------------------
# Checkpoint folders (no torch needed)

def list_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in folder, oldest first. ``.tmp-*`` folders never count."""
    found = []
    if folder.is_dir():
        for child in folder.iterdir():
            m = CHECKPOINT_RE.match(child.name)
            if m and (child / STATE_FILE).is_file():
                found.append((int(m.group(1)), child))
    return sorted(found)


def resolve_resume(arg: str | None, checkpoint_dir: Path) -> Path | None:
    if not arg:
        return None
    if arg == "latest":
        ckpts = list_checkpoints(checkpoint_dir)
        return ckpts[-1][1] if ckpts else None
    path = Path(arg)
    if (path / STATE_FILE).is_file():
        return path
    ckpts = list_checkpoints(path)
    if ckpts:
        return ckpts[-1][1]
    raise UsageError(f"--resume-from {arg}: not a complete checkpoint nor a folder holding one")


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_tmp(checkpoint_dir: Path) -> None:
    """Half-written checkpoints of a killed earlier process: we are the only writer here."""
    if checkpoint_dir.is_dir():
        for child in checkpoint_dir.iterdir():
            if child.name.startswith((TMP_PREFIX, ".old-step-")) and child.is_dir():
                shutil.rmtree(child, ignore_errors=True)


def step_seed(seed: int, step: int, purpose: str) -> int:
    """A 63-bit seed that depends only on (seed, step, purpose): resume-proof randomness."""
    digest = hashlib.sha256(f"{seed}:{step}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


# ---------------------------------------------------------------------------------------------
# Data

def synthetic_images(n: int, resolution: int) -> list[dict[str, Any]]:
    """n deterministic images (gradient + rectangles), each as HWC uint8, with a caption."""
    import numpy as np

    out = []
    yy, xx = np.mgrid[0:resolution, 0:resolution] / max(resolution - 1, 1)
    for i in range(n):
        rng = np.random.default_rng(10_000 + i)
        c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        img = c0 * (1 - xx[..., None]) + c1 * yy[..., None]
        for _ in range(3):
            x0, y0 = rng.integers(0, resolution, 2)
            w, h = rng.integers(resolution // 8, resolution // 2 + 1, 2)
            img[y0:y0 + h, x0:x0 + w] = rng.uniform(0, 255, 3)
        arr = np.clip(img, 0, 255).astype(np.uint8)
        out.append({"pixels": arr, "caption": f"a synthetic pattern number {i}", "crop": (0, 0),
                    "orig": (resolution, resolution)})
    return out


def dataset_files(folder: Path) -> list[Path]:
    """Images of the documented layout: any depth of subfolders, hidden files skipped."""
    return sorted(f for f in folder.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_EXTS
                  and not any(part.startswith(".") for part in f.relative_to(folder).parts))


def make_buckets(resolution: int, multiple: int) -> list[tuple[int, int]]:
    """(width, height) pairs, multiples of `multiple`, of about resolution^2 pixels, aspect from 1:4
    to 4:1 -- the same grid each run, so a resumed run buckets every image the same way."""
    area, out = resolution * resolution, []
    w = max(multiple, (resolution // 2) // multiple * multiple)
    while w <= resolution * 2:
        h = (area // w) // multiple * multiple
        if h >= multiple and 0.25 <= w / h <= 4:
            out.append((w, h))
        w += multiple
    return sorted(set(out))


def fit_image(im: Any, size: tuple[int, int]) -> tuple[Any, tuple[int, int], tuple[int, int]]:
    """Resize to cover `size` (w, h), centre-crop. Returns (HWC uint8, crop (top, left) in the
    resized image, original (height, width)) -- SDXL's conditioning wants both."""
    import numpy as np
    from PIL import Image

    im = im.convert("RGB")
    orig = (im.height, im.width)
    tw, th = size
    scale = max(tw / im.width, th / im.height)
    im = im.resize((max(tw, round(im.width * scale)), max(th, round(im.height * scale))),
                   Image.BICUBIC)
    left, top = (im.width - tw) // 2, (im.height - th) // 2
    return np.asarray(im.crop((left, top, left + tw, top + th))), (top, left), orig


def folder_images(folder: Path, resolution: int, default_caption: str,
                  buckets: list[tuple[int, int]] | None = None) -> list[dict[str, Any]]:
    from PIL import Image

    files = dataset_files(folder)
    if not files:
        raise UsageError(f"--data-dir {folder}: no images ({', '.join(sorted(IMAGE_EXTS))})")
    out = []
    for f in files:
        try:
            with Image.open(f) as im:
                size = (resolution, resolution)
                if buckets:
                    aspect = im.width / im.height
                    size = min(buckets, key=lambda b: (abs(math.log(b[0] / b[1] / aspect)), -b[0] * b[1]))
                arr, crop, orig = fit_image(im, size)
        except OSError as exc:
            raise UsageError(f"--data-dir: {f} is not a readable image ({exc})") from None
        cap = f.with_suffix(".txt")
        caption = cap.read_text(encoding="utf-8").strip() if cap.is_file() else default_caption
        out.append({"pixels": arr, "caption": caption or default_caption, "crop": crop,
                    "orig": orig})
    return out


def data_fingerprint(args: argparse.Namespace) -> str:
    if args.data_dir is None:
        return f"synthetic:{args.synthetic}"
    h = hashlib.sha256()
    for f in sorted(args.data_dir.rglob("*")):
        if f.is_file():
            h.update(f"{f.relative_to(args.data_dir)}:{f.stat().st_size}\n".encode())
    return "dir:" + h.hexdigest()[:16]


def batch_indices(step: int, batch_size: int, n: int, seed: int) -> list[int]:
    """Sample positions of global step `step` (1-based): epoch e uses a permutation seeded by
    (seed, e), so the order is a pure function of the step and survives any resume."""
    import torch

    idx = []
    for j in range(batch_size):
        pos = (step - 1) * batch_size + j
        epoch, k = divmod(pos, n)
        g = torch.Generator().manual_seed(step_seed(seed, epoch, "epoch"))
        idx.append(int(torch.randperm(n, generator=g)[k]))
    return idx


# ---------------------------------------------------------------------------------------------
# Training

DIFFUSERS_LORA = "pytorch_lora_weights.safetensors"
KOHYA_LORA = "lora_kohya.safetensors"
PIPELINES = {"sd15": "StableDiffusionPipeline", "sd2": "StableDiffusionPipeline",
             "sdxl": "StableDiffusionXLPipeline"}


def _atomic_save(save_file: Any, tensors: dict[str, Any], path: Path, meta: dict[str, str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, path)


def readme(args: argparse.Namespace, family: str, step: int, files: list[str]) -> str:
    """The artifacts' README: what the files are and how to load them."""
    pipe = PIPELINES[family]
    base = args.model
    lines = [f"# sdcloud {args.mode} ({family})", "",
             f"Base model: `{base}` ({family}); {step} steps at {args.resolution} px, seed {args.seed}.",
             "", "## Files", ""]
    if args.mode == "lora":
        lines += [f"- `{DIFFUSERS_LORA}`: the LoRA in diffusers format (rank {args.rank}).",
                  f"- `{KOHYA_LORA}`: the same LoRA in kohya format (`lora_unet_...` keys with alpha), "
                  "for AUTOMATIC1111, ComfyUI and kohya sd-scripts.", "",
                  "## diffusers", "", "```python", "import torch",
                  f"from diffusers import {pipe}",
                  f"pipe = {pipe}.from_pretrained({base!r}, torch_dtype=torch.float16).to('cuda')",
                  "pipe.load_lora_weights('.')  # this folder",
                  f"# or the kohya file: pipe.load_lora_weights('.', weight_name='{KOHYA_LORA}')",
                  "image = pipe('a photo of sks').images[0]", "```", "",
                  "## ComfyUI", "",
                  f"Copy `{KOHYA_LORA}` to `ComfyUI/models/loras/`, then add a *Load LoRA* node "
                  "between the checkpoint loader (the same base model) and the sampler.", "",
                  "## AUTOMATIC1111", "",
                  f"Copy `{KOHYA_LORA}` to `stable-diffusion-webui/models/Lora/`, select the same base "
                  "checkpoint, and add `<lora:lora_kohya:1>` to the prompt."]
    else:
        lines += ["- a diffusers pipeline folder: " + ", ".join(f"`{f}`" for f in files), "",
                  "## diffusers", "", "```python", f"from diffusers import {pipe}",
                  f"pipe = {pipe}.from_pretrained('.')  # this folder", "```", "",
                  "## ComfyUI and AUTOMATIC1111", "",
                  "Both load single-file checkpoints: convert this folder with diffusers' "
                  "`scripts/convert_diffusers_to_original_stable_diffusion.py` (SDXL: "
                  "`convert_diffusers_to_original_sdxl.py`), then copy the file to "
                  "`ComfyUI/models/checkpoints/` or `stable-diffusion-webui/models/Stable-diffusion/`."]
    return "\n".join(lines) + "\n"


def auto_precision(torch: Any, device: Any) -> str:
    """bf16 where the GPU computes it natively (compute capability 8.x and later: A10G, A100, L4,
    H100); fp16 with a loss scaler below (T4, V100). torch.cuda.is_bf16_supported() says yes on
    T4/V100 too (emulated, slow), so the capability decides."""
    if device.type != "cuda":
        return "no"
    major, _ = torch.cuda.get_device_capability(device)
    return "bf16" if major >= 8 else "fp16"


def make_optimizer(args: argparse.Namespace, params: list[Any], device: Any) -> Any:
    import torch

    if args.optimizer == "adamw8bit":
        if device.type != "cuda":
            raise UsageError("--optimizer adamw8bit needs CUDA (bitsandbytes)")
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise UsageError("--optimizer adamw8bit needs the bitsandbytes package") from None
        return bnb.optim.AdamW8bit(params, lr=args.lr, betas=(0.9, 0.999), weight_decay=1e-2,
                                   eps=1e-8)
    if args.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        # A fixed learning rate (the LR scheduler drives it), as for the other optimizers.
        return Adafactor(params, lr=args.lr, relative_step=False, scale_parameter=False,
                         warmup_init=False, weight_decay=1e-2)
    return torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)


class Trainer:
    def __init__(self, args: argparse.Namespace, signals: Signals) -> None:
        import torch

        self.args, self.signals, self.torch = args, signals, torch
        if args.device == "auto":
            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        if args.device == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device")
        self.device = torch.device(args.device)
        if DIST.on and self.device.type == "cuda":
            self.device = torch.device("cuda", DIST.local_rank)
            torch.cuda.set_device(self.device)
        DIST.init(torch, self.device.type)
        mp = args.mixed_precision
        if mp == "auto":
            mp = auto_precision(torch, self.device)
        if mp in ("fp16", "bf16") and self.device.type != "cuda":
            log(f"{mp} autocast is for CUDA here; training in fp32")
            mp = "no"
        self.mixed_precision = mp
        self.autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(mp)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

        t0 = time.monotonic()
        # Start-up takes seconds on a real model: honour a stop request between the phases.
        for phase in (self._load_model, self._apply_recipe, self._encode_dataset, self._setup_training):
            if signals.stop:
                raise Stopped()
            phase()
        log(f"ready in {time.monotonic() - t0:.2f}s: model={args.model} family={self.family} "
            f"mode={args.mode} device={self.device} precision={mp} images={self.n_images} "
            f"buckets={sorted(self.buckets_used)} trainable={sum(p.numel() for p in self.params)}")

    # -- setup ----------------------------------------------------------------------------------

    def _load_model(self) -> None:
        from . import models

        args = self.args
        want = args.families
        try:
            c = models.load_components(args.model, family=want[0] if want else None,
                                       resolution=args.resolution, config=args.model_config)
        except models.ModelError as exc:
            raise UsageError(str(exc)) from None
        self.family = models.family_of(c)
        if want and self.family not in want:
            raise UsageError(f"--model {args.model} is an {self.family} model; this run trains "
                             f"{' or '.join(want)} (pick a model of that family or another tier)")
        self.components = c
        self.unet, self.vae, self.text_encoder = c["unet"], c["vae"], c["text_encoder"]
        self.tokenizer, self.noise_scheduler = c["tokenizer"], c["scheduler"]
        self.text_encoder_2, self.tokenizer_2 = c.get("text_encoder_2"), c.get("tokenizer_2")
        if args.prediction_type != "auto":
            self.noise_scheduler.register_to_config(prediction_type=args.prediction_type)
        # The frozen parts stay fp32: the VAE of SDXL overflows in fp16 (NaN latents), and they
        # run once per image (the cache), so their precision costs nothing per step.
        for m in self.frozen():
            m.requires_grad_(False)
            m.eval()
            m.to(self.device, dtype=self.torch.float32)
        self.unet.to(self.device)
        vae_f = 2 ** (len(self.vae.config.block_out_channels) - 1)
        unet_f = 2 ** (len(self.unet.config.down_block_types) - 1)
        self.pixel_multiple = max(8, vae_f * unet_f)
        if args.resolution % self.pixel_multiple:
            raise UsageError(f"--resolution must be a multiple of {self.pixel_multiple} for this model")

    def _apply_recipe(self) -> None:
        """Fill the memory flags the user left unset from the GPU's recipe (CPU: no savings). A
        batch larger than the recipe's micro-batch becomes gradient accumulation: the same
        samples per optimizer step (batch_indices), so a resume on another GPU sees the same data."""
        args = self.args
        self.recipe = None
        resumed = getattr(args, "resume_state", None) or {}
        if args.optimizer is None and resumed.get("optimizer"):
            # The optimizer state in the checkpoint decides: a resume on a GPU with another recipe
            # continues with the optimizer it was saved with.
            args.optimizer = resumed["optimizer"]
        if self.device.type == "cuda" and args.memory_recipe == "auto":
            from . import recipes

            usable = recipes.usable_vram_gb(self.torch, self.device)
            mode = "dreambooth" if args.mode == "dreambooth" else "lora"
            self.recipe = recipes.choose(self.family, mode, args.resolution, usable)
            log(f"memory recipe for {usable:.1f} GB usable: {self.recipe.describe()}")
            if args.gradient_checkpointing is None:
                args.gradient_checkpointing = self.recipe.gradient_checkpointing
            if args.optimizer is None:
                args.optimizer = self.recipe.optimizer
            if args.grad_accum is None and args.batch_size > self.recipe.max_batch:
                per_step = args.batch_size
                args.batch_size = max(d for d in range(1, self.recipe.max_batch + 1) if per_step % d == 0)
                args.grad_accum = per_step // args.batch_size
        if args.gradient_checkpointing is None:
            args.gradient_checkpointing = False
        if args.optimizer is None:
            args.optimizer = "adamw"
        if args.grad_accum is None:
            args.grad_accum = 1

    def frozen(self) -> list[Any]:
        return [m for m in (self.vae, self.text_encoder, self.text_encoder_2) if m is not None]

    def _encode_prompts(self, captions: list[str]) -> tuple[Any, Any | None]:
        """(prompt embeddings, pooled embeddings or None). SDXL: the penultimate hidden states of
        both encoders side by side, and the second encoder's projected pooled output."""
        dev = self.device

        def ids(tok: Any) -> Any:
            return tok(captions, padding="max_length", truncation=True,
                       max_length=tok.model_max_length, return_tensors="pt").input_ids.to(dev)

        if self.text_encoder_2 is None:
            return self.text_encoder(ids(self.tokenizer))[0], None
        h1 = self.text_encoder(ids(self.tokenizer), output_hidden_states=True).hidden_states[-2]
        out2 = self.text_encoder_2(ids(self.tokenizer_2), output_hidden_states=True)
        return self.torch.cat([h1, out2.hidden_states[-2]], dim=-1), out2.text_embeds

    def _encode_dataset(self) -> None:
        """The VAE and text encoders are frozen: encode every image and caption once, keep the
        latent distribution (mean, std) and sample from it each step with a per-step generator."""
        import numpy as np

        torch, args = self.torch, self.args
        use_buckets = args.buckets if args.buckets is not None else self.family == "sdxl"
        buckets = make_buckets(args.resolution, self.pixel_multiple) if use_buckets else None
        if args.data_dir is not None:
            items = folder_images(args.data_dir, args.resolution, args.instance_prompt, buckets)
        else:
            items = synthetic_images(args.synthetic, args.resolution)
        self.n_images = len(items)
        self.lat_mean, self.lat_std, self.text_embeds, self.pooled, self.time_ids = [], [], [], [], []
        with torch.no_grad():
            for it in items:
                pix = torch.from_numpy(np.ascontiguousarray(it["pixels"])).permute(2, 0, 1)[None]
                pix = (pix.float() / 127.5 - 1.0).to(self.device)
                dist = self.vae.encode(pix).latent_dist
                self.lat_mean.append(dist.mean.float().cpu())
                self.lat_std.append(dist.std.float().cpu())
                emb, pooled = self._encode_prompts([it["caption"]])
                self.text_embeds.append(emb.float().cpu())
                h, w = it["pixels"].shape[:2]
                # SDXL's micro-conditioning: original size, crop top-left, target size.
                self.time_ids.append(torch.tensor([[*it["orig"], *it["crop"], h, w]],
                                                  dtype=torch.float32))
                self.pooled.append(pooled.float().cpu() if pooled is not None else None)
        self.buckets_used = {tuple(m.shape[-2:]) for m in self.lat_mean}
        self.scaling = float(getattr(self.vae.config, "scaling_factor", 0.18215))
        if self.device.type == "cuda" and not args.validation_prompt:
            # Cached: the encoders are not needed on the GPU again (validation moves them back).
            for m in self.frozen():
                m.to("cpu")

    def _setup_training(self) -> None:
        torch, args = self.torch, self.args
        # Seeds the LoRA init (and anything else drawing on the global generators).
        random.seed(args.seed)
        torch.manual_seed(args.seed)
        import numpy as np

        np.random.seed(args.seed % (1 << 32))
        if args.mode == "lora":
            from peft import LoraConfig

            self.unet.requires_grad_(False)
            self.unet.add_adapter(LoraConfig(r=args.rank, lora_alpha=args.rank,
                                             init_lora_weights="gaussian",
                                             target_modules=LORA_TARGETS))
        else:
            self.unet.requires_grad_(True)
        if args.gradient_checkpointing:
            self.unet.enable_gradient_checkpointing()
        self.unet.train()
        # Trainable weights stay fp32 (autocast does the low-precision math).
        self.params = [p for p in self.unet.parameters() if p.requires_grad]
        for p in self.params:
            p.data = p.data.float()
        self.optimizer = make_optimizer(args, self.params, self.device)
        from diffusers.optimization import get_scheduler

        self.lr_scheduler = get_scheduler(args.lr_scheduler, self.optimizer,
                                          num_warmup_steps=args.lr_warmup_steps,
                                          num_training_steps=args.steps)
        self.scaler = torch.amp.GradScaler("cuda") if self.mixed_precision == "fp16" else None
        self.global_step = 0

    def _autocast(self) -> Any:
        import contextlib

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return self.torch.autocast(self.device.type, dtype=self.autocast_dtype)

    # -- one step -------------------------------------------------------------------------------

    def train_step(self, step: int) -> float:
        """One optimizer step over batch_size * grad_accum samples. The samples of a micro-batch
        that fall in different aspect buckets run as separate forward passes, each weighted by
        its share, so the gradient is that of the whole micro-batch."""
        torch, args = self.torch, self.args
        per_rank = args.batch_size * args.grad_accum
        per_step = per_rank * DIST.world
        # The step's samples are a pure function of the step; each rank takes its share.
        order = batch_indices(step, per_step, self.n_images, args.seed)[DIST.rank * per_rank:(DIST.rank + 1) * per_rank]
        dev = self.device
        purpose = f"noise:{DIST.rank}" if DIST.on else "noise"
        g = torch.Generator(device=dev).manual_seed(step_seed(args.seed, step, purpose))
        sched = self.noise_scheduler
        total = 0.0
        self._oom_hook(step)
        self.data_wait = 0.0
        read_delay = float(os.environ.get(READ_DELAY_ENV) or 0)
        for m in range(args.grad_accum):
            micro = order[m * args.batch_size:(m + 1) * args.batch_size]
            groups: dict[tuple, list[int]] = {}
            for i in micro:
                groups.setdefault(tuple(self.lat_mean[i].shape), []).append(i)
            for members in groups.values():
                w0 = time.perf_counter()
                if read_delay:
                    time.sleep(read_delay * len(members))
                mean = torch.cat([self.lat_mean[i] for i in members]).to(dev)
                std = torch.cat([self.lat_std[i] for i in members]).to(dev)
                self.data_wait += time.perf_counter() - w0
                latents = (mean + std * torch.randn(mean.shape, generator=g, device=dev)) * self.scaling
                noise = torch.randn(latents.shape, generator=g, device=dev)
                t = torch.randint(0, sched.config.num_train_timesteps, (latents.shape[0],),
                                  generator=g, device=dev)
                noisy = sched.add_noise(latents, noise, t)
                if sched.config.prediction_type == "v_prediction":
                    target = sched.get_velocity(latents, noise, t)
                else:
                    target = noise
                enc = torch.cat([self.text_embeds[i] for i in members]).to(dev)
                kw: dict[str, Any] = {}
                if self.text_encoder_2 is not None:
                    kw["added_cond_kwargs"] = {
                        "text_embeds": torch.cat([self.pooled[i] for i in members]).to(dev),
                        "time_ids": torch.cat([self.time_ids[i] for i in members]).to(dev)}
                with self._autocast():
                    pred = self.unet(noisy, t, enc, **kw).sample
                share = len(members) / per_step
                loss = torch.nn.functional.mse_loss(pred.float(), target.float()) * share
                if self.scaler is not None:
                    self.scaler.scale(loss).backward()
                else:
                    loss.backward()
                total += float(loss.detach())
        if DIST.on:
            # Each rank's loss is weighted by its share of the step: the sum is the whole batch's gradient.
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                DIST.sum_(p.grad)
            t = torch.tensor([total], dtype=torch.float64)
            DIST.sum_(t)
            total = float(t.item())
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.params, args.max_grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total

    def _oom_hook(self, step: int) -> None:
        spec = os.environ.get(OOM_AT_ENV)
        if not spec:
            return
        at, _, flag = spec.partition(":")
        if step >= int(at) and not getattr(self.args, flag.replace("-", "_"), False):
            raise self.torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 20.00 MiB (injected by {OOM_AT_ENV} at step {step})")

    # -- checkpoints ----------------------------------------------------------------------------

    def _weights(self) -> dict[str, Any]:
        if self.args.mode == "lora":
            from peft.utils import get_peft_model_state_dict

            sd = get_peft_model_state_dict(self.unet)
        else:
            sd = self.unet.state_dict()
        return {k: v.detach().to("cpu").contiguous() for k, v in sd.items()}

    def _config_record(self) -> dict[str, Any]:
        a = self.args
        return {"mode": a.mode, "rank": a.rank if a.mode == "lora" else None, "model": a.model,
                "family": self.family, "seed": a.seed, "resolution": a.resolution,
                "batch_size": a.batch_size, "grad_accum": a.grad_accum, "optimizer": a.optimizer,
                "world_size": DIST.world,
                "data": data_fingerprint(a)}

    def save_checkpoint(self) -> Path:
        root = self.args.checkpoint_dir
        final = root / f"step-{self.global_step:09d}"
        if DIST.rank == 0:
            self._save_checkpoint()
        DIST.barrier()  # the others go on once the folder is complete
        return final

    def _save_checkpoint(self) -> Path:
        import numpy as np
        from safetensors.torch import save_file

        torch, step = self.torch, self.global_step
        save_t0 = time.monotonic()
        root = self.args.checkpoint_dir
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"step-{step:09d}"
        tmp = root / f"{TMP_PREFIX}{step:09d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        weights = "lora.safetensors" if self.args.mode == "lora" else "unet.safetensors"
        save_file(self._weights(), str(tmp / weights), metadata={"global_step": str(step)})
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(self.lr_scheduler.state_dict(), tmp / "scheduler.pt")
        if self.scaler is not None:
            torch.save(self.scaler.state_dict(), tmp / "scaler.pt")
        np_state = np.random.get_state()
        py_state = random.getstate()
        (tmp / "rng.json").write_text(json.dumps({
            "python": [py_state[0], list(py_state[1]), py_state[2]],
            "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]]}))
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            for i, s in enumerate(torch.cuda.get_rng_state_all()):
                rng[f"cuda_{i}"] = s
        save_file(rng, str(tmp / "rng.safetensors"))
        self._validation_images(tmp)
        pause = float(os.environ.get(SAVE_PAUSE_ENV) or 0)
        if pause:
            time.sleep(pause)
        files = {f.name: f.stat().st_size for f in sorted(tmp.iterdir())}
        state = {"global_step": step, "total_steps": self.args.steps, **self._config_record(),
                 "mixed_precision": self.mixed_precision, "weights": weights, "files": files,
                 "time": time.time()}
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
        for f in tmp.iterdir():
            _fsync_path(f)
        _fsync_path(tmp)
        if final.exists():  # re-saving a step (resumed from an older one): swap, then drop
            old = root / f".old-step-{step:09d}-{os.getpid()}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_path(root)
        emit("CHECKPOINT", {"step": step, "path": str(final.resolve()),
                            "save_s": round(time.monotonic() - save_t0, 3)})
        self._prune()
        return final

    def _prune(self) -> None:
        keep = self.args.keep_checkpoints
        if keep:
            for _, path in list_checkpoints(self.args.checkpoint_dir)[:-keep]:
                # Rename first so a reader never sees a step-* folder being emptied.
                doomed = path.with_name(f".old-{path.name}-{os.getpid()}")
                os.rename(path, doomed)
                shutil.rmtree(doomed, ignore_errors=True)

    def load_checkpoint(self, path: Path) -> None:
        import numpy as np
        from safetensors.torch import load_file

        torch = self.torch
        state = json.loads((path / STATE_FILE).read_text())
        mine = self._config_record()
        fresh_optimizer = False
        for key in ("mode", "rank", "family", "optimizer"):
            if key == "optimizer" and state.get(key) != mine[key] and self.args.optimizer_change:
                log(f"optimizer {state.get(key)} -> {mine[key]}: its state starts afresh at step "
                    f"{state.get('global_step')}")
                fresh_optimizer = True
                continue
            if state.get(key) != mine[key]:
                raise UsageError(f"checkpoint {path} has {key}={state.get(key)!r}, "
                                 f"this run {mine[key]!r}")
        for key in ("seed", "batch_size", "grad_accum", "world_size", "resolution", "data", "model"):
            if state.get(key) != mine[key]:
                log(f"warning: checkpoint {key}={state.get(key)!r} differs from {mine[key]!r}; "
                    "the run will not match an uninterrupted one")
        weights = load_file(str(path / state["weights"]), device=str(self.device))
        if self.args.mode == "lora":
            from peft.utils import set_peft_model_state_dict

            res = set_peft_model_state_dict(self.unet, weights)
            if getattr(res, "unexpected_keys", None):
                raise UsageError(f"checkpoint {path}: unexpected LoRA keys {res.unexpected_keys[:3]}")
        else:
            self.unet.load_state_dict(weights)
        for p in self.params:
            p.data = p.data.float()
        if not fresh_optimizer:
            self.optimizer.load_state_dict(
                torch.load(path / "optimizer.pt", map_location=self.device, weights_only=True))
        self.lr_scheduler.load_state_dict(
            torch.load(path / "scheduler.pt", weights_only=True))
        if self.scaler is not None and (path / "scaler.pt").is_file():
            self.scaler.load_state_dict(torch.load(path / "scaler.pt", weights_only=True))
        rj = json.loads((path / "rng.json").read_text())
        random.setstate((rj["python"][0], tuple(rj["python"][1]), rj["python"][2]))
        n = rj["numpy"]
        np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), *n[2:]))
        rng = load_file(str(path / "rng.safetensors"))
        torch.set_rng_state(rng["torch"])
        if torch.cuda.is_available():
            cuda = [rng[f"cuda_{i}"] for i in range(torch.cuda.device_count()) if f"cuda_{i}" in rng]
            if len(cuda) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(cuda)
        self.global_step = int(state["global_step"])

    # -- output ---------------------------------------------------------------------------------

    def _validation_images(self, folder: Path) -> None:
        """sample-NN.png for each --validation-prompt, fixed seeds: the same prompt at every
        checkpoint, so a user sees the training progress. The RNG is put back afterwards so that
        taking samples never changes what training does next."""
        args, torch = self.args, self.torch
        if not args.validation_prompt:
            return
        from diffusers import EulerDiscreteScheduler

        from .models import pipeline

        cpu_rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        for m in self.frozen():
            m.to(self.device)
        self.unet.eval()
        try:
            pipe = pipeline({**self.components, "scheduler":
                             EulerDiscreteScheduler.from_config(self.noise_scheduler.config)})
            pipe.set_progress_bar_config(disable=True)
            for i, prompt in enumerate(args.validation_prompt):
                gen = torch.Generator(device=self.device).manual_seed(args.seed + i)
                with torch.no_grad(), self._autocast():
                    image = pipe(prompt, num_inference_steps=args.validation_steps,
                                 height=args.resolution, width=args.resolution,
                                 generator=gen).images[0]
                image.save(folder / f"sample-{i:02d}.png")
        finally:
            self.unet.train()
            torch.set_rng_state(cpu_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)

    def write_output(self) -> Path:
        """LoRA: the diffusers file, the kohya file (A1111, ComfyUI) and a README. DreamBooth: a
        diffusers pipeline folder and a README."""
        from safetensors.torch import save_file

        out = self.args.output
        out.mkdir(parents=True, exist_ok=True)
        files: list[str] = []
        if self.args.mode == "lora":
            from diffusers.utils import convert_state_dict_to_diffusers

            from .lora_export import to_kohya

            peft_sd = self._weights()
            # The layout StableDiffusionPipeline.save_lora_weights writes and load_lora_weights
            # reads: "unet."-prefixed diffusers-style keys in one safetensors file.
            sd = convert_state_dict_to_diffusers(dict(peft_sd))
            meta = {"format": "pt", "global_step": str(self.global_step)}
            _atomic_save(save_file, {f"unet.{k}": v for k, v in sd.items()},
                         out / DIFFUSERS_LORA, meta)
            kohya = to_kohya(peft_sd, alpha=self.args.rank, sdxl=self.family == "sdxl",
                             layers_per_block=int(self.unet.config.layers_per_block))
            _atomic_save(save_file, kohya, out / KOHYA_LORA, {
                "ss_network_module": "networks.lora", "ss_network_dim": str(self.args.rank),
                "ss_network_alpha": str(self.args.rank), "ss_base_model_version": self.family,
                "ss_steps": str(self.global_step), "ss_resolution": str(self.args.resolution),
                "sdcloud_base_model": self.args.model})
            files = [DIFFUSERS_LORA, KOHYA_LORA]
        else:
            from .models import pipeline

            pipeline(self.components).save_pretrained(str(out), safe_serialization=True)
            files = ["model_index.json", "unet/", "vae/", "text_encoder/", "tokenizer/"]
        (out / "README.md").write_text(readme(self.args, self.family, self.global_step, files),
                                       encoding="utf-8")
        return out

    # -- the loop -------------------------------------------------------------------------------

    def run(self, resume: Path | None) -> int:
        args, sig = self.args, self.signals
        if DIST.rank == 0:
            remove_stale_tmp(args.checkpoint_dir)
        DIST.barrier()
        saved_step: int | None = None
        if resume is not None:
            self.load_checkpoint(resume)
            saved_step = self.global_step
            log(f"resumed from {resume} at global step {self.global_step}")
        emit("START", {"step": self.global_step, "total_steps": args.steps,
                       "resumed_from": str(resume) if resume else None,
                       # The memory settings in force (the GPU's recipe filled what the flags left
                       # unset): the agent's out-of-memory ladder climbs from these.
                       "recipe": {"gradient_checkpointing": bool(args.gradient_checkpointing),
                                  "optimizer": args.optimizer, "batch_size": args.batch_size,
                                  "grad_accum": args.grad_accum}})
        while self.global_step < args.steps and not DIST.any(bool(sig.stop)):
            t0 = time.perf_counter()
            self.global_step += 1
            loss = self.train_step(self.global_step)
            dt = time.perf_counter() - t0
            if args.min_step_seconds > dt:
                sig.wait(args.min_step_seconds - dt)
                dt = time.perf_counter() - t0
            emit("STEP", {"step": self.global_step, "loss": round(loss, 6),
                          "lr": self.lr_scheduler.get_last_lr()[0],
                          "it_per_s": round(1.0 / dt, 3) if dt > 0 else None,
                          # Seconds of the step spent gathering its samples, and the step's own:
                          # the agent's health sampler (sdcloud_agent/health.py) reads both.
                          "data_wait_s": round(getattr(self, "data_wait", 0.0), 4),
                          "step_s": round(dt, 4)})
            due = args.checkpoint_every and self.global_step % args.checkpoint_every == 0
            stop, save = (DIST.any(bool(sig.stop)), DIST.any(sig.save)) if DIST.on else (sig.stop, sig.save)
            if stop and not sig.stop:
                sig.stop = signal.SIGTERM  # another rank was asked to stop: stop with it
            if due or save or stop:
                sig.save = False
                self.save_checkpoint()
                saved_step = self.global_step
        if DIST.on and self.global_step < args.steps and not sig.stop:
            sig.stop = signal.SIGTERM  # the loop ended because another rank was asked to stop
        if sig.stop:
            if self.global_step > 0 and saved_step != self.global_step:
                self.save_checkpoint()
            log(f"stopped by signal {sig.stop} at global step {self.global_step}")
            return sig.exit_code()
        if saved_step != self.global_step:
            # A final checkpoint: if we die while writing the output, a resume only rewrites it.
            self.save_checkpoint()
        out = self.args.output
        if DIST.rank == 0:
            self.write_output()
        DIST.barrier()
        emit("DONE", {"step": self.global_step, "output": str(out.resolve())})
        return EXIT_OK


def _is_oom(exc: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError, or an older torch's RuntimeError saying the same."""
    return type(exc).__name__ == "OutOfMemoryError" or "CUDA out of memory" in str(exc)


def main(argv: list[str] | None = None) -> int:
    signals = Signals()
    signals.install()  # before the slow imports: a SIGTERM during start-up still exits cleanly
    args = parse_args(argv)
    reserve_stdout()
    from .models import looks_like_hub_id

    if not looks_like_hub_id(args.model):
        # Only a hub id is fetched (the base model the user named); nothing else is downloaded.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        resume = resolve_resume(args.resume_from, args.checkpoint_dir)
        args.resume_state = json.loads((resume / STATE_FILE).read_text()) if resume else None
        if signals.stop:
            raise Stopped()
        trainer = Trainer(args, signals)
        try:
            return trainer.run(resume)
        except Exception as exc:
            if not _is_oom(exc):
                raise
            # One line the agent reads (sdcloud_agent/oom.py): the error and torch's peak.
            import torch

            peak = total = None
            if torch.cuda.is_available():
                peak = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
                total = round(torch.cuda.get_device_properties(0).total_memory / 2 ** 30, 2)
            emit("OOM", {"step": trainer.global_step, "peak_gb": peak, "total_gb": total,
                         "error": str(exc).splitlines()[0][:300]})
            print(f"torch.OutOfMemoryError: {exc}", file=sys.stderr, flush=True)
            return EXIT_FAILED
        finally:
            DIST.close()
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except Stopped:
        log(f"stopped by signal {signals.stop} during start-up")
        return signals.exit_code()


if __name__ == "__main__":
    sys.exit(main())
