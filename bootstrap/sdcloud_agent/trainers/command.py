"""Adapter for any command: it gets SDCLOUD_CHECKPOINT_DIR and SDCLOUD_RESUME_FROM (and
SDCLOUD_STEPS, SDCLOUD_CHECKPOINT_EVERY, SDCLOUD_RESUME_STEP, SDCLOUD_OUTPUT_DIR, SDCLOUD_DATASET)
in its environment.

Contract: write each checkpoint as a folder in SDCLOUD_CHECKPOINT_DIR whose name ends with the
global step (`step-000000120`), ideally by renaming a `.`-prefixed temp folder; a folder counts
as finished once a newer one exists, it has not changed for a few seconds, the trainer printed
`SDCLOUD_CHECKPOINT {"step": n, "path": ...}`, or the trainer exited on its own. SIGTERM is sent
to its process group on a reclaim notice; a trainer that saves then is given until the deadline.
With `trainer_args = {"command": [...], "save_signal": "SIGUSR1"}` a rebalance recommendation sends
that signal to ask for a checkpoint without stopping (unknown commands get none: SIGUSR1 kills a
program that does not handle it).
"""

from __future__ import annotations

import signal
import subprocess

from .base import Context, Trainer


class CommandTrainer(Trainer):
    name = "command"
    saves_on_sigterm = True  # it may; waiting costs nothing when it does not

    def command(self, ctx: Context) -> list[str]:
        args = ctx.trainer_args
        if isinstance(args, dict):
            args = args.get("command", [])
        if isinstance(args, str):
            return ["/bin/sh", "-c", args]
        if not args:
            raise ValueError("trainer 'command' needs trainer_args: the command line")
        return [str(a) for a in args]

    def __init__(self) -> None:
        super().__init__()
        self.save_signal: int | None = None

    def environment(self, ctx: Context) -> dict[str, str]:
        args = ctx.trainer_args
        name = args.get("save_signal") if isinstance(args, dict) else None
        self.save_signal = int(getattr(signal, name)) if name else None
        return super().environment(ctx)

    def missing_output(self, ctx: Context) -> str | None:
        return None  # any command: where (and whether) it writes a model is its own business

    def request_save(self, proc: subprocess.Popen) -> bool:
        if self.save_signal is None:
            return False
        self._signal(proc, self.save_signal)
        return True
