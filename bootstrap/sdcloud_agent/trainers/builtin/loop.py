"""The training loop: one optimizer step at a time, checkpoints between steps when asked (a signal,
`--checkpoint-every`), and `main`, the process's entry point.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .arguments import parse_args
from .checkpoints import CheckpointIO, STATE_FILE, remove_stale_tmp, resolve_resume
from .data import batch_indices, step_seed
from .distributed import DIST
from .model import ModelSetup, auto_precision
from .output import Output
from .protocol import (EXIT_FAILED, EXIT_OK, EXIT_USAGE, OOM_AT_ENV, READ_DELAY_ENV, READ_SLOW_DIR_ENV, Signals, Stopped,
                       UsageError, emit, log, reserve_stdout)


class Trainer(ModelSetup, CheckpointIO, Output):
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

    # -- one step -------------------------------------------------------------------------------

    def train_step(self, step: int) -> float:
        """One optimizer step over batch_size * grad_accum samples. The samples of a micro-batch
        that fall in different aspect buckets run as separate forward passes, each weighted by
        its share, so the gradient is that of the whole micro-batch."""
        torch, args = self.torch, self.args
        per_rank = args.batch_size * args.grad_accum
        per_step = per_rank * DIST.world
        # The step's samples are a pure function of the step; each rank takes its share.
        first = DIST.rank * per_rank  # this rank's first position in the step's global batch
        order = batch_indices(step, per_step, self.n_images, args.seed)[first:first + per_rank]
        dev = self.device
        purpose = f"noise:{DIST.rank}" if DIST.on else "noise"
        g = torch.Generator(device=dev).manual_seed(step_seed(args.seed, step, purpose))
        sched = self.noise_scheduler
        total = 0.0
        self._oom_hook(step)
        self.data_wait = 0.0
        read_delay = float(os.environ.get(READ_DELAY_ENV) or 0)
        slow_dir = os.environ.get(READ_SLOW_DIR_ENV)
        if slow_dir and args.data_dir is not None and not str(args.data_dir.resolve()).startswith(
                str(Path(slow_dir).resolve())):
            read_delay = 0.0
        for m in range(args.grad_accum):
            micro = order[m * args.batch_size:(m + 1) * args.batch_size]
            groups: dict[tuple, list[int]] = {}
            places: dict[tuple, list[int]] = {}
            for j, i in enumerate(micro):
                groups.setdefault(tuple(self.lat_mean[i].shape), []).append(i)
                places.setdefault(tuple(self.lat_mean[i].shape), []).append(first + m * args.batch_size + j)
            for shape, members in groups.items():
                w0 = time.perf_counter()
                if read_delay:
                    time.sleep(read_delay * len(members))
                mean = torch.cat([self.lat_mean[i] for i in members]).to(dev)
                std = torch.cat([self.lat_std[i] for i in members]).to(dev)
                self.data_wait += time.perf_counter() - w0
                if self.family == "sd3":  # flow matching on the transformer (sd3.py)
                    total += self._sd3_backward(mean, std, members, g, per_step)
                    continue
                eps, noise, t = self._sample_draws(step, places[shape], mean.shape[1:])
                latents = (mean + std * eps) * self.scaling
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
                total += self._backward_share(pred, target, len(members) / per_step)
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

    def _sample_draws(self, step: int, places: list[int], shape: Any) -> tuple[Any, Any, Any]:
        """The latent sample's noise, the diffusion noise and the timestep of each sample, drawn
        from a generator of (seed, step, its place in the step's global batch): the same numbers
        whichever rank or host trains it, so N hosts of batch b train as one host of batch N*b."""
        torch, dev, steps = self.torch, self.device, self.noise_scheduler.config.num_train_timesteps
        eps, noise, t = [], [], []
        for place in places:
            g = torch.Generator(device=dev).manual_seed(step_seed(self.args.seed, step, f"sample:{place}"))
            eps.append(torch.randn((1, *shape), generator=g, device=dev))
            noise.append(torch.randn((1, *shape), generator=g, device=dev))
            t.append(torch.randint(0, steps, (1,), generator=g, device=dev))
        return torch.cat(eps), torch.cat(noise), torch.cat(t)

    def _backward_share(self, pred: Any, target: Any, share: float, weighting: Any = None) -> float:
        """One micro-batch's loss, weighted by its share of the optimizer step, and its gradients
        (through the fp16 loss scaler where one is on): every family's objective ends here.
        `weighting`: a per-sample weight of the squared error (sd3's --weighting-scheme)."""
        if weighting is None:
            loss = self.torch.nn.functional.mse_loss(pred.float(), target.float()) * share
        else:
            loss = (weighting.float() * (pred.float() - target.float()) ** 2).mean() * share
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        return float(loss.detach())

    def _oom_hook(self, step: int) -> None:
        spec = os.environ.get(OOM_AT_ENV)
        if not spec:
            return
        at, _, flag = spec.partition(":")
        if step >= int(at) and not getattr(self.args, flag.replace("-", "_"), False):
            raise self.torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 20.00 MiB (injected by {OOM_AT_ENV} at step {step})")

    # -- checkpoints ----------------------------------------------------------------------------

    # -- output ---------------------------------------------------------------------------------

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
    from ..models import looks_like_hub_id

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
