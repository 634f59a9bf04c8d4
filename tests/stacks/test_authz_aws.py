"""Every AWS call the cloud driver and the host make, authorized as AWS authorizes it, against the
policies the stack itself builds (stacks/aws, under Pulumi mocks: nothing is copied here).

Each recorded call is expanded into the requests AWS evaluates (tests/support/authz/authz_expand.py: a launch
from the stack's template is RunInstances on each resource it uses, ec2:CreateTags for each type
the request or the template tags, iam:PassRole for the host role, the Spot service-linked role)
and each request is judged, conditions included, by tests/support/authz/authz_aws.py. Then each action is taken
out of each policy in turn: some recorded call must be refused, or the grant is in UNREACHED with
the path that needs it and why the suite does not take it.

The user's own calls with a stack in place (the same controller step, then `sdcloud gc`) are judged
the same way against the minimal user policy sdcloud documents (docs/aws-user-policy.json), each of
its grants needed. `sdcloud infra up` is not covered: Pulumi's AWS provider makes the stack's calls
itself (roles, the bucket, the template, the function), with rights that document does not give.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from tests.support import ROOT

pytest.importorskip("pulumi")
pytest.importorskip("pulumi_aws")

from tests.support.authz.authz_aws import actions_of, refused, without_action
from tests.support.authz.authz_expand import AwsEnv, expand_aws
from tests.support.authz.authz_record import Call, record_calls
from tests.stacks.test_aws_host_policy import BUCKET as HOST_BUCKET
from tests.stacks.test_aws_host_policy import PREFIX as HOST_PREFIX
from tests.stacks.test_aws_host_policy import _host_calls, aws_iam  # noqa: F401  (aws_iam: a fixture)
from tests.stacks.test_stacks_driver import ACCOUNT, AMI, BUCKET, PREFIX, _build, _policies
from tests.support.harness_stacks import stack_module

REGION = "us-east-1"
USER_POLICY = ROOT / "docs" / "aws-user-policy.json"

# Grants no recorded call needs, each with the path that needs it and why the suite does not take it.
UNREACHED: dict[tuple[str, str], str] = {
    ("driver", "logs:CreateLogGroup"): "Lambda writes the function's own log with its role; no step calls it",
    ("driver", "logs:CreateLogStream"): "Lambda writes the function's own log with its role; no step calls it",
    ("driver", "logs:PutLogEvents"): "Lambda writes the function's own log with its role; no step calls it",
    ("host", "s3:AbortMultipartUpload"): "the clean-up of an upload whose part failed (s3transfer aborts it); "
                                         "the recorded host calls all succeed",
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The AWS stack, built with the driver, under Pulumi mocks: its policies and its launch template."""
    import zipfile

    aws_stack = stack_module("aws")

    package = tmp_path_factory.mktemp("authz-pkg") / "sdcloud-driver.zip"
    with zipfile.ZipFile(package, "w") as zf:
        zf.writestr("sdcloud_driver.py", "def main_handler(event, context):\n    return {}\n")
    mocks, _ = _build(aws_stack.StackConfig(stack="test", region=REGION, prefix=PREFIX, owner_tag="alice",
                                            driver_package=str(package)))
    [(_, template)] = mocks.of_type("ec2/launchTemplate:LaunchTemplate")
    [(_, profile)] = mocks.of_type("iam/instanceProfile:InstanceProfile")
    return {"policies": _policies(mocks), "template": template,
            "host_role": f"arn:aws:iam::{ACCOUNT}:role/{profile['role']}"}


def _env(stack: dict, profile_arn: str = "") -> AwsEnv:
    lt = stack["template"]
    kinds = tuple(spec["resourceType"] for spec in lt["tagSpecifications"])
    tags = {k: v for spec in lt["tagSpecifications"] for k, v in spec["tags"].items()}
    return AwsEnv(account=ACCOUNT, region=REGION, template_tagged=kinds, template_tags=tags,
                  template_role_arn=stack["host_role"], profile_roles={profile_arn: stack["host_role"]} if profile_arn else {})


def _driver_step(tmp_path, monkeypatch, stack: dict) -> tuple[list[Call], str]:
    """A controller step's AWS calls, as the function makes them: the run's journal and lease, the
    agent wheel, a spot launch from the stack's template (its subnet, group and profile), an
    on-demand launch where the run's infra names no template, describe, find, prices, terminate."""
    import boto3
    from botocore.awsrequest import AWSResponse
    from moto import mock_aws

    from sdcloud.offers.catalog import bundled_rows
    from sdcloud.offers.optimizer import Offer
    from sdcloud.providers import get_provider
    from sdcloud.providers.base import LaunchSpec
    from sdcloud.runs.records.lease import DriverLease
    from sdcloud.runs.records.journal import Journal, restore
    from sdcloud.runs.records.state import StateStore
    from sdcloud.runs.records.store import open_run_store
    from sdcloud.driver.unattended import live_runs
    from sdcloud_agent import wheel

    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
        vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
        subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]
        sg = ec2.create_security_group(GroupName="sdcloud-host", Description="hosts", VpcId=vpc)["GroupId"]
        iam = boto3.client("iam", region_name=REGION)
        iam.create_role(RoleName="host-role", AssumeRolePolicyDocument="{}")
        profile = iam.create_instance_profile(InstanceProfileName="host-profile")["InstanceProfile"]["Arn"]
        iam.add_role_to_instance_profile(InstanceProfileName="host-profile", RoleName="host-role")
        lt = stack["template"]
        template = ec2.create_launch_template(LaunchTemplateName="sdcloud-host", LaunchTemplateData={
            "ImageId": AMI, "IamInstanceProfile": {"Arn": profile}, "SecurityGroupIds": [sg],
            "TagSpecifications": [{"ResourceType": s["resourceType"],
                                   "Tags": [{"Key": k, "Value": v} for k, v in s["tags"].items()]}
                                  for s in lt["tagSpecifications"]]})["LaunchTemplate"]["LaunchTemplateId"]
        infra = {"launch_template_id": template, "security_group_id": sg, "instance_profile_arn": profile,
                 "subnet_ids": {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}, "image_id": AMI}

        calls = record_calls(monkeypatch)
        store = open_run_store({"url": f"s3://{BUCKET}/{PREFIX}", "region": REGION})
        state = StateStore(tmp_path / "state.db")
        rid = "run-authz-1"
        state.create_run(rid, "sd15-lora", {"provider": "aws", "region": REGION, "tier": "sd15-lora"}, 10)
        state.update_run(rid, state="running")
        Journal(state, store, rid).flush()
        assert live_runs(store) == [rid]
        assert restore(StateStore(tmp_path / "fn.db"), store, rid) is not None
        lease = DriverLease(store, rid, poll_seconds=5, driver="aws-lambda")
        assert lease.acquire() and lease.renew()
        wheel.ensure_uploaded(store)

        provider = get_provider("aws", region=REGION, regions=[REGION], retry_base=0, retry_cap=0)
        provider.client("ssm", REGION).meta.events.register(  # moto reserves /aws/ names: answer as AWS does
            "before-call.ssm.GetParameter",
            lambda **kw: (AWSResponse("https://ssm", 200, {}, None),
                          {"Parameter": {"Name": "x", "Type": "String", "Value": AMI}}))
        row = next(r for r in bundled_rows("aws") if r.region == REGION and r.instance_type == "g5.xlarge")
        spot = provider.launch(Offer(row, "spot"), LaunchSpec(run_id=rid, attempt=2, user_data="#!/bin/sh\ntrue\n",
                                                              infra=infra), "spot")
        bare = provider.launch(Offer(row, "on-demand"), LaunchSpec(run_id=rid, attempt=3, user_data="#!/bin/sh\ntrue\n"),
                               "on-demand")
        assert provider.describe([spot.id, bare.id], REGION)
        assert {i.id for i in provider.find_tagged(rid, regions=[REGION])} == {spot.id, bare.id}
        now = datetime.now(timezone.utc)
        provider.price_history("g5.xlarge", spot.zone, now - timedelta(hours=1), now)
        # A 2-node group: its cluster placement group (moto has none: answered by the fake), two launches
        # in it, then the group's end (its hosts, then the placement group).
        from tests.support.clouds.fake_ec2_placement import PlacementGroups

        PlacementGroups(lambda: [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]).attach(
            provider.client("ec2", REGION))
        big = next(r for r in bundled_rows("aws") if r.region == REGION and r.instance_type == "g5.12xlarge")
        group = provider.launch(Offer(big, "spot"), LaunchSpec(
            run_id=rid, attempt=4, user_data="#!/bin/sh\ntrue\n", infra=infra, agent_config={"nodes": 2},
            node_user_data=["#!/bin/sh\ntrue\n", "#!/bin/sh\ntrue # rank 1\n"]), "spot")
        provider.terminate([spot.id], REGION)
        provider.terminate([bare.id], REGION)
        provider.terminate([group.id], REGION)
        lease.release()
        state.update_run(rid, state="succeeded")
        Journal(state, store, rid).flush()
        assert live_runs(store) == []
        return [c for c in calls if c.ok], profile


@pytest.fixture(scope="module")
def driver(stack, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}.items():
            mp.setenv(k, v)
        for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            mp.delenv(k, raising=False)
        calls, profile = _driver_step(tmp_path_factory.mktemp("authz-driver"), mp, stack)
    return calls, _env(stack, profile), stack["policies"]["driver-access"]


@pytest.fixture
def host(aws_iam, tmp_path, monkeypatch):  # noqa: F811
    """The host's store calls under moto with IAM enforced and the stack's host policy (as before),
    recorded, for the evaluator's stricter judgement (tagging, per-key deletes, conditions)."""
    aws_stack = stack_module("aws")

    policy = aws_stack.role_policy_document(HOST_BUCKET, HOST_PREFIX)
    store = aws_iam(policy)
    calls = record_calls(monkeypatch)
    _host_calls(store, tmp_path)
    return [c for c in calls if c.ok], AwsEnv(account=ACCOUNT, region=REGION), json.loads(policy)


def _refusals(calls: list[Call], env: AwsEnv, policy: dict) -> list[str]:
    env.instance_tags.clear()
    out = []
    for c in calls:
        for req in refused(policy, expand_aws(c.service, c.operation, c.params, env, c.result)):
            out.append(f"{c.service}:{c.operation} needs {req}, which the policy does not allow — source: {req.source}")
    return out


def test_every_call_of_a_driver_step_is_authorized_by_the_function_role(driver):
    calls, env, policy = driver
    assert {(c.service, c.operation) for c in calls} >= {("ec2", "RunInstances"), ("ec2", "TerminateInstances"),
                                                           ("s3", "PutObject"), ("s3", "DeleteObjects")}
    refusals = _refusals(calls, env, policy)
    assert not refusals, "\n".join(refusals)


def test_the_template_launch_is_expanded_into_what_ec2_evaluates(driver):
    """The expansion is what the EC2 User Guide says, for the stack's own template: tags on each
    type the template tags, the host role passed to EC2 only, the spot service-linked role."""
    calls, env, _ = driver
    env.instance_tags.clear()
    launch, *group = [c for c in calls if c.operation == "RunInstances" and "LaunchTemplate" in c.params]
    # A 2-node group is one request for both hosts, into its placement group.
    assert [(c.params["MinCount"], c.params["MaxCount"]) for c in group] == [(2, 2)]
    assert all(c.params["Placement"]["GroupName"].startswith("sdcloud-") for c in group)
    assert ("ec2", "DescribePlacementGroups") in {(c.service, c.operation) for c in calls}  # the run's leftovers swept
    reqs = expand_aws("ec2", "RunInstances", launch.params, env, launch.result)
    tagged = {r.resource.split(":")[-1].split("/")[0] for r in reqs if r.action == "ec2:CreateTags"}
    assert tagged == set(env.template_tagged) >= {"instance", "volume", "network-interface"}
    assert all(r.context["ec2:CreateAction"] == "RunInstances" for r in reqs if r.action == "ec2:CreateTags")
    [passed] = [r for r in reqs if r.action == "iam:PassRole"]
    assert passed.resource.endswith(":role/host-role") and passed.context == {"iam:PassedToService": "ec2.amazonaws.com"}
    assert any(r.action == "iam:CreateServiceLinkedRole" for r in reqs)
    used = {r.resource.split(":")[-1].split("/")[0] for r in reqs if r.action == "ec2:RunInstances"}
    assert used >= {"instance", "volume", "network-interface", "subnet", "security-group", "image", "launch-template"}


def test_conditions_are_evaluated_not_ignored(driver):
    """A launch without the run tag, an end of an untagged instance, a role passed to another
    service, a listing outside the prefix: each is refused by the function's policy."""
    from tests.support.authz.authz_aws import Request, decide

    _, _, policy = driver
    inst = f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/*"
    assert decide(policy, Request("ec2:RunInstances", inst, {"aws:RequestTag/sdcloud:run": "r"})) == "Allow"
    assert decide(policy, Request("ec2:RunInstances", inst, {})) == "ImplicitDeny"
    assert decide(policy, Request("ec2:TerminateInstances", inst, {"aws:ResourceTag/team": "web"})) == "ImplicitDeny"
    assert decide(policy, Request("ec2:CreateTags", inst, {"ec2:CreateAction": "CreateTags"})) == "ImplicitDeny"
    role = f"arn:aws:iam::{ACCOUNT}:role/host-role"
    assert decide(policy, Request("iam:PassRole", role, {"iam:PassedToService": "lambda.amazonaws.com"})) == "ImplicitDeny"
    bucket = f"arn:aws:s3:::{BUCKET}"
    assert decide(policy, Request("s3:ListBucket", bucket, {"s3:prefix": f"{PREFIX}/runs/"})) == "Allow"
    assert decide(policy, Request("s3:ListBucket", bucket, {"s3:prefix": "other/"})) == "ImplicitDeny"
    assert decide(policy, Request("s3:ListBucket", bucket, {})) == "ImplicitDeny"


def test_every_call_the_host_makes_is_authorized_by_the_host_role(host):
    calls, env, policy = host
    assert any(c.params.get("Tagging") for c in calls), "the checkpoint upload's tag is part of what is judged"
    refusals = _refusals(calls, env, policy)
    assert not refusals, "\n".join(refusals)


def _least_privilege(principal: str, calls: list[Call], env: AwsEnv, policy: dict) -> None:
    assert not _refusals(calls, env, policy)
    unproved = []
    for action in actions_of(policy):
        needed = bool(_refusals(calls, env, without_action(policy, action)))
        listed = (principal, action) in UNREACHED
        if needed and listed:
            unproved.append(f"{action} is listed as unreached but a recorded call needs it: take it off UNREACHED")
        if not needed and not listed:
            unproved.append(f"{action}: no recorded {principal} call needs it; drop the grant or list why in UNREACHED")
    stale = [a for (p, a) in UNREACHED if p == principal and a not in actions_of(policy)]
    assert not unproved and not stale, "\n".join(unproved + [f"{a}: listed but not granted" for a in stale])


def test_each_grant_of_the_function_role_is_needed(driver):
    _least_privilege("driver", *driver)


def test_each_grant_of_the_host_role_is_needed(host):
    _least_privilege("host", *host)


# -- the user's own calls, against the documented user policy ---------------------------------------

def _user_policy(host_role_arn: str) -> dict:
    """docs/aws-user-policy.json filled in as its placeholders say: the account, the stack's bucket
    and prefix, its host role."""
    text = USER_POLICY.read_text()
    for k, v in {"ACCOUNT_ID": ACCOUNT, "BUCKET": BUCKET, "PREFIX": PREFIX, "HOST_ROLE_ARN": host_role_arn}.items():
        text = text.replace(k, v)
    return json.loads(text)


@pytest.fixture(scope="module")
def user(stack, driver, tmp_path_factory):
    """The controller step's calls (the same code `up` runs with the user's keys), then a stray
    launched and reaped by `sdcloud gc`."""
    from moto import mock_aws

    from sdcloud.cli import main
    from sdcloud.offers.catalog import bundled_rows
    from sdcloud.offers.optimizer import Offer
    from sdcloud.providers import get_provider
    from sdcloud.providers.base import LaunchSpec

    step, env, _ = driver
    tmp = tmp_path_factory.mktemp("authz-user")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
                     "SDCLOUD_HOME": str(tmp / "home"), "AWS_CONFIG_FILE": str(tmp / "no-config")}.items():
            mp.setenv(k, v)
        for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            mp.delenv(k, raising=False)
        with mock_aws():
            calls = record_calls(mp)  # the stray's launch too: gc's end is judged by the tags it launched with
            row = next(r for r in bundled_rows("aws") if r.region == REGION and r.instance_type == "g5.xlarge")
            stray = get_provider("aws", image_id=AMI).launch(Offer(row, "on-demand"), LaunchSpec("run-stray", 1),
                                                             "on-demand")
            assert main(["gc", "--provider", "aws", "--region", REGION, "--yes", "--json"]) == 0
            assert any(c.operation == "TerminateInstances" and stray.id in c.params["InstanceIds"] for c in calls)
    return step + [c for c in calls if c.ok], env, _user_policy(stack["host_role"])


def test_every_call_of_the_user_passes_the_documented_user_policy(user):
    calls, env, policy = user
    assert {c.operation for c in calls} >= {"RunInstances", "TerminateInstances", "DescribeInstances", "PutObject"}
    refusals = _refusals(calls, env, policy)
    assert not refusals, "\n".join(refusals)


def test_each_grant_of_the_user_policy_is_needed(user):
    calls, env, policy = user
    unneeded = [a for a in actions_of(policy) if not _refusals(calls, env, without_action(policy, a))]
    assert not unneeded, f"no recorded user call needs {unneeded}: drop them from docs/aws-user-policy.json"


def test_the_user_policy_refuses_an_instance_sdcloud_did_not_launch(user):
    """The check can fail: a TerminateInstances on an instance no recorded launch tagged."""
    _, env, policy = user
    found = _refusals([Call("user", "ec2", "TerminateInstances", {"InstanceIds": ["i-0other"]})], env, policy)
    assert len(found) == 1 and "ec2:TerminateInstances" in found[0] and "i-0other" in found[0], found
