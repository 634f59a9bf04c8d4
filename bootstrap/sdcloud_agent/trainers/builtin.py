"""sdcloud's builtin Stable Diffusion trainer: LoRA (default) or DreamBooth (full UNet fine-tune).

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
    _protocol.write(f"SDCLOUD_{kind} {json.dumps(payload, separators=(', ', ': '))}\n")
    _protocol.flush()


def log(msg: str) -> None:
    print(f"[sdcloud-builtin] {msg}", file=sys.stderr, flush=True)


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

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(
        prog="python -m sdcloud_agent.trainers.builtin",
        description="LoRA / DreamBooth trainer for Stable Diffusion that survives spot reclaims.")
    p.add_argument("--model", default="tiny",
                   help="'tiny' (random tiny SD pipeline, for tests) or a local diffusers folder")
    p.add_argument("--mode", choices=["lora", "dreambooth"], default="lora")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="images (png/jpg/webp) with optional same-name .txt captions")
    p.add_argument("--synthetic", type=int, default=None, metavar="N",
                   help="train on N generated images (the default, with N=8, without --data-dir)")
    p.add_argument("--instance-prompt", default="a photo of sks",
                   help="caption for images that have no .txt")
    p.add_argument("--resolution", type=int, default=None,
                   help="square training resolution (default 32 for tiny, 512 otherwise)")
    p.add_argument("--steps", type=int, required=True, help="total optimizer steps (global)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--lr-scheduler", default="constant",
                   choices=["constant", "constant_with_warmup", "linear", "cosine"])
    p.add_argument("--lr-warmup-steps", type=int, default=0)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--rank", type=int, default=4, help="LoRA rank (alpha = rank)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mixed-precision", choices=["auto", "no", "fp16", "bf16"], default="auto",
                   help="auto: bf16 on CUDA when supported, else fp16 on CUDA, no on CPU")
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
    a = p.parse_args(argv)
    if a.steps < 1:
        p.error("--steps must be >= 1")
    if a.batch_size < 1 or a.rank < 1 or a.checkpoint_every < 0 or a.keep_checkpoints < 0:
        p.error("--batch-size and --rank must be >= 1; --checkpoint-every, --keep-checkpoints >= 0")
    if a.resolution is None:
        a.resolution = 32 if a.model == "tiny" else 512
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

def synthetic_images(n: int, resolution: int) -> list[tuple[Any, str]]:
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
        out.append((np.clip(img, 0, 255).astype(np.uint8), f"a synthetic pattern number {i}"))
    return out


def folder_images(folder: Path, resolution: int, default_caption: str) -> list[tuple[Any, str]]:
    import numpy as np
    from PIL import Image

    files = sorted(f for f in folder.iterdir() if f.suffix.lower() in IMAGE_EXTS)
    if not files:
        raise UsageError(f"--data-dir {folder}: no images ({', '.join(sorted(IMAGE_EXTS))})")
    out = []
    for f in files:
        with Image.open(f) as im:
            im = im.convert("RGB")
            scale = resolution / min(im.size)
            im = im.resize((max(resolution, round(im.width * scale)),
                            max(resolution, round(im.height * scale))), Image.BICUBIC)
            left, top = (im.width - resolution) // 2, (im.height - resolution) // 2
            arr = np.asarray(im.crop((left, top, left + resolution, top + resolution)))
        cap = f.with_suffix(".txt")
        caption = cap.read_text(encoding="utf-8").strip() if cap.is_file() else default_caption
        out.append((arr, caption or default_caption))
    return out


def data_fingerprint(args: argparse.Namespace) -> str:
    if args.data_dir is None:
        return f"synthetic:{args.synthetic}"
    h = hashlib.sha256()
    for f in sorted(args.data_dir.iterdir()):
        if f.is_file():
            h.update(f"{f.name}:{f.stat().st_size}\n".encode())
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

class Trainer:
    def __init__(self, args: argparse.Namespace, signals: Signals) -> None:
        import torch

        self.args, self.signals, self.torch = args, signals, torch
        if args.device == "auto":
            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        if args.device == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device")
        self.device = torch.device(args.device)
        mp = args.mixed_precision
        if mp == "auto":
            mp = "no"
            if self.device.type == "cuda":
                mp = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        if mp == "fp16" and self.device.type != "cuda":
            log("fp16 needs CUDA; training in fp32")
            mp = "no"
        self.mixed_precision = mp
        self.autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(mp)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

        t0 = time.monotonic()
        # Start-up takes seconds on a real model: honour a stop request between the phases.
        for phase in (self._load_model, self._encode_dataset, self._setup_training):
            if signals.stop:
                raise Stopped()
            phase()
        log(f"ready in {time.monotonic() - t0:.2f}s: model={args.model} mode={args.mode} "
            f"device={self.device} precision={mp} images={self.n_images} "
            f"trainable={sum(p.numel() for p in self.params)}")

    # -- setup ----------------------------------------------------------------------------------

    def _load_model(self) -> None:
        args = self.args
        if args.model == "tiny":
            from . import tiny

            c = tiny.build_components(resolution=args.resolution)
        else:
            path = Path(args.model)
            if not (path / "unet").is_dir():
                raise UsageError(f"--model {args.model}: not 'tiny' nor a local diffusers folder")
            from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
            from transformers import CLIPTextModel, CLIPTokenizer

            kw = {"local_files_only": True}
            c = {"unet": UNet2DConditionModel.from_pretrained(path, subfolder="unet", **kw),
                 "vae": AutoencoderKL.from_pretrained(path, subfolder="vae", **kw),
                 "text_encoder": CLIPTextModel.from_pretrained(path, subfolder="text_encoder", **kw),
                 "tokenizer": CLIPTokenizer.from_pretrained(path, subfolder="tokenizer", **kw),
                 "scheduler": DDPMScheduler.from_pretrained(path, subfolder="scheduler", **kw)}
        self.unet, self.vae, self.text_encoder = c["unet"], c["vae"], c["text_encoder"]
        self.tokenizer, self.noise_scheduler = c["tokenizer"], c["scheduler"]
        for m in (self.vae, self.text_encoder):
            m.requires_grad_(False)
            m.eval()
            m.to(self.device)
        self.unet.to(self.device)

    def _encode_dataset(self) -> None:
        """The VAE and text encoder are frozen: encode every image and caption once, keep the
        latent distribution (mean, std) and sample from it each step with a per-step generator."""
        torch, args = self.torch, self.args
        if args.data_dir is not None:
            items = folder_images(args.data_dir, args.resolution, args.instance_prompt)
        else:
            items = synthetic_images(args.synthetic, args.resolution)
        self.n_images = len(items)
        means, stds, embeds = [], [], []
        with torch.no_grad(), self._autocast():
            for i in range(0, len(items), 8):
                chunk = items[i:i + 8]
                import numpy as np

                pix = torch.from_numpy(np.stack([a for a, _ in chunk])).permute(0, 3, 1, 2)
                pix = (pix.float() / 127.5 - 1.0).to(self.device)
                dist = self.vae.encode(pix).latent_dist
                means.append(dist.mean.float().cpu())
                stds.append(dist.std.float().cpu())
                ids = self.tokenizer([c for _, c in chunk], padding="max_length", truncation=True,
                                     max_length=self.tokenizer.model_max_length,
                                     return_tensors="pt").input_ids.to(self.device)
                embeds.append(self.text_encoder(ids)[0].float().cpu())
        self.lat_mean, self.lat_std = torch.cat(means), torch.cat(stds)
        self.text_embeds = torch.cat(embeds)
        self.scaling = float(getattr(self.vae.config, "scaling_factor", 0.18215))

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
        self.unet.train()
        # Trainable weights stay fp32 (autocast does the low-precision math).
        self.params = [p for p in self.unet.parameters() if p.requires_grad]
        for p in self.params:
            p.data = p.data.float()
        self.optimizer = torch.optim.AdamW(self.params, lr=args.lr, betas=(0.9, 0.999),
                                           weight_decay=1e-2, eps=1e-8)
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
        torch, args = self.torch, self.args
        idx = torch.tensor(batch_indices(step, args.batch_size, self.n_images, args.seed))
        dev = self.device
        g = torch.Generator(device=dev).manual_seed(step_seed(args.seed, step, "noise"))
        mean, std = self.lat_mean[idx].to(dev), self.lat_std[idx].to(dev)
        latents = (mean + std * torch.randn(mean.shape, generator=g, device=dev)) * self.scaling
        noise = torch.randn(latents.shape, generator=g, device=dev)
        sched = self.noise_scheduler
        t = torch.randint(0, sched.config.num_train_timesteps, (latents.shape[0],), generator=g,
                          device=dev)
        noisy = sched.add_noise(latents, noise, t)
        if sched.config.prediction_type == "v_prediction":
            target = sched.get_velocity(latents, noise, t)
        else:
            target = noise
        with self._autocast():
            pred = self.unet(noisy, t, self.text_embeds[idx].to(dev)).sample
        loss = torch.nn.functional.mse_loss(pred.float(), target.float())
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.params, args.max_grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

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
                "seed": a.seed, "resolution": a.resolution, "batch_size": a.batch_size,
                "data": data_fingerprint(a)}

    def save_checkpoint(self) -> Path:
        import numpy as np
        from safetensors.torch import save_file

        torch, step = self.torch, self.global_step
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
        emit("CHECKPOINT", {"step": step, "path": str(final.resolve())})
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
        for key in ("mode", "rank"):
            if state.get(key) != mine[key]:
                raise UsageError(f"checkpoint {path} has {key}={state.get(key)!r}, "
                                 f"this run {mine[key]!r}")
        for key in ("seed", "batch_size", "resolution", "data", "model"):
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

    def write_output(self) -> Path:
        out = self.args.output
        out.mkdir(parents=True, exist_ok=True)
        if self.args.mode == "lora":
            from diffusers.utils import convert_state_dict_to_diffusers
            from safetensors.torch import save_file

            # The layout StableDiffusionPipeline.save_lora_weights writes and load_lora_weights
            # reads: "unet."-prefixed diffusers-style keys in one safetensors file.
            sd = convert_state_dict_to_diffusers(self._weights())
            tmp = out / ".pytorch_lora_weights.safetensors.tmp"
            save_file({f"unet.{k}": v for k, v in sd.items()}, str(tmp),
                      metadata={"format": "pt", "global_step": str(self.global_step)})
            os.replace(tmp, out / "pytorch_lora_weights.safetensors")
        else:
            from diffusers import StableDiffusionPipeline

            pipe = StableDiffusionPipeline(
                vae=self.vae, text_encoder=self.text_encoder, tokenizer=self.tokenizer,
                unet=self.unet, scheduler=self.noise_scheduler, safety_checker=None,
                feature_extractor=None, requires_safety_checker=False)
            pipe.save_pretrained(str(out), safe_serialization=True)
        return out

    # -- the loop -------------------------------------------------------------------------------

    def run(self, resume: Path | None) -> int:
        args, sig = self.args, self.signals
        remove_stale_tmp(args.checkpoint_dir)
        saved_step: int | None = None
        if resume is not None:
            self.load_checkpoint(resume)
            saved_step = self.global_step
            log(f"resumed from {resume} at global step {self.global_step}")
        emit("START", {"step": self.global_step, "total_steps": args.steps,
                       "resumed_from": str(resume) if resume else None})
        while self.global_step < args.steps and not sig.stop:
            t0 = time.perf_counter()
            self.global_step += 1
            loss = self.train_step(self.global_step)
            dt = time.perf_counter() - t0
            if args.min_step_seconds > dt:
                sig.wait(args.min_step_seconds - dt)
                dt = time.perf_counter() - t0
            emit("STEP", {"step": self.global_step, "loss": round(loss, 6),
                          "lr": self.lr_scheduler.get_last_lr()[0],
                          "it_per_s": round(1.0 / dt, 3) if dt > 0 else None})
            due = args.checkpoint_every and self.global_step % args.checkpoint_every == 0
            if due or sig.save or sig.stop:
                sig.save = False
                self.save_checkpoint()
                saved_step = self.global_step
        if sig.stop:
            if self.global_step > 0 and saved_step != self.global_step:
                self.save_checkpoint()
            log(f"stopped by signal {sig.stop} at global step {self.global_step}")
            return sig.exit_code()
        if saved_step != self.global_step:
            # A final checkpoint: if we die while writing the output, a resume only rewrites it.
            self.save_checkpoint()
        out = self.write_output()
        emit("DONE", {"step": self.global_step, "output": str(out.resolve())})
        return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    signals = Signals()
    signals.install()  # before the slow imports: a SIGTERM during start-up still exits cleanly
    args = parse_args(argv)
    reserve_stdout()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download weights from a training host
    try:
        resume = resolve_resume(args.resume_from, args.checkpoint_dir)
        if signals.stop:
            raise Stopped()
        trainer = Trainer(args, signals)
        return trainer.run(resume)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except Stopped:
        log(f"stopped by signal {signals.stop} during start-up")
        return signals.exit_code()


if __name__ == "__main__":
    sys.exit(main())
