"""What a run is asked to do: `sdcloud up` flags over an optional run file (YAML or TOML).

Validation happens here, before anything is launched: every bad value is one UserError line.
`build_spec` returns a `RunPlan`: the spec with what it resolves to (the tier, the provider's
traits, the USD amounts checked by money.usd), resolved once here; a run row read back becomes a
plan with `RunPlan.of_run`. The controller, the agent config and the summary carry the plan and
never look a tier name up again.
"""

from __future__ import annotations

import tomllib
from dataclasses import fields
from pathlib import Path

from ...durations import parse_duration, parse_seconds  # noqa: F401 - re-exported: callers import them from here
from ...errors import UserError
from ...money import usd
from ...names import check_name, match_name
from ...providers.traits import traits
from ...offers.kinds import RunKind
from ...offers.tiers import get_tier
# The spec and plan live with the records (the bottom of runs/); they are built and checked here.
from ..records.run_spec import RunPlan, RunSpec  # noqa: F401 - callers import them from here

TRAINERS = ("builtin", "diffusers", "kohya", "command")
MAX_NODES = 64  # hosts in one multi-node group (`--nodes`)


FIELDS = {f.name for f in fields(RunSpec)}
# Names a run file may use for the same fields as the flags.
ALIASES = {"deadline": "deadline_hours", "max-price": "max_price", "simulate-preemption": "simulate_preemption",
           "trainer-args": "trainer_args", "checkpoint-every": "checkpoint_every",
           "max-failed-boots": "max_failed_boots", "self-end-grace": "self_end_grace",
           "sample-prompts": "sample_prompts", "sample-every": "sample_every", "sample-seed": "sample_seed",
           "report-to": "report_to"}


def load_runfile(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"run file {path} does not exist")
    text = p.read_text()
    try:
        if p.suffix in (".toml",):
            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as exc:  # a parse error of either format: one line
        kind = "TOML" if p.suffix == ".toml" else "YAML"
        raise UserError(f"run file {path} is not valid {kind}: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"run file {path} must hold a mapping of fields (tier, provider, steps, ...)")
    if {"spot", "on-demand", "on_demand"} & set(data) and len({"spot", "on-demand", "on_demand", "market"} & set(data)) > 1:
        raise UserError(f"run file {path}: spot, on-demand and market exclude each other: give one of them")
    out = {}
    for key, value in data.items():
        name = ALIASES.get(key, key.replace("-", "_"))
        if name == "spot":
            name, value = "market", ("spot" if value else "on-demand")
        elif name == "on_demand":
            name, value = "market", ("on-demand" if value else "spot")
        if name not in FIELDS:
            raise UserError(f"run file {path}: unknown field {key!r}; known: {', '.join(sorted(FIELDS))}")
        if name in ("dataset", "model") and isinstance(value, str) and "://" not in value:
            # A relative path: from the directory the user is in, else from the run file's folder.
            for base in (Path.cwd(), p.parent):
                candidate = (base / value).expanduser()
                if candidate.exists():
                    value = str(candidate.resolve())
                    break
        out[name] = value
    return out


def _positive(value, what: str, integer: bool = False):
    try:
        number = int(value) if integer else float(value)
        if integer and float(value) != int(value):
            raise ValueError
    except (TypeError, ValueError):
        raise UserError(f"{what} must be a positive {'whole ' if integer else ''}number, got {value!r}") from None
    if not number > 0:
        raise UserError(f"{what} must be a positive {'whole ' if integer else ''}number, got {value!r}")
    return number


def _simulates_reclaim(provider: str) -> bool:
    """Whether the provider can announce a reclaim on its own host (capabilities.SimulatesReclaim)."""
    from ...providers.capabilities import SimulatesReclaim
    from ...providers.loader import provider_class

    return issubclass(provider_class(provider), SimulatesReclaim)


def _providers(data: dict) -> str:
    """The run's (home) provider; `aws,tencent` (the flag or `providers`) also sets the run's list."""
    from .clouds import resolve

    listed = data.get("providers") is not None  # [defaults] providers or the run file's: named as such in an error
    found = resolve(data["providers"] if listed else data.get("provider", "local"), flag="providers" if listed else "--provider")
    data["providers"] = found if len(found) > 1 else None
    return found[0]


def build_spec(runfile: str | None, overrides: dict) -> RunPlan:
    """Flags (non-None values in `overrides`) override the run file; the result is validated and
    resolved (its tier, its provider's traits) into the run's plan."""
    data = load_runfile(runfile) if runfile else {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    from .config_check import check_settings

    check_settings()  # every section of config.toml, before the run exists (not only what this run reads)
    if "tier" not in data:
        raise UserError("--tier is required (or `tier:` in the run file); see: sdcloud tiers")
    tier = get_tier(str(data["tier"]))  # the one look-up of the tier name: the plan carries the Tier
    if tier.kind is not RunKind.TRAIN:
        raise UserError(f"tier {tier.name} makes images, it does not train: run it with "
                        f"sdcloud batch submit --tier {tier.name} --model M --prompts FILE")
    data["tier"] = tier.name
    data["provider"] = _providers(data)
    kind = traits(data["provider"])
    if data.get("region"):
        if not kind.default_region:  # a provider without regions (this machine, SSH hosts)
            raise UserError(f"--region {data['region']}: the {data['provider']} provider has no regions; "
                            "leave --region out (or [defaults] region in config.toml)")
    if data.get("market", "spot") not in ("spot", "on-demand"):
        raise UserError(f"market must be spot or on-demand, got {data['market']!r}")
    data["trainer"] = match_name(data.get("trainer", "builtin"), TRAINERS, "trainer")
    if data.get("max_price") is not None:  # USD amounts: money.usd, the one check of them
        data["max_price"] = usd(data["max_price"], "--max-price", per_hour=True)
    if data.get("budget") is not None:
        data["budget"] = usd(data["budget"], "--budget")
    if data.get("deadline_hours") is not None:
        data["deadline_hours"] = parse_duration(data["deadline_hours"])
    if data.get("steps") is not None:
        data["steps"] = _positive(data["steps"], "--steps", integer=True)
    if data.get("checkpoint_every") is not None:
        data["checkpoint_every"] = _positive(data["checkpoint_every"], "--checkpoint-every", integer=True)
    if data.get("nodes") is not None:
        data["nodes"] = _positive(data["nodes"], "--nodes", integer=True)
        if data["nodes"] > MAX_NODES:
            raise UserError(f"--nodes {data['nodes']}: at most {MAX_NODES} hosts train together")
        if data["nodes"] > 1 and not kind.market.multi_node:  # machines of a marketplace share no private network
            raise UserError(f"--nodes {data['nodes']}: the {data['provider']} provider rents single machines; "
                            "several hosts train together on a cloud whose hosts share a network, or this machine")
        if data["nodes"] > 1 and data.get("providers"):  # a group's hosts meet over one cloud's private network
            raise UserError(f"--nodes {data['nodes']}: a group of hosts trains in one cloud; name one provider, "
                            f"not {','.join(data['providers'])}")
        from ...providers.groups import check_group

        check_group(kind.name, data["nodes"])  # a provider that launches groups (capabilities.LaunchesGroups), this large
    if data.get("max_failed_boots") is not None:
        data["max_failed_boots"] = _positive(data["max_failed_boots"], "max-failed-boots", integer=True)
    if data.get("self_end_grace") is not None:
        data["self_end_grace"] = parse_seconds(data["self_end_grace"], "--self-end-grace")
    if data.get("simulate_preemption") is not None:
        data["simulate_preemption"] = _positive(data["simulate_preemption"], "--simulate-preemption")
        if not _simulates_reclaim(data.get("provider", "local")):
            raise UserError("--simulate-preemption works with the local provider only")
    if data.get("name") is not None:
        data["name"] = check_name(data["name"])
    if data.get("store") is not None:
        from .preflight import check_store_url

        # Before anything is created: an unusable URL used to leave a pending run behind.
        data["store"] = check_store_url(str(data["store"]), data.get("provider", "local"))
    if data.get("network") is not None:
        from .network import check_run

        data["network"] = check_run(data["network"])
    dataset = data.get("dataset")
    if dataset and "://" not in str(dataset) and not Path(str(dataset)).expanduser().exists():
        raise UserError(f"dataset path {dataset} does not exist")
    from .training import check_model_family, check_trainer_args, merge_trainer_args, resolve_model

    # `--trainer-arg KEY=VALUE` pairs go over the run file's trainer_args; a mapping stays one.
    data["trainer_args"] = merge_trainer_args(data.get("trainer_args"), data.pop("trainer_arg", None) or [])
    from .samples import check_samples

    check_samples(data)  # after the trainer's own flags are merged: the two sets of samples must not fight
    data["model"] = resolve_model(data.get("model"), data.get("provider", "local"), tier)
    check_model_family(data["model"], tier)
    model = str(data["model"])
    if "://" not in model and not model.startswith("cache:") and Path(model).expanduser().exists():
        from sdcloud_agent.trainers.models import is_tiny

        if not is_tiny(model):  # a local file or folder: absolute, as the controller (and upload) sees it
            data["model"] = str(Path(model).expanduser().resolve())
    if dataset and "://" not in str(dataset):
        from .datasets import check_dataset

        check_dataset(Path(str(dataset)).expanduser())
        limit = kind.object_key_bytes
        if limit:  # the cloud's bucket refuses a longer key: refused here, before anything launches
            from .datasets import check_keys

            check_keys(Path(str(dataset)).expanduser(), limit, data.get("store"))
    spec = RunSpec(**data)
    check_trainer_args(spec, tier)
    from .preflight import check_trainer_flags

    # The trainer's own parser, here rather than on a host that boots to print its usage text.
    check_trainer_flags(spec, tier, spec.steps or tier.job_size)
    return RunPlan(spec, tier, kind)
