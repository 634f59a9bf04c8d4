"""The Tencent Cloud stack under Pulumi mocks: no CLI, no provider plugin, no network."""

from __future__ import annotations

import base64
import json

import pytest

pulumi = pytest.importorskip("pulumi")
pytest.importorskip("tencentcloud_iac_pulumi")

from tests.support.harness_stacks import stack_module

stack = stack_module("tencent")

APP_ID = "1250000000"
IMAGE = "img-22ubuntu"
ZONES = ["ap-guangzhou-3", "ap-guangzhou-6", "ap-guangzhou-7"]

UNTAGGABLE = {
    "tencentcloud:Security/groupRuleSet:GroupRuleSet",
    "tencentcloud:Cam/policy:Policy",
    "tencentcloud:Cam/rolePolicyAttachment:RolePolicyAttachment",
}


class Recorder(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: list[tuple[str, str, dict]] = []
        self.calls: list[tuple[str, dict]] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append((args.typ, args.name, dict(args.inputs)))
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.calls.append((args.token, dict(args.args)))
        if args.token == "tencentcloud:User/getInfo:getInfo":
            return {"appId": APP_ID, "id": "info", "name": "me", "ownerUin": "100000000001", "uin": "100000000001"}
        if args.token == "tencentcloud:Availability/getZonesByProduct:getZonesByProduct":
            zones = [{"name": z, "state": "AVAILABLE", "id": str(i), "description": z} for i, z in enumerate(ZONES)]
            zones.append({"name": "ap-guangzhou-1", "state": "UNAVAILABLE", "id": "9", "description": "closed"})
            return {"zones": zones, "id": "zones", "product": "cvm"}
        if args.token == "tencentcloud:Images/getInstance:getInstance":
            return {"id": "images", "images": [{"imageId": IMAGE, "imageName": "Ubuntu Server 22.04 LTS 64bit",
                                                "imageType": "PUBLIC_IMAGE", "osName": "Ubuntu Server 22.04 LTS 64bit"}]}
        raise AssertionError(f"unexpected invoke {args.token}")

    def of_type(self, suffix: str) -> list[dict]:
        return [inputs for typ, _, inputs in self.resources if typ.endswith(suffix)]


def run(cfg: stack.StackConfig) -> tuple[Recorder, dict]:
    mocks = Recorder()
    pulumi.runtime.set_mocks(mocks, project="sdcloud-tencent", stack="test", preview=False)
    result: dict = {}

    @pulumi.runtime.test
    def program():
        return pulumi.Output.from_input(stack.build(cfg)).apply(result.update)

    program()
    return mocks, result


@pytest.fixture(scope="module")
def built() -> tuple[Recorder, dict]:
    cfg = stack.StackConfig(stack="ap-guangzhou", region="ap-guangzhou", prefix="team/sd", ssh_cidr="203.0.113.7/32",
                            public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample me@laptop", root_volume_gb=120,
                            owner_tag="alice", agent_source="sdcloud==0.1.0", instance_type="GT4.4XLARGE96",
                            local_nvme_disks=[3570, 3570])
    return run(cfg)


def test_outputs(built):
    _, out = built
    assert out["bucket"] == f"sdcloud-ap-guangzhou-{APP_ID}"
    assert out["region"] == "ap-guangzhou"
    assert out["subnet_ids"] == {z: f"subnet-{z}-id" for z in ZONES}  # the unavailable zone is left out
    assert out["launch_template_ids"] == {z: f"host-template-{z}-id" for z in ZONES}
    assert out["launch_template_id"] == f"host-template-{ZONES[0]}-id"
    assert out["security_group_id"] == "hosts-id"
    assert out["role_name"] == "sdcloud-ap-guangzhou-host"
    assert out["image_id"] == IMAGE
    assert out["vpc_id"] == "vpc-id"
    assert out["key_id"] == "ssh-key-id"


def test_bucket_is_private_and_encrypted(built):
    mocks, _ = built
    [bucket] = mocks.of_type("Cos/bucket:Bucket")
    assert bucket["acl"] == "private"
    assert "aclBody" not in bucket
    assert bucket["encryptionAlgorithm"] in ("AES256", "KMS")
    assert not mocks.of_type("Cos/bucketPolicy:BucketPolicy")
    assert bucket["lifecycleRules"][0]["filterPrefix"] == "team/sd/"


def _group_rules(rules: dict) -> list[dict]:
    return [r for r in rules.get("ingresses", []) if r.get("sourceSecurityId")]


def test_only_ingress_is_ssh_from_the_given_cidr_and_the_groups_ports_from_its_own_hosts(built):
    mocks, _ = built
    [rules] = mocks.of_type("Security/groupRuleSet:GroupRuleSet")
    assert rules["ingresses"][0] == {"action": "ACCEPT", "protocol": "TCP", "port": "22", "cidrBlock": "203.0.113.7/32",
                                     "description": "SSH from the sdcloud user"}
    group = _group_rules(rules)
    assert [(r["protocol"], r["port"]) for r in group] == [("TCP", "29500"), ("TCP", "32768-60999")]
    assert len(rules["ingresses"]) == 3 and all(not r.get("cidrBlock") for r in group)
    # The source is the hosts' own security group (the mocks name it by its resource id).
    [sg_id] = {r["sourceSecurityId"] for r in group}
    assert sg_id == rules["securityGroupId"]
    assert all(e["action"] == "ACCEPT" for e in rules["egresses"])
    assert not mocks.of_type("Security/groupRule:GroupRule") and not mocks.of_type("Security/groupLiteRule:GroupLiteRule")


def test_empty_ssh_cidr_means_no_ingress_but_between_its_own_hosts():
    mocks, out = run(stack.StackConfig(stack="t", region="ap-guangzhou", zones=["ap-guangzhou-3"]))
    [rules] = mocks.of_type("Security/groupRuleSet:GroupRuleSet")
    assert rules.get("ingresses", []) == _group_rules(rules) and len(_group_rules(rules)) == 2
    assert out["key_id"] == "" and not mocks.of_type("Key/pair:Pair")


def test_role_policy_allows_only_the_bucket_prefix(built):
    mocks, _ = built
    [role] = mocks.of_type("Cam/role:Role")
    trust = json.loads(role["document"])
    assert trust["statement"][0]["principal"] == {"service": ["cvm.qcloud.com"]}
    [policy] = [p for p in mocks.of_type("Cam/policy:Policy") if p["name"].endswith("-bucket")]
    doc = json.loads(policy["document"])
    base = f"qcs::cos:ap-guangzhou:uid/{APP_ID}:sdcloud-ap-guangzhou-{APP_ID}"
    for st in doc["statement"]:
        assert st["effect"] == "allow"
        assert all(a.startswith("name/cos:") and "*" not in a for a in st["action"])
        if st["action"] == ["name/cos:GetBucket"]:
            assert st["resource"] == [f"{base}/*"]
            assert st["condition"]["string_like"]["cos:prefix"] == ["team/sd/*", "team/sd"]
        elif st["action"] == ["name/cos:DeleteMultipleObjects"]:
            # A bucket action: each key in the batch is checked for DeleteObject under the prefix.
            assert st["resource"] == [f"{base}/*"]
        else:
            assert st["resource"] == [f"{base}/team/sd/*"]
    attaches = mocks.of_type("Cam/rolePolicyAttachment:RolePolicyAttachment")
    assert sorted(a["policyId"] for a in attaches) == ["host-bucket-access-id", "host-self-end-id"]
    assert {a["roleId"] for a in attaches} == {"host-role-id"}


def test_role_may_terminate_only_instances_with_the_stacks_tag(built):
    """A host ends itself with TerminateInstances; the condition keeps it to this stack's instances."""
    from tests.support.authz.authz_cam import Need, allowed

    mocks, _ = built
    [policy] = [p for p in mocks.of_type("Cam/policy:Policy") if p["name"].endswith("-self-end")]
    [template] = mocks.of_type("Cvm/launchTemplate:LaunchTemplate")[:1]
    tags = tuple(f"{t['key']}&{t['value']}" for t in template["tagSpecifications"][0]["tags"])
    need = lambda tags: Need("name/cvm:TerminateInstances", "qcs::cvm:ap-guangzhou:uin/1:instance/ins-1",  # noqa: E731
                             (("qcs:resource_tag", tags),))
    assert allowed(policy["document"], need(tags))
    assert not allowed(policy["document"], need(("sdcloud:stack&other", "team&web")))
    assert not allowed(policy["document"], Need("name/cvm:RunInstances", "*", (("qcs:resource_tag", tags),)))


def test_launch_templates_use_the_image_local_nvme_and_the_role(built):
    mocks, _ = built
    templates = mocks.of_type("Cvm/launchTemplate:LaunchTemplate")
    # One per available zone; Pulumi registers them as their inputs resolve, in no fixed order.
    assert sorted(t["placement"]["zone"] for t in templates) == ZONES
    for t in templates:
        assert t["imageId"] == IMAGE
        assert t["dataDisks"] == [{"diskType": "LOCAL_NVME", "diskSize": 3570, "deleteWithInstance": True}] * 2
        assert t["camRoleName"] == "sdcloud-ap-guangzhou-host"
        assert t["securityGroupIds"] == ["hosts-id"]
        assert t["systemDisk"]["diskSize"] == 120
        assert t["loginSettings"]["keyIds"] == ["ssh-key-id"]
        assert {tag["key"] for tag in t["tagSpecifications"][0]["tags"]} >= {"sdcloud:managed", "sdcloud:stack"}
    [(_, query)] = [c for c in mocks.calls if c[0] == "tencentcloud:Images/getInstance:getInstance"]
    assert query["imageTypes"] == ["PUBLIC_IMAGE"] and query["instanceType"] == "GT4.4XLARGE96"


def test_no_local_disks_without_them():
    mocks, _ = run(stack.StackConfig(stack="t", region="ap-guangzhou", zones=["ap-guangzhou-3"], image_id="img-mine"))
    [t] = mocks.of_type("Cvm/launchTemplate:LaunchTemplate")
    assert not t.get("dataDisks") and t["imageId"] == "img-mine"
    assert not [c for c in mocks.calls if c[0].startswith("tencentcloud:Images")]


def test_local_nvme_needs_an_instance_type():
    with pytest.raises(ValueError, match="instanceType"):
        stack.StackConfig(local_nvme_disks=[3570]).validate()


def test_user_data_installs_driver_and_agent_without_credentials(built):
    mocks, _ = built
    for t in mocks.of_type("Cvm/launchTemplate:LaunchTemplate"):
        text = base64.b64decode(t["userData"]).decode()
        assert text.startswith("#!/bin/bash")
        assert "nvidia-driver-535-server" in text
        assert '"linux-headers-$(uname -r)" nvidia-driver-535-server' in text and "blacklist nouveau" in text
        assert "pip install" not in text and "sdcloud==" not in text  # nothing installed by name
        lowered = text.lower()
        for word in ("tencentcloud_secret_id", "tencentcloud_secret_key", "secretid", "secretkey", "password", "akid"):
            assert word not in lowered


def test_every_taggable_resource_is_tagged(built):
    mocks, _ = built
    assert len(mocks.resources) >= 12
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
        module, cls = token.split(":")[1].split("/")[0].lower(), token.rsplit(":", 1)[1]
        args = getattr(importlib.import_module(f"tencentcloud_iac_pulumi.{module}"), f"{cls}Args")
        assert "tags" not in inspect.signature(args.__init__).parameters, token
