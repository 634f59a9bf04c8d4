"""Tencent Cloud: credentials, signing and retries (session.py), the catalog refresh (catalog.py), CVM compute
(compute.py), the bill (billing.py), COS through its S3 endpoint (storage.py)."""

from sdcloud_agent.store import dialects

from ..traits import (Billing, CloudFunction, CodeLimits, Hosts, HostTraits, Network, PriceCatalog, ProviderTraits, Stack,
                      Timing, name_of)
from . import limits
from .network import PROFILES

NAME = name_of(__name__)

TRAITS = ProviderTraits(
    name=NAME,
    hosts=Hosts.CLOUD,
    adapter=".compute",
    timing=Timing(poll_seconds=5.0, boot_timeout=1800.0, heartbeat_timeout=600.0, cooldown_seconds=1800.0),
    host=HostTraits(nvme=True, gpu_required=True, metadata="tencent", heartbeat_seconds=10, poll_seconds=5),
    # The mainland site quotes in CNY; an international account's currency is detected (site.py).
    billing=Billing(currency="CNY", storage_prices="storage_prices.toml", account_currency=".site"),
    default_region="ap-guangzhou",
    # Its plugin is published on GitHub by Tencent, not on Pulumi's registry.
    stack=Stack(folder="tencent", module="sdcloud_tencent_stack", region_key="tencentcloud:region",
                plugin="tencentcloud", distribution="tencentcloud-iac-pulumi",
                plugin_server="github://api.github.com/tencentcloudstack"),
    stores=(dialects.COS, dialects.S3),
    # Tencent has no spot price history API: the controller samples the quote while a host runs.
    spot_prices="samples",
    catalog=PriceCatalog(build=".catalog_build", refresh=".catalog"),  # catalog.csv here
    object_key_bytes=limits.OBJECT_KEY_BYTES,  # the bucket's key limit (limits.py)
    # CVM documents no per-flow limit: EC2's figure outside a cluster placement group is assumed, as are NCCL's flows.
    network=Network(interconnect="interconnect.csv", cluster_flow_gbps=5.0, zone_flow_gbps=5.0, flows=16,
                    source="assumed: CVM documents no per-flow limit (EC2's 5 Gbps outside a placement group)"),
    bill=".billing",  # `sdcloud cost reconcile` (billing.py)
    infra_check=".service_role",  # SCF_QcsRole before `infra up` (service_role.py)
    schedules=".schedules",  # `sdcloud batch schedule add --provider tencent` (schedules.py)
    # SCF's per-GB-second and per-invocation prices could not be read into a citable figure: unpriced.
    # Python3.10, SCF's newest Python: the package carries the two 3.11 names the control plane uses
    # (sdcloud/infra/function_package.py; docs/stacks.md says why not a Custom Runtime).
    function=CloudFunction(
        name="tencent-scf", runtime="Python3.10", timeout_seconds=240, memory_mb=512, safety_seconds=30.0,
        schedule_seconds=300,
        code_limits=CodeLimits(unzipped_bytes=limits.FUNCTION_UNZIPPED_BYTES,
                               inline_zip_bytes=limits.FUNCTION_ZIP_INLINE_BYTES,
                               request_bytes=limits.API_POST_TC3_BYTES,
                               environment_bytes=limits.FUNCTION_ENVIRONMENT_BYTES),
        code_from_bucket=True,
    ),
    config_sections=(NAME,),  # [tencent], named after the provider
    config_keys=".site",  # [tencent] site
    # The per-run user-data replaces the stack's template, driver install included (the stack's default series).
    host_driver="535-server",
    network_profiles=PROFILES,  # mainland China's mirrors (network.py)
    run_store=".run_store",  # COS: the host signs with its CVM role
)
