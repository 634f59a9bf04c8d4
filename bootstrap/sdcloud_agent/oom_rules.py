"""What each trainer allows the memory ladder (oom.py) to change without breaking the run: reading
a flag out of trainer_args, whether a changed optimizer can start fresh from a checkpoint, whether
kohya's SDXL scripts may cache the text encoders' outputs.

Pure: no torch; the facts are the pinned scripts' own checks, cited where they are used.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from typing import Any

# kohya's SDXL scripts assert `train_dataset_group.is_text_encoder_output_cacheable()` when
# --cache_text_encoder_outputs is given (sdxl_train_network.py assert_extra_args, sdxl_train.py
# train): that is false for any subset with caption dropout, shuffled captions, token warm-up or
# tag dropout, since each makes the text differ from one step to the next. The option names are
# the same on the command line and in a dataset_config subset.
TE_CACHE_BLOCKERS = ("shuffle_caption", "caption_dropout_rate", "token_warmup_step", "caption_tag_dropout_rate")


def lookup(args: Any, *names: str) -> Any:
    """A flag's value in trainer_args (a dict, or an argv list for builtin/command); None if unset."""
    keys = {n for name in names for n in (name, name.replace("-", "_"), name.replace("_", "-"))}
    if isinstance(args, dict):
        for k, v in args.items():
            if str(k).lstrip("-") in keys:
                return v
        return None
    if isinstance(args, list):
        found = None
        items = [str(a) for a in args]
        for i, a in enumerate(items):
            key, eq, val = a.lstrip("-").partition("=")
            if a.startswith("--") and key in keys:
                if eq:
                    found = val
                elif i + 1 < len(items) and not items[i + 1].startswith("--"):
                    found = items[i + 1]
                else:
                    found = True
            if a.startswith("--no-") and a[5:] in keys:
                found = False
        return found
    return None


def _on(value: Any) -> bool:
    """A flag or a rate that is in force: True, or a number above 0."""
    if value is True:
        return True
    if value in (None, False):
        return False
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return str(value).lower() in ("true", "yes", "on")


def te_cache_blocker(args: Any) -> str | None:
    """The option that makes kohya's text-encoder-output cache assert fail, or None. A user's own
    dataset_config is read for the same options in its [general], [[datasets]] and subsets; one
    that cannot be read counts as a blocker (caching is only an optimisation)."""
    for name in TE_CACHE_BLOCKERS:
        if _on(lookup(args, name)):
            return f"--{name}"
    config = lookup(args, "dataset_config")
    if not config or config is True:
        return None
    try:
        import tomllib  # novermin: Python 3.11+; the host may run 3.10 (caught below)
    except ImportError:
        return "a dataset_config (no TOML reader on this Python)"
    try:
        doc = tomllib.loads(Path(str(config)).read_text())
    except (OSError, ValueError) as exc:
        return f"a dataset_config that cannot be read ({exc})"
    tables = [doc.get("general") or {}]
    for ds in doc.get("datasets") or []:
        tables.append(ds)
        tables.extend(ds.get("subsets") or [])
    for table in tables:
        for name in TE_CACHE_BLOCKERS:
            if isinstance(table, dict) and _on(table.get(name)):
                return f"{name} in {Path(str(config)).name}"
    return None


def fresh_optimizer_refusal(trainer: str, args: Any, options: dict | None) -> str | None:
    """Why this trainer cannot start a changed optimizer fresh from a checkpoint's weights and step
    (None: it can). Resuming from the checkpoint itself would load the old optimizer's state into
    the new one (accelerate's load_state): bitsandbytes' AdamW8bit then reads state['state1'] and
    Adafactor state['exp_avg_sq_row'], a KeyError at the first step."""
    if trainer in ("builtin", "command"):
        return None  # builtin: --optimizer-change; command: told through SDCLOUD_MEMORY_RECIPE
    if trainer == "kohya":
        from .trainers.kohya import STEP_LOSING_SCRIPTS

        script = Path(str(lookup(args, "script") or "sdxl_train_network.py")).name
        if script in STEP_LOSING_SCRIPTS:
            return (f"{script} resumes only through --resume, which loads the old optimizer's state "
                    "into the new optimizer (a KeyError at the first step)")
        if options is not None and not ("--network_weights" in options and "--initial_step" in options):
            return f"{script} has no --network_weights/--initial_step to start a fresh optimizer from"
        return None
    if trainer == "diffusers":
        return ("the diffusers example scripts resume only through --resume_from_checkpoint, which loads "
                "AdamW's state into the new optimizer (a KeyError at the first step)")
    return "unknown trainer"


def has_bitsandbytes(python: str | None = None) -> bool:
    """Whether the trainer's interpreter can import bitsandbytes (its own venv for kohya)."""
    if python is None:
        return importlib.util.find_spec("bitsandbytes") is not None
    try:
        return subprocess.run([python, "-c", "import importlib.util,sys;"
                               "sys.exit(importlib.util.find_spec('bitsandbytes') is None)"],
                              capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def script_options(trainer: str, trainer_args: Any) -> dict | None:
    if trainer not in ("kohya", "diffusers"):
        return None
    from .trainers import options

    default = {"kohya": "sdxl_train_network.py", "diffusers": "train_dreambooth_lora_sdxl.py"}[trainer]
    script = trainer_args.get("script", default) if isinstance(trainer_args, dict) else default
    return options.script_options(trainer, Path(str(script)).name)
