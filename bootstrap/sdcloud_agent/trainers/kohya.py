"""Adapter for kohya sd-scripts.

Network scripts (`train_network.py`, `sdxl_train_network.py`, ...): `--save_state
--save_every_n_steps K` writes `<output_name>-step<8 digits>-state/` with train_state.json; resume
with `--resume <newest state folder> --skip_until_initial_step`, which restores the data position.
Past the first epoch those scripts set their global step to the step *within* the epoch (upstream:
`initial_step -= len(train_dataloader)` per skipped epoch, then `global_step = initial_step`), so
their folder names and step counts restart low. The adapter keeps its own global step: kohya's
first progress bar after a resume has `max_train_steps - kohya_step` steps, which gives kohya's
starting step, and every folder name is shifted by (our step - kohya's step). Progress bars count
from 0 in each process and are shifted by the resumed step.
When the memory ladder changed the optimizer after the checkpoint was saved (ctx.fresh_optimizer),
a network script starts from the state's weights (`--network_weights <state>/model.safetensors`,
names unprefixed) and `--initial_step <its step> --skip_until_initial_step`, with a fresh optimizer:
`--resume` would load the old optimizer's state into the new one.
DreamBooth / fine-tune scripts (`train_db.py`, `sdxl_train.py`, `fine_tune.py`) do not restore the
step: we pass only the remaining steps and add the resumed step to the numbers they print and save.

The dataset folder is converted into a dataset_config TOML (subsets, repeats, caption_extension):
a flat folder of images given as `--train_data_dir` makes kohya print "No data found" and exit 0.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .base import AccelerateTrainer, Context, _TQDM, flag_args, parse_tqdm

_STATE = re.compile(r"-step(\d+)-state$")
STEP_LOSING_SCRIPTS = ("train_db.py", "sdxl_train.py", "fine_tune.py", "sd3_train.py", "flux_train.py")
OWNED = ("output_dir", "max_train_steps", "save_every_n_steps", "save_state", "resume", "skip_until_initial_step",
         "initial_step")
# Our keys in trainer_args that are not kohya flags.
OURS = ("instance_prompt",)
# Attention implementations kohya takes (library/train_util.py at the pin): the user's choice wins.
ATTENTION = ("sdpa", "xformers", "mem_eff_attn")


def v_prediction_sd2(model: str) -> bool:
    """True for a Stable Diffusion 2 v-prediction model (SD 2.x 768-v) in diffusers layout: its
    UNet cross-attends to OpenCLIP-H (1024 wide) and its scheduler predicts v. kohya must then be
    told `--v2 --v_parameterization`, or it loads the wrong text encoder and trains on the wrong
    target. A single-file checkpoint does not say; the user passes the flags for one."""
    root = Path(model)
    try:
        unet = json.loads((root / "unet" / "config.json").read_text())
        sched = json.loads((root / "scheduler" / "scheduler_config.json").read_text())
    except (OSError, ValueError):
        return False
    return (unet.get("cross_attention_dim") == 1024 and not unet.get("addition_embed_type")
            and sched.get("prediction_type") == "v_prediction")


class KohyaTrainer(AccelerateTrainer):
    name = "kohya"
    default_script = "sdxl_train_network.py"

    def __init__(self) -> None:
        super().__init__()
        self.resumed_step = 0  # the run's global step at this process's start
        self.max_steps = 0  # the max_train_steps we passed
        self.awaiting_start = False  # a network-script resume whose starting step is not known yet

    def restores_step(self, ctx: Context) -> bool:
        _, script, _ = self._opts(ctx)
        return Path(script).name not in STEP_LOSING_SCRIPTS

    def missing_flags(self, args: dict, has_dataset: bool) -> list[str]:
        script = Path(str(args.get("script") or self.default_script)).name
        out = []
        if script not in STEP_LOSING_SCRIPTS and not args.get("network_module"):
            out.append("network_module")  # e.g. networks.lora
        if not (has_dataset or args.get("train_data_dir") or args.get("dataset_config")):
            out.append("dataset_config")
        if not (args.get("resolution") or args.get("dataset_config")):
            out.append("resolution")
        return out

    def model_flags(self, script: str, args: dict, model: str) -> dict:
        """Flags the model and the settled precision need, over what the user gave (each checked
        against the pinned sd-scripts parsers in data/trainer-options.json by the tests):
        - SDXL under fp16 (T4, V100): `--no_half_vae`, since SDXL's VAE overflows to NaN in fp16
          (kohya's docs/train_SDXL-en.md says so and recommends the flag);
        - an SD 2.x v-prediction model: `--v2 --v_parameterization`;
        - `--sdpa` (PyTorch's scaled-dot-product attention) unless another attention is chosen:
          without one of them kohya runs its plain attention, slower and larger.
        At the pinned commit (ae72efb9) the parsers define them at train_network.py:1849 and
        sdxl_train.py:925 (--no_half_vae), library/train_util.py:3644/3647 (--v2,
        --v_parameterization) and :3941 (--sdpa)."""
        out = dict(args)
        name = Path(script).name
        if name.startswith("sdxl_") and out.get("mixed_precision") == "fp16":
            out.setdefault("no_half_vae", True)
        if name.startswith("sd3_"):
            # SD3: the single file and the encoders' files (a folder fetched for kohya holds them).
            from .models import sd3_single_file_flags

            path = Path(model)
            if path.is_dir():
                out.update({k: v for k, v in sd3_single_file_flags(path).items() if not args.get(k)})
        elif not name.startswith("sdxl_") and v_prediction_sd2(model):
            out.setdefault("v2", True)
            out.setdefault("v_parameterization", True)
        if not any(out.get(a) for a in ATTENTION):
            out["sdpa"] = True
        return out

    def command(self, ctx: Context) -> list[str]:
        launcher, script, args = self._opts(ctx)
        args = self.model_flags(script, args, str(args.get("pretrained_model_name_or_path") or ctx.model))
        for k in OWNED:
            args.pop(k, None)
        instance_prompt = str(args.pop("instance_prompt", "sks"))
        args.setdefault("pretrained_model_name_or_path", ctx.model)
        args.setdefault("output_name", "sdcloud")
        batches_per_epoch = None
        if ctx.dataset is not None and "dataset_config" not in args and "train_data_dir" not in args:
            from .datasets import images_per_epoch, kohya_config

            res = int(str(args.get("resolution") or 1024).split(",")[0])
            batch = int(args.get("train_batch_size") or 1)
            args["dataset_config"] = str(kohya_config(
                ctx.dataset, ctx.workdir / "kohya_dataset.toml", res, batch, instance_prompt))
            if batch == 1 and int(args.get("gradient_accumulation_steps") or 1) == 1:
                # One image a batch: an epoch is exactly this many steps, buckets or not.
                batches_per_epoch = images_per_epoch(ctx.dataset)
        restores = self.restores_step(ctx)
        self.resumed_step = ctx.resume_step if ctx.resume is not None else 0
        # Step-losing scripts count from 0: shift everything by the resumed step. Network scripts
        # restore *a* step: the shift is learnt from their first progress bar (parse_line).
        self.step_offset = 0 if restores else self.resumed_step
        self.awaiting_start = restores and ctx.resume is not None
        steps = ctx.steps if restores else max(1, ctx.steps - self.resumed_step)
        if self.awaiting_start and batches_per_epoch:
            # Kohya will start at resumed_step mod batches_per_epoch and train to max_train_steps
            # in its own count: ask for the steps left, not for resumed_step's worth more.
            steps = ctx.steps - (self.resumed_step - self.resumed_step % batches_per_epoch)
        self.max_steps = steps
        flags: dict = {"output_dir": str(ctx.checkpoint_dir), "max_train_steps": steps,
                       "save_state": True, "save_every_n_steps": ctx.checkpoint_every,
                       **self.sample_flags(ctx, args), **self.log_flags(ctx, args), **args}
        if ctx.resume is not None and ctx.fresh_optimizer and restores:
            # The checkpoint's LoRA weights and kohya's step in it, without its optimizer state:
            # --initial_step takes the place of the state's step in kohya's arithmetic.
            from .safetensors_keys import unprefixed

            flags["network_weights"] = str(unprefixed(ctx.resume / "model.safetensors",
                                                      ctx.workdir / "fresh-optimizer" / "network_weights.safetensors"))
            flags["initial_step"] = json.loads((ctx.resume / "train_state.json").read_text())["current_step"]
            flags["skip_until_initial_step"] = True
        elif ctx.resume is not None:
            flags["resume"] = str(ctx.resume)
            if restores:
                flags["skip_until_initial_step"] = True
        return [*launcher, script, *flag_args(flags)]

    def sample_flags(self, ctx: Context, args: dict) -> dict:
        """The run's sample prompts as kohya's prompt file (`--d` seed, `--s` steps, size) and its
        interval; kohya renders them into <output_dir>/sample/ (sdcloud_agent/samples.py)."""
        s = ctx.samples
        if s is None or not s.prompts:
            return {}
        from ..samples import kohya_prompt_file

        res = str(args.get("resolution") or 1024).split(",")
        w, h = int(res[0]), int(res[-1])
        path = kohya_prompt_file(s, ctx.workdir / "kohya_sample_prompts.txt", w, h)
        return {"sample_prompts": str(path), "sample_every_n_steps": s.interval(ctx.checkpoint_every),
                "sample_sampler": s.sampler}

    def log_flags(self, ctx: Context, args: dict) -> dict:
        """kohya's own TensorBoard logs (and W&B's, with --report-to wandb) where the agent collects them."""
        if args.get("log_with") or args.get("logging_dir"):
            return {}  # the user's own logging wins; log_dir() finds theirs
        return {"log_with": "all" if ctx.report_to == "wandb" else "tensorboard",
                "logging_dir": str(ctx.workdir / "trainer-logs")}

    def log_dir(self, ctx: Context) -> Path | None:
        args = ctx.trainer_args if isinstance(ctx.trainer_args, dict) else {}
        return Path(str(args["logging_dir"])) if args.get("logging_dir") else ctx.workdir / "trainer-logs"

    def export_files(self, ctx: Context, step: int, path: Path) -> list[Path]:
        """kohya's LoRA at that step: `<output_name>-step<NNNNNNNN>.<ext>` beside the state folder
        (train_util.get_step_ckpt_name), written before the state."""
        m = _STATE.search(path.name)
        if not m:
            return []
        name = path.name[:m.start()]
        return sorted(p for p in ctx.checkpoint_dir.glob(f"{name}-step{m.group(1)}.*")
                      if p.is_file() and p.suffix in (".safetensors", ".ckpt", ".pt"))

    def samples(self, ctx: Context, folder: Path, step: int) -> list:
        from ..samples import kohya_samples

        return kohya_samples(ctx.checkpoint_dir, step, step - self.step_offset)

    def parse_line(self, line: str) -> dict | None:
        if not self.progress_label.search(line):
            return None
        m = _TQDM.search(line)
        prog = parse_tqdm(line)
        if m is None or prog is None:
            return None
        if self.awaiting_start:
            kohya_start = self.max_steps - int(m.group(2))  # the bar spans max_train_steps - start
            self.step_offset = self.resumed_step - kohya_start
            self.awaiting_start = False
        prog["step"] = int(m.group(1)) + self.resumed_step
        return prog

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

    def candidates(self, ctx: Context):
        if self.awaiting_start:
            return []  # folder numbers mean nothing until kohya's starting step is known
        return super().candidates(ctx)

    def is_complete(self, path: Path) -> bool:
        return any(path.glob("random_states_*.pkl"))

    def artifacts(self, ctx: Context) -> list[Path]:
        if not ctx.checkpoint_dir.is_dir():
            return []
        return sorted(p for p in ctx.checkpoint_dir.iterdir() if p.is_file())

    def missing_output(self, ctx: Context) -> str | None:
        if not any(p.suffix in (".safetensors", ".ckpt", ".pt") for p in self.artifacts(ctx)):
            return ("kohya exited 0 without writing its model (a .safetensors file in the output folder); "
                    "its log above says why (\"No data found\": the dataset layout)")
        return None
