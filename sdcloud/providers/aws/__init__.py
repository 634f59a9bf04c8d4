"""AWS: EC2 compute (compute.py), the price-list and spot-price catalog refresh (catalog.py), shared session helpers
(session.py), the bill from Cost Explorer (billing.py)."""

from sdcloud_agent.store import dialects

from ..traits import (Billing, CloudFunction, CodeLimits, Hosts, HostTraits, Network, PriceCatalog, ProviderTraits, Stack,
                      Timing, name_of)
from . import limits

TRAITS = ProviderTraits(
    name=name_of(__name__),
    hosts=Hosts.CLOUD,
    adapter=".compute",
    # The spot interruption notice: two minutes (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
    timing=Timing(poll_seconds=5.0, boot_timeout=1800.0, heartbeat_timeout=600.0, cooldown_seconds=1800.0,
                  reclaim_notice_seconds=120.0),
    host=HostTraits(nvme=True, gpu_required=True, metadata="aws", heartbeat_seconds=10, poll_seconds=5),
    # EC2 bills per second with a 60 s minimum, and not at all for a spot instance it interrupts in
    # its first hour (https://aws.amazon.com/ec2/pricing/, "Per Second Billing"; Spot interruption FAQ).
    billing=Billing(currency="USD", minimum_seconds=60.0, free_spot_interrupt_seconds=3600.0,
                    storage_prices="storage_prices.toml"),  # EBS, S3, egress (storage_prices.toml)
    default_region="us-east-1",
    region_env="AWS_DEFAULT_REGION",
    stack=Stack(folder="aws", module="sdcloud_aws_stack", region_key="aws:region", plugin="aws",
                distribution="pulumi-aws"),
    stores=(dialects.S3,),
    spot_prices="history",
    # catalog.csv here; refreshed from the APIs (compute.refresh_catalog) or the public price list.
    catalog=PriceCatalog(build=".catalog_build", refresh=".compute", public=".public_prices",
                         hint="`sdcloud catalog refresh --provider {name} --public` (no credentials) or without "
                              "--public (per-zone spot, credentials)"),
    object_key_bytes=limits.OBJECT_KEY_BYTES,  # the bucket's key limit (limits.py)
    # One TCP flow: 10 Gbps inside a cluster placement group, 5 outside (EC2 User Guide, "Amazon EC2 instance
    # network bandwidth"); NCCL on AWS opens NCCL_SOCKET_NTHREADS 2 x NCCL_NSOCKS_PERTHREAD 8 (NCCL docs).
    network=Network(interconnect="interconnect.csv", cluster_flow_gbps=10.0, zone_flow_gbps=5.0, flows=16,
                    source="EC2 User Guide, \"Amazon EC2 instance network bandwidth\"; NCCL's socket defaults on AWS"),
    bill=".billing",  # `sdcloud cost reconcile` (billing.py)
    schedules=".schedules",  # `sdcloud batch schedule add --provider aws` (schedules.py)
    function=CloudFunction(
        # python3.13: the newest runtime whose dates are published (new functions until 2029-07-31, limits.py).
        name="aws-lambda", runtime="python3.13", timeout_seconds=240, memory_mb=512, safety_seconds=30.0,
        schedule_seconds=300,
        # https://aws.amazon.com/lambda/pricing/ (us-east-1, x86, first tier, as transcribed on 2026-09-20).
        request_usd=0.20 / 1_000_000, gb_second_usd=0.0000166667,
        price_source="https://aws.amazon.com/lambda/pricing/ (2026-09-20)",
        code_limits=CodeLimits(unzipped_bytes=limits.FUNCTION_UNZIPPED_BYTES,
                               inline_zip_bytes=limits.FUNCTION_ZIP_DIRECT_BYTES,
                               request_bytes=limits.FUNCTION_CREATE_REQUEST_BYTES,
                               environment_bytes=limits.FUNCTION_ENVIRONMENT_BYTES),
    ),
)
