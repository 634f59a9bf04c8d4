"""Where sdcloud keeps its files, and the user's settings ($SDCLOUD_HOME/config.toml)."""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from pathlib import Path

from .errors import UserError

# Default CNY per USD used to rank Tencent Cloud offers priced in yuan against USD ones.
# Order of magnitude of the 2025-2026 rate (about 7.1-7.3, People's Bank of China central parity);
# override with SDCLOUD_CNY_PER_USD or [currency] cny_per_usd in config.toml.
DEFAULT_CNY_PER_USD = 7.1


def home() -> Path:
    """$SDCLOUD_HOME, default ~/.sdcloud; created with mode 0700 on first use."""
    path = Path(os.environ.get("SDCLOUD_HOME") or Path.home() / ".sdcloud").expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:  # a file of that name, a read-only place: one line, not a traceback
        why = "it is a file" if path.exists() and not path.is_dir() else (exc.strerror or str(exc))
        raise UserError(f"sdcloud's home {path} cannot be used ({why}): set SDCLOUD_HOME to a folder sdcloud may "
                        "write") from None
    return path


@lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


# The config.toml sections a run recorded when it was made (runs/inputs/staging.py): while a controller
# acts for that run, they stand in for this machine's (a cloud function's home has no config.toml).
_RUN_SETTINGS: ContextVar[dict | None] = ContextVar("sdcloud_run_settings", default=None)


def settings() -> dict:
    """The parsed config.toml under $SDCLOUD_HOME, or {} when there is none; with the sections of the
    run being driven (`run_settings`) in place of this machine's."""
    path = home() / "config.toml"
    base: dict = {}
    if path.exists():
        if path.is_dir():
            raise UserError(f"{path} is a folder: config.toml must be a file (move the folder aside)")
        try:
            base = _load(str(path), path.stat().st_mtime)
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{path}: not valid TOML ({exc})") from exc
        except UnicodeDecodeError as exc:  # TOML is UTF-8: a file saved in another encoding, or not text
            raise UserError(f"{path}: not UTF-8 text (byte {exc.start}): save it as UTF-8") from None
        except OSError as exc:
            raise UserError(f"{path} cannot be read ({exc.strerror or exc})") from None
    recorded = _RUN_SETTINGS.get()
    return {**base, **recorded} if recorded else base


@contextmanager
def run_settings(sections: dict | None) -> Iterator[None]:
    """Within: `settings()` answers with these sections (a run's recorded ones) over config.toml's."""
    token = _RUN_SETTINGS.set(dict(sections) if sections else None)
    try:
        yield
    finally:
        _RUN_SETTINGS.reset(token)


def _positive_float(value: object, what: str) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise UserError(f"{what} must be a positive number, got {value!r}") from None
    if not 0 < number < math.inf:  # nan and inf too: a rate that ranks every yuan offer as free or priceless
        raise UserError(f"{what} must be a positive number, got {value!r}")
    return number


def usd_per(currency: str) -> float:
    """How many USD one unit of `currency` is worth, for ranking offers in one currency."""
    currency = currency.upper()
    if currency == "USD":
        return 1.0
    if currency == "CNY":
        env = os.environ.get("SDCLOUD_CNY_PER_USD")
        if env is not None:
            return 1.0 / _positive_float(env, "SDCLOUD_CNY_PER_USD")
        section = settings().get("currency", {})
        if not isinstance(section, dict):
            raise UserError(f"{home() / 'config.toml'}: [currency] must be a table")
        conf = section.get("cny_per_usd")
        if conf is not None:
            return 1.0 / _positive_float(conf, "config.toml [currency] cny_per_usd")
        return 1.0 / DEFAULT_CNY_PER_USD
    raise UserError(f"unknown currency {currency!r}: sdcloud knows USD and CNY")


# unattended: `sdcloud up` hands every run to the cloud driver (as --unattended does).
# providers: the clouds a run may use, home first ("aws,tencent" or a list; docs/runs.md).
DEFAULT_KEYS = ("provider", "region", "tier", "unattended", "providers")


def defaults() -> dict:
    """[defaults] in config.toml: provider, region and tier used when a command is not given them."""
    raw = settings().get("defaults", {})
    if not isinstance(raw, dict):
        raise UserError(f"{home() / 'config.toml'}: [defaults] must be a table")
    unknown = set(raw) - set(DEFAULT_KEYS)
    if unknown:
        raise UserError(f"{home() / 'config.toml'}: unknown key(s) in [defaults]: {', '.join(sorted(unknown))}; "
                        f"known: {', '.join(DEFAULT_KEYS)}")
    out = {k: ",".join(map(str, v)) if isinstance(v, list) else str(v) for k, v in raw.items()}
    if "unattended" in raw:
        out["unattended"] = "true" if _flag(raw["unattended"], "[defaults] unattended") else "false"
    return out


_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def _flag(value: object, what: str) -> bool:
    """A yes/no setting: TOML's true/false (or the words for them); anything else is refused, not read as no."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise UserError(f"config.toml {what} must be true or false, got {value!r}")


def numbers(section: str, keys: tuple[str, ...] | list[str]) -> dict[str, float]:
    """The keys of a provider's section of config.toml that are set, each a number of 0 or more
    (the local provider's [local]: what this machine costs in USD per hour, for costs and the cost
    report, and the seconds of the simulated reclaim notice)."""
    raw = settings().get(section, {})
    if not isinstance(raw, dict):
        raise UserError(f"{home() / 'config.toml'}: [{section}] must be a table")
    out = {}
    for key in keys:
        if key in raw:
            value = raw[key]
            try:
                out[key] = float(value)
            except (TypeError, ValueError):
                raise UserError(f"config.toml [{section}] {key} must be a number, got {value!r}") from None
            if out[key] < 0:
                raise UserError(f"config.toml [{section}] {key} must be 0 or more, got {value!r}")
    return out


DEFAULT_SELF_END_GRACE_S = 600.0


def self_end_grace() -> float:
    """[hosts] self_end_grace in config.toml (seconds, or a duration such as "10m"): how long a host
    whose work is over waits for the controller before it ends itself; 10 minutes when unset."""
    raw = settings().get("hosts", {})
    if not isinstance(raw, dict):
        raise UserError(f"{home() / 'config.toml'}: [hosts] must be a table")
    if "self_end_grace" not in raw:
        return DEFAULT_SELF_END_GRACE_S
    from .durations import parse_seconds

    return parse_seconds(raw["self_end_grace"], "config.toml [hosts] self_end_grace")


# A setting whose name holds one of these words, or whose value starts like a known credential, is a
# secret: shown masked (config show), never written to state, journal, log or report.
SECRET_KEY_WORDS = ("token", "secret", "password", "access_key", "credential", "private_key")
SECRET_VALUE_PREFIXES = ("hf_", "AKIA", "ASIA", "AKID", "-----BEGIN")
# Settings that are secrets under a plain name (section.key).
SECRET_SETTINGS = ("wandb.key",)


def looks_secret(key: str, value: object) -> bool:
    return key.lower() in SECRET_SETTINGS or any(w in key.lower() for w in SECRET_KEY_WORDS) or (
        isinstance(value, str) and value.startswith(SECRET_VALUE_PREFIXES))


def masked(value: object) -> str:
    """A secret as it may be shown: its kind prefix (`hf_`) and its last four characters, enough for
    the user to tell which token is in effect, e.g. `hf_…abcd`; a short one shows nothing of itself."""
    text = str(value)
    prefix = next((p for p in ("hf_", "AKIA", "ASIA", "AKID") if text.startswith(p)), "")
    rest = text[len(prefix):]
    return f"{prefix}…{rest[-4:]}" if len(rest) >= 12 else f"{prefix}…"


# Values shaped like credentials, wherever they stand in a message: a Hugging Face token, an AWS or a
# Tencent Cloud key id, and a long base64 run of mixed case and digits (a secret key, a token).
_SECRET_SHAPES = re.compile(r"hf_[A-Za-z0-9]{8,}|(?:AKIA|ASIA)[A-Z0-9]{12,}|AKID[A-Za-z0-9]{12,}"
                            r"|(?<![A-Za-z0-9+/=])[A-Za-z0-9+/]{32,}={0,2}")


def _mask_match(m: re.Match) -> str:
    text = m.group()
    if text.startswith(("hf_", "AKIA", "ASIA", "AKID")):
        return masked(text)
    mixed = any(c.isupper() for c in text) and any(c.islower() for c in text) and any(c.isdigit() for c in text)
    return masked(text) if mixed and "//" not in text else text  # a hex digest or a path stays as it is


def redact(message: str) -> str:
    """A message with every value that looks like a secret masked (`hf_…abcd`): an error quotes what the
    user wrote, and a token pasted under the wrong key must not be echoed back to the terminal or a log."""
    return _SECRET_SHAPES.sub(_mask_match, message)
