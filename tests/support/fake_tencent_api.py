"""A fake Tencent Cloud CVM API (2017-03-12) on loopback, as the official SDK sees it.

POST / with a JSON body, the action in X-TC-Action, signed with TC3-HMAC-SHA256; every answer is
HTTP 200 with Content-Type exactly `application/json` (the SDK ignores error bodies of any other
type) and the `{"Response": {...}}` envelope. Instances live in memory: PENDING, then RUNNING;
terminated ones show TERMINATING for a while and then vanish, as post-paid instances do.

Control from a test: the FakeCVM methods in-process, or POST /_control with a JSON body
{"op": "inject" | "reclaim" | "sold_out" | "spot_price" | "template" | "site" | "instances" | "calls" | "reset", ...}.
Run alone: `python tests/support/fake_tencent_api.py --port 9000 [--secret-id ID --secret-key KEY]`.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import re
import secrets
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from typing import Callable

from tests.support.server_http import LoopbackServer, QuietHandler

API_VERSION = "2017-03-12"
SECRET_ID = "AKIDfake0000000000000000000000000000"
SECRET_KEY = "fake-secret-key-0000000000000000"
OWNER_UIN = "100000000001"  # the account's root uin, in CAM resource names

# (family, type, cpu, memory GB, GPUs, physical GPU count, on-demand CNY/h, spot CNY/h)
TYPES = [
    ("GN7", "GN7.2XLARGE32", 8, 32, 1, 1.0, 9.55, 2.87),
    ("GN7", "GN7.5XLARGE80", 20, 80, 1, 1.0, 14.63, 4.39),
    ("GN7", "GN7.10XLARGE160", 40, 160, 2, 2.0, 29.26, 8.78),
    ("GN10Xp", "GN10Xp.2XLARGE40", 10, 40, 1, 1.0, 21.5, 6.45),
    ("GT4", "GT4.4XLARGE96", 16, 96, 1, 1.0, 28.64, 8.6),
    ("PNV4", "PNV4.7XLARGE116", 28, 116, 1, 1.0, 16.07, 4.82),
    # A quarter of a T4 (vGPU): not a whole GPU, the catalog must skip it.
    ("GN7vw", "GN7vw.MEDIUM4", 2, 4, 1, 0.25, 1.2, 0.4),
    # No GPU at all.
    ("S5", "S5.MEDIUM4", 2, 4, 0, 0.0, 0.3, 0.1),
]
ZONES = {
    "ap-guangzhou": ["ap-guangzhou-3", "ap-guangzhou-4", "ap-guangzhou-6"],
    "ap-shanghai": ["ap-shanghai-2", "ap-shanghai-4"],
    "ap-beijing": ["ap-beijing-5", "ap-beijing-7"],
    "ap-singapore": ["ap-singapore-1", "ap-singapore-2"],
}
# Prices follow the account's site, in every region: a China-site account sees CNY, an
# international-site one USD (here the CNY list price at this rate).
SITES = ("china", "international")
CNY_PER_USD = 7.1
PENDING_S = 0.3  # PENDING before RUNNING
TERMINATING_S = 1.0  # TERMINATING before the instance vanishes


class ApiError(Exception):
    def __init__(self, code: str, message: str = ""):
        super().__init__(code)
        self.code = code
        self.message = message or code


@dataclass
class FakeInstance:
    id: str
    region: str
    zone: str
    instance_type: str
    charge_type: str
    tags: dict[str, str]
    created: float
    client_token: str | None = None
    name: str = ""
    image_id: str = ""
    user_data: str = ""
    max_price: str | None = None
    launch_template: dict | None = None
    state: str = "PENDING"
    fail: bool = False  # ends in LAUNCH_FAILED instead of RUNNING
    terminated_at: float | None = None
    private_ip: str = ""
    public_ip: str = ""
    request: dict = field(default_factory=dict)

    def tick(self, now: float) -> None:
        if self.state == "PENDING" and now - self.created >= PENDING_S:
            self.state = "LAUNCH_FAILED" if self.fail else "RUNNING"

    def as_api(self) -> dict:
        cpu, mem = next((t[2], t[3]) for t in TYPES if t[1] == self.instance_type)
        return {
            "Placement": {"Zone": self.zone, "ProjectId": 0},
            "InstanceId": self.id,
            "InstanceType": self.instance_type,
            "CPU": cpu,
            "Memory": mem,
            "RestrictState": "NORMAL",
            "InstanceName": self.name,
            "InstanceChargeType": self.charge_type,
            "PrivateIpAddresses": [self.private_ip],
            "PublicIpAddresses": [self.public_ip] if self.state == "RUNNING" else None,
            "ImageId": self.image_id,
            "CreatedTime": datetime.fromtimestamp(self.created, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "ExpiredTime": None,
            "InstanceState": self.state,
            "Tags": [{"Key": k, "Value": v} for k, v in self.tags.items()],
            "StopChargingMode": "NOT_APPLICABLE",
            "Uuid": str(uuid.uuid5(uuid.NAMESPACE_OID, self.id)),
            "LatestOperation": "RunInstances",
            "LatestOperationState": "SUCCESS" if self.state == "RUNNING" else "OPERATING",
            "LatestOperationRequestId": None,
        }


@dataclass
class Injection:
    action: str
    code: str
    message: str
    times: int
    zone: str | None = None


def _sdk_model(name: str):
    from tencentcloud.cvm.v20170312 import models  # the SDK's own field names are the contract
    return getattr(models, name, None)


class FakeCVM:
    """The state and the API actions; thread-safe, one lock."""

    def __init__(self, secret_id: str = SECRET_ID, secret_key: str = SECRET_KEY, site: str = "china"):
        assert site in SITES, site
        self.site = site
        self.accounts = {secret_id: secret_key}
        self.lock = threading.RLock()
        self.reset()

    def reset(self) -> None:
        with getattr(self, "lock", threading.RLock()):
            self.instances: dict[str, FakeInstance] = {}
            self.tokens: dict[tuple[str, str], list[str]] = {}  # (region, ClientToken) -> ids
            self.injections: list[Injection] = []
            self.sold_out: set[tuple[str, str, str]] = set()  # (zone, type, charge type or "*")
            self.spot_prices: dict[tuple[str, str], float] = {}  # (zone, type) -> current spot price
            self.calls: list[dict] = []  # every accepted call: action, region, params (for assertions)
            self.quota = {"spot": 1000, "total": 1000}
            self.fail_launch: set[tuple[str, str]] = set()  # (zone, type) that end in LAUNCH_FAILED
            # What the real RunInstances refuses, each with its documented code:
            self.spot_out_of_stock: set[tuple[str, str]] = set()  # (zone, type): InsufficientOffering
            self.not_sold: set[tuple[str, str]] = set()  # (zone, type): ResourceUnavailable.InstanceType
            self.no_spot: set[str] = set()  # types never sold as spot: NoInstanceTypeSupportSpot
            self.full_subnets: set[str] = set()  # NoAvailableIpAddressCountInSubnet
            self.passable_roles: set[str] | None = None  # None: any CAM role may be passed
            self.balance_ok = True  # False: InvalidAccount.InsufficientBalance
            self.templates: dict[str, dict] = {}  # launch template id -> its RunInstances fields
            # A CVM role's temporary keys: TmpSecretId -> {"key", "token", "role", "policies"}. A call
            # signed with them must carry its token and is judged against the role's CAM policies.
            self.role_keys: dict[str, dict] = {}
            # A sub-account's (or a function role's) keys with CAM policies: SecretId -> {"name", "policies"}.
            self.user_keys: dict[str, dict] = {}

    def add_role_keys(self, role: str, policies: list[str]) -> dict:
        """Temporary keys of a CVM role (as the metadata service hands them out) with its policies."""
        with self.lock:
            keys = {"TmpSecretId": "AKID" + secrets.token_hex(16), "TmpSecretKey": secrets.token_hex(16),
                    "Token": secrets.token_hex(24), "ExpiredTime": int(time.time()) + 3600, "Code": "Success"}
            self.role_keys[keys["TmpSecretId"]] = {"key": keys["TmpSecretKey"], "token": keys["Token"], "role": role,
                                                   "policies": list(policies)}
            return keys

    def add_user_keys(self, name: str, policies: list[str]) -> tuple[str, str]:
        """Long-term keys (a sub-account's, or what a function's role signs with) that hold only `policies`."""
        with self.lock:
            secret_id, secret_key = "AKID" + secrets.token_hex(16), secrets.token_hex(16)
            self.accounts[secret_id] = secret_key
            self.user_keys[secret_id] = {"name": name, "policies": list(policies)}
            return secret_id, secret_key

    def authorize(self, secret_id: str, token: str, action: str, region: str, params: dict) -> str | None:
        """The account's own keys may do anything; keys with CAM policies (a role's temporary keys,
        which need their token, or a sub-account's) must be allowed every authorization CAM
        evaluates for the call (tests/support/authz/authz_expand.cvm_needs: the instances' tags as
        `qcs:resource_tag`, cam:PassRole for CamRoleName, the launch template's fields included),
        else AuthFailure.UnauthorizedOperation, as CVM answers. The caller's name, or None."""
        role = self.role_keys.get(secret_id)
        holder = role or self.user_keys.get(secret_id)
        if holder is None:
            return None
        if role is not None and token != role["token"]:
            raise ApiError("AuthFailure.TokenFailure", "the token does not belong to these temporary keys")
        from tests.support.authz.authz_expand import cvm_needs
        from tests.support.authz.authz_cam import allowed

        name = holder.get("role") or holder["name"]
        with self.lock:
            tags = {iid: inst.tags for iid, inst in self.instances.items()}
            ref = (params.get("LaunchTemplate") or {}).get("LaunchTemplateId")
            for need, _source in cvm_needs(action, region, OWNER_UIN, params, tags, self.templates.get(ref or "")):
                if not any(allowed(p, need) for p in holder["policies"]):
                    op = need.action.removeprefix("name/")
                    raise ApiError("AuthFailure.UnauthorizedOperation",
                                   f"you are not authorized to perform operation ({op})\nresource ({need.resource}) "
                                   f"has no permission (caller {name})")
        return name

    def add_launch_template(self, template_id: str, fields: dict) -> None:
        """A launch template (as the stack makes one): RunInstances fields in the API's own names."""
        with self.lock:
            self.templates[template_id] = json.loads(json.dumps(fields))

    def _merged(self, params: dict) -> dict:
        """The fields a launch really gets: the template's, each replaced whole by the request's when
        the request sets it too (a request's TagSpecification or SystemDisk replaces the template's)."""
        ref = params.get("LaunchTemplate") or {}
        if not ref.get("LaunchTemplateId"):
            return params
        template = self.templates.get(ref["LaunchTemplateId"])
        if template is None:
            raise ApiError("InvalidParameterValue.LaunchTemplateNotFound",
                           f"launch template {ref['LaunchTemplateId']} does not exist")
        return {**template, **params}

    # -- control -------------------------------------------------------------------------------
    def inject(self, action: str, code: str, message: str = "", times: int = 1, zone: str | None = None) -> None:
        """The next `times` calls of `action` (in `zone`, when given) fail with `code`."""
        with self.lock:
            self.injections.append(Injection(action, code, message or f"injected {code}", times, zone))

    def set_sold_out(self, zone: str, instance_type: str, charge_type: str = "*", sold_out: bool = True) -> None:
        with self.lock:
            key = (zone, instance_type, charge_type)
            (self.sold_out.add if sold_out else self.sold_out.discard)(key)

    def set_spot_price(self, zone: str, instance_type: str, price: float) -> None:
        with self.lock:
            self.spot_prices[(zone, instance_type)] = price

    def reclaim(self, instance_id: str) -> None:
        """The spot market takes the instance back: it terminates without being asked."""
        with self.lock:
            inst = self.instances[instance_id]
            inst.state, inst.terminated_at = "TERMINATING", time.time()

    def live(self) -> list[FakeInstance]:
        with self.lock:
            self._tick()
            return [i for i in self.instances.values() if i.state not in ("TERMINATING", "SHUTDOWN", "LAUNCH_FAILED")]

    def control(self, body: dict) -> dict:
        op = body.get("op")
        if op == "inject":
            self.inject(body["action"], body["code"], body.get("message", ""), int(body.get("times", 1)), body.get("zone"))
        elif op == "reclaim":
            self.reclaim(body["instance_id"])
        elif op == "sold_out":
            self.set_sold_out(body["zone"], body["instance_type"], body.get("charge_type", "*"), body.get("sold_out", True))
        elif op == "spot_price":
            self.set_spot_price(body["zone"], body["instance_type"], float(body["price"]))
        elif op == "template":
            self.add_launch_template(body["template_id"], body.get("fields") or {})
        elif op == "site":
            with self.lock:
                self.site = body["site"]
        elif op == "reset":
            self.reset()
        elif op == "instances":
            with self.lock:
                self._tick()
                return {"instances": [i.as_api() | {"Region": i.region} for i in self.instances.values()]}
        elif op == "calls":
            with self.lock:
                return {"calls": list(self.calls)}
        else:
            raise ApiError("InvalidParameter", f"unknown control op {op!r}")
        return {"ok": True}

    # -- helpers ---------------------------------------------------------------------------------
    def _tick(self) -> None:
        now = time.time()
        for iid in list(self.instances):
            inst = self.instances[iid]
            inst.tick(now)
            if inst.terminated_at is not None and now - inst.terminated_at >= TERMINATING_S:
                del self.instances[iid]

    def _injected(self, action: str, zone: str | None) -> None:
        for inj in self.injections:
            if inj.action == action and inj.times > 0 and (inj.zone is None or inj.zone == zone):
                inj.times -= 1
                raise ApiError(inj.code, inj.message)

    def _is_sold_out(self, zone: str, itype: str, charge: str) -> bool:
        return (zone, itype, "*") in self.sold_out or (zone, itype, charge) in self.sold_out

    def _spot_price(self, zone: str, row: tuple) -> float:
        return self.spot_prices.get((zone, row[1]), self._local(zone, row[7]))

    def _local(self, zone: str, cny: float) -> float:
        """A list price in the account's currency (the site decides it, not the region)."""
        return round(cny / CNY_PER_USD, 4) if self.site == "international" else cny

    @staticmethod
    def _check_fields(model_name: str, params: dict) -> None:
        """Reject field names the SDK's model does not know (the real API says UnknownParameter)."""
        cls = _sdk_model(model_name)
        if cls is None:
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cls()._deserialize(json.loads(json.dumps(params)))
        useless = [str(w.message) for w in caught if "useless" in str(w.message)]
        if useless:
            raise ApiError("UnknownParameter", "; ".join(useless))

    def _region(self, region: str) -> list[str]:
        if region not in ZONES:
            raise ApiError("InvalidRegion.NotFound", f"region {region!r} does not exist")
        return ZONES[region]

    @staticmethod
    def _filters(params: dict) -> dict[str, list[str]]:
        return {f["Name"]: [str(v) for v in f.get("Values", [])] for f in params.get("Filters") or []}

    # -- actions --------------------------------------------------------------------------------
    def handle(self, action: str, region: str, params: dict, caller: str | None = None) -> dict:
        with self.lock:
            self._tick()
            fn = getattr(self, "do_" + action, None)
            if fn is None:
                raise ApiError("InvalidAction", f"action {action} is not supported by the fake")
            self._check_fields(action + "Request", params)
            zone = (params.get("Placement") or {}).get("Zone")
            self._injected(action, zone)
            self.calls.append({"action": action, "region": region, "params": params,
                               "caller": f"role:{caller}" if caller else "account"})
            return fn(region, params)

    def do_DescribeZones(self, region: str, params: dict) -> dict:
        zones = self._region(region)
        return {"TotalCount": len(zones), "ZoneSet": [
            {"Zone": z, "ZoneName": z, "ZoneId": str(100000 + i), "ZoneState": "AVAILABLE"} for i, z in enumerate(zones)]}

    def do_DescribeZoneInstanceConfigInfos(self, region: str, params: dict) -> dict:
        zones = self._region(region)
        flt = self._filters(params)
        charges = flt.get("instance-charge-type") or ["POSTPAID_BY_HOUR"]
        items = []
        for zone in zones:
            if "zone" in flt and zone not in flt["zone"]:
                continue
            for row in TYPES:
                family, itype, cpu, mem, gpu, gpu_count, od, spot = row
                if "instance-family" in flt and family not in flt["instance-family"]:
                    continue
                if "instance-type" in flt and itype not in flt["instance-type"]:
                    continue
                for charge in charges:
                    if charge not in ("POSTPAID_BY_HOUR", "SPOTPAID"):
                        raise ApiError("InvalidFilterValue", f"instance-charge-type {charge} is not supported here")
                    price = self._local(zone, od) if charge == "POSTPAID_BY_HOUR" else self._spot_price(zone, row)
                    sold = self._is_sold_out(zone, itype, charge)
                    items.append({
                        "Zone": zone, "InstanceType": itype, "InstanceChargeType": charge, "NetworkCard": 25,
                        "Externals": {}, "InstanceFamily": family, "TypeName": f"GPU {family}",
                        # The real API is not consistent about numbers: some arrive as strings.
                        "Cpu": cpu, "Memory": str(mem) if family == "GT4" else mem,
                        "LocalDiskTypeList": [], "Status": "SOLD_OUT" if sold else "SELL",
                        "Price": {"UnitPrice": round(self._local(zone, od), 4),
                                  "ChargeUnit": "HOUR",
                                  "UnitPriceDiscount": str(price) if family == "GN10Xp" else price,
                                  "Discount": round(100 * price / self._local(zone, od), 1)},
                        "SoldOutReason": "sold out" if sold else "", "InstanceBandwidth": 10.0,
                        "InstancePps": 100, "StorageBlockAmount": 0, "CpuType": "Intel Xeon", "Gpu": gpu,
                        "Fpga": 0, "Remark": "", "GpuCount": gpu_count, "Frequency": "2.5GHz",
                        "StatusCategory": "WithoutStock" if sold else "EnoughStock",
                    })
        return {"InstanceTypeQuotaSet": items}

    def _row(self, itype: str) -> tuple:
        for row in TYPES:
            if row[1] == itype:
                return row
        raise ApiError("InvalidParameterValue.InstanceTypeNotFound", f"instance type {itype} not found")

    def _check_launch(self, region: str, params: dict) -> tuple[str, tuple, str]:
        zones = self._region(region)
        zone = (params.get("Placement") or {}).get("Zone")
        if not zone:
            raise ApiError("MissingParameter", "Placement.Zone is required")
        if zone not in zones:
            raise ApiError("InvalidZone.MismatchRegion", f"zone {zone} is not in {region}")
        if not params.get("InstanceType"):
            raise ApiError("MissingParameter", "InstanceType is required")
        row = self._row(params["InstanceType"])
        if not params.get("ImageId") and not (params.get("LaunchTemplate") or {}).get("LaunchTemplateId"):
            raise ApiError("MissingParameter", "ImageId is required without a launch template")
        charge = params.get("InstanceChargeType", "POSTPAID_BY_HOUR")
        if charge not in ("POSTPAID_BY_HOUR", "SPOTPAID", "PREPAID"):
            raise ApiError("InvalidParameterValue", f"InstanceChargeType {charge}")
        if (zone, row[1]) in self.not_sold:
            raise ApiError("ResourceUnavailable.InstanceType", f"The zone {zone} does not sell {row[1]}")
        if self._is_sold_out(zone, row[1], charge):
            raise ApiError("ResourceInsufficient.SpecifiedInstanceType",
                           f"The specified instance type {row[1]} is sold out in {zone}")
        if charge == "SPOTPAID":
            if row[1] in self.no_spot:
                raise ApiError("UnsupportedOperation.NoInstanceTypeSupportSpot", f"{row[1]} does not support spot")
            market = params.get("InstanceMarketOptions")
            if market is not None:  # without it, SPOTPAID bids the market price (no cap)
                spot = market.get("SpotOptions") or {}
                if market.get("MarketType") != "spot":
                    raise ApiError("InvalidParameterValue", "InstanceMarketOptions.MarketType must be spot for SPOTPAID")
                if "MaxPrice" in spot and not isinstance(spot.get("MaxPrice"), str):
                    raise ApiError("InvalidParameterValue", "SpotOptions.MaxPrice must be a string")
                current = self._spot_price(zone, row)
                if "MaxPrice" in spot and float(spot["MaxPrice"]) < current:
                    raise ApiError("InvalidParameterValue.InsufficientPrice",
                                   f"The bid price {spot['MaxPrice']} is lower than the current price {current}.")
            if (zone, row[1]) in self.spot_out_of_stock:
                raise ApiError("InvalidParameterValue.InsufficientOffering", f"Spot stock of {row[1]} in {zone} is insufficient")
        return zone, row, charge

    def do_InquiryPriceRunInstances(self, region: str, params: dict) -> dict:
        params = self._merged(params)
        zone, row, charge = self._check_launch(region, params)
        count = int(params.get("InstanceCount") or 1)
        list_price = self._local(zone, row[6])
        price = self._spot_price(zone, row) if charge == "SPOTPAID" else list_price
        return {"Price": {"InstancePrice": {"UnitPrice": list_price * count, "ChargeUnit": "HOUR",
                                            "UnitPriceDiscount": round(price * count, 4),
                                            "Discount": round(100 * price / list_price, 1)},
                          "BandwidthPrice": {"UnitPrice": 0.8, "ChargeUnit": "GB", "UnitPriceDiscount": 0.8, "Discount": 100}}}

    def do_RunInstances(self, region: str, params: dict) -> dict:
        token = params.get("ClientToken")
        if token and len(token) > 64:
            raise ApiError("InvalidClientToken.TooLong", "ClientToken is longer than 64 characters")
        if token and (region, token) in self.tokens:
            return {"InstanceIdSet": list(self.tokens[(region, token)])}
        params = self._merged(params)
        zone, row, charge = self._check_launch(region, params)
        count = int(params.get("InstanceCount") or 1)
        role = params.get("CamRoleName")
        if role and self.passable_roles is not None and role not in self.passable_roles:
            raise ApiError("AuthFailure.CamRoleNameAuthenticateFailed", f"The role {role} cannot be passed to CVM")
        subnet = (params.get("VirtualPrivateCloud") or {}).get("SubnetId")
        if subnet in self.full_subnets:
            raise ApiError("FailedOperation.NoAvailableIpAddressCountInSubnet", f"The subnet {subnet} has no free IP address")
        if not self.balance_ok and charge != "PREPAID":
            raise ApiError("InvalidAccount.InsufficientBalance", "The account balance is insufficient")
        live = [i for i in self.instances.values() if i.state in ("PENDING", "RUNNING")]
        if charge == "SPOTPAID" and sum(i.charge_type == "SPOTPAID" for i in live) + count > self.quota["spot"]:
            raise ApiError("LimitExceeded.SpotQuota", "The spot instance quota of this region is used up")
        if len(live) + count > self.quota["total"]:
            raise ApiError("LimitExceeded.InstanceQuota", "The instance quota of this zone is used up")
        user_data = params.get("UserData") or ""
        if len(user_data) > 16384:
            raise ApiError("InvalidParameterValue.InvalidUserDataFormat", "UserData is longer than 16 KB")
        tags: dict[str, str] = {}
        for spec in params.get("TagSpecification") or []:
            if spec.get("ResourceType") == "instance":
                tags.update({t["Key"]: t["Value"] for t in spec.get("Tags") or []})
        ids = []
        for _ in range(count):
            iid = "ins-" + secrets.token_hex(4)
            n = len(self.instances) + 2
            self.instances[iid] = FakeInstance(
                id=iid, region=region, zone=zone, instance_type=row[1], charge_type=charge, tags=tags,
                created=time.time(), client_token=token, name=params.get("InstanceName", ""),
                image_id=params.get("ImageId", ""), user_data=user_data,
                max_price=((params.get("InstanceMarketOptions") or {}).get("SpotOptions") or {}).get("MaxPrice"),
                launch_template=params.get("LaunchTemplate"), fail=(zone, row[1]) in self.fail_launch,
                private_ip=f"10.0.{n // 250}.{n % 250 + 2}", public_ip=f"203.0.113.{n % 250 + 2}", request=params)
            ids.append(iid)
        if token:
            self.tokens[(region, token)] = ids
        return {"InstanceIdSet": ids}

    def do_DescribeInstances(self, region: str, params: dict) -> dict:
        zones = self._region(region)
        ids = params.get("InstanceIds")
        flt = self._filters(params)
        if ids and flt:
            raise ApiError("InvalidParameter", "InstanceIds and Filters cannot be used together")
        for iid in ids or []:
            if not re.fullmatch(r"ins-[0-9a-z]{8}", iid):
                raise ApiError("InvalidInstanceId.Malformed", f"instance id {iid} is malformed")
        limit = int(params.get("Limit") or 20)
        if limit > 100:
            raise ApiError("InvalidParameterValue.LimitExceeded", "Limit is at most 100")
        offset = int(params.get("Offset") or 0)
        found = []
        for inst in self.instances.values():
            if inst.zone not in zones or (ids and inst.id not in ids):
                continue
            ok = True
            for name, values in flt.items():
                if name == "instance-id":
                    ok = inst.id in values
                elif name == "zone":
                    ok = inst.zone in values
                elif name == "instance-state":
                    ok = inst.state in values
                elif name == "instance-charge-type":
                    ok = inst.charge_type in values
                elif name == "tag-key":
                    ok = any(k in inst.tags for k in values)
                elif name.startswith("tag:"):
                    ok = inst.tags.get(name[4:]) in values
                else:
                    raise ApiError("InvalidFilter", f"unknown filter {name}")
                if not ok:
                    break
            if ok:
                found.append(inst)
        found.sort(key=lambda i: i.created)
        return {"TotalCount": len(found), "InstanceSet": [i.as_api() for i in found[offset:offset + limit]]}

    def do_TerminateInstances(self, region: str, params: dict) -> dict:
        ids = params.get("InstanceIds") or []
        if not ids or len(ids) > 100:
            raise ApiError("InvalidParameterValue", "InstanceIds must hold 1 to 100 ids")
        zones = self._region(region)
        for iid in ids:
            inst = self.instances.get(iid)
            if inst is None or inst.zone not in zones:
                raise ApiError("InvalidInstanceId.NotFound", f"instance {iid} not found")
        # As the real API: an instance that failed to launch is not billed and cannot be terminated,
        # and one call may not mix charge types (spot with pay-as-you-go).
        for iid in ids:
            if self.instances[iid].state == "LAUNCH_FAILED":
                raise ApiError("UnsupportedOperation.InstanceStateLaunchFailed", f"instance {iid} failed to launch")
        if len({self.instances[iid].charge_type for iid in ids}) > 1:
            raise ApiError("UnsupportedOperation.InstanceMixedPricingModel",
                           "instances of different charge types cannot be terminated together")
        now = time.time()
        for iid in ids:
            inst = self.instances[iid]
            if inst.state != "TERMINATING":
                inst.state, inst.terminated_at = "TERMINATING", now
        return {}


# -- TC3-HMAC-SHA256 ---------------------------------------------------------------------------------

_AUTH_RE = re.compile(r"TC3-HMAC-SHA256 Credential=([^/]+)/(\d{4}-\d{2}-\d{2})/([a-z]+)/tc3_request, "
                      r"SignedHeaders=([a-z;-]+), Signature=([0-9a-f]{64})$")


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def tc3_signature(secret_key: str, method: str, path: str, query: str, headers: dict[str, str],
                  signed_headers: str, body: bytes, timestamp: str, date: str, service: str) -> str:
    """The TC3-HMAC-SHA256 signature, computed from the published algorithm (not from the SDK)."""
    canonical_headers = "".join(f"{h}:{headers.get(h, '').strip()}\n" for h in signed_headers.split(";"))
    canonical = "\n".join([method, path, query, canonical_headers, signed_headers, hashlib.sha256(body).hexdigest()])
    scope = f"{date}/{service}/tc3_request"
    to_sign = "\n".join(["TC3-HMAC-SHA256", timestamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(("TC3" + secret_key).encode(), date), service), "tc3_request")
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def verify_tc3(handler: BaseHTTPRequestHandler, body: bytes, accounts: dict[str, str], service: str) -> dict[str, str]:
    """Check a request's TC3-HMAC-SHA256 signature as every Tencent Cloud API does; its headers, lower-cased.

    Shared by the fakes of each service (CVM here, billing in tencent_billing_fake)."""
    m = _AUTH_RE.match(handler.headers.get("Authorization", ""))
    if not m:
        raise ApiError("AuthFailure.InvalidAuthorization", "Authorization header is malformed")
    secret_id, date, scope_service, signed_headers, signature = m.groups()
    secret_key = accounts.get(secret_id)
    if secret_key is None:
        raise ApiError("AuthFailure.SecretIdNotFound", "The SecretId is not found")
    stamp = handler.headers.get("X-TC-Timestamp", "")
    if not stamp.isdigit() or abs(time.time() - int(stamp)) > 300:
        raise ApiError("AuthFailure.SignatureExpire", "The signature expired (clock skew over 5 minutes)")
    if datetime.fromtimestamp(int(stamp), timezone.utc).strftime("%Y-%m-%d") != date:
        raise ApiError("AuthFailure.SignatureFailure", "The credential date does not match X-TC-Timestamp")
    if scope_service != service:
        raise ApiError("AuthFailure.SignatureFailure", f"service {scope_service} in the credential scope is not {service}")
    if "content-type" not in signed_headers.split(";") or "host" not in signed_headers.split(";"):
        raise ApiError("AuthFailure.SignatureFailure", "content-type and host must be signed")
    headers = {k.lower(): v for k, v in handler.headers.items()}
    path, _, query = handler.path.partition("?")
    expected = tc3_signature(secret_key, handler.command, path, query, headers, signed_headers, body, stamp, date,
                             scope_service)
    if not hmac.compare_digest(expected, signature):
        raise ApiError("AuthFailure.SignatureFailure", "The provided credentials could not be validated")
    return headers


class TencentApiHandler(QuietHandler):
    """What every Tencent API fake answers alike (CVM, SCF, billing): POST / with the action in
    X-TC-Action; every answer HTTP 200 `application/json` in the `{"Response": ...}` envelope, with a
    RequestId, an error as its Code and Message, and a bug in the fake as the real API's InternalError."""

    def body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def answer(self, call: Callable[[], dict]) -> None:
        request_id = str(uuid.uuid4())
        try:
            payload = {"Response": {**call(), "RequestId": request_id}}
        except ApiError as exc:
            payload = {"Response": {"Error": {"Code": exc.code, "Message": exc.message}, "RequestId": request_id}}
        except Exception as exc:  # a bug in the fake: answer like the real API's InternalError
            payload = {"Response": {"Error": {"Code": "InternalError", "Message": repr(exc)}, "RequestId": request_id}}
        self.send_json(payload)


def json_params(body: bytes) -> dict:
    try:
        return json.loads(body or b"{}")
    except ValueError:
        raise ApiError("InvalidParameter", "the body is not JSON") from None


class _Handler(TencentApiHandler):
    server_version = "fake-cvm/1"
    fake: FakeCVM  # set on the subclass

    def _verify(self, body: bytes) -> dict[str, str]:
        accounts = {**self.fake.accounts, **{k: v["key"] for k, v in self.fake.role_keys.items()}}
        headers = verify_tc3(self, body, accounts, "cvm")
        if headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise ApiError("InvalidParameter", "Content-Type must be application/json")
        return headers

    def do_POST(self) -> None:
        body = self.body()
        if self.path == "/_control":
            try:
                self.send_json(self.fake.control(json.loads(body or b"{}")))
            except (ApiError, KeyError, ValueError) as exc:
                self.send_json({"error": str(exc)})
            return

        def call() -> dict:
            headers = self._verify(body)
            if self.headers.get("X-TC-Version") != API_VERSION:
                raise ApiError("InvalidParameter", f"X-TC-Version must be {API_VERSION}")
            action = self.headers.get("X-TC-Action", "")
            region = self.headers.get("X-TC-Region", "")
            if not region:
                raise ApiError("MissingParameter", "X-TC-Region is required")
            params = json_params(body)
            secret_id = _AUTH_RE.match(headers.get("authorization", "")).group(1)
            caller = self.fake.authorize(secret_id, headers.get("x-tc-token", ""), action, region, params)
            return self.fake.handle(action, region, params, caller)

        self.answer(call)


class FakeServer(LoopbackServer):
    """The fake on 127.0.0.1 in a thread: `with FakeServer() as srv: srv.endpoint, srv.cvm`."""

    thread_name = "fake-cvm"

    def __init__(self, port: int = 0, secret_id: str = SECRET_ID, secret_key: str = SECRET_KEY):
        self.cvm = FakeCVM(secret_id, secret_key)
        self.bind(type("Handler", (_Handler,), {"fake": self.cvm}), port=port)

    @property
    def endpoint(self) -> str:
        return self.address()


# -- SCF (2018-04-16): the timer triggers of the cloud driver's function --------------------------------
# Its own server (service `scf` in the TC3 scope, version 2018-04-16), same envelope and signing as
# the CVM fake. What the real actions refuse, as SCF's documents state: a timer's cron that is not
# seven fields (second minute hour day month week year) within their ranges, a trigger name that does
# not start with a letter, a second trigger of one name on a function, a custom argument over 4 KB,
# a function or trigger that does not exist, and field names the action does not take.

SCF_VERSION = "2018-04-16"
_SCF_FIELDS = {
    "CreateTrigger": {"FunctionName", "TriggerName", "Type", "TriggerDesc", "Namespace", "Qualifier", "Enable",
                      "CustomArgument", "Description"},
    "DeleteTrigger": {"FunctionName", "TriggerName", "Type", "Namespace", "TriggerDesc", "Qualifier"},
    "ListTriggers": {"FunctionName", "Namespace", "Offset", "Limit", "OrderBy", "Order", "Filters"},
    "UpdateTriggerStatus": {"Enable", "FunctionName", "TriggerName", "Type", "Qualifier", "Namespace", "TriggerDesc"},
    "CreateFunction": {"FunctionName", "Code", "Handler", "Description", "MemorySize", "Timeout", "Environment",
                       "Runtime", "Namespace", "Role", "Tags", "Type", "CodeSource"},
}
# CAM (2019-01-16), on the same server: the account's roles, for SCF's service role (SCF_QcsRole).
CAM_VERSION = "2019-01-16"
SCF_SERVICE_ROLE = "SCF_QcsRole"
_MONTHS = "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split()
_DAYS = "SUN MON TUE WED THU FRI SAT".split()
# (low, high, names, special characters) per field of SCF's seven-field cron.
_SCF_CRON = [(0, 59, [], ""), (0, 59, [], ""), (0, 23, [], ""), (1, 31, [], "?LW"), (1, 12, _MONTHS, ""),
             (0, 6, _DAYS, "?L#"), (1970, 2099, [], "")]


def scf_cron_ok(expr: str) -> bool:
    """Whether SCF takes `expr` as a timer's cron (the seven-field form; `,` `-` `*` `/` in every field)."""
    fields = expr.split()
    if len(fields) != len(_SCF_CRON):
        return False

    def value(tok: str, lo: int, hi: int, names: list[str]) -> bool:
        if tok.upper() in names:
            return True
        return tok.isdigit() and lo <= int(tok) <= hi

    for tok, (lo, hi, names, special) in zip(fields, _SCF_CRON):
        for item in tok.split(","):
            if item in special or item == "*":
                continue
            base, _, step = item.partition("/")
            if step and not (step.isdigit() and int(step) > 0):
                return False
            if base == "*":
                continue
            ends = base.split("-")
            if len(ends) > 2 or not all(value(e, lo, hi, names) for e in ends):
                return False
    return True


class FakeSCF:
    """Functions (added in-process with `add_function`) and their triggers."""

    def __init__(self, secret_id: str = SECRET_ID, secret_key: str = SECRET_KEY):
        self.accounts = {secret_id: secret_key}
        self.functions: dict[tuple[str, str, str], list[dict]] = {}  # (region, namespace, name) -> triggers
        # The account's CAM roles: an account has SCF_QcsRole once SCF's service was authorized in the
        # console; a fresh one has none (`roles.discard(SCF_SERVICE_ROLE)` in a test).
        self.roles: set[str] = {SCF_SERVICE_ROLE}
        self.calls: list[dict] = []
        self.lock = threading.Lock()

    def add_function(self, name: str, region: str, namespace: str = "default") -> None:
        self.functions[(region, namespace, name)] = []

    def _triggers(self, region: str, params: dict) -> list[dict]:
        key = (region, params.get("Namespace") or "default", params.get("FunctionName") or "")
        if key not in self.functions:
            raise ApiError("ResourceNotFound.Function", f"function {key[2]} does not exist in {key[1]} ({region})")
        return self.functions[key]

    def handle(self, action: str, region: str, params: dict) -> dict:
        with self.lock:
            if action not in _SCF_FIELDS:
                raise ApiError("InvalidAction", f"action {action} is not supported by the fake")
            unknown = set(params) - _SCF_FIELDS[action]
            if unknown:
                raise ApiError("UnknownParameter", f"The parameter {sorted(unknown)[0]} is not recognized")
            self.calls.append({"action": action, "region": region, "params": params})
            return getattr(self, "do_" + action)(region, params)

    def do_CreateTrigger(self, region: str, params: dict) -> dict:
        triggers = self._triggers(region, params)
        name, kind = str(params.get("TriggerName") or ""), params.get("Type")
        if kind not in ("cos", "cmq", "timer", "ckafka", "apigw", "http"):
            raise ApiError("InvalidParameterValue.Type", f"Type {kind!r} is not a trigger type")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,99}", name):
            raise ApiError("InvalidParameterValue.TriggerName", f"TriggerName {name!r} is invalid")
        desc = str(params.get("TriggerDesc") or "")
        if kind == "timer" and not scf_cron_ok(desc):
            raise ApiError("InvalidParameterValue.TriggerDesc", f"TriggerDesc {desc!r} is not a valid cron expression")
        if len(str(params.get("CustomArgument") or "").encode()) > 4096:
            raise ApiError("InvalidParameterValue.CustomArgument", "CustomArgument is longer than 4 KB")
        if params.get("Enable", "OPEN") not in ("OPEN", "CLOSE"):
            raise ApiError("InvalidParameterValue.Enable", "Enable must be OPEN or CLOSE")
        if any(t["TriggerName"] == name and t["Type"] == kind for t in triggers):
            raise ApiError("ResourceInUse.Trigger", f"trigger {name} already exists")
        now = time.strftime("%Y-%m-%d %H:%M:%S")
        info = {"TriggerName": name, "Type": kind, "TriggerDesc": json.dumps({"cron": desc}) if kind == "timer" else desc,
                "Enable": 1 if params.get("Enable", "OPEN") == "OPEN" else 0, "CustomArgument": params.get("CustomArgument", ""),
                "AddTime": now, "ModTime": now, "Qualifier": params.get("Qualifier") or "$LATEST",
                "AvailableStatus": "Available", "BindStatus": "", "TriggerAttribute": "", "ResourceId": "",
                "Description": params.get("Description", "")}
        triggers.append(info)
        return {"TriggerInfo": dict(info)}

    def do_CreateFunction(self, region: str, params: dict) -> dict:
        """A function's code from COS (Code.CosBucketName) is read through SCF's service role: without
        SCF_QcsRole in the account SCF cannot fetch it, and the function is not made."""
        code = params.get("Code") or {}
        if code.get("CosBucketName") and SCF_SERVICE_ROLE not in self.roles:
            raise ApiError("FailedOperation.CreateFunction",
                           f"SCF cannot read the code from COS: the account has no {SCF_SERVICE_ROLE}")
        self.add_function(str(params.get("FunctionName") or ""), region, params.get("Namespace") or "default")
        return {}

    def cam(self, action: str, params: dict) -> dict:
        with self.lock:
            self.calls.append({"action": action, "service": "cam", "params": params})
            if action != "GetRole":
                raise ApiError("InvalidAction", f"action {action} is not supported by the fake")
            name = params.get("RoleName")
            if name not in self.roles:
                raise ApiError("ResourceNotFound.RoleNotExist", f"role {name} does not exist")
            return {"RoleInfo": {"RoleName": name, "RoleType": "system"}}

    def do_DeleteTrigger(self, region: str, params: dict) -> dict:
        triggers = self._triggers(region, params)
        for t in triggers:
            if t["TriggerName"] == params.get("TriggerName") and t["Type"] == params.get("Type"):
                triggers.remove(t)
                return {}
        raise ApiError("ResourceNotFound.Trigger", f"trigger {params.get('TriggerName')} does not exist")

    def do_UpdateTriggerStatus(self, region: str, params: dict) -> dict:
        # Enable, FunctionName, TriggerName and Type are required; types other than timer, cos and ckafka
        # are refused (SCF's API document 583/89800).
        triggers = self._triggers(region, params)
        for name in ("Enable", "TriggerName", "Type"):
            if not params.get(name):
                raise ApiError("MissingParameter", f"The request is missing a required parameter `{name}`")
        if params["Enable"] not in ("OPEN", "CLOSE"):
            raise ApiError("InvalidParameterValue.Enable", "Enable must be OPEN or CLOSE")
        if params["Type"] not in ("timer", "cos", "ckafka"):
            raise ApiError("InvalidParameterValue.Type", f"Type {params['Type']!r} cannot change status")
        for t in triggers:
            if t["TriggerName"] == params["TriggerName"] and t["Type"] == params["Type"]:
                t["Enable"] = 1 if params["Enable"] == "OPEN" else 0
                t["ModTime"] = time.strftime("%Y-%m-%d %H:%M:%S")
                return {}
        raise ApiError("ResourceNotFound.Trigger", f"trigger {params['TriggerName']} does not exist")

    def do_ListTriggers(self, region: str, params: dict) -> dict:
        triggers = self._triggers(region, params)
        offset, limit = int(params.get("Offset") or 0), int(params.get("Limit") or 20)
        if limit > 100:
            raise ApiError("InvalidParameterValue.Limit", "Limit must be at most 100")
        return {"TotalCount": len(triggers), "Triggers": [dict(t) for t in triggers[offset:offset + limit]]}


class _ScfHandler(TencentApiHandler):
    server_version = "fake-scf/1"
    fake: FakeSCF  # set on the subclass

    def do_POST(self) -> None:
        body = self.body()
        service = "cam" if self.headers.get("X-TC-Version") == CAM_VERSION else "scf"

        def call() -> dict:
            headers = verify_tc3(self, body, self.fake.accounts, service)
            if headers.get("content-type", "").split(";")[0].strip() != "application/json":
                raise ApiError("InvalidParameter", "Content-Type must be application/json")
            if service == "scf" and self.headers.get("X-TC-Version") != SCF_VERSION:
                raise ApiError("InvalidParameter", f"X-TC-Version must be {SCF_VERSION}")
            action = self.headers.get("X-TC-Action", "")
            if service == "cam":
                return self.fake.cam(action, json_params(body))
            return self.fake.handle(action, self.headers.get("X-TC-Region", ""), json_params(body))

        self.answer(call)


class ScfServer(LoopbackServer):
    """The SCF fake on 127.0.0.1 in a thread: `with ScfServer() as srv: srv.endpoint, srv.scf`."""

    thread_name = "fake-scf"

    def __init__(self, port: int = 0):
        self.scf = FakeSCF()
        self.bind(type("ScfHandler", (_ScfHandler,), {"fake": self.scf}), port=port)

    @property
    def endpoint(self) -> str:
        return self.address()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="A fake Tencent Cloud CVM API on 127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--secret-id", default=SECRET_ID)
    ap.add_argument("--secret-key", default=SECRET_KEY)
    args = ap.parse_args(argv)
    server = FakeServer(args.port, args.secret_id, args.secret_key)
    print(f"fake CVM API on {server.endpoint}", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()


if __name__ == "__main__":
    main()


@contextmanager
def serving(monkeypatch, tmp_path, pending_s: float = 0.1, terminating_s: float = 0.2) -> Iterator[FakeServer]:
    """The fake on loopback as a Tencent provider's tests see it: the test account's keys, no
    developer profile file, the endpoint override, instances that start and end in a blink."""
    monkeypatch.setattr(sys.modules[__name__], "PENDING_S", pending_s)
    monkeypatch.setattr(sys.modules[__name__], "TERMINATING_S", terminating_s)
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", SECRET_ID)
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", SECRET_KEY)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no developer profile file
    with FakeServer() as srv:
        monkeypatch.setenv("SDCLOUD_TENCENT_ENDPOINT", srv.endpoint)
        yield srv
