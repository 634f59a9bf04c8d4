"""A multi-node group on EC2: its hosts in one cluster placement group, where the type allows it.

A cluster placement group packs instances close together in one availability zone, for the low
latency and high per-flow bandwidth (10 Gbps a flow inside, 5 outside) that NCCL's all-reduce needs
(EC2 User Guide, "Placement strategies" and "Amazon EC2 instance network bandwidth"). Which types
take one is the `placement` column of interconnect.csv in this folder (every GPU type sdcloud lists:
cluster placement groups refuse only burstable T, Mac and a few flex types). One group per launch
token, named after it and tagged like the hosts; created before rank 0 launches (idempotent: an
existing one of the same name is used), deleted when the group's hosts are terminated. EC2 refuses
to delete a group while its instances are still shutting down: `sdcloud gc` deletes the ones left
behind by runs that are over (sweep_placement_groups). Placement groups cost nothing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from botocore.exceptions import BotoCoreError, ClientError

from ...offers.groups import link_of
from ..base import TAG_RUN, TAG_TOKEN, EventSink, Instance, LaunchSpec, ProviderError
from ..groups import expand
from .session import NAME, error_code, error_message

PREFIX = "sdcloud-"


def placement_group_name(token: str) -> str:
    return f"{PREFIX}{token}"  # 44 characters; EC2 takes 255


def place_group(provider: Any, offer, spec: LaunchSpec, events: EventSink) -> LaunchSpec:
    """The group's spec with its cluster placement group (made now) in `infra`; unchanged where the type takes none."""
    row = offer.row
    if link_of(NAME, row.instance_type).placement != "cluster":
        return spec
    name = placement_group_name(spec.token)
    tags = [{"Key": k, "Value": v} for k, v in spec.tags.items()]
    try:
        provider._call("ec2", row.region, "create_placement_group", events, GroupName=name, Strategy="cluster",
                       TagSpecifications=[{"ResourceType": "placement-group", "Tags": tags}])
    except ClientError as exc:
        if error_code(exc) != "InvalidPlacementGroup.Duplicate":
            raise ProviderError(f"AWS CreatePlacementGroup {name} in {row.region}: {error_code(exc)}: "
                                f"{error_message(exc)}") from None
    return replace(spec, infra={**(spec.infra or {}), "placement_group": name})


def delete_placement_groups(provider: Any, names: set[str], region: str) -> list[str]:
    """Delete `names`; those EC2 refuses now (instances still shutting down) are returned."""
    left = []
    for name in sorted(names):
        try:
            provider._call("ec2", region, "delete_placement_group", GroupName=name)
        except (ClientError, BotoCoreError, ProviderError) as exc:  # the hosts are ended: what is left is free
            if error_code(exc) != "InvalidPlacementGroup.Unknown":
                left.append(name)
    return left


def end_groups(provider: Any, ids: list[str], region: str | None) -> None:
    """Terminate every host of the groups `ids`, then their placement groups (best effort)."""
    region = region or provider.region
    hosts = provider.describe(expand(ids), region)
    provider.terminate(expand(ids), region)
    group_ended(provider, hosts, region)


def group_ended(provider: Any, members: list[Instance], region: str | None) -> None:
    names = {placement_group_name(h.tags[TAG_TOKEN]) for h in members if h.tags.get(TAG_TOKEN)}
    delete_placement_groups(provider, names, region or provider.region)


def sweep_placement_groups(provider: Any, region: str, is_active: Callable[[str], bool]) -> list[str]:
    """`sdcloud gc`: delete the placement groups of runs that are not active; the names deleted."""
    try:
        resp = provider._call("ec2", region, "describe_placement_groups",
                              Filters=[{"Name": "tag-key", "Values": [TAG_RUN]}])
    except Exception:  # noqa: BLE001 - not allowed or not there: what is left is free clutter, the hosts are what count
        return []
    stale = set()
    for pg in resp.get("PlacementGroups", []):
        tags = {t["Key"]: t["Value"] for t in pg.get("Tags", []) or []}
        if pg.get("GroupName", "").startswith(PREFIX) and not is_active(tags.get(TAG_RUN, "")):
            stale.add(pg["GroupName"])
    left = delete_placement_groups(provider, stale, region)
    return sorted(stale - set(left))
