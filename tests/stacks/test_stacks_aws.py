"""The AWS stack under Pulumi mocks: no CLI, no provider plugin, no network."""

from __future__ import annotations

import base64
import json

import pytest

pulumi = pytest.importorskip("pulumi")
pytest.importorskip("pulumi_aws")

from tests.support.harness_stacks import stack_module

stack = stack_module("aws")

AMI = "ami-0123456789abcdef0"
ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]

# Resource types with no `tags` argument in pulumi-aws (checked below against the SDK itself).
UNTAGGABLE = {
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls",
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
    "aws:iam/rolePolicy:RolePolicy",
    "aws:ec2/routeTableAssociation:RouteTableAssociation",
}


class Recorder(pulumi.runtime.Mocks):
    """Answers the stack's invokes and records every resource with its inputs."""

    def __init__(self) -> None:
        self.resources: list[tuple[str, str, dict]] = []
        self.calls: list[tuple[str, dict]] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append((args.typ, args.name, dict(args.inputs)))
        state = dict(args.inputs)
        rid = f"{args.name}-id"
        if args.typ == "aws:s3/bucket:Bucket":
            state["bucket"] = "sdcloud-test-abc123"
        if args.typ in ("aws:iam/role:Role", "aws:iam/instanceProfile:InstanceProfile"):
            state["arn"] = f"arn:aws:iam::123456789012:{args.name}"
            state["name"] = args.name
        if args.typ == "aws:ec2/keyPair:KeyPair":
            state["keyName"] = "sdcloud-key"
        return rid, state

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.calls.append((args.token, dict(args.args)))
        if args.token == "aws:ssm/getParameter:getParameter":
            return {"name": args.args["name"], "value": AMI, "type": "String", "arn": "arn", "id": args.args["name"],
                    "version": 1, "insecureValue": AMI}
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            return {"names": ZONES, "zoneIds": ["use1-az1", "use1-az2", "use1-az4"], "id": "us-east-1",
                    "groupNames": ["us-east-1"]}
        if args.token == "aws:index/getRegion:getRegion":
            return {"region": "us-east-1", "name": "us-east-1", "id": "us-east-1", "endpoint": "ec2.us-east-1.amazonaws.com",
                    "description": "US East (N. Virginia)"}
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": "123456789012", "arn": "arn:aws:iam::123456789012:user/me",
                    "userId": "AID", "id": "123456789012"}
        raise AssertionError(f"unexpected invoke {args.token}")

    def of_type(self, suffix: str) -> list[dict]:
        return [inputs for typ, _, inputs in self.resources if typ.endswith(suffix)]


def run(cfg: stack.StackConfig) -> tuple[Recorder, dict]:
    """Build the program under mocks; return the recorder (all resources registered) and the outputs."""
    mocks = Recorder()
    pulumi.runtime.set_mocks(mocks, project="sdcloud-aws", stack="test", preview=False)
    result: dict = {}

    @pulumi.runtime.test
    def program():
        outputs = stack.build(cfg)
        return pulumi.Output.from_input(outputs).apply(result.update)

    program()
    return mocks, result


@pytest.fixture(scope="module")
def built() -> tuple[Recorder, dict]:
    cfg = stack.StackConfig(stack="test", region="us-east-1", prefix="team/sd", ssh_cidr="203.0.113.7/32",
                            public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample me@laptop", root_volume_gb=250,
                            owner_tag="alice", checkpoint_expire_days=14, agent_source="sdcloud==0.1.0")
    return run(cfg)


def test_outputs_are_what_the_provider_launches_from(built):
    _, out = built
    assert out["bucket"] == "sdcloud-test-abc123"
    assert out["prefix"] == "team/sd"
    assert out["launch_template_id"] == "host-template-id"
    assert out["subnet_ids"] == {z: f"subnet-{z}-id" for z in ZONES}
    assert out["security_group_id"] == "hosts-id"
    assert out["instance_profile_arn"].endswith("host-profile")
    assert out["role_arn"].endswith("host-role")
    assert out["key_name"] == "sdcloud-key"
    assert out["region"] == "us-east-1"
    assert out["image_id"] == AMI


def test_bucket_is_private_and_encrypted(built):
    mocks, _ = built
    [block] = mocks.of_type("bucketPublicAccessBlock:BucketPublicAccessBlock")
    assert all(block[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"))
    [sse] = mocks.of_type("bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")
    assert sse["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] in ("AES256", "aws:kms")
    [bucket] = mocks.of_type("s3/bucket:Bucket")
    assert "acl" not in bucket and "policy" not in bucket  # no ACL grant, no bucket policy opening it
    assert not mocks.of_type("bucketPolicy:BucketPolicy")
    [owner] = mocks.of_type("bucketOwnershipControls:BucketOwnershipControls")
    assert owner["rule"]["objectOwnership"] == "BucketOwnerEnforced"  # ACLs disabled altogether


def test_lifecycle_expires_old_checkpoints_and_logs_only(built):
    mocks, _ = built
    [life] = mocks.of_type("bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    expiring = {r["id"]: r for r in life["rules"] if "expiration" in r}
    assert set(expiring) == {"expire-old-checkpoints", "expire-old-logs"}
    for rule in expiring.values():
        assert rule["expiration"]["days"] == 14
        assert rule["filter"]["and"]["prefix"] == "team/sd/runs/"
        assert rule["filter"]["and"]["tags"][stack.CLASS_TAG] in ("checkpoint", "log")


GROUP_RULES = [{"description": "rendezvous of a multi-node run, between sdcloud hosts only", "protocol": "tcp",
                "fromPort": 29500, "toPort": 29500, "self": True},
               {"description": "NCCL and gloo of a multi-node run, between sdcloud hosts only", "protocol": "tcp",
                "fromPort": 32768, "toPort": 60999, "self": True}]


def test_only_ingress_is_ssh_from_the_given_cidr_and_the_groups_ports_from_its_own_hosts(built):
    mocks, _ = built
    groups = mocks.of_type("ec2/securityGroup:SecurityGroup")
    [sg] = groups
    assert sg["ingress"] == [{"description": "SSH from the sdcloud user", "protocol": "tcp", "fromPort": 22, "toPort": 22,
                              "cidrBlocks": ["203.0.113.7/32"]}] + GROUP_RULES
    # The group's ports are open to the group's own security group only, never to an address range.
    assert all(not r.get("cidrBlocks") and not r.get("ipv6CidrBlocks") for r in sg["ingress"][1:])
    [default] = mocks.of_type("ec2/defaultSecurityGroup:DefaultSecurityGroup")
    assert default.get("ingress", []) == [] and default.get("egress", []) == []
    # No rule resources beside the inline ones.
    assert not [t for t, _, _ in mocks.resources if "securityGroupRule" in t or "IngressRule" in t]


def test_empty_ssh_cidr_means_no_ingress_but_between_its_own_hosts():
    mocks, _ = run(stack.StackConfig(stack="test", region="us-east-1", ssh_cidr=""))
    [sg] = mocks.of_type("ec2/securityGroup:SecurityGroup")
    assert sg.get("ingress", []) == GROUP_RULES


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "::/0", "not-a-cidr"])
def test_world_or_bad_ssh_cidr_is_refused(cidr):
    with pytest.raises(ValueError, match="sshCidr"):
        stack.StackConfig(ssh_cidr=cidr).validate()


def test_role_policy_allows_only_the_bucket_prefix(built):
    mocks, _ = built
    [attached] = mocks.of_type("iam/rolePolicy:RolePolicy")
    policy = json.loads(attached["policy"])
    [role] = mocks.of_type("iam/role:Role")
    assert not role.get("managedPolicyArns") and not role.get("inlinePolicies")
    assert json.loads(role["assumeRolePolicy"])["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    for st in policy["Statement"]:
        assert st["Effect"] == "Allow"
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        assert not any("*" in a for a in actions)
        s3 = [a for a in actions if a.startswith("s3:")]
        if not s3:
            assert set(actions) <= {"ec2:DescribeInstances", "ec2:DescribeTags"}
            continue
        assert s3 == actions
        resources = st["Resource"]
        if "s3:ListBucket" in actions:
            assert resources == ["arn:aws:s3:::sdcloud-test-abc123"]
            assert st["Condition"]["StringLike"]["s3:prefix"] == ["team/sd/*", "team/sd"]
        else:
            assert resources == ["arn:aws:s3:::sdcloud-test-abc123/team/sd/*"]


def test_launch_template_requires_imdsv2_maps_nvme_and_uses_the_ssm_image(built):
    mocks, _ = built
    [lt] = mocks.of_type("ec2/launchTemplate:LaunchTemplate")
    assert lt["metadataOptions"]["httpTokens"] == "required"
    assert lt["metadataOptions"]["httpPutResponseHopLimit"] == 2
    assert lt["imageId"] == AMI
    [(_, param)] = [c for c in mocks.calls if c[0] == "aws:ssm/getParameter:getParameter"]
    assert param["name"] == stack.DEFAULT_AMI_PARAMETER
    ephemeral = [m["virtualName"] for m in lt["blockDeviceMappings"] if "virtualName" in m]
    assert ephemeral[:2] == ["ephemeral0", "ephemeral1"]
    [root] = [m for m in lt["blockDeviceMappings"] if "ebs" in m]
    assert root["ebs"]["volumeSize"] == 250 and root["ebs"]["encrypted"] == "true"
    assert lt["iamInstanceProfile"]["arn"].endswith("host-profile")
    assert lt["vpcSecurityGroupIds"] == ["hosts-id"]
    kinds = {spec["resourceType"] for spec in lt["tagSpecifications"]}
    assert {"instance", "volume"} <= kinds


def test_user_data_installs_nothing_by_name_and_carries_no_credentials(built):
    mocks, _ = built
    [lt] = mocks.of_type("ec2/launchTemplate:LaunchTemplate")
    text = base64.b64decode(lt["userData"]).decode()
    assert text.startswith("#!/bin/bash")
    # The template installs nothing by name: the per-run user-data fetches the agent from the bucket.
    assert "pip install" not in text and "sdcloud==" not in text
    lowered = text.lower()
    for word in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token", "akia", "secret_key", "password"):
        assert word not in lowered


def test_every_taggable_resource_is_tagged(built):
    mocks, _ = built
    assert len(mocks.resources) > 15
    for typ, name, inputs in mocks.resources:
        if typ in UNTAGGABLE:
            continue
        tags = inputs.get("tags")
        assert tags, f"{typ} {name} has no tags"
        assert tags["sdcloud:managed"] == "true" and tags["sdcloud:owner"] == "alice", (typ, name)


def test_untaggable_list_matches_the_sdk():
    import importlib
    import inspect

    for token in UNTAGGABLE:
        module, cls = token.split(":")[1].split("/")[0], token.rsplit(":", 1)[1]
        args = getattr(importlib.import_module(f"pulumi_aws.{module}"), f"{cls}Args")
        assert "tags" not in inspect.signature(args.__init__).parameters, token


def test_no_key_pair_without_a_public_key():
    mocks, out = run(stack.StackConfig(stack="test", region="us-east-1"))
    assert not mocks.of_type("ec2/keyPair:KeyPair")
    assert out["key_name"] == ""
    [lt] = mocks.of_type("ec2/launchTemplate:LaunchTemplate")
    assert not lt.get("keyName")
