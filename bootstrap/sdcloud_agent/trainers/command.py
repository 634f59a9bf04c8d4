"""Adapter for any command: it gets SDCLOUD_CHECKPOINT_DIR and SDCLOUD_RESUME_FROM (and
SDCLOUD_STEPS, SDCLOUD_CHECKPOINT_EVERY, SDCLOUD_RESUME_STEP, SDCLOUD_OUTPUT_DIR, SDCLOUD_DATASET)
in its environment.

Contract: write each checkpoint as a folder in SDCLOUD_CHECKPOINT_DIR whose name ends with the
global step (`step-000000120`), ideally by renaming a `.`-prefixed temp folder; a folder counts
as finished once a newer one exists, it has not changed for a few seconds, the trainer printed
`SDCLOUD_CHECKPOINT {"step": n, "path": ...}`, or the trainer exited on its own. SIGTERM is sent
to its process group on a reclaim notice; a trainer that saves then is given until the deadline.
"""

from __future__ import annotations

import shlex

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
