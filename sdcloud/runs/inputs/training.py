"""What a run trains and with which flags, settled before launch.

- the base model: ``--model`` or the tier's default (``tiny`` on this machine and the user's boxes,
  the tier's ``base_model`` on a cloud, which bills for it); its family is checked against the tier's;
- the trainer flags: the tier's defaults for the trainer (resolution, batch size, memory-saving
  flags), under what the user passed (``--trainer-arg KEY=VALUE``, ``trainer_args`` in a run file);
- the flags each external trainer's scripts require, refused before anything launches.
"""

from __future__ import annotations

from typing import Any

from ...errors import UserError
from ...offers.tiers import Tier
from ...providers.traits import Hosts, is_cloud, names

# The local provider paces the tiny model to one step a second so that a reclaim lands mid-run.
DEMO_STEP_SECONDS = 1.0


def resolve_model(model: str | None, provider: str, tier: Tier) -> str:
    """The model to train. ``tiny`` (a random test model) costs money on a paid provider without
    teaching anything: there only its full name (``tiny-sd15`` ...) asks for it."""
    paid = provider in names(where=is_cloud)
    if model is None:
        if paid:
            if not tier.base_model:
                raise UserError(f"tier {tier.name} names no base model: pass --model")
            return tier.base_model
        return "tiny"
    if model == "tiny" and paid:
        raise UserError(f"--model tiny is a random test model; on {provider} ask for it by its full name "
                        f"(--model tiny-{tier.family}) or train a real one (default: {tier.base_model})")
    return model


def on_this_machine(provider: str) -> bool:
    """Hosts that are this computer (the local provider): the tiny model is paced there."""
    return provider in names(where=lambda t: t.hosts is Hosts.THIS_MACHINE)


def accepted_families(tier: Tier) -> tuple[str, ...]:
    """SD 2.x models train under the SD 1.5 tiers: the same UNet size at 512-768 px."""
    return ("sd15", "sd2") if tier.family == "sd15" else (tier.family,)


def check_model_family(model: str, tier: Tier) -> str | None:
    """The model's family, checked against the tier's; None when only the host can tell (a bucket
    URL or an unknown hub id: the trainer checks it there with the real loaders)."""
    from sdcloud_agent.trainers.models import ModelError, detect_family

    try:
        family = detect_family(model, default_tiny=tier.family)
    except ModelError as exc:
        raise UserError(f"--model {exc}") from None
    if family is not None and family not in accepted_families(tier):
        raise UserError(f"--model {model} is an {family} model but tier {tier.name} trains {tier.family}; "
                        f"pick a {tier.family} model or a {family} tier (sdcloud tiers)")
    from sdcloud_agent.trainers.models import looks_like_hub_id

    from . import hub_access

    if looks_like_hub_id(model) and hub_access.gated_family(family):
        hub_access.check_access(model)  # the gate, answered for the user's token (one line each)
    return family


# -- trainer flags -------------------------------------------------------------------------------

def parse_trainer_arg(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> (key, value); ``true``/``false`` become booleans (a bare flag / none),
    a bare ``KEY`` is a flag."""
    key, eq, value = text.partition("=")
    key = key.strip().lstrip("-")
    if not key:
        raise UserError(f"--trainer-arg must be KEY=VALUE, got {text!r}")
    if not eq:
        return key, True
    low = value.strip().lower()
    if low in ("true", "yes"):
        return key, True
    if low in ("false", "no"):
        return key, False
    return key, value


def merge_trainer_args(from_file: Any, pairs: list[str] | tuple[str, ...]) -> Any:
    """A run file's trainer_args (a mapping, an argv list or a string) with --trainer-arg pairs
    on top. A mapping stays a mapping (keys and values)."""
    if isinstance(from_file, str):
        import shlex

        from_file = shlex.split(from_file)
    if from_file is None:
        from_file = {} if pairs else []
    if not isinstance(from_file, (dict, list)):
        raise UserError(f"trainer_args must be a mapping or a list, got {type(from_file).__name__}")
    if not pairs:
        return from_file
    extra = dict(parse_trainer_arg(p) for p in pairs)
    if isinstance(from_file, dict):
        return {**from_file, **extra}
    from sdcloud_agent.trainers.base import flag_args

    return [*map(str, from_file), *flag_args(extra)]


def _given(args: Any, key: str) -> bool:
    names = {key, key.replace("-", "_"), key.replace("_", "-")}
    if isinstance(args, dict):
        return any(str(k).lstrip("-") in names for k in args)
    return any(str(a).split("=")[0].lstrip("-") in names for a in args or [])


KOHYA_SCRIPTS = {("sd15", "lora"): "train_network.py", ("sdxl", "lora"): "sdxl_train_network.py",
                 ("sd15", "dreambooth"): "train_db.py", ("sdxl", "dreambooth"): "sdxl_train.py",
                 ("sd3", "lora"): "sd3_train_network.py", ("sd3", "dreambooth"): "sd3_train.py"}
DIFFUSERS_SCRIPTS = {("sd15", "lora"): "train_dreambooth_lora.py", ("sdxl", "lora"): "train_dreambooth_lora_sdxl.py",
                     ("sd15", "dreambooth"): "train_dreambooth.py",
                     ("sd3", "lora"): "train_dreambooth_lora_sd3.py", ("sd3", "dreambooth"): "train_dreambooth_sd3.py"}


def tier_defaults(trainer: str, tier: Tier) -> dict[str, Any]:
    """Flags that fit the tier's VRAM floor, for each trainer. mixed_precision "auto" is settled on
    the host from the GPU's compute capability (bf16 on 8.x and later, fp16 below)."""
    fam = "sd15" if tier.family == "sd2" else tier.family
    if trainer == "builtin":
        return {"family": ",".join(accepted_families(tier)), "mode": tier.mode, "resolution": tier.resolution,
                "batch-size": tier.batch_size}
    if trainer == "kohya":
        out: dict[str, Any] = {"script": KOHYA_SCRIPTS.get((fam, tier.mode), "sdxl_train_network.py"),
                               "resolution": f"{tier.resolution},{tier.resolution}",
                               "train_batch_size": tier.batch_size, "mixed_precision": "auto",
                               "gradient_checkpointing": True, "cache_latents": True,
                               "optimizer_type": "AdamW8bit"}
        if tier.mode == "lora":
            out.update(network_module="networks.lora", network_dim=16, network_alpha=16)
            if fam == "sdxl":
                # Text-encoder outputs cached once: both encoders leave the GPU (UNet-only LoRA).
                out.update(cache_text_encoder_outputs=True, network_train_unet_only=True)
            if fam == "sd3":
                # SD3's own LoRA module; the three encoders' outputs (T5-XXL's ~9.5 GB) cached once
                # and the transformer alone trained (kohya docs/sd3_train_network.md).
                out.update(network_module="networks.lora_sd3", cache_text_encoder_outputs=True,
                           network_train_unet_only=True)
        if tier.name == "sdxl-finetune":
            out["optimizer_type"] = "Adafactor"
        return out
    if trainer == "diffusers":
        return {"script": DIFFUSERS_SCRIPTS.get((fam, tier.mode), "train_dreambooth_lora_sdxl.py"),
                "resolution": tier.resolution, "train_batch_size": tier.batch_size, "mixed_precision": "auto",
                "gradient_checkpointing": True, "use_8bit_adam": True}
    return {}


def trainer_args_for(spec: Any, tier: Tier) -> Any:
    """The trainer_args the agent gets: the user's over the tier's defaults."""
    user = spec.trainer_args if spec.trainer_args is not None else []
    if spec.trainer in ("kohya", "diffusers") and not user:
        user = {}  # their adapters read flags from a mapping
    defaults = tier_defaults(spec.trainer, tier)
    if spec.trainer == "builtin" and on_this_machine(spec.provider) and str(spec.model).startswith("tiny"):
        defaults["min-step-seconds"] = DEMO_STEP_SECONDS
    if spec.trainer == "builtin" and str(spec.model).startswith("tiny"):
        defaults.pop("resolution", None)  # the tiny models train at 32 px whatever the tier
    if spec.trainer == "command":
        return user
    missing = {k: v for k, v in defaults.items() if not _given(user, k)}
    if isinstance(user, dict):
        return {**missing, **user}
    from sdcloud_agent.trainers.base import flag_args

    return [*flag_args(missing), *map(str, user)]


def resolution_from_model(spec: Any) -> bool:
    """Whether the host replaces the tier's resolution with the model's own (sdcloud_agent/resolution.py):
    for the trainers that take one, unless the user gave a resolution (or, for kohya, a dataset
    config, which carries its own)."""
    if spec.trainer not in ("builtin", "kohya", "diffusers"):
        return False
    user = spec.trainer_args if spec.trainer_args is not None else []
    return not (_given(user, "resolution") or (spec.trainer == "kohya" and _given(user, "dataset_config")))


def check_trainer_args(spec: Any, tier: Tier) -> None:
    """Refuse, before launch, a run whose trainer would stop at once for want of a flag."""
    if spec.trainer == "command":
        args = spec.trainer_args
        given = args.get("command") if isinstance(args, dict) else args
        if not given:  # its host would fail every boot on "needs trainer_args: the command line"
            raise UserError("trainer command needs the command to run: --trainer-arg command='python train.py ...' "
                            "(or trainer_args: [python, train.py, ...] in a run file)")
        return
    if spec.trainer not in ("kohya", "diffusers"):
        return
    from sdcloud_agent.trainers.diffusers import DiffusersTrainer
    from sdcloud_agent.trainers.kohya import KohyaTrainer

    args = trainer_args_for(spec, tier)
    if not isinstance(args, dict):
        raise UserError(f"trainer {spec.trainer} takes trainer_args as KEY=VALUE pairs or a mapping, not an argv list")
    adapter = KohyaTrainer() if spec.trainer == "kohya" else DiffusersTrainer()
    missing = adapter.missing_flags(args, has_dataset=bool(spec.dataset))
    if missing:
        raise UserError(f"trainer {spec.trainer} ({args.get('script') or adapter.default_script}) needs "
                        + ", ".join(f"--trainer-arg {m}=..." for m in missing))


def gpus_used(spec: Any) -> int | None:
    """How many GPUs of a host the run's trainer drives, for the optimizer's estimate (None: all).
    The builtin trainer uses every GPU; kohya and diffusers under a plain `accelerate launch` run
    one process on one GPU; a launcher that asks for more (--num_processes N, --multi_gpu) uses N
    (or all)."""
    if spec.trainer in ("builtin", "command"):
        # The builtin trainer runs one process per GPU (DDP); a command: assume it uses them all.
        return None
    args = spec.trainer_args if isinstance(spec.trainer_args, dict) else {}
    launcher = args.get("launcher") or []
    if isinstance(launcher, str):
        import shlex

        launcher = shlex.split(launcher)
    launcher = [str(a) for a in launcher]
    for i, a in enumerate(launcher):
        if a.startswith("--num_processes"):
            value = a.split("=", 1)[1] if "=" in a else (launcher[i + 1] if i + 1 < len(launcher) else "")
            try:
                return max(1, int(value))
            except ValueError:
                return None
    return None if "--multi_gpu" in launcher else 1
