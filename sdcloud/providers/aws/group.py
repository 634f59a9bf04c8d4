"""A multi-node group on EC2: its hosts in one cluster placement group, where the type allows it.

A cluster placement group packs instances close together in one availability zone, for the low
latency and high per-flow bandwidth (10 Gbps a flow inside, 5 outside) that NCCL's all-reduce needs
(EC2 User Guide, "Placement strategies" and "Amazon EC2 instance network bandwidth"). Which types
take one is the `placement` column of interconnect.csv in this folder (every GPU type sdcloud lists:
cluster placement groups refuse only burstable T, Mac and a few flex types). One group per launch
token, named after it and tagged like the hosts; created before the group's one RunInstances request
(idempotent: an existing one of the same name is used). It is deleted on every path: at once when
the launch fails, and after the hosts are `terminated` when the group ends (EC2 refuses to delete
a group while its instances are still shutting down: ending waits, bounded). One still held at the
bound is deleted by the run's next group launch (sweep_run_leftovers, the laptop's controller or
the cloud driver alike) or by `sdcloud gc` once the run is over (sweep_placement_groups). Placement
groups cost nothing, but EC2 allows 500 a region: past that every group launch fails.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable

from botocore.exceptions import BotoCoreError, ClientError

from ...offers.groups import link_of
from ..base import TAG_RUN, TAG_TOKEN, TERMINATED, EventSink, Instance, LaunchSpec, ProviderError
from ..groups import adopt_found, expand
from .session import error_code, error_message

PREFIX = "sdcloud-"
# How long ending a group waits for its hosts to be `terminated` before it deletes their placement
# group (EC2 refuses while one is shutting down): within the cloud driver's 240 s invocation, beside
# its step. A group still shutting down then is deleted by the run's next group launch or by gc.
END_WAIT_S = 120.0
FIRST_POLL_S = 0.5
POLL_CAP_S = 10.0


def placement_group_name(token: str) -> str:
    return f"{PREFIX}{token}"  # 44 characters; EC2 takes 255


def place_group(provider: Any, offer, spec: LaunchSpec, events: EventSink) -> LaunchSpec:
    """The group's spec with its cluster placement group (made now) in `infra`; unchanged where the type takes none."""
    row = offer.row
    if link_of(row.provider, row.instance_type).placement != "cluster":
        return spec
    name = placement_group_name(spec.token)
    sweep_run_leftovers(provider, spec.run_id, spec.token, row.region)
    tags = [{"Key": k, "Value": v} for k, v in spec.tags.items()]
    try:
        provider._call("ec2", row.region, "create_placement_group", events, GroupName=name, Strategy="cluster",
                       TagSpecifications=[{"ResourceType": "placement-group", "Tags": tags}])
    except ClientError as exc:
        if error_code(exc) != "InvalidPlacementGroup.Duplicate":
            raise ProviderError(f"AWS CreatePlacementGroup {name} in {row.region}: {error_code(exc)}: "
                                f"{error_message(exc)}") from None
    return replace(spec, infra={**(spec.infra or {}), "placement_group": name})


def launch_group(provider: Any, offer, spec: LaunchSpec, market: str, max_price: float | None, events: EventSink,
                 region: str) -> Instance:
    """The whole group in one RunInstances request (`MinCount = MaxCount = N`) into its cluster placement
    group, as AWS advises for cluster placement (hosts added later meet more capacity errors); each
    host's rank is its launch index. A group already up for this token is adopted whole."""
    found = provider.find_tokens(spec.token, region)
    if found:
        return provider.adopted(adopt_found(found), region, spec, events)
    placed = place_group(provider, offer, spec, events)
    try:
        return provider._launch(offer, placed, market, max_price, events, region)
    except BaseException:
        drop_placement(provider, placed, region)  # all or nothing: nothing was launched into it
        raise


def drop_placement(provider: Any, spec: LaunchSpec, region: str) -> None:
    """A group launch that failed in every zone: its placement group holds no host, delete it now."""
    name = (spec.infra or {}).get("placement_group")
    if name:
        delete_placement_groups(provider, {str(name)}, region)


def delete_placement_groups(provider: Any, names: set[str], region: str) -> list[str]:
    """Delete `names`; those EC2 refuses now (InvalidPlacementGroup.InUse: a host still shutting down) are returned."""
    left = []
    for name in sorted(names):
        try:
            provider._call("ec2", region, "delete_placement_group", GroupName=name)
        except (ClientError, BotoCoreError, ProviderError) as exc:  # the hosts are ended: what is left is free
            if error_code(exc) != "InvalidPlacementGroup.Unknown":
                left.append(name)
    return left


def end_groups(provider: Any, ids: list[str], region: str | None) -> None:
    """Terminate every host of the groups `ids`, wait (bounded) until EC2 has them `terminated`, then
    delete their placement groups: EC2 refuses to delete one while a host is still shutting down. A
    group still shutting down at the bound is left to the sweeps (sweep_placement_groups)."""
    region = region or provider.region
    hosts = provider.describe(expand(ids), region)
    provider.terminate(expand(ids), region)
    if wait_terminated(provider, [h.id for h in hosts], region):
        group_ended(provider, hosts, region)


def wait_terminated(provider: Any, ids: list[str], region: str, limit_s: float | None = None,
                    sleep: Callable[[float], None] = time.sleep) -> bool:
    """Whether every one of `ids` reached `terminated` (or is forgotten) within `limit_s` seconds (END_WAIT_S)."""
    deadline = time.monotonic() + (END_WAIT_S if limit_s is None else limit_s)
    pause = FIRST_POLL_S
    while True:
        if all(h.state == TERMINATED for h in provider.describe(ids, region)):
            return True
        if time.monotonic() + pause > deadline:
            return False
        sleep(pause)
        pause = min(pause * 2, POLL_CAP_S)


def group_ended(provider: Any, members: list[Instance], region: str | None) -> None:
    names = {placement_group_name(h.tags[TAG_TOKEN]) for h in members if h.tags.get(TAG_TOKEN)}
    delete_placement_groups(provider, names, region or provider.region)


def stale_placement_groups(provider: Any, region: str, is_stale: Callable[[dict[str, str]], bool]) -> set[str]:
    """sdcloud's placement groups in `region` whose tags `is_stale` says are over (ec2:DescribePlacementGroups)."""
    resp = provider._call("ec2", region, "describe_placement_groups",
                          Filters=[{"Name": "tag-key", "Values": [TAG_RUN]}])
    out = set()
    for pg in resp.get("PlacementGroups", []):
        tags = {t["Key"]: t["Value"] for t in pg.get("Tags", []) or []}
        if pg.get("GroupName", "").startswith(PREFIX) and is_stale(tags):
            out.add(pg["GroupName"])
    return out


def sweep_placement_groups(provider: Any, region: str, is_active: Callable[[str], bool]) -> list[str]:
    """`sdcloud gc`: delete the placement groups of runs that are not active; the names deleted."""
    try:
        stale = stale_placement_groups(provider, region, lambda tags: not is_active(tags.get(TAG_RUN, "")))
    except Exception:  # noqa: BLE001 - not allowed or not there: clutter, the hosts are what count
        return []
    left = delete_placement_groups(provider, stale, region)
    return sorted(stale - set(left))


def sweep_run_leftovers(provider: Any, run_id: str, token: str, region: str) -> None:
    """Before a run's next group launches (the laptop's controller or the cloud driver's step): the
    placement groups its earlier attempts left (hosts still shutting down when they ended) are
    deleted, so that a long run never piles them up toward EC2's 500 a region. Best effort."""
    try:
        stale = stale_placement_groups(provider, region, lambda tags: tags.get(TAG_RUN) == run_id
                                       and tags.get(TAG_TOKEN) != token)
    except Exception:  # noqa: BLE001 - a sweep: a refusal here must not stop the launch
        return
    delete_placement_groups(provider, stale, region)
