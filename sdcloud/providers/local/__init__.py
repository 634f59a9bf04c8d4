"""This machine as a provider: agent processes (provider.py) and a metadata endpoint that can announce a reclaim (metadata.py)."""

from ..traits import Billing, Hosts, HostTraits, ProviderTraits, Setting, Timing, name_of

NAME = name_of(__name__)

TRAITS = ProviderTraits(
    name=NAME,
    hosts=Hosts.THIS_MACHINE,
    adapter=".provider",
    # The host is a process here: it shows at once, and is always there again after a simulated reclaim.
    timing=Timing(poll_seconds=1.0, boot_timeout=300.0, heartbeat_timeout=90.0, cooldown_seconds=0.0),
    host=HostTraits(nvme=False, gpu_required=False, metadata="none", heartbeat_seconds=2, poll_seconds=1),
    billing=Billing(currency="USD", free=True),  # config.toml [local] price_per_hour prices it, if set
    config_sections=(NAME,),  # [local], named after the provider
    settings=(Setting(NAME, "price_per_hour", 0.0, " USD/h"), Setting(NAME, "notice_seconds", 30.0, " s")),
)
