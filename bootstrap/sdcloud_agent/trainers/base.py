"""The trainer adapter: how to start a trainer, where its checkpoints land, how to resume it,
how to ask it to save, and how to read its progress."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from typing import Any
from dataclasses import dataclass, field
from pathlib import Path

# Seconds a checkpoint folder must stay unchanged before an external trainer's save counts as done.
SETTLE_SECONDS = 3.0
STEP_LINE = "SDCLOUD_STEP "
CHECKPOINT_LINE = "SDCLOUD_CHECKPOINT "
DONE_LINE = "SDCLOUD_DONE "


@dataclass
class LocalCheckpoint:
    step: int  # the run's global step
    path: Path


@dataclass
class Context:
    """What an adapter needs to build the trainer's command line."""
    steps: int
    checkpoint_every: int
    model: str
    workdir: Path
    checkpoint_dir: Path
    output_dir: Path
    dataset: Path | None = None
    resume: Path | None = None  # the restored checkpoint folder
    resume_step: int = 0  # its global step (0: a fresh start)
    trainer_args: object = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    gpus: int = 0  # GPUs on the host (nvidia-smi); the builtin trainer runs one process per GPU
    # The external trainer's sources on this host (sdcloud_agent/scripts.py), when it needed them.
    trainer_root: Path | None = None
    trainer_python: str | None = None  # the interpreter that runs accelerate (kohya: its own venv)
    # The memory ladder changed the optimizer after `resume` was saved (oom.py): start from its
    # weights and step with a fresh optimizer, not from its optimizer state.
    fresh_optimizer: bool = False
    # A multi-node group (sdcloud_agent/rendezvous.py): where rank 0 listens, and this host's rank.
    rendezvous: Any = None
    node_rank: int = 0
    # Sample images at the checkpoints (sdcloud_agent/samples.py SampleSettings), None: none; and the
    # trainer's own curve logging besides TensorBoard ("wandb"), its key in `env` only.
    samples: Any = None
    report_to: str | None = None


def flag_args(args: dict) -> list[str]:
    """{"learning_rate": 1e-4, "gradient_checkpointing": True} -> ["--learning_rate", "0.0001", "--gradient_checkpointing"]."""
    out: list[str] = []
    for k, v in args.items():
        flag = k if k.startswith("-") else f"--{k}"
        if v is True:
            out.append(flag)
        elif v is False or v is None:
            continue
        elif isinstance(v, (list, tuple)):
            out += [flag, *map(str, v)]
        else:
            out += [flag, str(v)]
    return out


def folder_mtime(path: Path) -> float:
    """Newest modification time of a folder and everything under it."""
    newest = path.stat().st_mtime
    for p in path.rglob("*"):
        try:
            newest = max(newest, p.stat().st_mtime)
        except FileNotFoundError:
            pass
    return newest


def parse_protocol(line: str) -> tuple[str, dict] | None:
    """The builtin protocol: `SDCLOUD_STEP {...}`, `SDCLOUD_CHECKPOINT {...}`, `SDCLOUD_DONE {...}`."""
    for tag in (STEP_LINE, CHECKPOINT_LINE, DONE_LINE):
        if line.startswith(tag):
            try:
                return tag.strip(), json.loads(line[len(tag):])
            except ValueError:
                return None
    return None


_TQDM = re.compile(r"(\d+)/(\d+) \[[^\]]*?(?:,\s*([\d.]+)(it/s|s/it))?[,\]]")
_LOSS = re.compile(r"(?:avr_loss|loss)=([-\d.e+]+)")


def parse_tqdm(line: str) -> dict | None:
    """Progress from a tqdm bar such as `Steps: 5%|| 5/100 [00:01<00:19, 4.9it/s, loss=0.12]`."""
    m = _TQDM.search(line)
    if not m:
        return None
    out: dict = {"step": int(m.group(1))}
    if m.group(3):
        rate = float(m.group(3))
        out["it_per_s"] = rate if m.group(4) == "it/s" else (1 / rate if rate else 0.0)
    lm = _LOSS.search(line)
    if lm:
        try:
            out["loss"] = float(lm.group(1))
        except ValueError:
            pass
    return out


class Trainer:
    """Base adapter. Subclasses set `name` and override what differs."""

    name = "base"
    saves_on_sigterm = False  # does SIGTERM make it save before exiting?
    signal_group = True  # signal the whole process group (accelerate launch does not forward signals)
    has_marker = False  # is_complete() checks a file the trainer writes last (so a killed save shows)
    samples_after_save = False  # renders its samples after the checkpoint they belong to (diffusers)

    def __init__(self) -> None:
        self.announced: dict[int, Path] = {}  # checkpoints the trainer told us about (protocol lines)
        self.step_offset = 0  # added to the trainer's own step numbers to get the run's global step

    # -- start ------------------------------------------------------------------------------
    def restore_dir(self, ctx: Context, name: str) -> Path:
        """Where a restored checkpoint folder goes (outside the folder we scan, by default)."""
        return ctx.workdir / "restore" / (name or "checkpoint")

    def command(self, ctx: Context) -> list[str]:
        raise NotImplementedError

    def environment(self, ctx: Context) -> dict[str, str]:
        env = {"SDCLOUD_CHECKPOINT_DIR": str(ctx.checkpoint_dir),
               "SDCLOUD_RESUME_FROM": str(ctx.resume) if ctx.resume else "",
               "SDCLOUD_RESUME_STEP": str(ctx.resume_step),
               "SDCLOUD_STEPS": str(ctx.steps),
               "SDCLOUD_CHECKPOINT_EVERY": str(ctx.checkpoint_every),
               "SDCLOUD_OUTPUT_DIR": str(ctx.output_dir),
               "PYTHONUNBUFFERED": "1"}
        if ctx.dataset:
            env["SDCLOUD_DATASET"] = str(ctx.dataset)
        return env

    # -- progress ---------------------------------------------------------------------------
    def parse_line(self, line: str) -> dict | None:
        """Progress fields (global step, loss, it_per_s) from one output line, or None."""
        proto = parse_protocol(line)
        if proto:
            tag, doc = proto
            if tag == "SDCLOUD_CHECKPOINT" and "step" in doc and "path" in doc:
                self.announced[int(doc["step"]) + self.step_offset] = Path(doc["path"])
            if tag == "SDCLOUD_STEP" and "step" in doc:
                return {k: doc[k] for k in ("loss", "it_per_s") if k in doc} | {"step": int(doc["step"]) + self.step_offset}
            return None
        prog = parse_tqdm(line)
        if prog:
            prog["step"] += self.step_offset
        return prog

    # -- checkpoints ------------------------------------------------------------------------
    def local_step(self, path: Path) -> int | None:
        """The trainer's own step number of a checkpoint folder, from its name."""
        m = re.search(r"(\d+)(?!.*\d)", path.name)
        return int(m.group(1)) if m else None

    def is_complete(self, path: Path) -> bool:
        """A marker file that the trainer writes last, if it has one."""
        return True

    def candidates(self, ctx: Context) -> list[LocalCheckpoint]:
        out = []
        if not ctx.checkpoint_dir.is_dir():
            return out
        for p in ctx.checkpoint_dir.iterdir():
            if not p.is_dir() or p.name.startswith("."):
                continue
            step = self.local_step(p)
            if step is not None:
                out.append(LocalCheckpoint(step + self.step_offset, p))
        return sorted(out, key=lambda c: c.step)

    def finished(self, ctx: Context, trainer_exited: bool = False, killed: bool = False) -> list[LocalCheckpoint]:
        """Checkpoints whose save is over: announced, superseded by a newer one, or settled."""
        cands = self.candidates(ctx)
        out = []
        now = time.time()
        for i, c in enumerate(cands):
            if c.step in self.announced:
                out.append(c)
                continue
            if not self.is_complete(c.path):
                continue
            newer = i < len(cands) - 1
            if newer or (trainer_exited and (not killed or self.has_marker)):
                out.append(c)
                continue
            try:
                if now - folder_mtime(c.path) >= SETTLE_SECONDS:
                    out.append(c)
            except FileNotFoundError:
                pass
        return out

    # -- signals ----------------------------------------------------------------------------
    def _signal(self, proc: subprocess.Popen, sig: int) -> None:
        try:
            if self.signal_group:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass

    def request_save(self, proc: subprocess.Popen) -> bool:
        """Ask for a checkpoint without stopping; False if the trainer cannot."""
        return False

    def request_stop(self, proc: subprocess.Popen) -> None:
        self._signal(proc, signal.SIGTERM)

    def kill(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    # -- samples and logs -------------------------------------------------------------------
    def samples(self, ctx: Context, folder: Path | None, step: int) -> list:
        """The sample images this trainer rendered at the run's `step` (sdcloud_agent/samples.py's
        Found); `folder` is the checkpoint's folder as it goes up."""
        return []

    def export_files(self, ctx: Context, step: int, path: Path) -> list[Path]:
        """The model at checkpoint `step` where the trainer keeps it beside the checkpoint folder
        (uploaded in the checkpoint's export/ folder), or none."""
        return []

    def log_dir(self, ctx: Context) -> Path | None:
        """Where the trainer writes its own TensorBoard logs, if it does."""
        return None

    # -- results ----------------------------------------------------------------------------
    def missing_output(self, ctx: Context) -> str | None:
        """Why a trainer that exited 0 did not finish (no final model), or None. Some scripts
        exit 0 after printing an error (kohya's "No data found"): that is a failed attempt."""
        if not self.artifacts(ctx):
            return f"trainer {self.name} exited 0 but wrote no model to {ctx.output_dir}"
        return None

    def artifacts(self, ctx: Context) -> list[Path]:
        """Files of the finished model (uploaded to artifacts/)."""
        if not ctx.output_dir.is_dir():
            return []
        return sorted(p for p in ctx.output_dir.rglob("*") if p.is_file())


class AccelerateTrainer(Trainer):
    """A training script started through accelerate: diffusers examples, kohya sd-scripts.

    The command is `<python> -m accelerate.commands.launch <absolute script> <flags>`: the python
    of the trainer's environment and the script in the sources the agent put on the host
    (sdcloud_agent/scripts.py), so nothing comes from PATH or the working directory.
    trainer_args (a dict) may name the `launcher` argv and the `script`; the rest are the script's
    flags. A launcher of `accelerate launch <options>` keeps its options on that command; any other
    launcher, and an absolute script, are used as given.
    """

    has_marker = True  # accelerate save_state writes random_states_*.pkl last
    default_script = ""
    # Progress bars of other phases (reading captions, caching latents, loading weights) are not
    # training steps: only the bar these scripts label "steps" counts.
    progress_label = re.compile(r"\bsteps:", re.IGNORECASE)

    def parse_line(self, line: str) -> dict | None:
        if parse_protocol(line) is None and not self.progress_label.search(line):
            return None
        return super().parse_line(line)

    def missing_flags(self, args: dict, has_dataset: bool) -> list[str]:
        """Flags the script cannot start without, that neither the user nor the agent supplies."""
        return []

    def settle_flags(self, args: dict) -> dict:
        """Host-side values: mixed_precision "auto" becomes bf16 on compute capability >= 8, else
        fp16 (torch.cuda.is_bf16_supported() says yes on T4/V100 by emulation, so it is not asked)."""
        if args.get("mixed_precision") == "auto":
            from ..gpu import compute_capability

            cap = compute_capability()
            args["mixed_precision"] = "no" if cap is None else ("bf16" if cap >= 8.0 else "fp16")
        return args

    def script_path(self, root: Path, script: str) -> Path:
        """The script's absolute path in the trainer's sources."""
        path = root / script
        if not path.is_file():
            raise FileNotFoundError(f"{self.name}: no script {script!r} in {root}")
        return path

    def _opts(self, ctx: Context) -> tuple[list[str], str, dict]:
        import shlex
        import sys

        args = dict(ctx.trainer_args) if isinstance(ctx.trainer_args, dict) else {}
        launcher = args.pop("launcher", None)
        script = str(args.pop("script", self.default_script))
        if isinstance(launcher, str):
            launcher = shlex.split(launcher)
        if launcher is None or [str(a) for a in launcher[:2]] == ["accelerate", "launch"]:
            from .multinode import machine_options  # a host of a multi-node group: the group's options

            options = machine_options(ctx, [str(a) for a in (launcher or [])[2:]])
            launcher = [ctx.trainer_python or sys.executable, "-m", "accelerate.commands.launch", *options]
            if ctx.trainer_root is not None and not Path(script).is_absolute():
                script = str(self.script_path(ctx.trainer_root, script))
        return list(launcher), script, self.settle_flags(args)
