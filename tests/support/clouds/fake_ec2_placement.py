"""EC2 placement groups for tests on moto, which does not implement them: CreatePlacementGroup,
DescribePlacementGroups and DeletePlacementGroup answered in-process on boto3 clients (through
botocore's `before-call` and `after-call` events, as tests/providers/aws inject faults), with EC2's
documented errors: a name taken (InvalidPlacementGroup.Duplicate), a group unknown
(InvalidPlacementGroup.Unknown, also for a RunInstances into it), a group that still holds
instances that are not `terminated` (InvalidPlacementGroup.InUse).

What moto does not keep, this fake does, as EC2 does:
- which instances a RunInstances request put into which placement group (moto drops
  `Placement.GroupName`), shown again in DescribeInstances;
- a terminated instance's `shutting-down` while: EC2 takes a while to terminate (a GPU host, tens of
  seconds), moto does it at once. Every instance terminated through an attached client is shown
  `shutting-down` for `linger_s` seconds (TerminateInstances' answer and DescribeInstances), and holds
  its placement group as long: a delete in that time is refused InUse.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from botocore.awsrequest import AWSResponse

SHUTTING_DOWN = {"Code": 32, "Name": "shutting-down"}


def _error(code: str, message: str) -> tuple[AWSResponse, dict]:
    return AWSResponse("https://ec2.amazonaws.com/", 400, {}, None), {
        "Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": 400}}


def _ok(body: dict) -> tuple[AWSResponse, dict]:
    return AWSResponse("https://ec2.amazonaws.com/", 200, {}, None), {**body, "ResponseMetadata": {"HTTPStatusCode": 200}}


class PlacementGroups:
    """The placement groups of one region; `attach(client)` answers its calls; `instances` the check for InUse."""

    def __init__(self, instances, linger_s: float = 1.0) -> None:
        self.groups: dict[str, dict] = {}
        self.instances = instances  # () -> the region's instances as describe_instances gives them
        self.linger_s = linger_s
        self.members: dict[str, str] = {}  # instance id -> its placement group
        self.ended: dict[str, float] = {}  # instance id -> when it was terminated (monotonic)
        self.deletes: list[tuple[str, str]] = []  # (name, "deleted" or the error code), in call order
        self._lock = threading.Lock()

    def attach(self, client: Any) -> "PlacementGroups":
        events = client.meta.events
        events.register("before-call.ec2.CreatePlacementGroup", self._create)
        events.register("before-call.ec2.DescribePlacementGroups", self._describe)
        events.register("before-call.ec2.DeletePlacementGroup", self._delete)
        events.register("before-call.ec2.RunInstances", self._run)
        events.register("after-call.ec2.RunInstances", self._ran)
        events.register("before-call.ec2.TerminateInstances", self._terminate)
        events.register("after-call.ec2.TerminateInstances", self._terminated)
        events.register("after-call.ec2.DescribeInstances", self._described)
        return self

    @staticmethod
    def _params(params: dict) -> dict:
        return params.get("body") or {}

    def shutting_down(self, instance_id: str) -> bool:
        when = self.ended.get(instance_id)
        return when is not None and time.monotonic() - when < self.linger_s

    # placement groups
    def _create(self, params, **kwargs):
        body = self._params(params)
        name = body["GroupName"]
        if name in self.groups:
            return _error("InvalidPlacementGroup.Duplicate", f"The placement group '{name}' already exists.")
        tags = {}
        n = 1
        while f"TagSpecification.1.Tag.{n}.Key" in body:
            tags[body[f"TagSpecification.1.Tag.{n}.Key"]] = body[f"TagSpecification.1.Tag.{n}.Value"]
            n += 1
        self.groups[name] = {"GroupName": name, "Strategy": body.get("Strategy"), "State": "available",
                             "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        return _ok({"PlacementGroup": self.groups[name]})

    def _describe(self, params, **kwargs):
        return _ok({"PlacementGroups": list(self.groups.values())})

    def _delete(self, params, **kwargs):
        name = self._params(params)["GroupName"]
        if name not in self.groups:
            self.deletes.append((name, "InvalidPlacementGroup.Unknown"))
            return _error("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
        held = [i for i in self.instances() if (i.get("Placement") or {}).get("GroupName") == name
                and i["State"]["Name"] != "terminated"]
        if held:
            self.deletes.append((name, "InvalidPlacementGroup.InUse"))
            return _error("InvalidPlacementGroup.InUse", f"The placement group '{name}' is in use.")
        del self.groups[name]
        self.deletes.append((name, "deleted"))
        return _ok({})

    # instances: their placement group, their shutting down
    def _run(self, params, context, **kwargs):
        name = self._params(params).get("Placement.GroupName")
        if name and name not in self.groups:
            return _error("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
        context["sdcloud_placement_group"] = name
        return None

    def _ran(self, parsed, context, **kwargs):
        name = context.get("sdcloud_placement_group")
        for inst in parsed.get("Instances", []) if name else []:
            self.members[inst["InstanceId"]] = name
            inst.setdefault("Placement", {})["GroupName"] = name

    def _terminate(self, params, **kwargs):
        body = self._params(params)
        now = time.monotonic()
        with self._lock:
            n = 1
            while f"InstanceId.{n}" in body:
                self.ended.setdefault(body[f"InstanceId.{n}"], now)
                n += 1

    def _terminated(self, parsed, **kwargs):
        for change in parsed.get("TerminatingInstances", []):
            if self.shutting_down(change["InstanceId"]):
                change["CurrentState"] = dict(SHUTTING_DOWN)

    def _described(self, parsed, **kwargs):
        for res in parsed.get("Reservations", []):
            for inst in res.get("Instances", []):
                if inst["InstanceId"] in self.members:
                    inst.setdefault("Placement", {})["GroupName"] = self.members[inst["InstanceId"]]
                if inst.get("State", {}).get("Name") == "terminated" and self.shutting_down(inst["InstanceId"]):
                    inst["State"] = dict(SHUTTING_DOWN)
