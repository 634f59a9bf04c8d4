"""The AWS provider's launch path against moto in-process, with faults injected through botocore events.

moto never runs out of capacity or throttles, so the faults are short-circuit responses from a
`before-call` handler on the provider's own EC2 client: the adapter's real code (zone order,
retry, failover, error mapping) runs unchanged, and calls not failed go on to moto.
"""

from __future__ import annotations

import subprocess
import sys

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from moto import mock_aws

from sdcloud.offers.catalog import bundled_rows
from sdcloud.errors import UserError
from sdcloud.offers.optimizer import Offer
from sdcloud.providers import get_provider
from sdcloud.providers.base import (
    TAG_ATTEMPT, TAG_RUN, TAG_TOKEN, CapacityError, CredentialsError, LaunchSpec, PriceTooLowError, ProviderError,
    QuotaError, Provider,
)

REGION = "us-east-1"



@pytest.fixture
def ec2(aws_env):
    with mock_aws():
        yield boto3.client("ec2", region_name=REGION)


@pytest.fixture
def ami(ec2) -> str:
    # One of moto's stock images (listing them all takes seconds).
    image = ec2.describe_images(ImageIds=["ami-12c6146b"])["Images"][0]
    return image["ImageId"]


@pytest.fixture
def provider(ec2, ami):
    # No backoff sleeps in tests; the bound on tries is what is exercised.
    return get_provider("aws", region=REGION, image_id=ami, retry_base=0, retry_cap=0)


def offer(itype: str = "g5.xlarge", market: str = "spot", region: str = REGION) -> Offer:
    row = next(r for r in bundled_rows("aws") if r.region == region and r.instance_type == itype)
    return Offer(row, market)


class Events(list):
    def __call__(self, kind: str, data: dict) -> None:
        self.append((kind, data))

    def kinds(self) -> list[str]:
        return [k for k, _ in self]


def live(ec2) -> list[dict]:
    res = ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return [i for r in res["Reservations"] for i in r["Instances"]]


def fail_with(code: str, message: str = "injected", status: int = 400):
    return AWSResponse("https://ec2.amazonaws.com/", status, {}, None), {
        "Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}


def inject(provider, op: str, decide) -> list[dict]:
    """Call `decide(body)` before each `op` call on the provider's EC2 client; a non-None result is the response."""
    calls: list[dict] = []

    def handler(params, **kwargs):
        body = params.get("body") or {}
        calls.append(body)
        return decide(body)

    provider.client("ec2", REGION).meta.events.register(f"before-call.ec2.{op}", handler)
    return calls


def test_provider_satisfies_the_protocol(provider):
    assert isinstance(provider, Provider)
    assert provider.name == "aws"


def test_spot_launch_has_lifecycle_imdsv2_tags_and_the_dlami_from_ssm(ec2, ami, aws_env):
    prov = get_provider("aws", region=REGION, retry_base=0)
    asked: list[str] = []

    def ssm_answer(params, **kwargs):  # moto reserves /aws/ names: answer like the public parameter does
        asked.append(params["body"].decode() if isinstance(params["body"], bytes) else str(params["body"]))
        return AWSResponse("https://ssm", 200, {}, None), {"Parameter": {"Name": "x", "Type": "String", "Value": ami}}

    prov.client("ssm", REGION).meta.events.register("before-call.ssm.GetParameter", ssm_answer)
    sent: list[dict] = []
    prov.client("ec2", REGION).meta.events.register(
        "before-parameter-build.ec2.RunInstances", lambda params, **kw: sent.append(dict(params)))
    spec = LaunchSpec(run_id="run-spot", attempt=1, user_data="#!/bin/sh\ntrue\n")
    events = Events()

    inst = prov.launch(offer(), spec, "spot", max_price=0.5, events=events)

    assert "/aws/service/deeplearning/ami/x86_64/" in asked[0]
    raw = ec2.describe_instances(InstanceIds=[inst.id])["Reservations"][0]["Instances"][0]
    assert raw["InstanceLifecycle"] == "spot" and inst.market == "spot"
    assert raw["MetadataOptions"]["HttpTokens"] == "required"
    assert raw["ImageId"] == ami
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags[TAG_RUN] == "run-spot" and tags[TAG_ATTEMPT] == "1" and tags[TAG_TOKEN] == spec.token
    assert sent[0]["InstanceMarketOptions"]["SpotOptions"] == {
        "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate", "MaxPrice": "0.5"}
    assert sent[0]["ClientToken"].startswith(spec.token)
    assert inst.price_per_hour == 0.5 and not inst.adopted
    assert events.kinds() == ["launched"]


def test_same_token_adopts_the_first_instance(provider, ec2):
    spec = LaunchSpec(run_id="run-adopt", attempt=3)
    first = provider.launch(offer(), spec, "spot")
    events = Events()
    second = provider.launch(offer("g6.xlarge"), spec, "spot", events=events)  # even a new offer: same attempt
    assert second.id == first.id and second.adopted
    assert events.kinds() == ["adopted"]
    assert len(live(ec2)) == 1
    # A new attempt is a new token: a new instance.
    third = provider.launch(offer(), LaunchSpec(run_id="run-adopt", attempt=4), "spot")
    assert third.id != first.id and len(live(ec2)) == 2


def test_capacity_error_in_one_zone_ends_in_the_next_zone(provider, ec2):
    zones = provider.zones(REGION)
    calls = inject(provider, "RunInstances", lambda body: fail_with("InsufficientInstanceCapacity")
                   if body.get("Placement.AvailabilityZone") == zones[0] else None)
    events = Events()
    inst = provider.launch(offer(market="on-demand"), LaunchSpec("run-cap", 1), "on-demand", events=events)
    assert [c["Placement.AvailabilityZone"] for c in calls] == zones[:2]
    assert inst.zone == zones[1] and inst.market == "on-demand"
    failover = [d for k, d in events if k == "failover"]
    assert failover == [{"provider": "aws", "region": REGION, "zone": zones[0], "next_zone": zones[1],
                         "instance_type": "g5.xlarge", "market": "on-demand", "code": "InsufficientInstanceCapacity"}]
    assert [i["InstanceId"] for i in live(ec2)] == [inst.id]


def test_a_subnet_out_of_addresses_fails_over_to_the_next_zone(provider, ec2):
    zones = provider.zones(REGION)
    calls = inject(provider, "RunInstances", lambda body: fail_with("InsufficientFreeAddressesInSubnet")
                   if body.get("Placement.AvailabilityZone") == zones[0] else None)
    events = Events()
    inst = provider.launch(offer(market="on-demand"), LaunchSpec("run-ips", 1), "on-demand", events=events)
    assert inst.zone == zones[1] and [c["Placement.AvailabilityZone"] for c in calls] == zones[:2]
    assert [d["code"] for k, d in events if k == "failover"] == ["InsufficientFreeAddressesInSubnet"]


def test_no_capacity_anywhere_raises_capacity_error_and_leaves_nothing(provider, ec2):
    calls = inject(provider, "RunInstances", lambda body: fail_with("InsufficientCapacity"))
    events = Events()
    with pytest.raises(CapacityError, match="no capacity for spot g5.xlarge"):
        provider.launch(offer(), LaunchSpec("run-nocap", 1), "spot", events=events)
    assert len(calls) == len(provider.zones(REGION)) > 1
    assert events.kinds().count("failover") == len(calls)
    assert live(ec2) == []


def test_a_zoned_offer_tries_only_its_zone(provider, ec2):
    row = offer().row
    from dataclasses import replace
    zoned = Offer(replace(row, zone=f"{REGION}c"), "spot")
    calls = inject(provider, "RunInstances", lambda body: fail_with("UnfulfillableCapacity"))
    with pytest.raises(CapacityError):
        provider.launch(zoned, LaunchSpec("run-zoned", 1), "spot")
    assert [c["Placement.AvailabilityZone"] for c in calls] == [f"{REGION}c"]


def test_three_throttles_then_success(provider, ec2):
    left = [3]

    def throttle(body):
        if left[0]:
            left[0] -= 1
            return fail_with("RequestLimitExceeded", "Request limit exceeded.", 503)
        return None

    calls = inject(provider, "RunInstances", throttle)
    events = Events()
    inst = provider.launch(offer(), LaunchSpec("run-throttle", 1), "spot", events=events)
    retries = [d for k, d in events if k == "retry"]
    assert [r["attempt"] for r in retries] == [1, 2, 3]
    assert {r["code"] for r in retries} == {"RequestLimitExceeded"} and retries[0]["call"] == "run_instances"
    assert len(calls) == 4
    # Every retry carried the same ClientToken: AWS would not start a second instance.
    assert len({c["ClientToken"] for c in calls}) == 1
    assert [i["InstanceId"] for i in live(ec2)] == [inst.id]


def test_a_lost_connection_is_retried_with_the_same_client_token(provider, ec2):
    from botocore.exceptions import ReadTimeoutError
    left = [2]

    def drop(body):
        if left[0]:
            left[0] -= 1
            raise ReadTimeoutError(endpoint_url="https://ec2.us-east-1.amazonaws.com/")
        return None

    calls = inject(provider, "RunInstances", drop)
    events = Events()
    inst = provider.launch(offer(), LaunchSpec("run-net", 1), "spot", events=events)
    assert [d["code"] for k, d in events if k == "retry"] == ["ReadTimeoutError"] * 2
    assert len(calls) == 3 and len({c["ClientToken"] for c in calls}) == 1
    assert [i["InstanceId"] for i in live(ec2)] == [inst.id]


def test_throttling_retries_are_bounded(ec2, ami):
    prov = get_provider("aws", region=REGION, image_id=ami, retry_attempts=3, retry_base=0, retry_cap=0)
    calls = inject(prov, "RunInstances", lambda body: fail_with("Throttling", "Rate exceeded", 400))
    with pytest.raises(ProviderError, match="still throttled"):
        prov.launch(offer(), LaunchSpec("run-throttle-max", 1), "spot")
    assert len(calls) == 3
    assert live(ec2) == []


@pytest.mark.parametrize("code,market,quota", [
    ("MaxSpotInstanceCountExceeded", "spot", "L-3819A6DF"),
    ("VcpuLimitExceeded", "on-demand", "L-DB2E81BA"),
    ("InstanceLimitExceeded", "on-demand", "L-DB2E81BA"),
])
def test_quota_error_stops_clearly_with_nothing_running(provider, ec2, code, market, quota):
    calls = inject(provider, "RunInstances", lambda body: fail_with(code, "You have requested more vCPU capacity"))
    events = Events()
    with pytest.raises(QuotaError) as err:
        provider.launch(offer(market=market), LaunchSpec("run-quota", 1), market, events=events)
    msg = str(err.value)
    assert isinstance(err.value, UserError) and "\n" not in msg
    assert code in msg and quota in msg and "Service Quotas" in msg and REGION in msg
    assert len(calls) == 1  # a quota is per region: no point trying other zones
    assert events.kinds() == ["quota"]
    assert live(ec2) == []


def test_quota_for_p_family_names_the_p_quota(provider, ec2):
    inject(provider, "RunInstances", lambda body: fail_with("MaxSpotInstanceCountExceeded"))
    with pytest.raises(QuotaError, match="All P Spot Instance Requests"):
        provider.launch(offer("p4d.24xlarge"), LaunchSpec("run-quota-p", 1), "spot")


def test_max_price_too_low_says_the_current_price(provider, ec2):
    inject(provider, "RunInstances", lambda body: fail_with("SpotMaxPriceTooLow", "Your max price is below"))
    current = min(provider.current_spot_prices(REGION, "g5.xlarge").values())
    with pytest.raises(PriceTooLowError) as err:
        provider.launch(offer(), LaunchSpec("run-price", 1), "spot", max_price=0.000001)
    assert err.value.current_price == pytest.approx(current)
    assert f"${current:.4f}/h" in str(err.value)
    assert live(ec2) == []


def test_launch_from_stack_outputs_uses_template_subnet_and_group(provider, ec2):
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    zones = provider.zones(REGION)[:2]
    subnets = {z: ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.9.{i}.0/24", AvailabilityZone=z)["Subnet"]["SubnetId"]
               for i, z in enumerate(zones)}
    sg = ec2.create_security_group(GroupName="sdcloud-host", Description="sdcloud", VpcId=vpc)["GroupId"]
    lt = ec2.create_launch_template(LaunchTemplateName="sdcloud-host", LaunchTemplateData={
        "InstanceInitiatedShutdownBehavior": "terminate"})["LaunchTemplate"]["LaunchTemplateId"]
    inject(provider, "RunInstances", lambda body: fail_with("InsufficientInstanceCapacity")
           if body.get("SubnetId") == subnets[zones[0]] else None)
    ec2.create_key_pair(KeyName="sdcloud-key")
    sent: list[dict] = []
    provider.client("ec2", REGION).meta.events.register(
        "before-parameter-build.ec2.RunInstances", lambda params, **kw: sent.append(dict(params)))
    spec = LaunchSpec("run-stack", 1, infra={"launch_template_id": lt, "subnet_ids": subnets, "security_group_id": sg,
                                             "bucket": "sdcloud-bucket", "key_name": "sdcloud-key"})
    inst = provider.launch(offer(market="on-demand"), spec, "on-demand")
    raw = ec2.describe_instances(InstanceIds=[inst.id])["Reservations"][0]["Instances"][0]
    assert sent[-1]["LaunchTemplate"] == {"LaunchTemplateId": lt, "Version": "$Latest"}
    assert "BlockDeviceMappings" not in sent[-1]  # the template's disks (root + NVMe) stay
    assert raw["KeyName"] == "sdcloud-key"
    assert raw["SubnetId"] == subnets[zones[1]] and inst.zone == zones[1]
    assert sg in [g["GroupId"] for g in raw["SecurityGroups"]]
    assert raw["MetadataOptions"]["HttpTokens"] == "required"


def test_find_tagged_describe_and_terminate(provider, ec2):
    a = provider.launch(offer(), LaunchSpec("run-a", 1), "spot")
    b = provider.launch(offer(market="on-demand"), LaunchSpec("run-b", 1), "on-demand")
    ec2.run_instances(ImageId=provider.image_id, MinCount=1, MaxCount=1, InstanceType="t3.micro")  # not ours
    everything = provider.find_tagged(regions=[REGION])
    assert sorted(i.id for i in everything) == sorted([a.id, b.id])
    only_a = provider.find_tagged("run-a", regions=[REGION])
    assert [i.id for i in only_a] == [a.id] and only_a[0].run_id == "run-a" and only_a[0].market == "spot"
    described = {i.id: i for i in provider.describe([a.id, b.id, "i-0123456789abcdef0"])}
    assert set(described) == {a.id, b.id} and described[b.id].market == "on-demand"
    assert described[a.id].tags[TAG_TOKEN] == LaunchSpec("run-a", 1).token
    provider.terminate([a.id, "i-0123456789abcdef0"])  # an id already gone does not stop the others
    assert [i.id for i in provider.find_tagged(regions=[REGION])] == [b.id]
    assert provider.describe([a.id])[0].state in ("stopping", "terminated")


def test_price_history_over_an_interval(provider):
    from datetime import datetime, timedelta, timezone
    end = datetime.now(timezone.utc)
    points = provider.price_history("g5.xlarge", f"{REGION}a", end - timedelta(days=1), end)
    assert points and all(isinstance(p, float) and p > 0 for _, p in points)


def test_no_credentials_is_one_clear_line(monkeypatch):
    with pytest.raises(CredentialsError) as err:
        get_provider("aws", region=REGION)
    assert "no AWS credentials found" in str(err.value) and "\n" not in str(err.value)


def test_bad_market_and_region_are_user_errors(provider):
    with pytest.raises(UserError, match="unknown market"):
        provider.launch(offer(), LaunchSpec("r", 1), "reserved")
    with pytest.raises(UserError, match="not an AWS region"):
        provider.find_tagged(regions=["mars-1"])


def test_help_does_not_import_boto3():
    code = ("import sys; from sdcloud.cli import main\n"
            "for argv in (['--help'], ['gc', '--help'], ['catalog', 'refresh', '--help']):\n"
            "    try: main(argv)\n"
            "    except SystemExit: pass\n"
            "assert 'boto3' not in sys.modules and 'botocore' not in sys.modules, 'boto3 imported'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
