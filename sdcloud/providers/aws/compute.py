"""AWS EC2 behind the Provider protocol (boto3).

Launch is idempotent on `spec.token`: before it calls RunInstances it looks for a live instance
tagged `sdcloud:token` = token and adopts it, because a ClientToken alone does not survive a new
zone, a new instance type or an AWS-compatible endpoint that ignores it. Throttling is retried
here (tenacity), not inside botocore, so that every retry is reported as a run event.

Credentials come from boto3's standard chain; `AWS_ENDPOINT_URL` (and the per-service
`AWS_ENDPOINT_URL_EC2` etc.) work as boto3 documents them. Nothing here logs or stores a secret.

This module imports boto3 at the top: only commands that need AWS import it, lazily.
"""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from ...offers.catalog import CatalogRow, load_provider
from ...errors import UserError
from ...money import usd
from ...events import Kind
from ...offers.optimizer import Offer, fits
from ..base import (
    FAILED, PENDING, RUNNING, STOPPING, TAG_NODE, TAG_NODES, TAG_RUN, TAG_TOKEN, TERMINATED,
    CapacityError, EventSink, Instance, LaunchSpec, PriceTooLowError, ProviderError,
    QuotaError, no_events,
)

from ..groups import combine, describe_groups, has_group, is_group_launch, nodes_of, rank_of
from . import group
from .session import (  # noqa: F401  (re-exported: the adapter's public helpers)
    AUTH_CODES, CLIENT_CONFIG, NAME, THROTTLE_CODES, Retry, check_region, error_code, error_message, is_retryable,
    new_session, quota_message, region_of_zone,
)
DEFAULT_REGION = "us-east-1"
# Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04): NVIDIA driver, CUDA, NVMe mounted at
# /opt/dlami/nvme. The public SSM parameter always names the newest build in each region.
DEFAULT_AMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"

CAPACITY_CODES = frozenset({"InsufficientInstanceCapacity", "InsufficientCapacity", "UnfulfillableCapacity"})
# The type is not offered in this zone, or the zone's subnet has no free address: as good as no
# capacity there, try the next zone (another subnet).
ZONE_UNSUPPORTED_CODES = frozenset({"Unsupported", "InsufficientFreeAddressesInSubnet"})
PRICE_CODES = frozenset({"SpotMaxPriceTooLow"})
QUOTA_CODES = frozenset({"MaxSpotInstanceCountExceeded", "VcpuLimitExceeded", "InstanceLimitExceeded"})
_STATES = {"pending": PENDING, "running": RUNNING, "stopping": STOPPING, "shutting-down": STOPPING,
           # A stopped host still bills its volumes: keep it visible (live) so that gc reaps it.
           "stopped": STOPPING, "terminated": TERMINATED}
# States find_tagged and gc look at: everything that still costs money.
_FIND_STATES = ["pending", "running", "stopping", "stopped"]
_ADOPT_STATES = ["pending", "running", "stopping"]

# Families the launch image cannot drive: the Deep Learning AMI with the open-source NVIDIA driver
# supports G4dn and newer, P4 and P5, but not P3's V100s (the open kernel modules need Turing or
# newer). They stay in the catalog for reference and are never ranked or launched.
UNSUPPORTED_FAMILIES = ("p3", "p3dn")


def image_supports(instance_type: str) -> bool:
    return instance_type.split(".")[0] not in UNSUPPORTED_FAMILIES


def client_token(spec: LaunchSpec, instance_type: str, zone: str, market: str) -> str:
    """RunInstances ClientToken: from run and attempt, and distinct per type/zone/market.

    AWS rejects one ClientToken reused with other parameters, and failing over to the next zone
    changes them; the `sdcloud:token` tag stays the same on every try.
    """
    detail = hashlib.sha256(f"{instance_type}/{zone}/{market}".encode()).hexdigest()[:12]
    return f"{spec.launch_key}-{detail}"  # 36 + 13 characters (+ a group's "-n63"), under the limit of 64


class AwsProvider:
    """EC2 adapter. `regions` bounds where find_tagged/gc look (default: the catalog's regions)."""

    name = NAME

    def __init__(self, region: str | None = None, regions: list[str] | None = None, profile: str | None = None,
                 ami_parameter: str = DEFAULT_AMI_PARAMETER, image_id: str | None = None,
                 retry_attempts: int = 6, retry_base: float = 0.5, retry_cap: float = 20.0,
                 session: boto3.session.Session | None = None):
        self.session = session or new_session(region, profile)
        self.region = check_region(region) if region else (self.session.region_name or DEFAULT_REGION)
        self.regions = [check_region(r) for r in regions] if regions else None
        self.ami_parameter = ami_parameter
        self.image_id = image_id
        self.retry = Retry(retry_attempts, retry_base, retry_cap)
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        self.last_errors: list[str] = []  # regions find_tagged could not read

    # clients
    def client(self, service: str, region: str | None = None):
        """One cached client per (service, region); boto3 clients are thread-safe once made."""
        key = (service, region or self.region)
        with self._lock:
            if key not in self._clients:
                self._clients[key] = self.session.client(service, region_name=key[1], config=CLIENT_CONFIG)
            return self._clients[key]

    def _call(self, service: str, region: str, op: str, events: EventSink = no_events, **params: Any) -> dict:
        cl = self.client(service, region)
        return self.retry.call(lambda: getattr(cl, op)(**params), op, events, region=region)

    def _paginate(self, service: str, region: str, op: str, key: str, **params: Any) -> list:
        cl = self.client(service, region)

        def run() -> list:
            out: list = []
            for page in cl.get_paginator(op).paginate(**params):
                out.extend(page.get(key, []))
            return out

        return self.retry.call(run, op, region=region)

    # catalog
    def offers(self, tier, market: str | None = None, regions: list[str] | None = None) -> list[Offer]:
        rows, _ = load_provider(NAME)
        markets = (market,) if market else ("spot", "on-demand")
        out = []
        for row in rows:
            if regions and row.region not in regions or not fits(tier, row) or not image_supports(row.instance_type):
                continue
            for m in markets:
                if (row.spot_price if m == "spot" else row.ondemand_price) is not None:
                    out.append(Offer(row, m))
        return out

    def catalog_regions(self) -> list[str]:
        rows, _ = load_provider(NAME)
        return sorted({r.region for r in rows} | {self.region})

    # images and zones
    def resolve_image(self, region: str, infra: dict) -> str:
        explicit = infra.get("image_id") or self.image_id
        if explicit:
            return str(explicit)
        name = infra.get("ami_parameter") or self.ami_parameter
        try:
            resp = self._call("ssm", region, "get_parameter", Name=name)
        except ClientError as exc:
            raise UserError(f"cannot resolve the Deep Learning AMI in {region} from SSM parameter {name}: "
                            f"{error_code(exc)} {error_message(exc)}") from None
        return str(resp["Parameter"]["Value"])

    def _root_device(self, region: str, image_id: str) -> str:
        try:
            images = self._call("ec2", region, "describe_images", ImageIds=[image_id]).get("Images", [])
        except ClientError as exc:
            if error_code(exc).startswith("InvalidAMIID"):
                raise UserError(f"AMI {image_id} does not exist in {region}") from None
            raise
        if not images:
            raise UserError(f"AMI {image_id} does not exist in {region}")
        return images[0].get("RootDeviceName") or "/dev/sda1"

    def zones(self, region: str) -> list[str]:
        resp = self._call("ec2", region, "describe_availability_zones",
                          Filters=[{"Name": "state", "Values": ["available"]},
                                   {"Name": "zone-type", "Values": ["availability-zone"]}])
        return sorted(z["ZoneName"] for z in resp.get("AvailabilityZones", []))

    def current_spot_prices(self, region: str, instance_type: str) -> dict[str, float]:
        """The spot price in effect now, per zone."""
        items = self._paginate("ec2", region, "describe_spot_price_history", "SpotPriceHistory",
                               InstanceTypes=[instance_type], ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                               StartTime=datetime.now(timezone.utc))
        newest: dict[str, tuple[datetime, float]] = {}
        for item in items:
            zone, stamp = item["AvailabilityZone"], item["Timestamp"]
            if zone not in newest or stamp > newest[zone][0]:
                newest[zone] = (stamp, float(item["SpotPrice"]))
        return {z: p for z, (_, p) in newest.items()}

    def _launch_zones(self, offer: Offer, region: str, market: str, subnets: dict[str, str], events: EventSink) -> list[str]:
        if offer.row.zone:
            return [offer.row.zone]
        zones = sorted(subnets) if subnets else self.zones(region)
        if market == "spot" and len(zones) > 1:
            # Cheapest zone first; a failed price lookup keeps the name order.
            try:
                prices = self.current_spot_prices(region, offer.row.instance_type)
                zones.sort(key=lambda z: (prices.get(z, float("inf")), z))
            except (ClientError, ProviderError) as exc:
                events(Kind.PRICE_LOOKUP_FAILED, {"provider": NAME, "region": region, "code": error_code(exc)})
        return zones

    # launch
    def find_tokens(self, token: str, region: str, node: int | None = None) -> list[Instance]:
        """Every live host launched with `token` (a group's hosts: all of them; `node`: that rank's)."""
        node_filter = [] if node is None else [{"Name": f"tag:{TAG_NODE}", "Values": [str(node)]}]
        return self._describe_filtered(region, [{"Name": f"tag:{TAG_TOKEN}", "Values": [token]},
                                                {"Name": "instance-state-name", "Values": _ADOPT_STATES}] + node_filter)

    def find_token(self, token: str, region: str, node: int | None = None) -> Instance | None:
        found = self.find_tokens(token, region, node)  # the oldest, if several
        return min(found, key=lambda i: i.launched_at or datetime.min.replace(tzinfo=timezone.utc), default=None)

    def launch(self, offer: Offer, spec: LaunchSpec, market: str, max_price: float | None = None,
               events: EventSink = no_events) -> Instance:
        """One host, or a whole multi-node group in one request, all its hosts or none (group.py)."""
        if market not in ("spot", "on-demand"):
            raise UserError(f"unknown market {market!r}; valid: spot, on-demand")
        if max_price is not None:
            max_price = usd(max_price, "max price", per_hour=True)
        region = check_region(offer.row.region)
        if is_group_launch(spec):
            return group.launch_group(self, offer, spec, market, max_price, events, region)
        return self._launch(offer, spec, market, max_price, events, region)

    def adopted(self, existing: Instance, region: str, spec: LaunchSpec, events: EventSink) -> Instance:
        existing.adopted = True  # found by its token: launched before a crash, or by another driver
        events(Kind.ADOPTED, {"provider": NAME, "region": region, "instance_id": existing.id, "token": spec.token})
        return existing

    def _launch(self, offer: Offer, spec: LaunchSpec, market: str, max_price: float | None, events: EventSink,
                region: str) -> Instance:
        row = offer.row
        infra = spec.infra or {}
        count = nodes_of(spec) if is_group_launch(spec) else 1

        if count == 1:
            existing = self.find_token(spec.token, region, spec.node)
            if existing is not None:
                return self.adopted(existing, region, spec, events)

        subnets: dict[str, str] = dict(infra.get("subnet_ids") or {})
        zones = self._launch_zones(offer, region, market, subnets, events)
        if not zones:
            raise CapacityError(f"no usable zone for {row.instance_type} in {region}")
        image_id = self.resolve_image(region, infra)
        root_device = "" if infra.get("launch_template_id") else self._root_device(region, image_id)
        price_errors: list[tuple[str, float | None]] = []
        capacity_errors: list[str] = []

        for i, zone in enumerate(zones):
            nxt = zones[i + 1] if i + 1 < len(zones) else None
            if subnets and zone not in subnets:
                capacity_errors.append(f"{zone}: no subnet in the stack")
                events(Kind.FAILOVER, {"provider": NAME, "region": region, "zone": zone, "next_zone": nxt,
                                       "instance_type": row.instance_type, "reason": "no subnet for this zone"})
                continue
            params = self._run_params(spec, row.instance_type, zone, market, max_price, image_id, root_device,
                                      infra, subnets.get(zone), count)
            try:
                resp = self._call("ec2", region, "run_instances", events, **params)
            except ClientError as exc:
                code, msg = error_code(exc), error_message(exc)
                if code in QUOTA_CODES:
                    events(Kind.QUOTA, {"provider": NAME, "region": region, "zone": zone, "code": code,
                                        "instance_type": row.instance_type, "market": market})
                    raise QuotaError(quota_message(code, region, row.instance_type, market, msg)) from None
                if code in CAPACITY_CODES or code in ZONE_UNSUPPORTED_CODES:
                    capacity_errors.append(f"{zone}: {code}")
                    events(Kind.FAILOVER, {"provider": NAME, "region": region, "zone": zone, "next_zone": nxt,
                                           "instance_type": row.instance_type, "market": market, "code": code})
                    continue
                if code in PRICE_CODES:
                    current = self._spot_price_now(region, zone, row.instance_type)
                    price_errors.append((zone, current))
                    events(Kind.FAILOVER, {"provider": NAME, "region": region, "zone": zone, "next_zone": nxt,
                                           "instance_type": row.instance_type, "code": code, "max_price": max_price,
                                           "current_price": current})
                    continue
                raise ProviderError(f"AWS RunInstances {row.instance_type} in {zone}: {code}: {msg}") from None
            listed = row.spot_price if market == "spot" else row.ondemand_price
            price = max_price if (market == "spot" and max_price) else listed
            hosts = sorted((replace(self._instance(raw, region), price_per_hour=price) for raw in resp["Instances"]),
                           key=rank_of)
            inst = hosts[0] if count == 1 else combine(hosts, count)
            events(Kind.LAUNCHED, {"provider": NAME, "region": region, "zone": inst.zone, "instance_id": inst.id,
                                   "instance_type": row.instance_type, "market": market, "token": spec.token})
            return inst

        if price_errors:
            known = [p for _, p in price_errors if p is not None]
            current = min(known) if known else None
            now = f"${current:.4f}/h" if current is not None else "unknown"
            raise PriceTooLowError(f"spot max price ${max_price}/h is below the current spot price of "
                                   f"{row.instance_type} in {region} (lowest now: {now})", current)
        raise CapacityError(f"no capacity for {market} {row.instance_type} in {region}: " + "; ".join(capacity_errors))

    def _spot_price_now(self, region: str, zone: str, instance_type: str) -> float | None:
        try:
            return self.current_spot_prices(region, instance_type).get(zone)
        except (ClientError, ProviderError):
            return None

    def _run_params(self, spec: LaunchSpec, instance_type: str, zone: str, market: str, max_price: float | None,
                    image_id: str, root_device: str, infra: dict, subnet_id: str | None, count: int = 1) -> dict:
        given = spec.tags if count == 1 else {**spec.tags, TAG_NODES: str(count)}  # each host's rank: its launch index
        tags = [{"Key": k, "Value": v} for k, v in given.items()]
        tags.append({"Key": "Name", "Value": f"sdcloud-{spec.run_id}-{spec.attempt}"})
        params: dict[str, Any] = {
            "MinCount": count, "MaxCount": count,  # a group: all its hosts or none (AWS's all-or-nothing request)
            "ClientToken": client_token(spec, instance_type, zone, market),
            "InstanceType": instance_type,
            "ImageId": image_id,
            # IMDSv2 only; hop limit 2 so that a container on the host can read the spot notice.
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 2},
            # A host that shuts itself down is gone, not a stopped volume that bills.
            "InstanceInitiatedShutdownBehavior": "terminate",
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}, {"ResourceType": "volume", "Tags": tags}],
        }
        if infra.get("launch_template_id"):
            # The stack's template maps the root disk and the instance-store NVMe: a mapping given
            # here would replace the template's whole list, so leave the disks to it.
            params["LaunchTemplate"] = {"LaunchTemplateId": str(infra["launch_template_id"]),
                                        "Version": str(infra.get("launch_template_version", "$Latest"))}
        else:
            params["BlockDeviceMappings"] = [{"DeviceName": root_device, "Ebs": {
                "VolumeSize": int(spec.root_volume_gb), "VolumeType": "gp3", "DeleteOnTermination": True, "Encrypted": True}}]
        if subnet_id:
            params["SubnetId"] = subnet_id
        else:
            params["Placement"] = {"AvailabilityZone": zone}
        if infra.get("placement_group"):  # a multi-node group's (group.py)
            params.setdefault("Placement", {})["GroupName"] = str(infra["placement_group"])
        if infra.get("security_group_id"):
            params["SecurityGroupIds"] = [str(infra["security_group_id"])]
        if infra.get("instance_profile_arn"):
            params["IamInstanceProfile"] = {"Arn": str(infra["instance_profile_arn"])}
        key_name = spec.ssh_key_name or infra.get("key_name")
        if key_name:
            params["KeyName"] = str(key_name)
        if spec.user_data:
            params["UserData"] = spec.user_data  # boto3 base64-encodes it
        if market == "spot":
            spot: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
            if max_price is not None:
                spot["MaxPrice"] = f"{max_price:.6f}".rstrip("0").rstrip(".")
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
        return params

    # describe, terminate, find
    def _instance(self, raw: dict, region: str) -> Instance:
        tags = {t["Key"]: t["Value"] for t in raw.get("Tags", []) or []}
        if TAG_NODES in tags and TAG_NODE not in tags:  # a host of a group launched in one request: its launch index
            tags[TAG_NODE] = str(raw.get("AmiLaunchIndex", 0))
        zone = raw.get("Placement", {}).get("AvailabilityZone", "")
        return Instance(
            provider=NAME, id=raw["InstanceId"], region=region or region_of_zone(zone), zone=zone,
            instance_type=raw.get("InstanceType", ""),
            market="spot" if raw.get("InstanceLifecycle") == "spot" else "on-demand",
            state=_STATES.get(raw.get("State", {}).get("Name", ""), FAILED),
            public_ip=raw.get("PublicIpAddress"), private_ip=raw.get("PrivateIpAddress"),
            launched_at=raw.get("LaunchTime"), tags=tags,
        )

    def _describe_filtered(self, region: str, filters: list[dict], ids: list[str] | None = None) -> list[Instance]:
        params: dict[str, Any] = {"Filters": filters} if filters else {}
        if ids:
            params["InstanceIds"] = ids
        reservations = self._paginate("ec2", region, "describe_instances", "Reservations", **params)
        return [self._instance(raw, region) for res in reservations for raw in res.get("Instances", [])]

    def describe(self, ids: list[str], region: str | None = None) -> list[Instance]:
        """The instances among `ids` that AWS still knows; ids it has forgotten are left out."""
        if not ids:
            return []
        if has_group(ids):  # a multi-node group's id: its hosts, as one (providers/groups.py)
            return describe_groups(self.describe, ids, region)
        region = region or self.region
        try:
            return self._describe_filtered(region, [], ids)
        except ClientError as exc:
            if error_code(exc) != "InvalidInstanceID.NotFound":
                raise
        # One id unknown fails the whole call: ask one at a time.
        out = []
        for one in ids:
            try:
                out.extend(self._describe_filtered(region, [], [one]))
            except ClientError as exc:
                if error_code(exc) not in ("InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"):
                    raise
        return out

    def terminate(self, ids: list[str], region: str | None = None) -> None:
        if not ids:
            return
        if has_group(ids):  # every host of a group, then its placement group (group.py)
            return group.end_groups(self, ids, region)
        region = region or self.region
        try:
            self._call("ec2", region, "terminate_instances", InstanceIds=list(ids))
        except ClientError as exc:
            if error_code(exc) != "InvalidInstanceID.NotFound":
                raise
            if len(ids) > 1:  # one id already gone fails the whole call: the others still go
                for one in ids:
                    self.terminate([one], region)

    def find_tagged(self, run_id: str | None = None, regions: list[str] | None = None) -> list[Instance]:
        """Instances that still cost money and carry `sdcloud:run` (= run_id when given), in every region."""
        regions = [check_region(r) for r in regions] if regions else (self.regions or self.catalog_regions())
        tag_filter = ({"Name": f"tag:{TAG_RUN}", "Values": [run_id]} if run_id
                      else {"Name": "tag-key", "Values": [TAG_RUN]})
        filters = [tag_filter, {"Name": "instance-state-name", "Values": _FIND_STATES}]
        errors: list[str] = []
        found: list[Instance] = []

        def one(region: str) -> list[Instance]:
            return self._describe_filtered(region, filters)

        with ThreadPoolExecutor(max_workers=min(8, len(regions))) as pool:
            futures = {r: pool.submit(one, r) for r in regions}
            for region, fut in futures.items():
                try:
                    found.extend(fut.result())
                except (ClientError, ProviderError, UserError, BotoCoreError) as exc:
                    errors.append(f"{region}: {error_code(exc) or type(exc).__name__}: {error_message(exc, 200)}")
        self.last_errors = errors
        if errors and len(errors) == len(regions):
            raise UserError("AWS: no region could be searched for sdcloud instances: " + errors[0])
        return found

    group_limit = staticmethod(lambda: None)  # capabilities.LaunchesGroups: one request of N (group.py); no bound here

    def sweep_group_leftovers(self, regions: list[str] | None, is_active) -> list[str]:
        return [n for r in (regions or self.regions or [self.region]) for n in group.sweep_placement_groups(self, r, is_active)]

    def price_history(self, instance_type: str, zone: str, start: datetime, end: datetime) -> list[tuple[datetime, float]]:
        """Spot price changes for one type in one zone over [start, end], oldest first (for cost reports)."""
        region = region_of_zone(zone)
        items = self._paginate("ec2", region, "describe_spot_price_history", "SpotPriceHistory",
                               InstanceTypes=[instance_type], AvailabilityZone=zone, StartTime=start, EndTime=end,
                               ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"])
        points = sorted({(i["Timestamp"], float(i["SpotPrice"])) for i in items if i["AvailabilityZone"] == zone})
        return points


def refresh_catalog(regions: list[str] | None = None, **kwargs: Any) -> tuple[Path, list[CatalogRow], list[str]]:
    """`sdcloud catalog refresh --provider aws`: see catalog.refresh."""
    from .catalog import refresh

    return refresh(regions, **kwargs)


PROVIDER_CLASS = AwsProvider
