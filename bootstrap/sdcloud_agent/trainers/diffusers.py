"""Adapter for the diffusers example scripts (train_dreambooth_lora_sdxl.py and siblings).

They save `checkpoint-<global_step>/` (accelerate `save_state`) every `--checkpointing_steps` and
resume with `--resume_from_checkpoint latest`, restoring the global step. With
`--checkpoints_total_limit` they delete old checkpoints *before* saving, so we keep at least two.
They do not save on SIGTERM: a notice stops them and the newest periodic checkpoint is uploaded.
"""

from __future__ import annotations

import re
from pathlib import Path

from .base import AccelerateTrainer, Context, flag_args

_CKPT = re.compile(r"^checkpoint-(\d+)$")
# Flags the agent owns; a value in trainer_args for them is replaced (or bounded).
OWNED = ("output_dir", "max_train_steps", "checkpointing_steps", "resume_from_checkpoint")
# Scripts that read captions from a dataset's caption column (--dataset_name/--caption_column).
CAPTION_SCRIPTS = ("train_dreambooth_lora_sdxl.py", "train_text_to_image.py", "train_text_to_image_lora.py",
                   "train_text_to_image_sdxl.py", "train_text_to_image_lora_sdxl.py",
                   # SD3's scripts, the LoRA one and the DreamBooth one, read --dataset_name with
                   # --image_column/--caption_column too (their DreamBoothDataset).
                   "train_dreambooth_lora_sd3.py", "train_dreambooth_sd3.py")


class DiffusersTrainer(AccelerateTrainer):
    name = "diffusers"
    default_script = "train_dreambooth_lora_sdxl.py"

    def restore_dir(self, ctx: Context, name: str) -> Path:
        # `--resume_from_checkpoint latest` looks in output_dir for the newest checkpoint-N.
        return ctx.checkpoint_dir / (name if _CKPT.match(name or "") else f"checkpoint-{ctx.resume_step}")

    def missing_flags(self, args: dict, has_dataset: bool) -> list[str]:
        script = Path(str(args.get("script") or self.default_script)).name
        out = []
        if script.startswith("train_dreambooth") and not args.get("instance_prompt"):
            out.append("instance_prompt")  # e.g. "a photo of sks dog": the scripts require it
        if not (has_dataset or args.get("instance_data_dir") or args.get("dataset_name")
                or args.get("train_data_dir")):
            out.append("instance_data_dir")
        return out

    def command(self, ctx: Context) -> list[str]:
        launcher, script, args = self._opts(ctx)
        for k in OWNED:
            args.pop(k, None)
        args.setdefault("pretrained_model_name_or_path", ctx.model)
        given = any(k in args for k in ("instance_data_dir", "dataset_name", "train_data_dir"))
        if ctx.dataset is not None and not given:
            from .datasets import imagefolder

            prompt = str(args.get("instance_prompt") or "sks")
            if Path(script).name in CAPTION_SCRIPTS:
                # Captions reach these scripts through an imagefolder's metadata.jsonl.
                folder = imagefolder(ctx.dataset, ctx.workdir / "imagefolder", prompt)
                args.update(dataset_name=str(folder), image_column="image", caption_column="text")
            else:
                # --instance_data_dir opens every file of one flat folder: images only.
                args["instance_data_dir"] = str(imagefolder(ctx.dataset, ctx.workdir / "instance-images",
                                                            prompt, metadata=False))
        limit = args.get("checkpoints_total_limit")
        if limit is not None:
            args["checkpoints_total_limit"] = max(2, int(limit))
        flags = {"output_dir": str(ctx.checkpoint_dir), "max_train_steps": ctx.steps,
                 "checkpointing_steps": ctx.checkpoint_every, **args}
        if ctx.resume is not None:
            flags["resume_from_checkpoint"] = "latest"
        return [*launcher, script, *flag_args(flags)]

    def script_path(self, root: Path, script: str) -> Path:
        """`train_dreambooth_lora_sdxl.py` is examples/dreambooth/train_dreambooth_lora_sdxl.py; a
        path with a folder (`text_to_image/train_text_to_image_sdxl.py`) is under examples/."""
        examples = root / "examples"
        if "/" in script:
            return super().script_path(examples, script)
        found = sorted(examples.glob(f"*/{script}"))
        if not found:
            raise FileNotFoundError(f"diffusers: no example script {script!r} in {examples}/*/")
        return found[0]

    def local_step(self, path: Path) -> int | None:
        m = _CKPT.match(path.name)
        return int(m.group(1)) if m else None

    def is_complete(self, path: Path) -> bool:
        # accelerate's save_state writes the RNG states last.
        return any(path.glob("random_states_*.pkl"))

    def artifacts(self, ctx: Context) -> list[Path]:
        if not ctx.checkpoint_dir.is_dir():
            return []
        return sorted(p for p in ctx.checkpoint_dir.rglob("*")
                      if p.is_file() and not any(_CKPT.match(part) for part in p.relative_to(ctx.checkpoint_dir).parts))
