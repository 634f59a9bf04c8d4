"""Every section and key of config.toml, checked at once before a run or a batch job is recorded.

Each setting is also read (and checked) where it is used, but some are used only on a host or only
on one provider ([hosts] on the host's self-end, [network] when a cloud host's user-data is
rendered): a bad value there used to surface after the run existed. `check_settings()` reads the
whole file against what sdcloud knows and refuses the first problem in one line: an unknown
section or key by name with the known ones, a bad value with the form it accepts.
"""

from __future__ import annotations

import math
from typing import Callable

from ... import config
from ...errors import UserError

Check = Callable[[object, str], None]


def _number(low: float, high: float | None = None, low_open: bool = False, whole: bool = False) -> Check:
    def check(value: object, what: str) -> None:
        form = ("a whole number" if whole else "a number") + (
            f" above {low:g}" if low_open else f" from {low:g}" if high is not None else f" of {low:g} or more")
        if high is not None:
            form += f" up to (not including) {high:g}"
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise UserError(f"{what} must be {form}, got {value!r}")
        try:
            number = float(value)
        except ValueError:
            raise UserError(f"{what} must be {form}, got {value!r}") from None
        if not math.isfinite(number) or (whole and number != int(number)) or number < low or (low_open and number <= low) or (
                high is not None and number >= high):
            raise UserError(f"{what} must be {form}, got {value!r}")
    return check


def _text(value: object, what: str) -> None:
    if not isinstance(value, str):
        raise UserError(f"{what} must be a string (in quotes), got {value!r}")


def _secret_text(value: object, what: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{what} must be a string (in quotes), e.g. token = \"hf_...\"")  # the value never shown


def _boolean(value: object, what: str) -> None:
    if not isinstance(value, bool) and str(value).lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise UserError(f"{what} must be true or false, got {value!r}")


def _duration(value: object, what: str) -> None:
    from ...durations import parse_seconds

    parse_seconds(value, what)  # type: ignore[arg-type]


def _provider(value: object, what: str) -> None:
    from ...providers.traits import names

    if str(value) not in names():
        raise UserError(f"{what} must be one of {', '.join(names())}, got {value!r}")


def _providers(value: object, what: str) -> None:
    """[defaults] providers: "aws,tencent" or a list, each a known provider (runs/inputs/clouds.py)."""
    from .clouds import split

    for name in split(value, what):
        _provider(name, what)


def _tier(value: object, what: str) -> None:
    from ...offers.tiers import all_tiers

    if str(value) not in all_tiers():
        raise UserError(f"{what} must be a tier ({', '.join(all_tiers())}), got {value!r}")


def _table(value: object, what: str) -> None:
    if not isinstance(value, dict) or any(isinstance(v, (dict, list)) for v in value.values()):
        raise UserError(f"{what} must be a table of names and values, e.g. [infra.extra] instanceType = \"g5.xlarge\"")


def _cidr(value: object, what: str) -> None:
    import ipaddress

    _text(value, what)
    if value != "":
        try:
            ipaddress.ip_network(str(value), strict=False)
        except ValueError:
            raise UserError(f"{what} must be an address range such as 203.0.113.7/32 (or \"\" for no SSH), "
                            f"got {value!r}") from None


def _network(table: dict, where: str) -> None:
    from sdcloud_agent.network import check

    try:
        check({k: v for k, v in table.items() if k != "regions"})
    except ValueError as exc:  # the agent's own words: the key, or the value and the form it takes
        raise UserError(f"{where}: {exc}") from None


def _network_section(table: object, what: str) -> None:
    from sdcloud_agent.network import SETTINGS

    if not isinstance(table, dict):
        raise UserError(f"{what} must be a table: [network] with {', '.join(SETTINGS)}, got {table!r}")
    unknown = sorted(set(table) - set(SETTINGS) - {"regions"})
    if unknown:
        raise UserError(f"{what} has no setting {unknown[0]!r}: use {', '.join(SETTINGS)} "
                        "or [network.regions.\"<region>\"]")
    _network(table, what)
    regions = table.get("regions", {})
    if not isinstance(regions, dict):
        raise UserError(f"{what}.regions must hold one table per region, e.g. [network.regions.\"ap-guangzhou\"]")
    for region, sub in regions.items():
        if not isinstance(sub, dict):
            raise UserError(f"{what}.regions.{region} must be a table of {', '.join(SETTINGS)}")
        _network(sub, f"{what}.regions.\"{region}\"")


# section -> key -> check. Sections a provider reads come from its traits (below).
KEYS: dict[str, dict[str, Check]] = {
    "defaults": {"provider": _provider, "region": _text, "tier": _tier, "unattended": _boolean,
                 "providers": _providers},
    "currency": {"cny_per_usd": _number(0, low_open=True)},
    "hosts": {"self_end_grace": _duration},
    "catalog": {"max_age_days": _number(0)},
    "infra": {"prefix": _text, "ssh_cidr": _cidr, "public_key": _text, "root_volume_gb": _number(0, low_open=True, whole=True),
              "owner_tag": _text, "checkpoint_expire_days": _number(0, whole=True), "agent_source": _text,
              "extra": _table},
    # a gated model's token (docs/training.md); HF_TOKEN in the environment goes over it (runs/hub_access.py)
    "huggingface": {"token": _secret_text},
    # the W&B key of `up --report-to wandb` (runs/inputs/samples.py); WANDB_API_KEY in the environment goes over it
    "wandb": {"key": _secret_text},
    # whether checkpoints with samples outlive the newest-3 rule while the run goes (runs/inputs/samples.py)
    "retention": {"keep_sampled": _boolean},
}


def known_keys() -> dict[str, dict[str, Check]]:
    """Every section sdcloud reads and its keys: the fixed ones, and each provider's own (its
    numeric settings, the spot discount of a provider with a price catalog, and what its
    `config_keys` module checks)."""
    from ...providers.loader import config_keys
    from ...providers.traits import every

    out = {k: dict(v) for k, v in KEYS.items()}
    for t in every():
        for section in t.config_sections:
            out.setdefault(section, {})
        for s in t.settings:
            out.setdefault(s.section, {})[s.key] = _number(0)
        if t.catalog:
            out.setdefault(t.name, {})["spot_discount"] = _number(0, 1)
        if t.config_keys:
            out.setdefault(t.name, {}).update(config_keys(t.name))
    return out


def check_settings(settings: dict | None = None) -> None:
    """UserError (one line) naming the first unknown section or key of config.toml, or the first bad
    value with the form it accepts; nothing when the file is absent or good."""
    settings = config.settings() if settings is None else settings
    if not settings:
        return
    name = "config.toml"
    known = known_keys()
    for section, table in settings.items():
        if section == "network":
            _network_section(table, f"{name} [network]")
            continue
        if section not in known:
            raise UserError(f"{name}: unknown section [{section}]; known: "
                            f"{', '.join(f'[{s}]' for s in sorted([*known, 'network']))}")
        if not isinstance(table, dict):
            raise UserError(f"{name}: [{section}] must be a table ([{section}] on a line of its own, then key = value)")
        keys = known[section]
        for key, value in table.items():
            if key not in keys:
                raise UserError(f"{name}: unknown key {key!r} in [{section}]; known: {', '.join(keys) or 'none'}")
            keys[key](value, f"{name} [{section}] {key}")
