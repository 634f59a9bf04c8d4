"""Vast.ai: a marketplace of GPU machines rented on demand or by interruptible bid (docs/providers-vast.md).

session.py: the REST API and its key; compute.py: offers, create, describe, destroy, bids; catalog.py:
the live bundles search; catalog_build.py and catalog.csv: the bundled snapshot; bids.py: the bid
sdcloud places; billing.py: the per-instance charges; credentials.py: the host's scoped store keys.
"""

from sdcloud_agent.store import dialects

from . import limits
from ..traits import Billing, HostTraits, Hosts, MarketRules, PriceCatalog, ProviderTraits, Setting, Timing, name_of

TRAITS = ProviderTraits(
    name=name_of(__name__),
    hosts=Hosts.CLOUD,
    adapter=".compute",
    # No reclaim notice: an outbid machine is paused at once (reclaim_notice_seconds 0). A stranger's
    # machine pulls the image before the onstart command runs: a longer boot than a cloud image.
    timing=Timing(poll_seconds=10.0, boot_timeout=2400.0, heartbeat_timeout=600.0, cooldown_seconds=1800.0,
                  reclaim_notice_seconds=0.0),
    # The container's disk is the machine's; nothing to format. The image brings CUDA and the driver.
    # The agent's clouds/vast.py: no metadata service, the store's keys from the container's environment.
    host=HostTraits(nvme=False, gpu_required=True, metadata="vast", heartbeat_seconds=10, poll_seconds=5),
    # Per-second billing of GPU time; disk billed while the instance exists, paused too; bandwidth per byte.
    billing=Billing(currency="USD"),
    stores=(dialects.S3,),  # the run's store is another cloud's bucket: Vast.ai has none of its own
    spot_prices="samples",
    catalog=PriceCatalog(build=".catalog_build", refresh=".catalog",
                         hint="`sdcloud catalog refresh --provider {name}` (VAST_API_KEY: each machine's live bid)"),
    bill=".billing",
    object_key_bytes=limits.OBJECT_KEY_BYTES,  # the run's S3 bucket (limits.py)
    config_sections=("vast",),
    config_keys=".session",
    settings=(Setting("vast", "bid_margin", 0.15), Setting("vast", "reliability_floor", 0.98),
              Setting("vast", "credentials_hours", 12.0, " h")),
    market=MarketRules(multi_node=False, reclaim_notice=False, pauses=True, bandwidth_priced=True, object_store=False),
)
