"""Adapter for kohya sd-scripts.

Network scripts (`train_network.py`, `sdxl_train_network.py`, ...): `--save_state
--save_every_n_steps K` writes `<output_name>-step<8 digits>-state/` with train_state.json; resume
with `--resume <newest state folder> --skip_until_initial_step`, which restores the step.
DreamBooth / fine-tune scripts (`train_db.py`, `sdxl_train.py`, `fine_tune.py`) do not restore the
step: we pass only the remaining steps and add the resumed step to the numbers they print and save.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .base import AccelerateTrainer, Context, flag_args

_STATE = re.compile(r"-step(\d+)-state$")
STEP_LOSING_SCRIPTS = ("train_db.py", "sdxl_train.py", "fine_tune.py", "sd3_train.py", "flux_train.py")
OWNED = ("output_dir", "max_train_steps", "save_every_n_steps", "save_state", "resume", "skip_until_initial_step")


class KohyaTrainer(AccelerateTrainer):
    name = "kohya"
    default_script = "sdxl_train_network.py"

    def restores_step(self, ctx: Context) -> bool:
        _, script, _ = self._opts(ctx)
        return Path(script).name not in STEP_LOSING_SCRIPTS

    def command(self, ctx: Context) -> list[str]:
        launcher, script, args = self._opts(ctx)
        for k in OWNED:
            args.pop(k, None)
        args.setdefault("pretrained_model_name_or_path", ctx.model)
        args.setdefault("output_name", "sdcloud")
        if ctx.dataset is not None and "dataset_config" not in args:
            args.setdefault("train_data_dir", str(ctx.dataset))
        restores = self.restores_step(ctx)
        # Numbers the trainer prints and saves are shifted by what it does not know it has done.
        self.step_offset = 0 if restores or ctx.resume is None else ctx.resume_step
        steps = ctx.steps if restores else max(1, ctx.steps - self.step_offset)
        flags: dict = {"output_dir": str(ctx.checkpoint_dir), "max_train_steps": steps,
                       "save_state": True, "save_every_n_steps": ctx.checkpoint_every, **args}
        if ctx.resume is not None:
            flags["resume"] = str(ctx.resume)
            if restores:
                flags["skip_until_initial_step"] = True
        return [*launcher, script, *flag_args(flags)]

    def local_step(self, path: Path) -> int | None:
        m = _STATE.search(path.name)
        if m:
            return int(m.group(1))
        if path.name.endswith("-state"):
            try:
                return int(json.loads((path / "train_state.json").read_text())["current_step"])
            except (OSError, ValueError, KeyError):
                return None  # an epoch number in the name is not a step
        return None

    def is_complete(self, path: Path) -> bool:
        return any(path.glob("random_states_*.pkl"))

    def artifacts(self, ctx: Context) -> list[Path]:
        if not ctx.checkpoint_dir.is_dir():
            return []
        return sorted(p for p in ctx.checkpoint_dir.iterdir() if p.is_file())
