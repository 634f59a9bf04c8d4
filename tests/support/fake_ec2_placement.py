"""EC2 placement groups for tests on moto, which does not implement them: CreatePlacementGroup,
DescribePlacementGroups and DeletePlacementGroup answered in-process on one boto3 client (through
botocore's `before-call` events, as tests/providers/aws inject faults), with EC2's documented errors:
a name taken (InvalidPlacementGroup.Duplicate), a group unknown (InvalidPlacementGroup.Unknown), a
group that still holds instances that are not terminated (InvalidPlacementGroup.InUse)."""

from __future__ import annotations

from typing import Any

from botocore.awsrequest import AWSResponse


def _error(code: str, message: str) -> tuple[AWSResponse, dict]:
    return AWSResponse("https://ec2.amazonaws.com/", 400, {}, None), {
        "Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": 400}}


def _ok(body: dict) -> tuple[AWSResponse, dict]:
    return AWSResponse("https://ec2.amazonaws.com/", 200, {}, None), {**body, "ResponseMetadata": {"HTTPStatusCode": 200}}


class PlacementGroups:
    """The placement groups of one region; `attach(client)` answers its calls; `instances` the check for InUse."""

    def __init__(self, instances) -> None:
        self.groups: dict[str, dict] = {}
        self.instances = instances  # () -> the region's instances as describe_instances gives them

    def attach(self, client: Any) -> "PlacementGroups":
        events = client.meta.events
        events.register("before-call.ec2.CreatePlacementGroup", self._create)
        events.register("before-call.ec2.DescribePlacementGroups", self._describe)
        events.register("before-call.ec2.DeletePlacementGroup", self._delete)
        return self

    @staticmethod
    def _params(params: dict) -> dict:
        return params.get("body") or {}

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
            return _error("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
        held = [i for i in self.instances() if (i.get("Placement") or {}).get("GroupName") == name
                and i["State"]["Name"] != "terminated"]
        if held:
            return _error("InvalidPlacementGroup.InUse", f"The placement group '{name}' is in use.")
        del self.groups[name]
        return _ok({})
