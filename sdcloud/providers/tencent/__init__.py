"""Tencent Cloud: credentials, signing and retries (session.py), the catalog refresh (catalog.py), CVM compute
(compute.py), the bill (billing.py), COS through its S3 endpoint (storage.py)."""

from ..traits import Billing, CloudFunction, CodeLimits, Hosts, HostTraits, ProviderTraits, Timing
from . import limits
from .network import PROFILES

TRAITS = ProviderTraits(
    name="tencent",
    hosts=Hosts.CLOUD,
    adapter="sdcloud.providers.tencent.compute",
    timing=Timing(poll_seconds=5.0, boot_timeout=1800.0, heartbeat_timeout=600.0, cooldown_seconds=1800.0),
    host=HostTraits(nvme=True, gpu_required=True, metadata="tencent", heartbeat_seconds=10, poll_seconds=5),
    # The mainland site quotes in CNY; an international account's currency is detected (site.py).
    billing=Billing(currency="CNY"),
    default_region="ap-guangzhou",
    stack="tencent",
    stores=("cos", "s3"),
    # Tencent has no spot price history API: the controller samples the quote while a host runs.
    spot_prices="samples",
    catalog=True,
    object_key_bytes=limits.OBJECT_KEY_BYTES,  # the bucket's key limit (limits.py)
    bill="sdcloud.providers.tencent.billing",  # `sdcloud cost reconcile` (billing.py)
    infra_check="sdcloud.providers.tencent.service_role",  # SCF_QcsRole before `infra up` (service_role.py)
    schedules="sdcloud.providers.tencent.schedules",  # `sdcloud batch schedule add --provider tencent` (schedules.py)
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
    config_sections=("tencent",),
    config_keys="sdcloud.providers.tencent.site",  # [tencent] site
    # The per-run user-data replaces the stack's template, driver install included (the stack's default series).
    host_driver="535-server",
    network_profiles=PROFILES,  # mainland China's mirrors (network.py)
    run_store="sdcloud.providers.tencent.run_store",  # COS: the host signs with its CVM role
)
