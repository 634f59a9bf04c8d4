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
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ... import clock, config
from ...offers.catalog import CatalogRow, bundled_rows, load_provider, write_refreshed
from ...errors import UserError
from ...offers.optimizer import Offer
from . import errors as codes
from . import site
from ..base import (FAILED, LIVE_STATES, PENDING, RUNNING, STOPPING, TAG_RUN, TAG_TOKEN, TERMINATED, CapacityError,
                   CredentialsError, EventSink, Instance, LaunchSpec, PriceTooLowError, ProviderError, QuotaError,
                   no_events)

NAME = "tencent"
API_VERSION = "2017-03-12"
ENDPOINT_ENV = "SDCLOUD_TENCENT_ENDPOINT"
# The CVM metadata service hands out CAM role credentials on a CVM host.
METADATA_URL = "http://metadata.tencentyun.com/latest/meta-data/"

SPOT, ONDEMAND = "SPOTPAID", "POSTPAID_BY_HOUR"
CHARGE_TYPES = {"spot": SPOT, "on-demand": ONDEMAND}

# Instance families with whole GPUs whose model is in sdcloud/data/gpus.csv. Tencent's API
# reports the GPU count, not the model, so the family decides it.
GPU_FAMILIES = {
    "GN7": "T4", "GN7vi": "T4", "GN7vw": "T4",
    "GN10X": "V100-32GB", "GN10Xp": "V100-32GB",
    "GT4": "A100",
    "GNV4": "A10", "PNV4": "A10",
}

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

# What each RunInstances error code means for the launch: sdcloud/providers/tencent/errors.py.
RETRY_PREFIXES = ("RequestLimitExceeded", "ClientNetworkError", "ServerNetworkError", "InternalError")
# Fields of RunInstances that InquiryPriceRunInstances also takes.
INQUIRY_FIELDS = ("Placement", "ImageId", "InstanceChargeType", "InstanceType", "SystemDisk", "VirtualPrivateCloud",
                  "InternetAccessible", "InstanceCount", "InstanceName", "LoginSettings", "SecurityGroupIds",
                  "TagSpecification", "InstanceMarketOptions", "LaunchTemplate")
USER_DATA_MAX = 16 * 1024  # bytes of base64, the API's limit


def _num(value: Any) -> float | None:
    """A number that may arrive as a string, or not at all."""
    if value in (None, ""):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def endpoint_override() -> tuple[str, str] | None:
    """(scheme, host[:port]) from SDCLOUD_TENCENT_ENDPOINT, or None for the SDK's default endpoint."""
    raw = os.environ.get(ENDPOINT_ENV, "").strip()
    if not raw:
        return None
    url = urlparse(raw)
    if url.scheme not in ("http", "https") or not url.hostname or url.path not in ("", "/") or url.query:
        raise UserError(f"{ENDPOINT_ENV} must look like http://host:port or https://host, got {raw!r}")
    return url.scheme, url.netloc


def _cvm_role() -> str | None:
    """The CAM role of this CVM host, or None when not on a CVM (asked with a short timeout)."""
    try:
        with urllib.request.urlopen(METADATA_URL + "cam/security-credentials/", timeout=1) as resp:
            role = resp.read().decode().strip()
            return role.splitlines()[0] if role else None
    except (OSError, ValueError):
        return None


def credentials():
    """SDK credentials: environment, then the SDK's profile file, then the CVM role; one clear line if none."""
    from tencentcloud.common import credential
    from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException

    sid, skey = os.environ.get("TENCENTCLOUD_SECRET_ID", ""), os.environ.get("TENCENTCLOUD_SECRET_KEY", "")
    try:
        if sid or skey:
            if not (sid and skey):
                missing = "TENCENTCLOUD_SECRET_KEY" if sid else "TENCENTCLOUD_SECRET_ID"
                raise CredentialsError(f"{missing} is not set, but its partner is: set both, or neither")
            return credential.Credential(sid, skey, os.environ.get("TENCENTCLOUD_SESSION_TOKEN") or None)
        cred = credential.ProfileCredential().get_credential()
        if cred is not None:
            return cred
    except TencentCloudSDKException as exc:
        raise CredentialsError(f"Tencent Cloud credentials are not usable: {exc.message}") from None
    role = _cvm_role()
    if role:
        cred = credential.CVMRoleCredential(role)
        cred._role_endpoint = METADATA_URL + "cam/security-credentials/"  # the service we just asked
        if cred.get_credential() is None:
            raise CredentialsError(f"the CVM role {role!r} gave no credentials: check the role's trust policy")
        return cred
    raise CredentialsError("no Tencent Cloud credentials: set TENCENTCLOUD_SECRET_ID and TENCENTCLOUD_SECRET_KEY, "
                           "write ~/.tencentcloud/credentials, or run on a CVM with a CAM role")


def _code(exc: Exception) -> str:
    return str(getattr(exc, "code", "") or "")


def _retryable(exc: BaseException) -> bool:
    return _code(exc).startswith(RETRY_PREFIXES)


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


def default_regions() -> list[str]:
    """The regions of the Tencent catalog in use (refreshed, else bundled)."""
    try:
        rows, _ = load_provider(NAME)
    except (OSError, ValueError, KeyError):
        rows = bundled_rows(NAME)
    return sorted({r.region for r in rows}) or sorted({r.region for r in bundled_rows(NAME)})


class TencentProvider:
    name = NAME

    def __init__(self, poll_interval: float = 3.0, launch_timeout: float = 600.0, max_attempts: int = 6,
                 backoff: float = 1.0, backoff_max: float = 20.0, request_timeout: int = 30):
        self.poll_interval = poll_interval
        self.launch_timeout = launch_timeout
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.request_timeout = request_timeout
        self._cred = None
        self._clients: dict[str, Any] = {}
        self.last_errors: list[str] = []
        self._currency: str | None = None

    def account_currency(self, region: str) -> str:
        """CNY or USD: the account's site decides (set by the user, else read from its prices once)."""
        configured = site.configured_currency()
        if configured:
            return configured
        if self._currency is None:
            resp = self.call(region, "DescribeZoneInstanceConfigInfos", {"Filters": [
                {"Name": "instance-family", "Values": sorted(GPU_FAMILIES)},
                {"Name": "instance-charge-type", "Values": [ONDEMAND]}]})
            quoted: dict[str, float] = {}
            for item in resp.get("InstanceTypeQuotaSet") or []:
                price = _num((item.get("Price") or {}).get("UnitPrice"))
                if price:
                    quoted.setdefault(str(item.get("InstanceType")), price)
            self._currency = site.detect_currency(region, quoted, site.bundled_reference(bundled_rows(NAME), region))
        return self._currency

    def check_credentials(self) -> None:
        """Raise CredentialsError (one line) now, before a run is created, when none can be found."""
        if self._cred is None:
            self._cred = credentials()

    # -- the API ---------------------------------------------------------------------------------
    def _client(self, region: str):
        client = self._clients.get(region)
        if client is None:
            from tencentcloud.common.profile.client_profile import ClientProfile
            from tencentcloud.common.profile.http_profile import HttpProfile
            from tencentcloud.cvm.v20170312 import cvm_client

            if self._cred is None:
                self._cred = credentials()
            override = endpoint_override()
            if override:
                http = HttpProfile(protocol=override[0], endpoint=override[1], reqTimeout=self.request_timeout)
            else:
                http = HttpProfile(reqTimeout=self.request_timeout)
            client = cvm_client.CvmClient(self._cred, region, ClientProfile(httpProfile=http, language="en-US"))
            self._clients[region] = client
        return client

    def call(self, region: str, action: str, params: dict, events: EventSink = no_events) -> dict:
        """One API call; throttling and network blips are retried, bounded, with exponential backoff."""
        from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException
        from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential, wait_random

        def report(state) -> None:
            exc = state.outcome.exception()
            events("retry", {"provider": NAME, "region": region, "action": action, "code": _code(exc),
                             "attempt": state.attempt_number, "wait_s": round(state.next_action.sleep, 3)})

        client = self._client(region)
        try:
            for attempt in Retrying(retry=retry_if_exception(_retryable), stop=stop_after_attempt(self.max_attempts),
                                    wait=wait_exponential(multiplier=self.backoff, max=self.backoff_max) + wait_random(0, self.backoff),
                                    before_sleep=report, reraise=True):
                with attempt:
                    return client.call_json(action, params)["Response"]
        except TencentCloudSDKException as exc:
            code = _code(exc)
            if code in codes.ROLE:  # the host's role, not the caller's credentials
                role = repr(params["CamRoleName"]) if params.get("CamRoleName") else "of the launch template"
                raise UserError(f"{codes.ROLE[code].format(role=role)} ({code})") from None
            if code.startswith("AuthFailure"):
                raise CredentialsError(f"Tencent Cloud rejected the credentials ({code}): {exc.message}") from None
            if code.startswith("UnauthorizedOperation"):
                raise UserError(f"Tencent Cloud denied {action} ({code}): grant the CAM policy QcloudCVMFullAccess "
                                f"or an equivalent one") from None
            if _retryable(exc):
                raise ProviderError(f"Tencent Cloud {action} in {region} failed after {self.max_attempts} tries: "
                                    f"{code}: {exc.message}") from exc
            raise
        raise AssertionError("unreachable")

    # -- catalog ---------------------------------------------------------------------------------
    def fetch_region(self, region: str) -> list[CatalogRow]:
        """Catalog rows of one region: one per zone and GPU type, on-demand and spot prices, stock."""
        from ...offers.gpus import gpu_table

        gpus = gpu_table()
        today = clock.utc_now().date().isoformat()  # the UTC day, as every price age is counted
        currency = self.account_currency(region)
        merged: dict[tuple[str, str], dict] = {}
        for charge in (ONDEMAND, SPOT):
            resp = self.call(region, "DescribeZoneInstanceConfigInfos", {"Filters": [
                {"Name": "instance-family", "Values": sorted(GPU_FAMILIES)},
                {"Name": "instance-charge-type", "Values": [charge]}]})
            for item in resp.get("InstanceTypeQuotaSet") or []:
                if item.get("InstanceChargeType", charge) != charge:
                    continue
                gpu = GPU_FAMILIES.get(str(item.get("InstanceFamily") or str(item.get("InstanceType", "")).split(".")[0]))
                count = _num(item.get("GpuCount")) or _num(item.get("Gpu")) or 0
                if gpu is None or gpu not in gpus or count < 1 or count != int(count):
                    continue  # unknown model, or a slice of a GPU (vGPU)
                key = (str(item["Zone"]), str(item["InstanceType"]))
                entry = merged.setdefault(key, {"item": item, "count": int(count), "gpu": gpu})
                price = item.get("Price") or {}
                value = _num(price.get("UnitPriceDiscount")) or _num(price.get("UnitPrice"))
                in_stock = item.get("Status", "SELL") == "SELL" and item.get("StatusCategory") != "WithoutStock"
                entry[charge] = value if in_stock and value and value > 0 else None
        rows = []
        for (zone, itype), entry in sorted(merged.items()):
            if entry.get(ONDEMAND) is None and entry.get(SPOT) is None:
                continue
            item = entry["item"]
            rows.append(CatalogRow(
                provider=NAME, region=region, zone=zone, instance_type=itype, gpu=entry["gpu"],
                gpu_count=entry["count"], vram_gb=gpus[entry["gpu"]].vram_gb, vcpus=int(_num(item.get("Cpu")) or 0),
                memory_gb=_num(item.get("Memory")) or 0.0, nvme_gb=self._nvme_gb(item),
                ondemand_price=entry.get(ONDEMAND), spot_price=entry.get(SPOT), currency=currency,
                interruption_band=None, snapshot_date=today, ondemand_estimate=False, spot_estimate=False,
                source=f"Tencent Cloud DescribeZoneInstanceConfigInfos ({ONDEMAND}, {SPOT}), {region}, {today}"))
        return rows

    @staticmethod
    def _nvme_gb(item: dict) -> float:
        total = 0.0
        blocks = int(_num(item.get("StorageBlockAmount")) or 1)
        for disk in item.get("LocalDiskTypeList") or []:
            if str(disk.get("Type", "")).upper() in ("LOCAL_NVME", "LOCAL_PRO", "LOCAL_SSD"):
                total += (_num(disk.get("MaxSize")) or 0) * max(blocks, 1)
        return total

    def offers(self, tier, market: str | None = None, regions: list[str] | None = None) -> list[Offer]:
        from ...offers.catalog import load_catalog
        from ...offers.optimizer import rank

        ranked = rank(tier, load_catalog([NAME]), market=market, provider=NAME)
        return [e.offer for e in ranked if not regions or e.offer.row.region in regions]

    def price_history(self, instance_type: str, zone: str, start: datetime, end: datetime) -> list[tuple[datetime, float]]:
        """Tencent publishes no spot price history: the current quote is the one sample."""
        region = zone.rsplit("-", 1)[0]
        resp = self.call(region, "DescribeZoneInstanceConfigInfos", {"Filters": [
            {"Name": "zone", "Values": [zone]}, {"Name": "instance-type", "Values": [instance_type]},
            {"Name": "instance-charge-type", "Values": [SPOT]}]})
        for item in resp.get("InstanceTypeQuotaSet") or []:
            price = item.get("Price") or {}
            value = _num(price.get("UnitPriceDiscount")) or _num(price.get("UnitPrice"))
            if value:
                return [(datetime.now(timezone.utc), value)]
        return []

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

    def _by_token(self, region: str, token: str, events: EventSink) -> Instance | None:
        raws = self._describe_all(region, {"Filters": [{"Name": f"tag:{TAG_TOKEN}", "Values": [token]}]}, events)
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
            "ClientToken": f"{spec.token}-{zone}"[:64],  # per zone: a retry in a zone is idempotent
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
                raise UserError(f"the host's user-data is {len(encoded)} bytes in base64; Tencent Cloud takes at most {USER_DATA_MAX}")
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
        region = row.region
        existing = self._by_token(region, spec.token, events)
        if existing is not None:
            events("adopted", {"provider": NAME, "instance": existing.id, "token": spec.token, "zone": existing.zone})
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
                    quote = self.call(region, "InquiryPriceRunInstances", {k: params[k] for k in INQUIRY_FIELDS if k in params}, events)
                    quoted = _num(((quote.get("Price") or {}).get("InstancePrice") or {}).get("UnitPriceDiscount"))
                    events("quote", {"provider": NAME, "zone": zone, "instance_type": row.instance_type, "market": market,
                                     "price": quoted, "currency": currency, "max_price": local_max})
                    if market == "spot" and quoted is not None and local_max is not None and quoted > local_max + 1e-9:
                        raise _PriceTooLow(quoted)
                    resp = self.call(region, "RunInstances", params, events)
                except _PriceTooLow as low:
                    too_low.append((zone, low.price))
                    events("price_too_low", {"provider": NAME, "zone": zone, "current_price": low.price, "max_price": local_max,
                                             "currency": currency})
                    break
                except TencentCloudSDKException as exc:
                    code = _code(exc)
                    meaning = codes.meaning(code)
                    if meaning == "zone":
                        sold_out.append(zone)
                        events("zone_failover", {"provider": NAME, "zone": zone, "code": code,
                                                 "reason": codes.ZONE_UNAVAILABLE[code], "next_zone": next_zone})
                        break
                    if meaning == "subnet":
                        more = k + 1 < len(subnets)
                        events("subnet_full", {"provider": NAME, "zone": zone, "subnet": subnet, "code": code,
                                               "next_subnet": subnets[k + 1] if more else None,
                                               "next_zone": None if more else next_zone})
                        if not more:
                            sold_out.append(zone)
                        continue
                    if meaning == "price":
                        current = _parse_price(exc.message)
                        too_low.append((zone, current))
                        events("price_too_low", {"provider": NAME, "zone": zone, "current_price": current,
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
                events("launched", {"provider": NAME, "instance": instance_id, "zone": zone, "market": market,
                                    "instance_type": row.instance_type, "max_price": local_max, "currency": currency})
                inst = self._wait(region, instance_id, events)
                if inst.state == RUNNING:
                    inst.price_per_hour = local_max if market == "spot" else (quoted or (row.ondemand_price or 0) * config.usd_per(row.currency) / usd)
                    return inst
                # LAUNCH_FAILED (often a spot capacity shortfall): try the next zone. Such an instance
                # is not billed, and TerminateInstances refuses it; it vanishes by itself.
                events("launch_failed", {"provider": NAME, "instance": instance_id, "zone": zone, "state": inst.state})
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


def refresh_catalog(regions: list[str] | None = None) -> tuple[Path, list[CatalogRow], list[str]]:
    """Read GPU offers and prices of `regions` (default: the catalog's) and write the refreshed catalog.

    A region that fails is reported in `errors` and skipped; when nothing at all was read the
    previous catalog is kept and a UserError says why.
    """
    from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException

    provider = TencentProvider()
    regions = list(regions or default_regions())
    rows: list[CatalogRow] = []
    errors: list[str] = []
    for region in regions:
        try:
            rows.extend(provider.fetch_region(region))
        except (ProviderError, TencentCloudSDKException) as exc:
            errors.append(f"{region}: {_code(exc) + ': ' if _code(exc) else ''}{getattr(exc, 'message', None) or exc}")
    if not rows:
        why = "; ".join(errors) if errors else "no GPU instance types on sale"
        raise UserError(f"Tencent Cloud catalog refresh read no offers ({why}); the previous catalog is kept")
    path = write_refreshed(NAME, rows, errors)
    return path, rows, errors


PROVIDER_CLASS = TencentProvider
