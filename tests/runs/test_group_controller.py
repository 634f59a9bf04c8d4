"""The controller on a multi-node run on AWS (moto in-process; no agents: the hosts' side is the other
half of the group's tests): its first step launches one attempt of two hosts in one zone and one cluster
placement group, each host's user-data with its own rank and the rendezvous settings; the cloud
reclaims one host, the next steps end both and launch a fresh group; after the run, gc finds nothing."""

from __future__ import annotations

import base64
import json
import re

import boto3
from moto import mock_aws

from sdcloud.providers.groups import members

from tests.support.clouds.fake_ec2_placement import PlacementGroups

AMI = "ami-12c6146b"


def _agent_config(ec2, iid: str) -> dict:
    text = base64.b64decode(ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"])
    body = text.decode()
    found = re.search(r"^(\{.*\"node_rank\".*\})$", body, re.M)
    assert found, body[:300]
    return json.loads(found.group(1))


def test_a_group_launches_as_one_unit_is_reclaimed_as_one_and_leaves_nothing(aws_env, capsys):
    from sdcloud.cli import main
    from sdcloud.providers import get_provider
    from sdcloud.runs.driving.controller import Controller, Timing, new_run_id
    from sdcloud.runs.inputs.spec import build_spec
    from sdcloud.runs.records.state import StateStore

    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="group-bucket")
        ec2 = boto3.client("ec2", region_name="us-east-1")
        provider = get_provider("aws", image_id=AMI, region="us-east-1", regions=["us-east-1"], retry_base=0, retry_cap=0)

        def instances(states=("pending", "running")) -> list[dict]:
            res = ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": list(states)}])
            return [i for r in res["Reservations"] for i in r["Instances"]]

        groups = PlacementGroups(lambda: instances(("pending", "running", "shutting-down", "terminated")))
        groups.attach(provider.client("ec2", "us-east-1")).attach(ec2)
        plan = build_spec(None, {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1", "model": "tiny-sd15",
                                 "steps": 50, "store": "s3://group-bucket/p", "market": "spot", "nodes": 2})
        state = StateStore()
        run_id = new_run_id()
        state.create_run(run_id, "sd15-lora", plan.as_dict(), 50)
        seen: list = []
        ctl = Controller(state, run_id, provider=provider, emit=lambda k, d: seen.append((k, d)),
                         timing=Timing(poll_seconds=0.01, boot_timeout=600, heartbeat_timeout=600))
        ctl.lease.acquire_or_refuse()  # as run() does
        for _ in range(5):  # a step or a few: the launch
            ctl.step()
            if ctl.current() is not None and ctl.current().instance_id:
                break
        first = ctl.current()
        assert first is not None, seen[-8:]
        hosts = members(first.instance_id)
        up = {i["InstanceId"]: i for i in instances()}
        assert len(hosts) == 2 and set(hosts) == set(up)
        assert len({i["Placement"]["AvailabilityZone"] for i in up.values()}) == 1
        assert [g["Strategy"] for g in groups.groups.values()] == ["cluster"]
        configs = [_agent_config(ec2, iid) for iid in hosts]
        # One request, one user-data: each host reads its rank, its launch index, from the metadata service.
        assert [(c["nodes"], c["node_rank_from"], c["rendezvous_port"]) for c in configs] == [(2, "launch-index", 29500)] * 2
        assert [up[iid]["AmiLaunchIndex"] for iid in hosts] == [0, 1]  # the group's id lists them in rank order
        assert {c["attempt"] for c in configs} == {1}
        # The cloud reclaims rank 1's host: the group is one unit.
        ec2.terminate_instances(InstanceIds=[hosts[1]])
        for _ in range(5):
            ctl.step()
            if len(state.attempts(run_id)) >= 2 and ctl.current() is not None and ctl.current().instance_id:
                break
        attempts = state.attempts(run_id)
        assert attempts[0].end_reason == "preempted"
        assert not {hosts[0]} & {i["InstanceId"] for i in instances()}  # rank 0 ended with rank 1
        second = members(attempts[1].instance_id)
        assert len(second) == 2 and set(second) == {i["InstanceId"] for i in instances()}
        assert [_agent_config(ec2, iid)["attempt"] for iid in second] == [2, 2]
        # The run ends: the controller ends its group (every host), and gc finds nothing left.
        ctl.finish_stop("test")
        assert instances() == [] and groups.groups == {}
        capsys.readouterr()
        assert main(["gc", "--provider", "aws", "--region", "us-east-1", "--yes", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["found"] == 0
