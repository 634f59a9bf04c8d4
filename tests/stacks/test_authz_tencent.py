"""The cloud driver's calls on Tencent Cloud, authorized as CAM authorizes them, against the SCF
role's policy the Tencent stack builds (under Pulumi mocks, from stacks/tencent: nothing copied).

The CVM calls run through the real SDK against the fake CVM API signed with keys that hold only
that policy: the fake refuses what CAM refuses (AuthFailure.UnauthorizedOperation, in the API's
envelope), judging each call as tests/support/authz/authz_expand.cvm_needs expands it (the instance's tags on
TerminateInstances, cam:PassRole for the launch template's role). The store's calls (the same code
on COS) are expanded into COS actions (authz_expand.cos_needs). Then each action is taken out of
the policy in turn: some recorded call must be refused, or the grant is listed in UNREACHED.
"""

from __future__ import annotations

import base64
import json
import urllib.request

import pytest

pytest.importorskip("pulumi")
pytest.importorskip("tencentcloud_iac_pulumi")

from tests.support import fake_tencent_api
from tests.support.authz.authz_expand import cos_needs, cvm_needs
from tests.support.authz.authz_cam import allowed
from tests.support.fake_tencent_api import FakeServer
from tests.stacks.test_stacks_driver import APP_ID, PREFIX, _of, _step_calls, _tencent_build

from sdcloud.errors import UserError
from sdcloud.offers.catalog import CatalogRow
from sdcloud.offers.optimizer import Offer
from sdcloud.providers.base import LaunchSpec
from sdcloud.providers.tencent import compute as tencent
from tests.support.harness_stacks import stack_module

REGION = "ap-guangzhou"
HOST_ROLE = "sdcloud-test-host"
STACK_TAGS = {"Name": "sdcloud-test-host", "sdcloud:managed": "true", "sdcloud:stack": "test"}
TEMPLATE = {"ImageId": "img-fake0001", "SystemDisk": {"DiskType": "CLOUD_BSSD", "DiskSize": 200},
            "SecurityGroupIds": ["sg-fake"], "CamRoleName": HOST_ROLE,
            "TagSpecification": [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in STACK_TAGS.items()]}],
            "UserData": base64.b64encode(b"#!/bin/sh\necho template\n").decode()}
INFRA = {"image_id": "img-fake0001", "launch_template_id": "lt-authz01", "vpc_id": "vpc-fake",
         "subnet_ids": {"ap-guangzhou-3": "subnet-3", "ap-guangzhou-4": "subnet-4"}, "security_group_id": "sg-fake",
         "cam_role_name": HOST_ROLE, "host_tags": STACK_TAGS}
UNREACHED: dict[str, str] = {
    "name/cos:PutObjectCopy": "the store's copy (CopyObject), sent by a driver that stages a run's inputs "
                              "(runs/inputs/carry.py: a part, then its final key); a recorded step stages none",
}


@pytest.fixture(scope="module")
def scf_policy(tmp_path_factory) -> dict:
    import zipfile

    tc_stack = stack_module("tencent")

    package = tmp_path_factory.mktemp("authz-tpkg") / "sdcloud-driver.zip"
    with zipfile.ZipFile(package, "w") as zf:
        zf.writestr("scf_bootstrap", "#!/bin/bash\n")
    resources, _ = _tencent_build(tc_stack.StackConfig(stack="test", region=REGION, prefix=PREFIX, owner_tag="alice",
                                                      zones=["ap-guangzhou-3"], image_id="img-test",
                                                      driver_package=str(package)))
    return {name: json.loads(i["document"]) for name, i in _of(resources, "cam/policy:Policy")}["driver-access"]


@pytest.fixture
def fake_with(monkeypatch, tmp_path):
    """The fake CVM API and a function that gives the caller keys holding only the given policies."""
    monkeypatch.setattr(fake_tencent_api, "PENDING_S", 0.05)
    monkeypatch.setattr(fake_tencent_api, "TERMINATING_S", 0.1)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr("sdcloud.providers.tencent.session.METADATA_URL", "http://127.0.0.1:9/")
    with FakeServer() as srv:
        monkeypatch.setenv("SDCLOUD_TENCENT_ENDPOINT", srv.endpoint)
        srv.cvm.add_launch_template(INFRA["launch_template_id"], TEMPLATE)

        def keys(*policies: dict) -> FakeServer:
            sid, skey = srv.cvm.add_user_keys("sdcloud-test-driver", [json.dumps(p) for p in policies])
            monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", sid)
            monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", skey)
            return srv
        yield keys


def _provider() -> tencent.TencentProvider:
    return tencent.TencentProvider(poll_interval=0.03, launch_timeout=10, backoff=0.01, backoff_max=0.05)


def _row(zone: str = "") -> CatalogRow:
    return CatalogRow("tencent", REGION, zone, "GN7.2XLARGE32", "T4", 1, 16, 8, 32, 0, 9.55, 2.87, "CNY", None,
                      "2026-01-01", False, False, "test")


def _cvm_step(srv: FakeServer) -> tuple[list[dict], dict[str, dict]]:
    """A step's CVM calls: zones, a spot launch from the stack's template, describe, find, end."""
    from datetime import datetime, timedelta, timezone

    prov = _provider()
    assert prov.zones(REGION)
    inst = prov.launch(Offer(_row(), "spot"), LaunchSpec(run_id="run-t1", attempt=1, user_data="#!/bin/sh\ntrue\n",
                                                         infra=dict(INFRA)), "spot", max_price=5.0)
    assert prov.describe([inst.id], REGION)
    assert [i.id for i in prov.find_tagged("run-t1", regions=[REGION])] == [inst.id]
    now = datetime.now(timezone.utc)
    prov.price_history("GN7.2XLARGE32", inst.zone, now - timedelta(hours=1), now)
    tags = {inst.id: dict(srv.cvm.instances[inst.id].tags)}
    prov.terminate([inst.id], REGION)
    return list(srv.cvm.calls), tags


def _cvm_refusals(calls: list[dict], policy: dict, tags: dict[str, dict]) -> list[str]:
    out = []
    for c in calls:
        for need, source in cvm_needs(c["action"], c["region"], fake_tencent_api.OWNER_UIN, c["params"], tags,
                                      TEMPLATE if c["params"].get("LaunchTemplate") else None):
            if not allowed(policy, need):
                out.append(f"{c['action']} needs {need.action} on {need.resource} — source: {source}")
    return out


def test_every_cvm_call_of_a_step_passes_with_only_the_function_roles_policy(fake_with, scf_policy):
    srv = fake_with(scf_policy)
    calls, _ = _cvm_step(srv)
    assert {c["action"] for c in calls} >= {"RunInstances", "TerminateInstances", "DescribeInstances", "DescribeZones"}
    assert all(c["caller"] != "account" for c in calls)  # every call was judged against the policy


def test_the_fake_refuses_what_cam_refuses_in_the_apis_envelope(fake_with, scf_policy):
    # Without cam:PassRole the launch from the stack's template (which names the host role) is refused.
    doc = json.loads(json.dumps(scf_policy))
    doc["statement"] = [st for st in doc["statement"] if st["action"] != ["name/cam:PassRole"]]
    srv = fake_with(doc)
    with pytest.raises(UserError, match=r"AuthFailure\.UnauthorizedOperation.*cam:PassRole"):
        _provider().launch(Offer(_row("ap-guangzhou-3"), "on-demand"),
                           LaunchSpec(run_id="run-t2", attempt=1, infra=dict(INFRA)), "on-demand")
    assert not srv.cvm.live()
    # An instance without the stack's tag is not the function's to end.
    other = srv.cvm.handle("RunInstances", REGION, {"Placement": {"Zone": "ap-guangzhou-3"}, "ImageId": "img-x",
                                                     "InstanceType": "GN7.2XLARGE32", "InstanceChargeType": "POSTPAID_BY_HOUR"})
    [iid] = other["InstanceIdSet"]
    with pytest.raises(UserError, match=r"AuthFailure\.UnauthorizedOperation.*TerminateInstances"):
        _provider().terminate([iid], REGION)
    # The raw answer: HTTP 200, the error inside {"Response": {"Error": ..., "RequestId": ...}}.
    from tencentcloud.common import credential
    from tencentcloud.common.common_client import CommonClient
    from tencentcloud.common.profile.client_profile import ClientProfile
    from tencentcloud.common.profile.http_profile import HttpProfile

    import os

    http = HttpProfile(endpoint=srv.endpoint.split("://", 1)[1], protocol=srv.endpoint.split("://", 1)[0])
    client = CommonClient("cvm", "2017-03-12", credential.Credential(os.environ["TENCENTCLOUD_SECRET_ID"],
                                                                      os.environ["TENCENTCLOUD_SECRET_KEY"]),
                          REGION, profile=ClientProfile(httpProfile=http))
    with pytest.raises(Exception) as err:
        client.call_json("TerminateInstances", {"InstanceIds": [iid]})
    assert getattr(err.value, "code", "") == "AuthFailure.UnauthorizedOperation" and getattr(err.value, "requestId", "")
    assert srv.cvm.instances[iid].state != "TERMINATING"


def test_each_grant_of_the_function_role_is_needed(fake_with, scf_policy, aws_env, monkeypatch, tmp_path):
    srv = fake_with(scf_policy)
    calls, tags = _cvm_step(srv)
    # The store is the same code on COS: a step's S3 calls (recorded against moto) become COS needs
    # on the Tencent stack's bucket.
    bucket = f"sdcloud-test-{APP_ID}"
    store_needs = [(op, n) for svc, op, p in _step_calls(monkeypatch, tmp_path) if svc == "s3"
                   for n in cos_needs(op, {**p, "Bucket": bucket}, REGION, APP_ID)]

    def refusals(policy: dict) -> list[str]:
        return _cvm_refusals(calls, policy, tags) + [f"{op} needs {n.action} on {n.resource}"
                                                     for op, n in store_needs if not allowed(policy, n)]

    assert not refusals(scf_policy), refusals(scf_policy)
    unproved = []
    for action in sorted({a for st in scf_policy["statement"] for a in st["action"]}):
        doc = json.loads(json.dumps(scf_policy))
        for st in doc["statement"]:
            st["action"] = [a for a in st["action"] if a != action]
        doc["statement"] = [st for st in doc["statement"] if st["action"]]
        if not refusals(doc) and action not in UNREACHED:
            unproved.append(f"{action}: no recorded call of a step needs it; drop the grant or list why in UNREACHED")
    assert not unproved, "\n".join(unproved)


def test_keys_whose_policies_grant_nothing_are_refused_everything(fake_with):
    """Policies attached, none allowing the call: refused, and nothing reaches the API's state."""
    srv = fake_with({"version": "2.0", "statement": []})
    with pytest.raises(UserError, match=r"AuthFailure\.UnauthorizedOperation.*cvm:DescribeZones"):
        _provider().zones(REGION)
    req = urllib.request.Request(srv.endpoint + "/_control", data=json.dumps({"op": "calls"}).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert json.loads(resp.read())["calls"] == []
