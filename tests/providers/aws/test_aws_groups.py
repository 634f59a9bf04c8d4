"""A multi-node group on EC2 (moto in-process, placement groups and shutting down from
tests/support/clouds/fake_ec2_placement.py): `--nodes 2` launches two hosts in one request, one zone and one
cluster placement group, each taking its rank from its launch index; a reclaim of either ends both; the
placement group is deleted on every path (a failed launch, a failed rank once its hosts are terminated,
the run's next launch, gc)."""

from __future__ import annotations

import base64
import gzip
import json
import re
from dataclasses import replace

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError
from moto import mock_aws

from sdcloud.fleet.lifecycle import Fleet, Timing
from sdcloud.offers.catalog import bundled_rows
from sdcloud.offers.optimizer import Offer
from sdcloud.providers import get_provider
from sdcloud.offers.groups import group_price
from sdcloud.providers.aws import group as aws_group
from sdcloud.providers.base import TAG_NODE, TAG_NODES, TAG_TOKEN, CapacityError, LaunchSpec, ProviderError
from sdcloud.providers.groups import GROUP_SEP, members
from sdcloud.runs.records.state import StateStore
from sdcloud.spot.policy import get_policy

from tests.support.clouds.fake_ec2_placement import PlacementGroups

REGION = "us-east-1"


@pytest.fixture
def ec2(aws_env):
    with mock_aws():
        yield boto3.client("ec2", region_name=REGION)


@pytest.fixture
def placement(ec2):
    # moto has no placement groups and terminates at once: one fake answers the provider's client and
    # the test's, keeps each group's hosts, and shows a terminated host shutting down for a while.
    return PlacementGroups(lambda: hosts(ec2, ("pending", "running", "stopping", "stopped", "shutting-down",
                                                "terminated")), linger_s=0.6)


@pytest.fixture
def provider(ec2, placement):
    image = ec2.describe_images(ImageIds=["ami-12c6146b"])["Images"][0]["ImageId"]
    prov = get_provider("aws", region=REGION, image_id=image, retry_base=0, retry_cap=0)
    placement.attach(prov.client("ec2", REGION)).attach(ec2)
    return prov


def group_spec(run_id: str = "r-group001", nodes: int = 2, attempt: int = 1) -> LaunchSpec:
    """As runs/driving/launching.py makes it: one user-data for the group's one request (each host's
    rank its launch index) and, for a cloud that launches host by host, each rank's own."""
    agent = {"run": run_id, "attempt": attempt, "nodes": nodes, "node_rank": 0, "rendezvous_port": 29500}
    data = [f"#!/bin/sh\n# rank {r}\n" + json.dumps({**agent, "node_rank": r}) for r in range(nodes)]
    once = "#!/bin/sh\n# the group\n" + json.dumps({**agent, "node_rank_from": "launch-index"})
    return LaunchSpec(run_id=run_id, attempt=attempt, user_data=once, agent_config=agent, node_user_data=data)


def offer(itype: str = "g5.12xlarge", market: str = "spot", zone: str = "") -> Offer:
    row = next(r for r in bundled_rows("aws") if r.region == REGION and r.instance_type == itype)
    return Offer(replace(row, zone=zone) if zone else row, market)


def hosts(ec2, states=("pending", "running")) -> list[dict]:
    res = ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": list(states)}])
    return [i for r in res["Reservations"] for i in r["Instances"]]


def user_data(ec2, instance_id: str) -> str:
    raw = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")["UserData"]["Value"]
    data = base64.b64decode(raw)
    return (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode()


def refuse_runs(provider, code: str = "InsufficientInstanceCapacity") -> list[dict]:
    """Every RunInstances of the provider answered `code`, as EC2 answers it; the requests are returned."""
    calls: list[dict] = []

    def refuse(params, **kwargs):
        calls.append(params.get("body") or {})
        return AWSResponse("https://ec2.amazonaws.com/", 400, {}, None), {
            "Error": {"Code": code, "Message": "We currently do not have sufficient capacity (injected)."},
            "ResponseMetadata": {"HTTPStatusCode": 400}}

    provider.client("ec2", REGION).meta.events.register("before-call.ec2.RunInstances", refuse)
    return calls


def test_a_group_launches_in_one_request_into_one_cluster_placement_group(ec2, provider):
    runs: list[dict] = []
    provider.client("ec2", REGION).meta.events.register(
        "before-call.ec2.RunInstances", lambda params, **kw: runs.append(params.get("body") or {}))
    inst = provider.launch(offer(), group_spec(), "spot")
    ids = members(inst.id)
    assert len(ids) == 2 and GROUP_SEP in inst.id
    up = {h["InstanceId"]: h for h in hosts(ec2)}
    assert set(up) == set(ids)
    assert len({h["Placement"]["AvailabilityZone"] for h in up.values()}) == 1
    [pg] = ec2.describe_placement_groups()["PlacementGroups"]
    # One RunInstances for the whole group: N hosts or none, all in the cluster placement group.
    [run] = runs
    assert (run["MinCount"], run["MaxCount"], run["Placement.GroupName"]) == (2, 2, pg["GroupName"])
    assert pg["Strategy"] == "cluster" and {h["Placement"]["GroupName"] for h in up.values()} == {pg["GroupName"]}
    assert {t["Key"]: t["Value"] for t in pg["Tags"]}[TAG_TOKEN] == group_spec().token
    for rank, iid in enumerate(ids):  # rank order: each host's rank is its launch index
        tags = {t["Key"]: t["Value"] for t in up[iid]["Tags"]}
        assert up[iid]["AmiLaunchIndex"] == rank and tags[TAG_TOKEN] == group_spec().token
        assert tags[TAG_NODES] == "2"
        text = user_data(ec2, iid)  # the one user-data: the rank is read on the host (ami-launch-index)
        assert '"node_rank_from": "launch-index"' in text and '"nodes": 2' in text and '"rendezvous_port": 29500' in text
    assert [provider.describe([i])[0].tags[TAG_NODE] for i in ids] == ["0", "1"]
    # The group's price: the group price of its host's.
    assert inst.live and inst.price_per_hour == pytest.approx(group_price(offer().row.spot_price, 2))
    # Launching the same attempt again adopts both hosts, launches nothing.
    again = provider.launch(offer(), group_spec(), "spot")
    assert again.id == inst.id and again.adopted and len(hosts(ec2)) == 2 and len(runs) == 1


def test_a_group_without_capacity_in_its_zone_leaves_no_placement_group(ec2, provider, placement):
    calls = refuse_runs(provider)
    with pytest.raises(CapacityError):
        provider.launch(offer(zone="us-east-1a"), group_spec(), "spot")
    # The group was asked for as a whole (MinCount 2), and nothing of it is left: no host, no placement group.
    assert [(c["MinCount"], c["Placement.AvailabilityZone"]) for c in calls] == [(2, "us-east-1a")]
    assert hosts(ec2) == [] and ec2.describe_placement_groups()["PlacementGroups"] == []
    assert placement.deletes == [(calls[0]["Placement.GroupName"], "deleted")]


def test_a_group_refused_in_every_zone_tries_each_whole_and_leaves_nothing(ec2, provider):
    calls = refuse_runs(provider, "InsufficientInstanceCapacity")
    with pytest.raises(CapacityError):
        provider.launch(offer(market="on-demand"), group_spec(), "on-demand")
    zones = [c["Placement.AvailabilityZone"] for c in calls]
    assert len(zones) == len(set(zones)) > 1 and {c["MaxCount"] for c in calls} == {2}
    assert ec2.describe_placement_groups()["PlacementGroups"] == []


def test_a_group_refused_in_one_zone_lands_whole_in_the_next(ec2, provider):
    calls: list[dict] = []

    def refuse_first(params, **kwargs):
        calls.append(params.get("body") or {})
        if len(calls) == 1:
            return AWSResponse("https://ec2.amazonaws.com/", 400, {}, None), {
                "Error": {"Code": "InsufficientInstanceCapacity", "Message": "injected"},
                "ResponseMetadata": {"HTTPStatusCode": 400}}
        return None

    provider.client("ec2", REGION).meta.events.register("before-call.ec2.RunInstances", refuse_first)
    inst = provider.launch(offer(market="on-demand"), group_spec(), "on-demand")
    first, second = calls
    assert first["Placement.AvailabilityZone"] != second["Placement.AvailabilityZone"] == inst.zone
    assert first["Placement.GroupName"] == second["Placement.GroupName"] and second["MinCount"] == 2
    up = hosts(ec2)
    assert {h["InstanceId"] for h in up} == set(members(inst.id)) and {h["Placement"]["AvailabilityZone"] for h in up} == {
        inst.zone}
    assert len(ec2.describe_placement_groups()["PlacementGroups"]) == 1  # kept: it holds the group


def test_a_group_refused_for_another_reason_leaves_no_placement_group(ec2, provider):
    refuse_runs(provider, "InvalidParameterCombination")
    with pytest.raises(ProviderError):
        provider.launch(offer(zone="us-east-1a"), group_spec(), "spot")
    assert ec2.describe_placement_groups()["PlacementGroups"] == []


def test_the_fake_refuses_to_delete_a_placement_group_whose_hosts_are_shutting_down(ec2, provider, placement):
    inst = provider.launch(offer(), group_spec(), "spot")
    [pg] = ec2.describe_placement_groups()["PlacementGroups"]
    with pytest.raises(ClientError) as refused:  # hosts running
        ec2.delete_placement_group(GroupName=pg["GroupName"])
    assert refused.value.response["Error"]["Code"] == "InvalidPlacementGroup.InUse"
    ended = ec2.terminate_instances(InstanceIds=members(inst.id))["TerminatingInstances"]
    assert {e["CurrentState"]["Name"] for e in ended} == {"shutting-down"}
    with pytest.raises(ClientError) as refused:  # terminated, but still shutting down, as EC2 shows it
        ec2.delete_placement_group(GroupName=pg["GroupName"])
    assert refused.value.response["Error"]["Code"] == "InvalidPlacementGroup.InUse"
    assert {provider.describe([i])[0].state for i in members(inst.id)} == {"stopping"}


def test_a_failed_rank_ends_the_group_then_its_placement_group(ec2, provider, placement, sdcloud_home):
    state = StateStore(sdcloud_home / "state.db")
    run_id = "r-group001"
    state.create_run(run_id, "sdxl-finetune", {"tier": "sdxl-finetune", "provider": "aws", "nodes": 2}, 100)
    fleet = Fleet(run_id, provider, "aws", state, [offer()], get_policy("sdcloud"), lambda k, d: None,
                  Timing(poll_seconds=1, boot_timeout=600, heartbeat_timeout=600))
    inst = fleet.launch("spot", offer(), lambda n: group_spec(run_id, attempt=n))
    [attempt] = fleet.attempts()
    assert attempt.instance_id == inst.id
    assert attempt.price == pytest.approx(group_price(offer().price_per_hour_usd, 2))  # one unit: the group's price
    first, second = members(inst.id)
    ec2.terminate_instances(InstanceIds=[second])  # the cloud reclaims rank 1
    assert fleet.check(fleet.current(), "training", heartbeat=None) == "preempted"
    assert hosts(ec2, ("pending", "running", "stopping", "stopped")) == []  # rank 0 ended with it
    # Deleted once both hosts were terminated, never tried while they were shutting down (EC2 would refuse).
    assert ec2.describe_placement_groups()["PlacementGroups"] == []
    assert [code for _, code in placement.deletes] == ["deleted"]
    state.update_run(run_id, state="failed")
    assert provider.find_tagged(run_id) == []


def test_a_group_still_shutting_down_at_the_bound_is_deleted_by_the_runs_next_launch(ec2, provider, placement,
                                                                                     monkeypatch):
    monkeypatch.setattr(aws_group, "END_WAIT_S", 0.2)  # the bound, shorter than EC2's shutting down here
    placement.linger_s = 30.0
    first = provider.launch(offer(), group_spec(attempt=1), "spot")
    provider.terminate([first.id])  # waits 0.2 s: the hosts are still shutting down, the group stays
    [left] = ec2.describe_placement_groups()["PlacementGroups"]
    assert placement.deletes == []
    placement.linger_s = 0.0  # EC2 has terminated them since
    provider.launch(offer(), group_spec(attempt=2), "spot")  # the run's next group sweeps what it left
    [now] = ec2.describe_placement_groups()["PlacementGroups"]
    assert now["GroupName"] != left["GroupName"] and placement.deletes == [(left["GroupName"], "deleted")]


def test_the_runs_driver_deletes_what_its_groups_left_when_the_run_is_over(ec2, provider, placement, sdcloud_home,
                                                                           monkeypatch):
    monkeypatch.setattr(aws_group, "END_WAIT_S", 0.2)
    state = StateStore(sdcloud_home / "state.db")
    run_id = "r-group003"
    state.create_run(run_id, "sdxl-finetune", {"tier": "sdxl-finetune", "provider": "aws", "nodes": 2}, 100)
    other = provider.launch(offer(), group_spec("r-other"), "spot")  # another run's group: not this driver's
    fleet = Fleet(run_id, provider, "aws", state, [offer()], get_policy("sdcloud"), lambda k, d: None,
                  Timing(poll_seconds=1, boot_timeout=600, heartbeat_timeout=600))
    placement.linger_s = 30.0
    fleet.launch("spot", offer(), lambda n: group_spec(run_id, attempt=n))
    fleet.end(fleet.current(), "succeeded")  # its hosts still shutting down after the bound: the group stays
    mine = aws_group.placement_group_name(group_spec(run_id).token)
    assert mine in {g["GroupName"] for g in ec2.describe_placement_groups()["PlacementGroups"]}
    placement.linger_s = 0.0
    fleet.sweep_strays(keep_open=False)  # as the controller's last step does, on the laptop or in the cloud driver
    left = {g["GroupName"] for g in ec2.describe_placement_groups()["PlacementGroups"]}
    assert left == {aws_group.placement_group_name(group_spec("r-other").token)} and members(other.id)


def test_gc_deletes_the_placement_groups_of_runs_that_are_over(ec2, provider, sdcloud_home):
    state = StateStore(sdcloud_home / "state.db")
    run_id = "r-group001"
    state.create_run(run_id, "sdxl-finetune", {"tier": "sdxl-finetune", "provider": "aws", "nodes": 2}, 100)
    ec2.create_placement_group(GroupName="sdcloud-sdc-left", Strategy="cluster", TagSpecifications=[
        {"ResourceType": "placement-group", "Tags": [{"Key": "sdcloud:run", "Value": run_id}]}])
    assert provider.sweep_group_leftovers([REGION], lambda r: r == run_id) == []
    state.update_run(run_id, state="failed")
    assert provider.sweep_group_leftovers([REGION], state.run_is_active) == ["sdcloud-sdc-left"]
    assert ec2.describe_placement_groups()["PlacementGroups"] == []
    assert re.fullmatch(r"sdc-[0-9a-f]{32}", group_spec().token)


def test_a_group_cut_short_by_a_crash_is_not_adopted_and_its_hosts_end(ec2, provider, sdcloud_home):
    from sdcloud.providers.groups import host_spec

    state = StateStore(sdcloud_home / "state.db")
    run_id = "r-group002"
    state.create_run(run_id, "sdxl-finetune", {"tier": "sdxl-finetune", "provider": "aws", "nodes": 2}, 100)
    spec = group_spec(run_id)
    # The controller wrote the attempt, launched rank 0, and died before rank 1.
    state.add_attempt(run_id, 1, "aws", spec.token, region=REGION, zone="", instance_type="g5.12xlarge",
                      market="spot", price=1.0, currency="USD")
    provider.launch(offer(), host_spec(spec, 0), "spot")
    assert len(hosts(ec2)) == 1
    fleet = Fleet(run_id, provider, "aws", state, [offer()], get_policy("sdcloud"), lambda k, d: None,
                  Timing(poll_seconds=1, boot_timeout=600, heartbeat_timeout=600))
    fleet.reconcile()
    [attempt] = state.attempts(run_id)
    assert attempt.state == "ended" and attempt.end_reason == "launch-failed" and hosts(ec2) == []
    # A whole group is adopted as one.
    inst = provider.launch(offer(), group_spec(run_id, attempt=2), "spot")
    state.add_attempt(run_id, 2, "aws", group_spec(run_id, attempt=2).token, region=REGION, zone="",
                      instance_type="g5.12xlarge", market="spot", price=1.0, currency="USD")
    fleet.reconcile()
    assert state.attempts(run_id)[1].instance_id == inst.id and len(hosts(ec2)) == 2
