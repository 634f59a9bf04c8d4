"""A multi-node group on EC2 (moto in-process): `--nodes 2` launches two hosts in one zone, in one cluster
placement group, each with its own rank in its user-data; a reclaim of either ends both; gc finds nothing."""

from __future__ import annotations

import base64
import gzip
import json
import re
from dataclasses import replace

import boto3
import pytest
from moto import mock_aws

from sdcloud.fleet.lifecycle import Fleet, Timing
from sdcloud.offers.catalog import bundled_rows
from sdcloud.offers.optimizer import Offer
from sdcloud.providers import get_provider
from sdcloud.providers.base import TAG_NODE, TAG_TOKEN, LaunchSpec
from sdcloud.providers.groups import GROUP_SEP, members
from sdcloud.runs.records.state import StateStore
from sdcloud.spot.policy import get_policy

from tests.support.fake_ec2_placement import PlacementGroups

REGION = "us-east-1"


@pytest.fixture
def ec2(aws_env):
    with mock_aws():
        yield boto3.client("ec2", region_name=REGION)


@pytest.fixture
def provider(ec2):
    image = ec2.describe_images(ImageIds=["ami-12c6146b"])["Images"][0]["ImageId"]
    prov = get_provider("aws", region=REGION, image_id=image, retry_base=0, retry_cap=0)
    # moto has no placement groups: the provider's own client and the test's answer them from one fake.
    groups = PlacementGroups(lambda: hosts(ec2, ("pending", "running", "stopping", "stopped", "shutting-down",
                                                 "terminated")))
    groups.attach(prov.client("ec2", REGION)).attach(ec2)
    return prov


def group_spec(run_id: str = "r-group001", nodes: int = 2, attempt: int = 1) -> LaunchSpec:
    agent = {"run": run_id, "attempt": attempt, "nodes": nodes, "node_rank": 0, "rendezvous_port": 29500}
    data = [f"#!/bin/sh\n# rank {r}\n" + json.dumps({**agent, "node_rank": r}) for r in range(nodes)]
    return LaunchSpec(run_id=run_id, attempt=attempt, user_data=data[0], agent_config=agent, node_user_data=data)


def offer(itype: str = "g5.12xlarge", market: str = "spot") -> Offer:
    return Offer(next(r for r in bundled_rows("aws") if r.region == REGION and r.instance_type == itype), market)


def hosts(ec2, states=("pending", "running")) -> list[dict]:
    res = ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": list(states)}])
    return [i for r in res["Reservations"] for i in r["Instances"]]


def user_data(ec2, instance_id: str) -> str:
    raw = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")["UserData"]["Value"]
    data = base64.b64decode(raw)
    return (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode()


def test_two_nodes_launch_in_one_zone_and_one_cluster_placement_group(ec2, provider):
    runs: list[dict] = []  # moto keeps no placement group on an instance: the requests are what is checked
    provider.client("ec2", REGION).meta.events.register(
        "before-call.ec2.RunInstances", lambda params, **kw: runs.append(params.get("body") or {}))
    inst = provider.launch(offer(), group_spec(), "spot")
    ids = members(inst.id)
    assert len(ids) == 2 and GROUP_SEP in inst.id
    up = {h["InstanceId"]: h for h in hosts(ec2)}
    assert set(up) == set(ids)
    assert len({h["Placement"]["AvailabilityZone"] for h in up.values()}) == 1
    [pg] = ec2.describe_placement_groups()["PlacementGroups"]
    assert pg["Strategy"] == "cluster" and [r["Placement.GroupName"] for r in runs] == [pg["GroupName"]] * 2
    assert {t["Key"]: t["Value"] for t in pg["Tags"]}[TAG_TOKEN] == group_spec().token
    for rank, iid in enumerate(ids):  # rank order, each host with its own rank in its tags and user-data
        tags = {t["Key"]: t["Value"] for t in up[iid]["Tags"]}
        assert tags[TAG_NODE] == str(rank) and tags[TAG_TOKEN] == group_spec().token
        text = user_data(ec2, iid)
        assert f'"node_rank": {rank}' in text and '"nodes": 2' in text and '"rendezvous_port": 29500' in text
    # The group's price is both hosts'.
    assert inst.live and inst.price_per_hour == pytest.approx(2 * offer().row.spot_price)
    # Launching the same attempt again adopts both hosts, launches nothing.
    again = provider.launch(offer(), group_spec(), "spot")
    assert again.id == inst.id and len(hosts(ec2)) == 2


def test_a_rank_that_cannot_launch_ends_the_ranks_already_up(ec2, provider):
    calls = []

    def refuse_second(params, **kwargs):
        body = params.get("body") or {}
        calls.append(body)
        if len(calls) == 2:
            from botocore.awsrequest import AWSResponse

            return AWSResponse("https://ec2.amazonaws.com/", 400, {}, None), {
                "Error": {"Code": "InsufficientInstanceCapacity", "Message": "injected"},
                "ResponseMetadata": {"HTTPStatusCode": 400}}
        return None

    provider.client("ec2", REGION).meta.events.register("before-call.ec2.RunInstances", refuse_second)
    from sdcloud.providers.base import CapacityError

    with pytest.raises(CapacityError):
        provider.launch(Offer(replace(offer().row, zone="us-east-1a"), "spot"), group_spec(), "spot")
    assert hosts(ec2) == []  # the group is one unit: no half group left running


def test_a_reclaim_of_one_host_ends_the_whole_group_and_gc_finds_nothing(ec2, provider, sdcloud_home):
    state = StateStore(sdcloud_home / "state.db")
    run_id = "r-group001"
    state.create_run(run_id, "sdxl-finetune", {"tier": "sdxl-finetune", "provider": "aws", "nodes": 2}, 100)
    fleet = Fleet(run_id, provider, "aws", state, [offer()], get_policy("sdcloud"), lambda k, d: None,
                  Timing(poll_seconds=1, boot_timeout=600, heartbeat_timeout=600))
    inst = fleet.launch("spot", offer(), lambda n: group_spec(run_id, attempt=n))
    [attempt] = fleet.attempts()
    assert attempt.instance_id == inst.id
    assert attempt.price == pytest.approx(2 * offer().price_per_hour_usd)  # one unit: N x the host's price
    first, second = members(inst.id)
    ec2.terminate_instances(InstanceIds=[second])  # the cloud reclaims node 2
    assert fleet.check(fleet.current(), "training", heartbeat=None) == "preempted"
    assert hosts(ec2, ("pending", "running", "stopping", "stopped")) == []  # node 1 ended with it
    state.update_run(run_id, state="failed")
    assert provider.find_tagged(run_id) == []
    assert ec2.describe_placement_groups()["PlacementGroups"] == []  # deleted once its hosts were gone
    # A placement group left behind (its hosts were still shutting down) is deleted by gc once the run is over.
    ec2.create_placement_group(GroupName="sdcloud-sdc-left", Strategy="cluster", TagSpecifications=[
        {"ResourceType": "placement-group", "Tags": [{"Key": "sdcloud:run", "Value": run_id}]}])
    assert provider.sweep_group_leftovers([REGION], lambda r: r == run_id) == []
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
