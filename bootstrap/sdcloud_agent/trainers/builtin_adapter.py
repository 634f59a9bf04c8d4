"""Adapter for sdcloud's builtin trainer (`python -m sdcloud_agent.trainers.builtin`).

It speaks the agent protocol: `SDCLOUD_STEP/CHECKPOINT/DONE` lines, checkpoints renamed
atomically to `step-<n:09d>/`, SIGTERM = finish the step, save, exit 143; SIGUSR1 = save, go on.
Its step count is global, so the agent never shifts it.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from .base import Context, Trainer, flag_args

_STEP_DIR = re.compile(r"^step-(\d+)$")
# The trainer's on/off flags (argparse.BooleanOptionalAction in builtin/arguments.py): off is --no-<flag>.
NEGATABLE = ("buckets", "gradient-checkpointing", "precondition-outputs")


class BuiltinTrainer(Trainer):
    name = "builtin"
    saves_on_sigterm = True
    signal_group = False  # it handles the signal itself; its helper processes must not see it

    def command(self, ctx: Context) -> list[str]:
        launch = [sys.executable, "-m", "sdcloud_agent.trainers.builtin"]
        self.signal_group = False
        if ctx.gpus > 1:
            # One process per GPU (DDP). accelerate does not forward signals to its children, so
            # a stop or save request goes to the whole group: every rank gets it.
            rv = ctx.rendezvous  # a multi-node group: every host's GPUs in one world (agent_nodes.py)
            machines = ["--num_machines", "1"] if rv is None else [
                "--num_machines", str(rv.nodes), "--machine_rank", str(ctx.node_rank),
                "--main_process_ip", rv.addr, "--main_process_port", str(rv.port)]
            launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
                      "--num_processes", str(ctx.gpus * (rv.nodes if rv else 1)), *machines,
                      "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "sdcloud_agent.trainers.builtin"]
            self.signal_group = True
        cmd = [*launch, "--model", ctx.model,
               "--steps", str(ctx.steps), "--checkpoint-every", str(ctx.checkpoint_every),
               "--checkpoint-dir", str(ctx.checkpoint_dir), "--output", str(ctx.output_dir)]
        if ctx.resume:
            cmd += ["--resume-from", str(ctx.resume)]
        args = ctx.trainer_args
        given = args if isinstance(args, (dict, list)) else {}
        if ctx.dataset is not None and not _given(given, "data-dir"):
            cmd += ["--data-dir", str(ctx.dataset)]
        if not _given(given, "keep-checkpoints"):
            # The agent uploads from hard-linked snapshots, so the trainer may delete old folders.
            cmd += ["--keep-checkpoints", "2"]
        s = ctx.samples
        if s is not None and s.prompts:  # each prompt as one --flag=value word: a prompt may start with "-"
            cmd += [f"--validation-prompt={p}" for p in s.prompts]
            cmd += ["--sample-every", str(s.interval(ctx.checkpoint_every)), "--sample-seed", str(s.seed),
                    "--validation-steps", str(s.steps)]
        if isinstance(args, dict):  # its flags use dashes: {"keep_checkpoints": 2} -> --keep-checkpoints 2
            flags = {}
            for k, v in args.items():
                k = k.replace("_", "-")
                if v is False and k in NEGATABLE:
                    flags[f"no-{k}"] = True  # buckets=false is --no-buckets (left out, the default would win)
                else:
                    flags[k] = v
            cmd += flag_args(flags)
        else:
            cmd += [str(a) for a in (args or [])]
        return cmd

    def local_step(self, path: Path) -> int | None:
        m = _STEP_DIR.match(path.name)
        return int(m.group(1)) if m else None

    def finished(self, ctx: Context, trainer_exited: bool = False, killed: bool = False):
        # The trainer renames `.tmp-*` to `step-*` when the save is complete: what we see is done.
        return self.candidates(ctx)

    def samples(self, ctx: Context, folder: Path, step: int) -> list:
        from ..samples import builtin_samples

        return builtin_samples(folder, step)

    def request_save(self, proc: subprocess.Popen) -> bool:
        self._signal(proc, signal.SIGUSR1)
        return True


def _given(args, flag: str) -> bool:
    """Whether trainer_args (dict or argv list) already sets --flag (dashes or underscores)."""
    names = {flag, flag.replace("-", "_"), f"--{flag}", f"--{flag.replace('-', '_')}"}
    return any(str(a).split("=")[0] in names for a in args)
