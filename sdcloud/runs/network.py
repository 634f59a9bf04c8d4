"""Where hosts get outside things, from config.toml: the agent's `network` setting
(sdcloud_agent/network.py: pip_index_url, hf_endpoint, torch_index_url).

    [network]                              # every host
    pip_index_url = "https://pypi.mirror.example/simple"
    [network.regions."ap-guangzhou"]       # hosts in one region (wins over [network])
    hf_endpoint = "https://hub.mirror.example"

sdcloud ships no mirror defaults: which mirror of the hub or of PyPI a user trusts is theirs to say.
"""

from __future__ import annotations

from sdcloud_agent.network import ENV, check

from .. import config
from ..errors import UserError


def host_network(region: str | None) -> dict[str, str]:
    """The network setting for a host in `region`: config.toml's [network], then its region's table."""
    table = config.settings().get("network") or {}
    if not isinstance(table, dict):
        raise UserError("config.toml [network] must be a table")
    out = {k: v for k, v in table.items() if k in ENV}
    regions = table.get("regions") or {}
    if region and isinstance(regions, dict) and isinstance(regions.get(region), dict):
        out.update(regions[region])
    unknown = set(table) - set(ENV) - {"regions"}
    if unknown:
        raise UserError(f"config.toml [network] has no setting {sorted(unknown)[0]!r}: use {', '.join(ENV)} or [network.regions.\"<region>\"]")
    try:
        check(out)
    except ValueError as exc:
        raise UserError(f"config.toml {exc}") from None
    return out
