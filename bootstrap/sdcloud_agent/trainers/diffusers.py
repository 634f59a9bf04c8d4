"""Adapter for the diffusers example scripts (train_dreambooth_lora_sdxl.py and siblings).

They save `checkpoint-<global_step>/` (accelerate `save_state`) every `--checkpointing_steps` and
resume with `--resume_from_checkpoint latest`, restoring the global step. With
`--checkpoints_total_limit` they delete old checkpoints *before* saving, so we keep at least two.
They do not save on SIGTERM: a notice stops them and the newest periodic checkpoint is uploaded.

Samples: the scripts render one `--validation_prompt` (with `--seed`) at the end of every
`--validation_epochs`-th epoch and log the images to their tracker; with `--report_to tensorboard`
(our default) they land in `<output_dir>/<logging_dir>/` as `validation` image summaries, epoch-stamped,
which the agent reads back (metrics.read_event_images) and files under the newest checkpoint at or
before the epoch's last step. They render after that checkpoint is saved, so such a sample goes up
with the next checkpoint or at the end.
"""

from __future__ import annotations

import math
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
    samples_after_save = True  # its validation runs after the epoch's checkpoint

    def __init__(self) -> None:
        super().__init__()
        self.per_epoch: int | None = None  # optimizer steps per epoch, where the dataset says it
        self.sent: set[tuple[int, int]] = set()  # (epoch, image) of the validation images put in the store

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
        args.update(self.sample_flags(ctx, args))
        if "report_to" not in args:  # the curves (and the validation images) where the agent reads them
            args["report_to"] = "all" if ctx.report_to == "wandb" else "tensorboard"
        limit = args.get("checkpoints_total_limit")
        if limit is not None:
            args["checkpoints_total_limit"] = max(2, int(limit))
        flags = {"output_dir": str(ctx.checkpoint_dir), "max_train_steps": ctx.steps,
                 "checkpointing_steps": ctx.checkpoint_every, **args}
        if ctx.resume is not None:
            flags["resume_from_checkpoint"] = "latest"
        return [*launcher, script, *flag_args(flags)]

    def sample_flags(self, ctx: Context, args: dict) -> dict:
        """The run's (one) sample prompt as the scripts' validation: its seed, one image, and the interval
        in epochs nearest the run's sample interval in steps."""
        s = ctx.samples
        if s is None or not s.prompts:
            return {}
        batch = int(args.get("train_batch_size") or 1) * int(args.get("gradient_accumulation_steps") or 1)
        if ctx.dataset is not None:
            from .datasets import images_per_epoch

            self.per_epoch = max(1, math.ceil(images_per_epoch(ctx.dataset) / batch))
        epochs = max(1, round(s.interval(ctx.checkpoint_every) / self.per_epoch)) if self.per_epoch else 1
        return {"validation_prompt": s.prompts[0], "num_validation_images": 1, "validation_epochs": epochs,
                "seed": args.get("seed", s.seed)}

    def log_dir(self, ctx: Context) -> Path | None:
        args = ctx.trainer_args if isinstance(ctx.trainer_args, dict) else {}
        return ctx.checkpoint_dir / str(args.get("logging_dir") or "logs")

    def samples(self, ctx: Context, folder: Path | None, step: int) -> list:
        """The validation images logged so far at or before `step` and not sent yet, each filed under the
        checkpoint step at or before its epoch's last step (a multiple of the checkpoint interval)."""
        from ..metrics import read_event_images
        from ..samples import Found

        logs = self.log_dir(ctx)
        if logs is None or not logs.is_dir() or not self.per_epoch:
            return []
        out = []
        for f in sorted(logs.rglob("events.out.tfevents.*")):
            try:
                images = read_event_images(f)
            except Exception:  # noqa: BLE001 - a file being written; the next call reads it
                continue
            seen: dict[int, int] = {}
            for epoch, _, _, png in images:
                i = seen.get(epoch, 0)
                seen[epoch] = i + 1
                at = (epoch + 1) * self.per_epoch  # the scripts validate after the epoch's last step
                if at > step or (epoch, i) in self.sent:
                    continue
                self.sent.add((epoch, i))
                path = ctx.workdir / "validation" / f"{epoch:06d}_{i:02d}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(png)
                every = max(1, ctx.checkpoint_every)
                out.append(Found(path, at - at % every or at, i, {"rendered_at": at}))
        return out

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
        logs = self.log_dir(ctx)  # the tracker's logs go to tensorboard/trainer/, not to the model
        return sorted(p for p in ctx.checkpoint_dir.rglob("*")
                      if p.is_file() and not any(_CKPT.match(part) for part in p.relative_to(ctx.checkpoint_dir).parts)
                      and not (logs is not None and p.is_relative_to(logs)))
