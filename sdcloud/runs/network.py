"""Where hosts get outside things: the agent's `network` setting (sdcloud_agent/network.py:
pip_index_url, hf_endpoint, torch_index_url, trainer_sources), from four layers, later ones win:

1. the profile of the host's network: Tencent's mainland China regions get MAINLAND below, every
   other region nothing (the public services);
2. config.toml's `[network]` (every host);
3. config.toml's `[network.regions."<region>"]` (hosts in that region);
4. the run file's `network:` mapping (this run's hosts).

    [network]
    pip_index_url = "https://pypi.mirror.example/simple"
    [network.regions."ap-guangzhou"]
    hf_endpoint = ""                       # "" puts a setting back to the public service

docs/providers-tencent.md says what each default is and why.
"""

from __future__ import annotations

from sdcloud_agent.network import SETTINGS, check

from .. import config
from ..errors import UserError

# Tencent Cloud regions in mainland China (Tencent's "Regions and Availability Zones" list, as COS
# names them: Guangzhou, Shanghai, Nanjing, Beijing, Chengdu, Chongqing and the finance zones of
# Shanghai, Shenzhen and Beijing; the catalog's ap-guangzhou, ap-shanghai and ap-beijing rows). Hong Kong, Taipei and every region outside China are not in it.
MAINLAND_REGIONS = frozenset({
    "ap-guangzhou", "ap-shanghai", "ap-nanjing", "ap-beijing", "ap-chengdu", "ap-chongqing",
    "ap-shanghai-fsi", "ap-shenzhen-fsi", "ap-beijing-fsi",
})

# The mainland profile. Each is a default, overridable as above:
# - pip_index_url: Tencent Cloud's own PyPI mirror (mirrors.cloud.tencent.com, its mirror site's
#   PyPI help page); over https it works from any network. Inside a Tencent VPC the same mirror is
#   also served as http://mirrors.tencentyun.com/pypi/simple (no public traffic; pip is then told
#   to trust the plain-http host);
# - hf_endpoint: hf-mirror.com, a community mirror of the Hugging Face hub that speaks the hub's
#   HTTP API (huggingface_hub reads HF_ENDPOINT); not run by Tencent nor by Hugging Face;
# - trainer_sources: "bucket": kohya's sd-scripts and the diffusers examples travel through the
#   run's bucket, put there by the control plane (sdcloud/runs/carry.py), never fetched from GitHub
#   by the host.
# torch's CUDA wheels keep download.pytorch.org (no mirror of its per-CUDA indexes was verified);
# the environment they are part of is cached in the bucket after the first boot.
MAINLAND = {
    "pip_index_url": "https://mirrors.cloud.tencent.com/pypi/simple",
    "hf_endpoint": "https://hf-mirror.com",
    "trainer_sources": "bucket",
}


def profile(provider: str | None, region: str | None) -> tuple[str, dict[str, str]]:
    """(name, defaults) of the network a host in `region` of `provider` is in."""
    if provider == "tencent" and region in MAINLAND_REGIONS:
        return "mainland", dict(MAINLAND)
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
