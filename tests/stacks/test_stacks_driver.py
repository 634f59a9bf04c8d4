"""The cloud driver in the stacks (issue 27): function, role, schedule under Pulumi mocks, and the
function role's policy judged against the API calls a controller step makes.

The calls are recorded, not listed by hand: every botocore request the step's code paths send
(the journal, the driver lease, the agent wheel's upload, a spot launch, describe, find, the
ledger's price history, terminate) against moto in this process, mapped to IAM actions through
stacks/aws/driver_policy.STEP_CALLS. The policy must grant exactly those actions (no fewer: the
step would fail; no more: the role could do what no step does), on the resources the step used.
"""

from __future__ import annotations

import base64
import json
import zipfile
from pathlib import Path

import pytest

from sdcloud.providers.traits import traits
from tests.support import ROOT
from tests.support.authz.authz_driver_calls import assert_allowed, needed_actions, record_aws_calls
from tests.support.harness_stacks import stack_module

pulumi = pytest.importorskip("pulumi")
pytest.importorskip("pulumi_aws")

TRAITS = {name: traits(name) for name in ("aws", "tencent")}
driver_policy = stack_module("aws", "driver_policy")
aws_stack = stack_module("aws")

AMI = "ami-12c6146b"  # one of moto's stock images
ZONES = ["us-east-1a", "us-east-1b"]
BUCKET = "sdcloud-test-abc123"
PREFIX = "team/sd"
ACCOUNT = "123456789012"


class Recorder(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: list[tuple[str, str, dict]] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append((args.typ, args.name, dict(args.inputs)))
        state = dict(args.inputs)
        if args.typ == "aws:s3/bucket:Bucket":
            state["bucket"] = BUCKET
        if args.typ in ("aws:iam/role:Role", "aws:iam/instanceProfile:InstanceProfile"):
            state["arn"] = f"arn:aws:iam::{ACCOUNT}:role/{args.name}"
            state["name"] = args.name
        if args.typ == "aws:lambda/function:Function":
            state["arn"] = f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:{args.inputs['name']}"
        if args.typ == "aws:cloudwatch/logGroup:LogGroup":
            state["arn"] = f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:{args.inputs['name']}"
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs):
        if args.token == "aws:ssm/getParameter:getParameter":
            return {"name": args.args["name"], "value": AMI, "type": "String", "arn": "arn", "id": "p", "version": 1,
                    "insecureValue": AMI}
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            return {"names": ZONES, "zoneIds": ["use1-az1", "use1-az2"], "id": "us-east-1", "groupNames": ["us-east-1"]}
        if args.token == "aws:index/getRegion:getRegion":
            return {"region": "us-east-1", "name": "us-east-1", "id": "us-east-1"}
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": ACCOUNT, "arn": f"arn:aws:iam::{ACCOUNT}:user/me", "userId": "AID", "id": ACCOUNT}
        raise AssertionError(f"unexpected invoke {args.token}")

    def of_type(self, suffix: str) -> list[tuple[str, dict]]:
        return [(name, inputs) for typ, name, inputs in self.resources if typ.endswith(suffix)]


def _build(cfg) -> tuple[Recorder, dict]:
    mocks = Recorder()
    pulumi.runtime.set_mocks(mocks, project="sdcloud-aws", stack="test", preview=False)
    result: dict = {}

    @pulumi.runtime.test
    def program():
        return pulumi.Output.from_input(aws_stack.build(cfg)).apply(result.update)

    program()
    return mocks, result


@pytest.fixture(scope="module")
def aws_built(tmp_path_factory) -> tuple[Recorder, dict]:
    package = tmp_path_factory.mktemp("pkg") / "sdcloud-driver.zip"
    with zipfile.ZipFile(package, "w") as zf:
        zf.writestr("sdcloud_driver.py", "def main_handler(event, context):\n    return {}\n")
    cfg = aws_stack.StackConfig(stack="test", region="us-east-1", prefix=PREFIX, owner_tag="alice",
                                driver_package=str(package))
    return _build(cfg)


def _policies(mocks: Recorder) -> dict[str, dict]:
    return {name: json.loads(inputs["policy"]) for name, inputs in mocks.of_type("iam/rolePolicy:RolePolicy")}


def _actions(policy: dict) -> set[str]:
    out: set[str] = set()
    for st in policy["Statement"]:
        assert st["Effect"] == "Allow"
        out |= set(st["Action"] if isinstance(st["Action"], list) else [st["Action"]])
    return out


def test_the_function_runs_the_handler_within_the_schedules_rate(aws_built):
    mocks, out = aws_built
    [(_, fn)] = mocks.of_type("lambda/function:Function")
    # The provider's runtime (traits), a current one: the package is built and tested for its Python.
    assert fn["runtime"] == TRAITS["aws"].function.runtime == "python3.13"
    assert fn["handler"] == "sdcloud.driver.unattended.handler"
    from sdcloud.providers.functions import handler

    assert fn["handler"] == handler("aws")
    assert 60 <= fn["timeout"] < driver_policy.SCHEDULE_SECONDS
    assert fn["environment"]["variables"]["SDCLOUD_STORE"] == f"s3://{BUCKET}/{PREFIX}"
    assert fn["role"].endswith("role/driver-role")
    assert fn["tags"]["sdcloud:managed"] == "true" and fn["tags"]["sdcloud:owner"] == "alice"
    assert out["driver_function"] == "sdcloud-test-driver"


def test_the_schedule_invokes_the_function_every_five_minutes_with_the_drive_input(aws_built):
    mocks, _ = aws_built
    [(_, sched)] = mocks.of_type("scheduler/schedule:Schedule")
    assert sched["scheduleExpression"] == "rate(5 minutes)"
    assert sched["flexibleTimeWindow"] == {"mode": "OFF"}
    assert sched["target"]["arn"] == f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:sdcloud-test-driver"
    assert json.loads(sched["target"]["input"]) == {"sdcloud": "drive"}
    assert sched["target"]["roleArn"].endswith("role/driver-scheduler-role")
    invoke = _policies(mocks)["driver-invoke"]
    assert _actions(invoke) == {"lambda:InvokeFunction"}
    [st] = invoke["Statement"]
    assert all(r.startswith(sched["target"]["arn"]) for r in st["Resource"])


def test_a_failed_tick_is_not_invoked_again(aws_built):
    # Lambda retries a failed asynchronous invocation twice unless told otherwise; the schedule's
    # own retry policy does not cover those retries.
    mocks, _ = aws_built
    [(_, conf)] = mocks.of_type("lambda/functionEventInvokeConfig:FunctionEventInvokeConfig")
    assert conf["maximumRetryAttempts"] == 0
    assert conf["functionName"] == "sdcloud-test-driver"


def test_roles_are_assumed_by_their_services_only(aws_built):
    mocks, _ = aws_built
    roles = {name: json.loads(inputs["assumeRolePolicy"]) for name, inputs in mocks.of_type("iam/role:Role")}
    assert roles["driver-role"]["Statement"][0]["Principal"] == {"Service": "lambda.amazonaws.com"}
    assert roles["driver-scheduler-role"]["Statement"][0]["Principal"] == {"Service": "scheduler.amazonaws.com"}
    for name, inputs in mocks.of_type("iam/role:Role"):
        assert not inputs.get("managedPolicyArns") and not inputs.get("inlinePolicies"), name


def test_the_function_role_ends_only_tagged_instances_and_passes_only_the_host_role(aws_built):
    mocks, _ = aws_built
    policy = _policies(mocks)["driver-access"]
    by_action: dict[str, list[dict]] = {}
    for st in policy["Statement"]:
        for a in st["Action"] if isinstance(st["Action"], list) else [st["Action"]]:
            by_action.setdefault(a, []).append(st)
    [term] = by_action["ec2:TerminateInstances"]
    assert term["Condition"] == {"Null": {"aws:ResourceTag/sdcloud:run": "false"}}
    assert term["Resource"] == [f"arn:aws:ec2:*:{ACCOUNT}:instance/*"]
    [pass_role] = by_action["iam:PassRole"]
    assert pass_role["Resource"] == [f"arn:aws:iam::{ACCOUNT}:role/host-role"]
    assert pass_role["Condition"]["StringEquals"]["iam:PassedToService"] == "ec2.amazonaws.com"
    tag, pg_tag = by_action["ec2:CreateTags"]  # tags only as part of a launch, or of a group's placement group
    assert tag["Condition"] == {"StringEquals": {"ec2:CreateAction": "RunInstances"}}
    assert pg_tag["Condition"] == {"StringEquals": {"ec2:CreateAction": "CreatePlacementGroup"}}
    assert pg_tag["Resource"] == [f"arn:aws:ec2:*:{ACCOUNT}:placement-group/sdcloud-*"]
    [pg] = by_action["ec2:CreatePlacementGroup"]
    assert pg["Resource"] == [f"arn:aws:ec2:*:{ACCOUNT}:placement-group/sdcloud-*"]
    launches = by_action["ec2:RunInstances"]
    assert any(st.get("Condition") == {"Null": {"aws:RequestTag/sdcloud:run": "false"}} for st in launches)
    for st in policy["Statement"]:
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        assert not any("*" in a for a in actions)
        if any(a.startswith("s3:") for a in actions):
            assert st["Resource"] in ([f"arn:aws:s3:::{BUCKET}/{PREFIX}/*"], [f"arn:aws:s3:::{BUCKET}"])
        if st["Resource"] == "*":  # only read-only actions that take no resource ARN
            assert all(a.startswith("ec2:Describe") for a in actions)


def test_the_function_may_tag_every_resource_type_the_launch_template_tags(aws_built):
    # EC2 authorizes ec2:CreateTags for tags a launch template applies as for tags in the request:
    # a template that tags a type the function's grant misses makes every driver launch
    # UnauthorizedOperation, which moto does not evaluate.
    mocks, _ = aws_built
    [(_, lt)] = mocks.of_type("ec2/launchTemplate:LaunchTemplate")
    tagged = {spec["resourceType"] for spec in lt["tagSpecifications"]}
    assert "network-interface" in tagged
    [tag] = [st for st in _policies(mocks)["driver-access"]["Statement"] if st["Action"] == ["ec2:CreateTags"]
             and st["Condition"]["StringEquals"]["ec2:CreateAction"] == "RunInstances"]
    granted = {arn.split(":")[-1].split("/")[0] for arn in tag["Resource"]}
    assert tagged <= granted, f"the template tags {sorted(tagged - granted)} that the function may not tag"


def test_the_create_request_and_environment_fit_lambda_s_limits(aws_built):
    """The CreateFunction request the stack's function makes, serialised as botocore sends it with the
    real package inline (Pulumi's AWS provider uploads a local archive as the request's ZipFile)."""
    import botocore.session
    from botocore.serialize import create_serializer

    from sdcloud.infra import function_package as fp

    mocks, _ = aws_built
    [(_, fn)] = mocks.of_type("lambda/function:Function")
    limits = TRAITS["aws"].function.code_limits
    pkg = fp.current()
    model = botocore.session.get_session().get_service_model("lambda")
    params = {"FunctionName": fn["name"], "Runtime": fn["runtime"], "Role": fn["role"], "Handler": fn["handler"],
              "Code": {"ZipFile": pkg.data}, "Description": fn["description"], "Timeout": int(fn["timeout"]),
              "MemorySize": int(fn["memorySize"]), "Environment": {"Variables": fn["environment"]["variables"]},
              "Architectures": fn["architectures"], "Tags": fn["tags"]}
    request = create_serializer(model.metadata["protocol"]).serialize_to_request(
        params, model.operation_model("CreateFunction"))
    assert pkg.zipped_bytes < limits.inline_zip_bytes and pkg.unzipped_bytes < limits.unzipped_bytes
    assert pkg.inline_request_bytes < len(request["body"]) < limits.request_bytes
    env = fn["environment"]["variables"]
    assert sum(len(k) + len(v) for k, v in env.items()) <= limits.environment_bytes


def test_no_driver_without_a_package():
    mocks, out = _build(aws_stack.StackConfig(stack="test", region="us-east-1"))
    assert not mocks.of_type("lambda/function:Function") and not mocks.of_type("scheduler/schedule:Schedule")
    assert "driver_function" not in out


# ---- the calls a step makes, against the policy ----------------------------------------------------

def _step_calls(monkeypatch, tmp_path) -> list[tuple[str, str, dict]]:
    """Run the AWS side of a controller step's paths against moto, recording every call."""
    import boto3
    from botocore.awsrequest import AWSResponse
    from datetime import datetime, timedelta, timezone
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
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        calls = record_aws_calls(monkeypatch)
        store = open_run_store({"url": f"s3://{BUCKET}/{PREFIX}", "region": "us-east-1"})
        state = StateStore(tmp_path / "state.db")
        rid = "run-driver-1"
        state.create_run(rid, "sd15-lora", {"provider": "aws", "region": "us-east-1", "tier": "sd15-lora"}, 10)
        state.update_run(rid, state="running")
        Journal(state, store, rid).flush()
        assert live_runs(store) == [rid]
        assert restore(StateStore(tmp_path / "fn.db"), store, rid) is not None
        lease = DriverLease(store, rid, poll_seconds=5, driver="aws-lambda")
        assert lease.acquire() and lease.renew()
        wheel.ensure_uploaded(store)  # a relaunch's user-data names the agent wheel in the bucket

        provider = get_provider("aws", region="us-east-1", regions=["us-east-1"], retry_base=0, retry_cap=0)
        provider.client("ssm", "us-east-1").meta.events.register(  # moto reserves /aws/ names: answer as AWS does
            "before-call.ssm.GetParameter",
            lambda **kw: (AWSResponse("https://ssm", 200, {}, None),
                          {"Parameter": {"Name": "x", "Type": "String", "Value": AMI}}))
        row = next(r for r in bundled_rows("aws") if r.region == "us-east-1" and r.instance_type == "g5.xlarge")
        inst = provider.launch(Offer(row, "spot"), LaunchSpec(run_id=rid, attempt=2, user_data="#!/bin/sh\ntrue\n"),
                               "spot")
        assert provider.describe([inst.id], "us-east-1")
        assert [i.id for i in provider.find_tagged(rid, regions=["us-east-1"])] == [inst.id]
        now = datetime.now(timezone.utc)
        provider.price_history("g5.xlarge", inst.zone, now - timedelta(hours=1), now)
        provider.terminate([inst.id], "us-east-1")
        # A 2-node group's launch and end: its cluster placement group (moto has none: the fake answers).
        from tests.support.clouds.fake_ec2_placement import PlacementGroups

        ec2 = boto3.client("ec2", region_name="us-east-1")
        PlacementGroups(lambda: [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]).attach(
            provider.client("ec2", "us-east-1"))
        big = next(r for r in bundled_rows("aws") if r.region == "us-east-1" and r.instance_type == "g5.12xlarge")
        group = provider.launch(Offer(big, "spot"), LaunchSpec(run_id=rid, attempt=3, user_data="#!/bin/sh\ntrue\n",
                                                               agent_config={"nodes": 2}), "spot")
        provider.terminate([group.id], "us-east-1")
        lease.release()
        state.update_run(rid, state="succeeded")
        Journal(state, store, rid).flush()  # a finished run leaves the driver's index
        assert live_runs(store) == []
        return list(calls)


@pytest.mark.slow
def test_every_call_a_step_makes_is_allowed_and_nothing_more_is_granted(aws_built, aws_env, monkeypatch, tmp_path):
    mocks, _ = aws_built
    calls = _step_calls(monkeypatch, tmp_path)
    policy = _policies(mocks)["driver-access"]
    needed = needed_actions(calls)
    granted = _actions(policy) - set(driver_policy.LOG_ACTIONS)
    assert needed == granted, {"missing": sorted(needed - granted), "unused": sorted(granted - needed)}
    assert_allowed(calls, policy, BUCKET, PREFIX)  # ...and on the resources the policy names


# ---- Tencent Cloud: SCF function on a timer, its CAM role ---------------------------------------

APP_ID = "1250000000"
OWNER_UIN = "100000000001"


def _tencent_build(cfg) -> tuple[list[tuple[str, str, dict]], dict]:
    pytest.importorskip("tencentcloud_iac_pulumi")
    tc_stack = stack_module("tencent")

    resources: list[tuple[str, str, dict]] = []

    class Mocks(pulumi.runtime.Mocks):
        def new_resource(self, args):
            resources.append((args.typ, args.name, dict(args.inputs)))
            return f"{args.name}-id", dict(args.inputs)

        def call(self, args):
            if args.token == "tencentcloud:User/getInfo:getInfo":
                return {"appId": APP_ID, "id": "info", "name": "me", "ownerUin": OWNER_UIN, "uin": OWNER_UIN}
            raise AssertionError(f"unexpected invoke {args.token}")

    pulumi.runtime.set_mocks(Mocks(), project="sdcloud-tencent", stack="test", preview=False)
    result: dict = {}

    @pulumi.runtime.test
    def program():
        return pulumi.Output.from_input(tc_stack.build(cfg)).apply(result.update)

    program()
    return resources, result


@pytest.fixture(scope="module")
def tencent_built(tmp_path_factory):
    pytest.importorskip("tencentcloud_iac_pulumi")
    tc_stack = stack_module("tencent")

    package = tmp_path_factory.mktemp("tpkg") / "sdcloud-driver.zip"
    with zipfile.ZipFile(package, "w") as zf:
        zf.writestr("scf_bootstrap", "#!/bin/bash\n")
    cfg = tc_stack.StackConfig(stack="test", region="ap-guangzhou", prefix=PREFIX, owner_tag="alice",
                               zones=["ap-guangzhou-3"], image_id="img-test", driver_package=str(package))
    return _tencent_build(cfg)


def _of(resources, suffix: str) -> list[tuple[str, dict]]:
    return [(name, inputs) for typ, name, inputs in resources if typ.lower().endswith(suffix.lower())]


def test_scf_function_and_timer(tencent_built):
    from sdcloud.providers.functions import handler

    resources, out = tencent_built
    [(_, fn)] = _of(resources, "scf/function:Function")
    # SCF's own Python runtime (traits): the package is built for it and its entry tested under it.
    assert fn["runtime"] == TRAITS["tencent"].function.runtime == "Python3.10"
    assert fn["handler"] == handler("tencent") == "sdcloud_driver.main_handler"
    assert 60 <= fn["timeout"] < 300 and fn["memSize"] == 512
    env = fn["environment"]
    assert env["SDCLOUD_STORE"] == f"s3://sdcloud-test-{APP_ID}/{PREFIX}"
    assert env["SDCLOUD_STORE_ENDPOINT"] == "https://cos.ap-guangzhou.myqcloud.com"
    [trigger] = fn["triggers"]
    assert trigger["type"] == "timer"
    fields = trigger["triggerDesc"].split()
    assert len(fields) == 7 and fields[0] == "0" and fields[1] == "*/5" and set(fields[2:]) == {"*"}
    assert fn["role"] == "sdcloud-test-driver"
    assert fn["tags"]["sdcloud:managed"] == "true"
    assert out["driver_function"] == "sdcloud-test-driver"
    # The public network reaches the CVM API and COS (no VPC, so no NAT gateway is needed).
    assert fn["enablePublicNet"] is True and not fn.get("vpcId")


def test_scf_code_comes_from_the_stack_s_bucket_outside_the_run_prefix(tencent_built):
    """The package goes to COS and the function is created from there: never inline in the request."""
    resources, out = tencent_built
    [(_, fn)] = _of(resources, "scf/function:Function")
    [(_, code)] = _of(resources, "cos/bucketObject:BucketObject")
    bucket = f"sdcloud-test-{APP_ID}"
    assert "zipFile" not in fn
    assert code["bucket"] == fn["cosBucketName"] == bucket and fn["cosBucketRegion"] == "ap-guangzhou"
    assert code["source"].endswith("sdcloud-driver.zip") and Path(code["source"]).is_file()
    assert fn["cosObjectName"] == "/" + code["key"] and code["key"].endswith(".zip")
    assert not code["key"].startswith(f"{PREFIX}/"), "the run prefix is writable by the hosts' and the function's roles"
    assert code["acl"] == "private" and code["tags"]["sdcloud:managed"] == "true"
    assert out["driver_code"] == code["key"]


def test_scf_create_request_and_environment_fit_tencent_s_limits(tencent_built):
    """CreateFunction as the provider sends it (a TencentCloud API 3.0 JSON POST): with the code in COS
    it is a few hundred bytes; with the real package inline it would be over the 10 MB a POST takes."""
    from sdcloud.infra import function_package as fp
    from sdcloud.providers.tencent import limits as tencent_limits

    resources, _ = tencent_built
    [(_, fn)] = _of(resources, "scf/function:Function")
    limits = TRAITS["tencent"].function.code_limits
    assert TRAITS["tencent"].function.code_from_bucket
    body = {"FunctionName": fn["name"], "Handler": fn["handler"], "Runtime": fn["runtime"],
            "Description": fn["description"], "MemorySize": fn["memSize"], "Timeout": fn["timeout"],
            "Role": fn["role"], "Namespace": "default",
            # The provider drops the -APPID of the bucket's name (Code.CosBucketName is its custom part).
            "Code": {"CosBucketName": fn["cosBucketName"].rsplit("-", 1)[0], "CosObjectName": fn["cosObjectName"],
                     "CosBucketRegion": fn["cosBucketRegion"]},
            "Environment": {"Variables": [{"Key": k, "Value": v} for k, v in fn["environment"].items()]},
            "PublicNetConfig": {"PublicNetStatus": "ENABLE", "EipConfig": {"EipStatus": "DISABLE"}},
            "Tags": [{"Key": k, "Value": v} for k, v in fn["tags"].items()]}
    assert len(json.dumps(body).encode()) < limits.request_bytes == tencent_limits.API_POST_TC3_BYTES
    pkg = fp.current()
    assert pkg.unzipped_bytes < limits.unzipped_bytes
    inline = dict(body, Code={"ZipFile": base64.b64encode(pkg.data).decode()})
    assert len(json.dumps(inline).encode()) > limits.request_bytes, "the package inline would fit: the bucket is not needed"
    assert sum(len(k) + len(v) for k, v in fn["environment"].items()) <= limits.environment_bytes


def test_scf_role_is_assumed_by_scf_and_may_only_what_a_step_does(tencent_built):
    resources, _ = tencent_built
    roles = {name: json.loads(inputs["document"]) for name, inputs in _of(resources, "cam/role:Role")}
    assert roles["driver-role"]["statement"][0]["principal"] == {"service": ["scf.qcloud.com"]}
    policies = {name: json.loads(inputs["document"]) for name, inputs in _of(resources, "cam/policy:Policy")}
    doc = policies["driver-access"]
    attached = {(i["roleId"], i["policyId"]) for _, i in _of(resources, "cam/rolePolicyAttachment:RolePolicyAttachment")}
    assert ("driver-role-id", "driver-access-id") in attached
    base = f"qcs::cos:ap-guangzhou:uid/{APP_ID}:sdcloud-test-{APP_ID}"
    for st in doc["statement"]:
        assert st["effect"] == "allow"
        assert not any(a.endswith("*") for a in st["action"])
        if any(a.startswith("name/cos:") for a in st["action"]):
            assert st["resource"] in ([f"{base}/{PREFIX}/*"], [f"{base}/*"])
        if st["action"] == ["name/cvm:TerminateInstances"]:
            assert st["condition"] == {"for_any_value:string_equal": {"qcs:resource_tag": ["sdcloud:stack&test"]}}
        if st["action"] == ["name/cam:PassRole"]:
            assert st["resource"] == [f"qcs::cam::uin/{OWNER_UIN}:roleName/sdcloud-test-host"]
        if st["action"] == ["name/cos:GetBucket"]:
            assert st["condition"]["string_like"]["cos:prefix"] == [f"{PREFIX}/*", PREFIX]


def _tencent_actions_called() -> set[str]:
    """The CVM actions the Tencent provider sends (its every `self.call(region, "Action", ...)`)."""
    import re

    folder = ROOT / "sdcloud/providers/tencent"
    source = "\n".join((folder / m).read_text() for m in ("session.py", "catalog.py", "compute.py"))
    return {f"name/cvm:{a}" for a in re.findall(r'self\.call\(\s*\w+,\s*"([A-Za-z]+)"', source)}


@pytest.mark.slow
def test_every_call_a_step_makes_on_tencent_is_allowed_and_nothing_more(tencent_built, aws_env, monkeypatch, tmp_path):
    tpol = stack_module("tencent", "scf_policy")

    resources, _ = tencent_built
    doc = {name: json.loads(i["document"]) for name, i in _of(resources, "cam/policy:Policy")}["driver-access"]
    granted = {a for st in doc["statement"] for a in st["action"]}
    # The store is the same code on COS: the S3 operations a step sent (recorded above) map to COS actions.
    store_ops = {op for svc, op, _ in _step_calls(monkeypatch, tmp_path) if svc == "s3"}
    needed = {a for op in store_ops for a in tpol.STORE_CALLS[op]}
    needed |= _tencent_actions_called() | {"name/cam:PassRole"}
    # The store's copy (CopyObject: a part, then its final key), which a driver that stages a run's inputs
    # sends (runs/inputs/carry.py, models.py); COS authorizes it as PutObjectCopy on the destination.
    needed |= set(tpol.STORE_CALLS["CopyObject"])
    # Every account_currency/catalog read is a step's too (DescribeZoneInstanceConfigInfos); nothing else.
    assert needed == granted, {"missing": sorted(needed - granted), "unused": sorted(granted - needed)}
