"""Tencent Cloud CVM behind the Provider protocol, on tencentcloud-sdk-python-cvm/-common.

Spot hosts are SPOTPAID instances (one-time, with a max price); on-demand ones POSTPAID_BY_HOUR.
Every instance carries the sdcloud tags, and launch() adopts a live instance with the same
`sdcloud:token` before it launches, so a retried or crashed launch never starts a second host.

Prices: the catalog keeps Tencent's own currency, which the account's site decides (CNY on the
China site, USD on the international one, in every region: see site.py); the `max_price` handed
to launch() is USD per hour, like every provider's, and is converted to the account's currency
for SpotOptions.MaxPrice.

The SDK is imported lazily: `sdcloud --help` must not pay for it.
"""

from __future__ import annotations

import base64
import os
import re
import time
from datetime import datetime, timezone
from typing import Any

from ... import config
from ...errors import UserError
from ...events import Kind
from ...offers.optimizer import Offer
from . import errors as codes
from . import limits
from ..groups import describe_groups, expand, has_group, is_group_launch, launch_group
from ..base import (FAILED, LIVE_STATES, PENDING, RUNNING, STOPPING, TAG_NODE, TAG_RUN, TAG_TOKEN, TERMINATED, CapacityError,
                   EventSink, Instance, LaunchSpec, PriceTooLowError, ProviderError, QuotaError, no_events)
# The catalog and session names are re-exported: they were this module's before the split, and the
# tests and `sdcloud catalog refresh` (which asks the adapter for refresh_catalog) still find them here.
from .catalog import (  # noqa: F401
    GPU_FAMILIES, ONDEMAND, SPOT, TencentCatalog, bundled_rows, default_regions, load_provider, refresh_catalog,
)
from .session import (  # noqa: F401
    API_VERSION, ENDPOINT_ENV, METADATA_URL, NAME, RETRY_PREFIXES, Session, _code, _num, _retryable, credentials,
    endpoint_override,
)

CHARGE_TYPES = {"spot": SPOT, "on-demand": ONDEMAND}

STATE_MAP = {
    "PENDING": PENDING, "STARTING": PENDING,
    "RUNNING": RUNNING, "REBOOTING": RUNNING,
    "ENTER_RESCUE_MODE": RUNNING, "RESCUE_MODE": RUNNING, "EXIT_RESCUE_MODE": RUNNING,
    "ENTER_SERVICE_LIVE_MIGRATE": RUNNING, "SERVICE_LIVE_MIGRATE": RUNNING, "EXIT_SERVICE_LIVE_MIGRATE": RUNNING,
    # A stopped instance still holds its disks (and is still ours to reap): keep it "live".
    "STOPPING": STOPPING, "STOPPED": STOPPING,
    "SHUTDOWN": TERMINATED, "TERMINATING": TERMINATED,
    "LAUNCH_FAILED": FAILED,
}

# Fields of RunInstances that InquiryPriceRunInstances also takes.
INQUIRY_FIELDS = ("Placement", "ImageId", "InstanceChargeType", "InstanceType", "SystemDisk", "VirtualPrivateCloud",
                  "InternetAccessible", "InstanceCount", "InstanceName", "LoginSettings", "SecurityGroupIds",
                  "TagSpecification", "InstanceMarketOptions", "LaunchTemplate")
USER_DATA_MAX = limits.USER_DATA_BASE64_BYTES  # bytes of base64, the API's limit (limits.py)


def _parse_price(message: str) -> float | None:
    """The current spot price from an InsufficientPrice message (its last number)."""
    numbers = re.findall(r"\d+(?:\.\d+)?", message or "")
    return float(numbers[-1]) if numbers else None


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


class TencentProvider(TencentCatalog):
    name = NAME

    def __init__(self, poll_interval: float = 3.0, launch_timeout: float = 600.0, max_attempts: int = 6,
                 backoff: float = 1.0, backoff_max: float = 20.0, request_timeout: int = 30):
        super().__init__(max_attempts=max_attempts, backoff=backoff, backoff_max=backoff_max,
                         request_timeout=request_timeout)
        self.poll_interval = poll_interval
        self.launch_timeout = launch_timeout
        self.last_errors: list[str] = []

    def offers(self, tier, market: str | None = None, regions: list[str] | None = None) -> list[Offer]:
        from ...offers.catalog import load_catalog
        from ...offers.optimizer import rank

        ranked = rank(tier, load_catalog([NAME]), market=market, provider=NAME)
        return [e.offer for e in ranked if not regions or e.offer.row.region in regions]

    # -- instances -------------------------------------------------------------------------------
    def _instance(self, region: str, raw: dict, price: float | None = None) -> Instance:
        tags = {t.get("Key"): t.get("Value") for t in raw.get("Tags") or [] if t.get("Key")}
        publics, privates = raw.get("PublicIpAddresses") or [], raw.get("PrivateIpAddresses") or []
        return Instance(
            provider=NAME, id=raw["InstanceId"], region=region, zone=(raw.get("Placement") or {}).get("Zone", ""),
            instance_type=raw.get("InstanceType", ""), market="spot" if raw.get("InstanceChargeType") == SPOT else "on-demand",
            state=STATE_MAP.get(raw.get("InstanceState", ""), PENDING), price_per_hour=price,
            public_ip=publics[0] if publics else None, private_ip=privates[0] if privates else None,
            launched_at=_parse_time(raw.get("CreatedTime")), tags=tags)

    def _describe_all(self, region: str, params: dict, events: EventSink = no_events) -> list[dict]:
        found, offset = [], 0
        while True:
            resp = self.call(region, "DescribeInstances", {**params, "Offset": offset, "Limit": 100}, events)
            batch = resp.get("InstanceSet") or []
            found.extend(batch)
            offset += len(batch)
            if not batch or offset >= int(resp.get("TotalCount") or 0):
                return found

    def describe(self, ids: list[str], region: str | None = None) -> list[Instance]:
        """The instances `ids`; one that the API no longer lists is reported TERMINATED."""
        if not ids:
            return []
        if has_group(ids):  # a multi-node group's id: its hosts, as one (providers/groups.py)
            return describe_groups(self.describe, ids, region)
        regions = [region] if region else default_regions()
        result: dict[str, Instance] = {}
        from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException

        for reg in regions:
            wanted = [i for i in ids if i not in result]
            try:
                for start in range(0, len(wanted), 100):
                    for raw in self._describe_all(reg, {"InstanceIds": wanted[start:start + 100]}):
                        result[raw["InstanceId"]] = self._instance(reg, raw)
            except TencentCloudSDKException as exc:
                # Searching every region: one this account cannot use holds none of ours.
                if region or not _code(exc).startswith(("InvalidRegion", "UnsupportedRegion")):
                    raise ProviderError(f"DescribeInstances in {reg}: {_code(exc)}: {exc.message}") from exc
            if len(result) == len(set(ids)):
                break
        return [result.get(i) or Instance(NAME, i, region or "", "", "", "", TERMINATED) for i in ids]

    def terminate(self, ids: list[str], region: str | None = None) -> None:
        """Terminate `ids`; ones already gone are skipped.

        TerminateInstances refuses LAUNCH_FAILED instances (they are not billed and go by
        themselves) and batches that mix charge types, so ids are described first, then sent per
        region and charge type, at most 100 at a time.
        """
        from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException

        if not ids:
            return
        ids = expand(ids)  # every host of a multi-node group (providers/groups.py)
        groups: dict[tuple[str, str], list[str]] = {}
        for inst in self.describe(list(dict.fromkeys(ids)), region):
            if inst.state in (TERMINATED, FAILED) or not (inst.region or region):
                continue
            groups.setdefault((inst.region or region or "", inst.market), []).append(inst.id)
        gone = ("InvalidInstanceId.NotFound", "UnsupportedOperation.InstanceStateLaunchFailed",
                "UnsupportedOperation.InstanceStateTerminating", "UnsupportedOperation.InstanceStateTerminated")
        for (reg, _market), reg_ids in groups.items():
            for start in range(0, len(reg_ids), 100):
                batch = reg_ids[start:start + 100]
                try:
                    self.call(reg, "TerminateInstances", {"InstanceIds": batch})
                except TencentCloudSDKException as exc:
                    if _code(exc) not in gone:
                        raise ProviderError(f"TerminateInstances in {reg}: {_code(exc)}: {exc.message}") from exc
                    # One id changed state since it was described and the call refuses the batch:
                    # terminate the rest one by one.
                    for iid in batch:
                        try:
                            self.call(reg, "TerminateInstances", {"InstanceIds": [iid]})
                        except TencentCloudSDKException as one:
                            if _code(one) not in gone:
                                raise ProviderError(f"TerminateInstances {iid}: {_code(one)}: {one.message}") from one

    @staticmethod
    def group_limit() -> None:  # capabilities.LaunchesGroups: host by host in one zone (providers/groups.py)
        return None

    def find_tagged(self, run_id: str | None = None, regions: list[str] | None = None) -> list[Instance]:
        """Live instances carrying `sdcloud:run` (= run_id when given), in `regions` (default: the catalog's)."""
        from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException

        flt = ({"Name": f"tag:{TAG_RUN}", "Values": [run_id]} if run_id else {"Name": "tag-key", "Values": [TAG_RUN]})
        found: list[Instance] = []
        self.last_errors = []  # a region that cannot be searched is reported, not fatal (gc shows these)
        for reg in regions or default_regions():
            try:
                raws = self._describe_all(reg, {"Filters": [flt]})
            except (ProviderError, TencentCloudSDKException) as exc:
                self.last_errors.append(f"{reg}: {_code(exc) + ': ' if _code(exc) else ''}{getattr(exc, 'message', None) or exc}")
                continue
            found += [i for i in (self._instance(reg, raw) for raw in raws) if i.live]
        return found

    def _by_token(self, region: str, token: str, events: EventSink, node: int | None = None) -> Instance | None:
        node_filter = [] if node is None else [{"Name": f"tag:{TAG_NODE}", "Values": [str(node)]}]
        raws = self._describe_all(region, {"Filters": [{"Name": f"tag:{TAG_TOKEN}", "Values": [token]}] + node_filter},
                                  events)
        live = [self._instance(region, raw) for raw in raws]
        live = [i for i in live if i.state in LIVE_STATES]
        return live[0] if live else None

    def zones(self, region: str) -> list[str]:
        """The region's available zones (the controller splits offers per zone, so a reclaim cools down one zone)."""
        resp = self.call(region, "DescribeZones", {}, no_events)
        return sorted(z["Zone"] for z in resp.get("ZoneSet") or [] if z.get("ZoneState", "AVAILABLE") == "AVAILABLE")

    # -- launch ----------------------------------------------------------------------------------
    def _zones(self, region: str, instance_type: str, charge: str, events: EventSink) -> list[str]:
        """Zones of `region` that sell `instance_type` in this market, in-stock ones first."""
        resp = self.call(region, "DescribeZoneInstanceConfigInfos", {"Filters": [
            {"Name": "instance-type", "Values": [instance_type]},
            {"Name": "instance-charge-type", "Values": [charge]}]}, events)
        zones: dict[str, bool] = {}
        for item in resp.get("InstanceTypeQuotaSet") or []:
            in_stock = item.get("Status", "SELL") == "SELL" and item.get("StatusCategory") != "WithoutStock"
            zones[item["Zone"]] = zones.get(item["Zone"], False) or in_stock
        return sorted(zones, key=lambda z: (not zones[z], z))

    @staticmethod
    def _subnets(infra: dict, zone: str) -> list[str]:
        """The zone's subnets from the stack (one, or a list tried in order when one runs out of addresses)."""
        subnets = infra.get("subnet_ids") or {}
        found = subnets.get(zone) if isinstance(subnets, dict) else None
        return [found] if isinstance(found, str) else list(found or [])

    def _run_params(self, offer: Offer, spec: LaunchSpec, market: str, zone: str, max_price: str | None,
                    subnet: str | None = None) -> dict:
        """The RunInstances request of one try.

        With the stack's launch template, the request sends only what the run needs: a field set in
        the request replaces the template's whole (TagSpecification, SystemDisk, ...), so the image,
        security group, role and network come from the template, the stack's tags go along with the
        run's, and the system disk is sent only when the run needs more than the template's, in the
        template's disk type.
        """
        infra = spec.infra or {}
        # The stack makes one template per zone (Tencent binds a template to its zone).
        template_id = (infra.get("launch_template_ids") or {}).get(zone) or infra.get("launch_template_id")
        defaults = infra.get("instance_defaults") or {}
        # The stack's tags on every host (template or not): the host role's self-end policy allows
        # TerminateInstances only on instances that carry them (stacks/tencent/host_policy.py).
        tags = {**(infra.get("host_tags") or {}), **spec.tags}
        params: dict[str, Any] = {
            "InstanceChargeType": CHARGE_TYPES[market],
            "Placement": {"Zone": zone},
            "InstanceType": offer.row.instance_type,
            "InstanceCount": 1,
            "InstanceName": f"sdcloud-{spec.run_id}-{spec.attempt}"[:60],
            "ClientToken": f"{spec.launch_key}-{zone}"[:64],  # per zone: a retry in a zone is idempotent
            "TagSpecification": [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
        }
        disk_type = infra.get("system_disk_type") or defaults.get("system_disk_type")
        if not template_id:
            params["SystemDisk"] = {"DiskType": disk_type or "CLOUD_PREMIUM", "DiskSize": spec.root_volume_gb}
        elif spec.root_volume_gb > int(defaults.get("system_disk_gb") or 0):
            params["SystemDisk"] = {**({"DiskType": disk_type} if disk_type else {}), "DiskSize": spec.root_volume_gb}
        if market == "spot":
            params["InstanceMarketOptions"] = {"MarketType": "spot",
                                               "SpotOptions": {"MaxPrice": max_price, "SpotInstanceType": "one-time"}}
        if template_id:
            template = {"LaunchTemplateId": template_id}
            if infra.get("launch_template_version"):
                template["LaunchTemplateVersion"] = int(infra["launch_template_version"])
            params["LaunchTemplate"] = template
        image = os.environ.get("SDCLOUD_TENCENT_IMAGE_ID") or (None if template_id else infra.get("image_id"))
        if image:
            params["ImageId"] = image
        elif not template_id:
            raise UserError("no image for the Tencent Cloud host: run `sdcloud infra up --provider tencent` "
                            "(it makes a launch template) or set SDCLOUD_TENCENT_IMAGE_ID")
        zone_subnets = self._subnets(infra, zone)
        chosen = subnet or next(iter(zone_subnets), None)
        # The template holds the zone's first subnet: name one only to move off it.
        if infra.get("vpc_id") and chosen and (not template_id or chosen != next(iter(zone_subnets), None)):
            params["VirtualPrivateCloud"] = {"VpcId": infra["vpc_id"], "SubnetId": chosen}
        if not template_id:
            groups = infra.get("security_group_ids") or ([infra["security_group_id"]] if infra.get("security_group_id") else [])
            if groups:
                params["SecurityGroupIds"] = list(groups)
            params["InternetAccessible"] = {"InternetChargeType": "TRAFFIC_POSTPAID_BY_HOUR",
                                            "InternetMaxBandwidthOut": int(infra.get("bandwidth_mbps", 10)),
                                            "PublicIpAssigned": True}
            if infra.get("cam_role_name"):
                params["CamRoleName"] = infra["cam_role_name"]
        if spec.ssh_key_name:
            params["LoginSettings"] = {"KeyIds": [spec.ssh_key_name]}
        if spec.user_data:
            encoded = base64.b64encode(spec.user_data.encode()).decode()
            if len(encoded) > USER_DATA_MAX:
                raise UserError(f"the host's user-data is {len(encoded)} bytes in base64; "
                                f"Tencent Cloud takes at most {USER_DATA_MAX}")
            params["UserData"] = encoded
        return params

    def _wait(self, region: str, instance_id: str, events: EventSink) -> Instance:
        """DescribeInstances until RUNNING or LAUNCH_FAILED (a new id may be missing for a moment)."""
        deadline = time.monotonic() + self.launch_timeout
        while True:
            raws = self._describe_all(region, {"InstanceIds": [instance_id]}, events)
            if raws:
                inst = self._instance(region, raws[0])
                if inst.state in (RUNNING, FAILED, TERMINATED):
                    return inst
            if time.monotonic() > deadline:
                raise ProviderError(f"{instance_id} is not running after {self.launch_timeout:g} s; it carries its "
                                    f"sdcloud tags, so the next launch adopts it and `sdcloud gc` can reap it")
            time.sleep(self.poll_interval)

    def launch(self, offer: Offer, spec: LaunchSpec, market: str, max_price: float | None = None,
               events: EventSink = no_events) -> Instance:
        from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException

        row = offer.row
        if row.provider != NAME:
            raise UserError(f"the Tencent Cloud provider cannot launch a {row.provider} offer")
        if market not in CHARGE_TYPES:
            raise UserError(f"unknown market {market!r}; valid: spot, on-demand")
        if is_group_launch(spec):  # N hosts in one zone: CVM has no cluster placement (docs/training.md)
            return launch_group(self, self.launch, offer, spec, market, max_price, events)
        region = row.region
        existing = self._by_token(region, spec.token, events, spec.node)
        if existing is not None:
            events(Kind.ADOPTED, {"provider": NAME, "instance": existing.id, "token": spec.token, "zone": existing.zone})
            inst = existing if existing.state == RUNNING else self._wait(region, existing.id, events)
            inst.adopted = True
            return inst

        # MaxPrice and every quote are in the account's currency, whatever the catalog row's is.
        currency = self.account_currency(region)
        usd = config.usd_per(currency)
        local_max: float | None = None
        if market == "spot":
            # Default cap: the on-demand price, so a spot host never costs more than an on-demand one.
            if max_price is not None:
                local_max = max_price / usd
            elif row.ondemand_price is not None:
                # The row's price in its own currency (a CNY catalog row on a USD account), to USD, to the account's.
                local_max = row.ondemand_price * config.usd_per(row.currency) / usd
            if local_max is None:
                raise UserError(f"no max price for spot {row.instance_type} in {region}: pass --max-price")
        price_text = f"{local_max:.4f}" if local_max is not None else None

        charge = CHARGE_TYPES[market]
        zones = [row.zone] if row.zone else self._zones(region, row.instance_type, charge, events)
        if not zones:
            raise CapacityError(f"{row.instance_type} is not sold as {market} in any zone of {region}")
        sold_out: list[str] = []
        too_low: list[tuple[str, float | None]] = []
        for i, zone in enumerate(zones):
            next_zone = zones[i + 1] if i + 1 < len(zones) else None
            subnets = self._subnets(spec.infra or {}, zone) or [None]
            for k, subnet in enumerate(subnets):
                params = self._run_params(offer, spec, market, zone, price_text, subnet)
                try:
                    quote = self.call(region, "InquiryPriceRunInstances",
                                      {k: params[k] for k in INQUIRY_FIELDS if k in params}, events)
                    quoted = _num(((quote.get("Price") or {}).get("InstancePrice") or {}).get("UnitPriceDiscount"))
                    events(Kind.QUOTE, {"provider": NAME, "zone": zone, "instance_type": row.instance_type, "market": market,
                                        "price": quoted, "currency": currency, "max_price": local_max})
                    if market == "spot" and quoted is not None and local_max is not None and quoted > local_max + 1e-9:
                        raise _PriceTooLow(quoted)
                    resp = self.call(region, "RunInstances", params, events)
                except _PriceTooLow as low:
                    too_low.append((zone, low.price))
                    events(Kind.PRICE_TOO_LOW, {"provider": NAME, "zone": zone, "current_price": low.price,
                                                "max_price": local_max, "currency": currency})
                    break
                except TencentCloudSDKException as exc:
                    code = _code(exc)
                    meaning = codes.meaning(code)
                    if meaning == "zone":
                        sold_out.append(zone)
                        events(Kind.FAILOVER, {"provider": NAME, "zone": zone, "code": code,
                                               "reason": codes.ZONE_UNAVAILABLE[code], "next_zone": next_zone})
                        break
                    if meaning == "subnet":
                        more = k + 1 < len(subnets)
                        events(Kind.SUBNET_FULL, {"provider": NAME, "zone": zone, "subnet": subnet, "code": code,
                                                  "next_subnet": subnets[k + 1] if more else None,
                                                  "next_zone": None if more else next_zone})
                        if not more:
                            sold_out.append(zone)
                        continue
                    if meaning == "price":
                        current = _parse_price(exc.message)
                        too_low.append((zone, current))
                        events(Kind.PRICE_TOO_LOW, {"provider": NAME, "zone": zone, "current_price": current,
                                                    "max_price": local_max, "currency": currency})
                        break
                    if meaning == "quota":
                        what = codes.QUOTAS.get(code, f"the quota {code.split('.', 1)[-1]}")
                        raise QuotaError(f"Tencent Cloud {code}: {what} is used up ({region}); raise it in the CVM console "
                                         f"(Instances > quota) or terminate other instances") from None
                    if meaning == "billing":
                        raise UserError(f"Tencent Cloud {code}: {codes.BILLING[code]}") from None
                    raise ProviderError(f"Tencent Cloud {code} launching {row.instance_type} in {zone}: {exc.message}") from exc
                instance_id = resp["InstanceIdSet"][0]
                events(Kind.LAUNCHED, {"provider": NAME, "instance": instance_id, "zone": zone, "market": market,
                                       "instance_type": row.instance_type, "max_price": local_max, "currency": currency})
                inst = self._wait(region, instance_id, events)
                if inst.state == RUNNING:
                    inst.price_per_hour = (local_max if market == "spot"
                                           else (quoted or (row.ondemand_price or 0) * config.usd_per(row.currency) / usd))
                    return inst
                # LAUNCH_FAILED (often a spot capacity shortfall): try the next zone. Such an instance
                # is not billed, and TerminateInstances refuses it; it vanishes by itself.
                events(Kind.LAUNCH_FAILED, {"provider": NAME, "instance": instance_id, "zone": zone, "state": inst.state})
                sold_out.append(zone)
                break
        if too_low:
            prices = [p for _, p in too_low if p is not None]
            current = min(prices) if prices else None
            raise PriceTooLowError(
                f"max price {price_text} {currency}/h is below the current spot price of {row.instance_type} in "
                f"{region}" + (f" ({current:g} {currency}/h)" if current is not None else ""), current_price=current)
        raise CapacityError(f"{row.instance_type} ({market}) is sold out in every zone tried: {', '.join(sold_out)}")


class _PriceTooLow(Exception):
    def __init__(self, price: float | None):
        super().__init__(price)
        self.price = price


PROVIDER_CLASS = TencentProvider
