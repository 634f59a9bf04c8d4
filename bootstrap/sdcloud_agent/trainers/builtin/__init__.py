"""sdcloud's builtin Stable Diffusion trainer: LoRA (default) or DreamBooth (full UNet fine-tune)
of SD 1.x, SD 2.x (v-prediction included) and SDXL models (models.py), with the memory recipe of
the GPU (recipes.py), one process per GPU when launched data-parallel (distributed.py).

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

The package's modules: protocol.py (the contract's exit codes, lines and signals), arguments.py
(the flags), data.py (images, buckets, the batch order), model.py (model, recipe, optimizer),
checkpoints.py (folders, save, load), output.py (the finished weights, validation images),
distributed.py (data-parallel ranks) and loop.py (the training loop and `main`). Every name the
agent, the control plane and the tests use is importable from `sdcloud_agent.trainers.builtin`.
"""

from __future__ import annotations

from .arguments import build_parser, parse_args
from .checkpoints import CHECKPOINT_RE, STATE_FILE, TMP_PREFIX, list_checkpoints, remove_stale_tmp, resolve_resume
from .data import (IMAGE_EXTS, batch_indices, data_fingerprint, dataset_files, fit_image, folder_images,
                   make_buckets, step_seed, synthetic_images)
from .distributed import DIST, Dist
from .loop import Trainer, main
from .model import LORA_TARGETS, auto_precision, make_optimizer
from .output import DIFFUSERS_LORA, KOHYA_LORA, PIPELINES, readme
from .protocol import (EXIT_FAILED, EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM, EXIT_USAGE, OOM_AT_ENV, READ_DELAY_ENV,
                       SAVE_PAUSE_ENV, Signals, Stopped, UsageError, emit, log, reserve_stdout)

__all__ = ["CHECKPOINT_RE", "DIFFUSERS_LORA", "DIST", "EXIT_FAILED", "EXIT_OK", "EXIT_SIGINT", "EXIT_SIGTERM",
           "EXIT_USAGE", "IMAGE_EXTS", "KOHYA_LORA", "LORA_TARGETS", "OOM_AT_ENV", "PIPELINES", "READ_DELAY_ENV",
           "SAVE_PAUSE_ENV", "STATE_FILE", "TMP_PREFIX", "Dist", "Signals", "Stopped", "Trainer", "UsageError",
           "auto_precision", "batch_indices", "build_parser", "data_fingerprint", "dataset_files", "emit",
           "fit_image", "folder_images", "list_checkpoints", "log", "main", "make_buckets", "make_optimizer",
           "parse_args", "readme", "remove_stale_tmp", "reserve_stdout", "resolve_resume", "step_seed",
           "synthetic_images"]
