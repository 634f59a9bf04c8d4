"""Where hosts get outside things: the agent's `network` setting (sdcloud_agent/network.py:
pip_index_url, hf_endpoint, torch_index_url, trainer_sources), from four layers, later ones win:

1. the profile of the host's network, as its provider declares it (`traits(name).network_profiles`:
   Tencent's mainland China regions get mirrors, providers/tencent/network.py), every other
   region nothing (the public services);
2. config.toml's `[network]` (every host);
3. config.toml's `[network.regions."<region>"]` (hosts in that region);
4. the run file's `network:` mapping (this run's hosts).

    [network]
    pip_index_url = "https://pypi.mirror.example/simple"
    [network.regions."ap-guangzhou"]
    hf_endpoint = ""                       # "" puts a setting back to the public service

docs/providers-tencent.md says what each default of the mainland profile is and why.
"""

from __future__ import annotations

from sdcloud_agent.network import SETTINGS, check

from ... import config
from ...errors import UserError
from ...providers.traits import names, traits


def profile(provider: str | None, region: str | None) -> tuple[str, dict[str, str]]:
    """(name, defaults) of the network a host in `region` of `provider` is in."""
    if provider in names():
        for net in traits(provider).network_profiles:
            if region in net.regions:
                return net.name, dict(net.defaults)
    return "global", {}


def host_network(region: str | None, provider: str | None = None, run: dict | None = None) -> dict[str, str]:
    """The network setting for a host: the region's profile, config.toml's [network], its region's
    table, then the run's own. Settings left at "" are dropped (the public service)."""
    table = config.settings().get("network") or {}
    if not isinstance(table, dict):
        raise UserError("config.toml [network] must be a table")
    unknown = set(table) - set(SETTINGS) - {"regions"}
    if unknown:
        raise UserError(f"config.toml [network] has no setting {sorted(unknown)[0]!r}: "
                        f"use {', '.join(SETTINGS)} or [network.regions.\"<region>\"]")
    out = profile(provider, region)[1]
    out.update({k: v for k, v in table.items() if k in SETTINGS})
    regions = table.get("regions") or {}
    if region and isinstance(regions, dict) and isinstance(regions.get(region), dict):
        out.update(regions[region])
    try:
        check(out)
    except ValueError as exc:
        raise UserError(f"config.toml {exc}") from None
    out.update(check_run(run))
    return {k: v for k, v in out.items() if v != ""}


def check_run(network) -> dict[str, str]:
    """A run file's `network:` mapping, checked; one UserError line when it is wrong."""
    if network is None:
        return {}
    try:
        check(network)
    except ValueError as exc:
        raise UserError(f"run file {exc}") from None
    return dict(network)
