"""GPU boxes the user owns (hosts.py), reached over SSH (connection.py), where host_helper.py does the work (provider.py)."""

from ..traits import Billing, Hosts, HostTraits, ProviderTraits, Timing, name_of

TRAITS = ProviderTraits(
    name=name_of(__name__),
    hosts=Hosts.OWN,
    adapter=".provider",
    # No image to boot: a lost box shows soon; a box is the same box after a reclaim, so no cooldown.
    timing=Timing(poll_seconds=2.0, boot_timeout=600.0, heartbeat_timeout=120.0, cooldown_seconds=0.0),
    # A box of the user's may train on its CPU, and its disks are the user's to arrange.
    host=HostTraits(nvme=False, gpu_required=False, metadata="none", heartbeat_seconds=10, poll_seconds=5),
    billing=Billing(currency="USD", free=True),
)
