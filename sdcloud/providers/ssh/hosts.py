"""The user's GPU boxes, as listed in $SDCLOUD_HOME/ssh-hosts.toml (docs/providers-ssh.md)."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ... import config
from ...errors import UserError

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class SshHost:
    name: str
    host: str
    user: str
    key: str  # path to the private key; the key itself is only ever read by paramiko
    gpu: str
    vram_gb: float
    gpu_count: int = 1
    port: int = 22
    price_per_hour: float = 0.0
    python: str = "python3"  # a shell word (or words) on the host
    workdir: str = "~/.sdcloud-agent"


def hosts_path(path: str | os.PathLike | None = None) -> Path:
    chosen = path or os.environ.get("SDCLOUD_SSH_HOSTS") or config.home() / "ssh-hosts.toml"
    return Path(chosen).expanduser()


def load_hosts(path: Path) -> list[SshHost]:
    """Parse and check the hosts file; any problem is one UserError line naming the file and field."""
    if not path.exists():
        raise UserError(f"no ssh hosts file at {path}: list your GPU hosts there as [[hosts]] tables "
                        f"(name, host, user, key, gpu, vram_gb; see docs/providers-ssh.md)")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{path}: not valid TOML ({exc})") from None
    raw_hosts = data.get("hosts")
    if not isinstance(raw_hosts, list) or not raw_hosts:
        raise UserError(f"{path}: no [[hosts]] tables; each needs name, host, user, key, gpu, vram_gb")
    hosts: list[SshHost] = []
    for i, raw in enumerate(raw_hosts, 1):
        where = f"{path}: host #{i}" + (f" ({raw.get('name')})" if isinstance(raw, dict) and raw.get("name") else "")
        if not isinstance(raw, dict):
            raise UserError(f"{where}: must be a table")
        for field in ("name", "host", "user", "key", "gpu", "vram_gb"):
            if raw.get(field) in (None, ""):
                raise UserError(f"{where} is missing '{field}'")
        unknown = set(raw) - set(SshHost.__dataclass_fields__)
        if unknown:
            raise UserError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        name = str(raw["name"])
        if not _NAME_RE.match(name):
            raise UserError(f"{where}: 'name' may hold letters, digits, '.', '_' and '-' only")
        if any(h.name == name for h in hosts):
            raise UserError(f"{where}: 'name' {name!r} is used twice")
        for field in ("host", "user", "key", "gpu", "python", "workdir"):
            if field in raw and not isinstance(raw[field], str):
                raise UserError(f"{where}: '{field}' must be a string")
        try:
            port, gpu_count = int(raw.get("port", 22)), int(raw.get("gpu_count", 1))
            vram, price = float(raw["vram_gb"]), float(raw.get("price_per_hour", 0.0))
        except (TypeError, ValueError) as exc:
            raise UserError(f"{where}: port, gpu_count, vram_gb and price_per_hour must be numbers ({exc})") from None
        if not 0 < port < 65536:
            raise UserError(f"{where}: 'port' must be 1-65535, got {port}")
        if gpu_count < 1 or vram <= 0 or price < 0:
            raise UserError(f"{where}: gpu_count and vram_gb must be positive and price_per_hour 0 or more")
        key = Path(raw["key"]).expanduser()
        if not key.is_absolute():
            key = path.parent / key  # relative to the hosts file, not to wherever sdcloud runs
        hosts.append(SshHost(name=name, host=raw["host"], user=raw["user"], key=str(key), gpu=raw["gpu"], vram_gb=vram,
                             gpu_count=gpu_count, port=port, price_per_hour=price, python=raw.get("python", "python3"),
                             workdir=raw.get("workdir", "~/.sdcloud-agent")))
    return hosts
