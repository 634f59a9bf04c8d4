"""A run's sample images and curve logging as asked (`--sample-prompt`, `--sample-every`, `--sample-seed`,
`--report-to`, or the run file's `sample_prompts` list), checked before anything launches, and what the
host agent is told of them (sdcloud_agent/samples.py's SampleSettings)."""

from __future__ import annotations

import os

from ... import config
from ...errors import UserError

MAX_PROMPTS = 16  # a grid of prompts x checkpoints a page can show; each costs GPU seconds per checkpoint
MAX_PROMPT_CHARS = 1000
REPORT_TO = ("tensorboard", "wandb")
# Trainers that render samples themselves from our prompts (the command trainer is the user's own program).
SAMPLING_TRAINERS = ("builtin", "kohya", "diffusers")
# A trainer's own sample flags: given beside --sample-prompt, two sets of prompts would fight.
# The trainers that log to W&B themselves (kohya's --log_with, the diffusers scripts' --report_to).
WANDB_TRAINERS = ("kohya", "diffusers")
WANDB_ENV = "WANDB_API_KEY"
WANDB_SECRET = "secrets/wandb-key"  # under the run's prefix; the host's agent reads it (sdcloud_agent/agent.py)
OWN_SAMPLE_FLAGS = ("validation-prompt", "validation_prompt", "sample_prompts", "sample_every_n_steps")


def check_samples(data: dict) -> None:
    """Settle and check the sample fields of a spec's data in place (one line, exit 2, on a bad one)."""
    prompts = data.get("sample_prompts")
    if prompts is not None:
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)) or not all(isinstance(p, str) for p in prompts):
            raise UserError("sample_prompts must be a list of prompts (text)")
        prompts = [p.strip() for p in prompts]
        if any(not p for p in prompts):
            raise UserError("--sample-prompt must not be empty")
        if any("\n" in p or "\r" in p for p in prompts):
            raise UserError("--sample-prompt must be one line (kohya reads its prompts a line each)")
        if any(len(p) > MAX_PROMPT_CHARS for p in prompts):
            raise UserError(f"--sample-prompt is at most {MAX_PROMPT_CHARS} characters")
        if len(prompts) > MAX_PROMPTS:
            raise UserError(f"at most {MAX_PROMPTS} sample prompts, got {len(prompts)}")
        data["sample_prompts"] = list(prompts) or None
    for key, flag in (("sample_every", "--sample-every"), ("sample_seed", "--sample-seed")):
        value = data.get(key)
        if value is None:
            continue
        try:
            number = int(value)
            if float(value) != number:
                raise ValueError
        except (TypeError, ValueError):
            raise UserError(f"{flag} must be a whole number, got {value!r}") from None
        if number < (1 if key == "sample_every" else 0) or number >= 2 ** 31:
            raise UserError(f"{flag} must be {'a positive' if key == 'sample_every' else 'a non-negative'} "
                            f"whole number below 2**31, got {value!r}")
        data[key] = number
    if (data.get("sample_every") is not None or data.get("sample_seed") is not None) and not data.get("sample_prompts"):
        raise UserError("--sample-every and --sample-seed need at least one --sample-prompt")
    trainer = data.get("trainer") or "builtin"
    if data.get("sample_prompts") and trainer not in SAMPLING_TRAINERS:
        raise UserError(f"--sample-prompt: the {trainer} trainer is your own program and renders no samples; "
                        f"use {', '.join(SAMPLING_TRAINERS)}")
    if trainer == "diffusers" and len(data.get("sample_prompts") or ()) > 1:
        raise UserError("--sample-prompt: the diffusers scripts render one validation prompt; give one "
                        "(the builtin trainer and kohya take several)")
    args = data.get("trainer_args")
    given = list(args) if isinstance(args, dict) else [str(a).lstrip("-").split("=")[0] for a in args or ()]
    if data.get("sample_prompts") and any(k in given for k in OWN_SAMPLE_FLAGS):
        raise UserError("--sample-prompt and the trainer's own sample flags in trainer_args both set the samples: keep one")
    report = data.get("report_to")
    if report is not None and report not in REPORT_TO:
        raise UserError(f"--report-to must be one of {', '.join(REPORT_TO)}, got {report!r}")
    if report == "wandb" and trainer not in WANDB_TRAINERS:
        raise UserError(f"--report-to wandb: the {trainer} trainer does not log to W&B; "
                        f"{' and '.join(WANDB_TRAINERS)} do (the curves are in the run's store either way)")
    if report == "wandb" and not wandb_key():
        raise UserError(f"--report-to wandb needs your W&B key: set {WANDB_ENV} or [wandb] key in config.toml")


def wandb_key() -> str | None:
    """The user's W&B key: the environment first, then config.toml [wandb] key."""
    value = os.environ.get(WANDB_ENV, "").strip() or str((config.settings().get("wandb") or {}).get("key") or "").strip()
    return value or None


def put_wandb_key(store, run_id: str, spec) -> bool:
    """The W&B key where the run's host reads it into its trainer's environment (never into its config,
    user-data, the state store or a log); whether one was put."""
    key = wandb_key() if spec.report_to == "wandb" else None
    if not key:
        return False
    store.put(f"runs/{run_id}/{WANDB_SECRET}", key.encode())
    return True


def keep_sampled() -> bool:
    """config.toml [retention] keep_sampled (default true): a checkpoint with samples is kept while the run
    goes, beside the newest ones, so that `pull --step N` can fetch the step a sample shows."""
    raw = (config.settings().get("retention") or {}).get("keep_sampled", True)
    return raw if isinstance(raw, bool) else str(raw).lower() in ("true", "1", "yes")


def agent_samples(spec) -> dict | None:
    """The host's sample settings (sdcloud_agent/samples.py SampleSettings.from_dict), or None."""
    if not spec.sample_prompts:
        return None
    return {"prompts": list(spec.sample_prompts), "every": int(spec.sample_every or 0),
            "seed": int(spec.sample_seed or 0), "sampler": "euler", "steps": 20}
