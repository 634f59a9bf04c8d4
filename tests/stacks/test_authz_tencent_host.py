"""A Tencent host with nothing but its CVM role: one set of the role's temporary keys, from the CVM
fake (`add_role_keys`), holding the two policies the Tencent stack attaches to the role
(stacks/tencent/host_policy.py: the COS objects under the prefix, and TerminateInstances held to the
stack's tag). The host's store calls (the agent's checkpoint flow, the boot's cache write, the batch
worker's create-only claims) go through the COS layer judging each request against those policies
as CAM does (tests/support/fronts/front_cos.py); the self-end's TerminateInstances goes to the CVM fake, which
judges it by the instance's tags (tests/support/authz/authz_expand.cvm_needs). Then each action of the role's
policies is taken out in turn: some recorded request must be refused, or the action is in UNREACHED
with the path that needs it and why the suite does not take it.
"""

from __future__ import annotations

import json
import threading

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.support.fake_batch import FakeGenerator
from tests.support.authz.authz_cam import Need, allowed
from tests.support.fronts.front_cos import CosLayer
from tests.support.server_seaweed import TEST_KEYS, SeaweedS3
from tests.support.harness_stacks import stack_module


_host_policy = stack_module("tencent", "host_policy")
role_policy_document, self_end_policy_document = _host_policy.role_policy_document, _host_policy.self_end_policy_document

REGION, APP_ID, BUCKET, PREFIX = "ap-guangzhou", "1250000000", "authz-host-1250000000", "sdcloud"
ROLE, STACK_TAG = "sdcloud-test-host", ("sdcloud:stack", "test")
MiB = 1 << 20

UNREACHED = {
    "name/cos:AbortMultipartUpload": "the clean-up of a multipart upload whose part failed; the recorded uploads succeed",
}
# The role's grants a batch worker host does not use, with what uses them (the training host).
NOT_FOR_WORKERS = {
    "name/cos:PutObjectCopy": "the boot's cache write (put .part, copy) and the store's copies",
    "name/cos:UploadPartCopy": "the store's copy of an object of 8 MiB and more",
    "name/cos:DeleteObject": "checkpoint rotation and the cache write's clean-up; a worker's writes are create-only",
    "name/cos:DeleteMultipleObjects": "checkpoint rotation; a worker never deletes",
    "name/cos:InitiateMultipartUpload": "checkpoints over the part size; a worker's images and markers are single PUTs",
    "name/cos:UploadPart": "checkpoints over the part size",
    "name/cos:CompleteMultipartUpload": "checkpoints over the part size",
    "name/cos:AbortMultipartUpload": "a failed multipart upload's clean-up",
    "name/cvm:TerminateInstances": "the self-end (a worker host ends itself through the same agent code, recorded above)",
}


@pytest.fixture(scope="module")
def anonymous_seaweed():
    """Role keys carry a session token, which SeaweedFS accepts only with no identities configured."""
    server = SeaweedS3(keys=None).start()
    yield server
    server.stop()


def _policies() -> list[dict]:
    return [json.loads(role_policy_document(REGION, APP_ID, BUCKET, PREFIX)), json.loads(self_end_policy_document(STACK_TAG))]


def _merged(policies: list[dict]) -> str:
    """The role's policies as one document: CAM allows what any attached policy allows."""
    return json.dumps({"version": "2.0", "statement": [st for p in policies for st in p["statement"]]})


@pytest.fixture(scope="module")
def host_run(anonymous_seaweed, tmp_path_factory):
    """The host's requests with the role's keys: (COS requests seen, CVM needs of its self-end)."""
    from tests.support import fake_tencent_api
    from tests.support.authz.authz_expand import cvm_needs
    from tests.support.fake_tencent_api import FakeServer
    from tests.agent.test_self_end import TencentMetadata, _fake_instance

    from sdcloud_agent import boot
    from sdcloud_agent.batch.verify import verify
    from sdcloud_agent.batch.worker import Worker, write_job
    from sdcloud_agent.clouds import tencent as host_cloud
    from sdcloud_agent.selfend import SelfEnd
    from sdcloud_agent.store import open_store

    tmp = tmp_path_factory.mktemp("authz-tencent-host")
    with FakeServer() as srv, pytest.MonkeyPatch.context() as mp:
        mine = _fake_instance(srv.cvm, "ins-host0001", {STACK_TAG[0]: STACK_TAG[1], "sdcloud:run": "r-1"})
        other = _fake_instance(srv.cvm, "ins-other001", {"team": "web"})
        raw = srv.cvm.add_role_keys(ROLE, [json.dumps(p) for p in _policies()])
        cos = CosLayer(anonymous_seaweed, policies={raw["TmpSecretId"]: _merged(_policies())}).start()
        meta = TencentMetadata(raw, ROLE)
        try:
            # The layer signs its own existence check with the caller's key, as it does for test keys.
            mp.setitem(TEST_KEYS, raw["TmpSecretId"], raw["TmpSecretKey"])
            for k, v in cos.env.items():
                mp.setenv(k, v)
            mp.setenv("NO_PROXY", ",".join(filter(None, [cos.env.get("NO_PROXY"), "127.0.0.1", "localhost"])))
            mp.setenv(host_cloud.METADATA_ENV, meta.url(mine.id))
            mp.setenv("SDCLOUD_TENCENT_ENDPOINT", srv.endpoint)
            owner = boto3.client("s3", endpoint_url=cos.endpoint(REGION), region_name=REGION,
                                 config=Config(s3={"addressing_style": "virtual"}),
                                 aws_access_key_id="x", aws_secret_access_key="y")
            owner.create_bucket(Bucket=BUCKET)
            conf = {"url": f"s3://{BUCKET}/{PREFIX}", "endpoint_url": cos.endpoint(REGION), "region": REGION,
                    "addressing_style": "virtual", "credentials": "tencent-cvm-role", "part_size": 5 * MiB}
            store = open_store(conf)
            # The agent's checkpoint flow: status, the lease, a multipart checkpoint, copies, reads,
            # the listing and the rotation's batch delete.
            big = tmp / "ckpt.bin"
            big.write_bytes(b"c" * (11 * MiB))
            store.put("runs/r-1/status.json", b"{}")
            assert store.create("runs/r-1/lease", b"1") and not store.create("runs/r-1/lease", b"2")
            store.put_file("runs/r-1/ckpt/step-1/model.bin", big)
            store.copy("runs/r-1/ckpt/step-1/model.bin", "runs/r-1/ckpt/step-2/model.bin")
            store.copy("runs/r-1/status.json", "runs/r-1/status-old.json")
            store.get_file("runs/r-1/ckpt/step-2/model.bin", tmp / "back.bin")
            assert store.get("runs/r-1/status.json") == b"{}" and store.head("runs/r-1/status.json") is not None
            store.delete([o.key for o in store.list("runs/r-1/ckpt/")])
            # The boot's cache write: put .part, copy, delete.
            env_tar = tmp / "env.tar"
            env_tar.write_bytes(b"e" * 4096)
            boot.put({"store": conf}, "cache/env/x.tar", str(env_tar))
            # A batch worker on the same role: create-only claims, images and markers.
            jobs = open_store({**conf, "url": f"s3://{BUCKET}/{PREFIX}/batch"})
            base = {"model": "tiny-sd15", "lora": None, "negative_prompt": "", "steps": 2, "guidance": 5.0,
                    "width": 64, "height": 64, "scheduler": "ddim"}
            write_job(jobs, "j1", {}, [{"id": f"i{k}", "settings": {**base, "prompt": f"a photo of thing {k}"}, "seeds": [0, 1]}
                                       for k in range(3)])
            stop = threading.Event()
            assert Worker(jobs, "j1", FakeGenerator(), idle_wait=0.05, ttl=30, stop=stop).run().items_done == 3
            assert verify(jobs, "j1").ok
            # The refusals that prove the layer judges: another prefix, another instance.
            with pytest.raises(ClientError, match="AccessDenied"):
                open_store({**conf, "url": f"s3://{BUCKET}/other"}).put("x", b"1")
            with pytest.raises(RuntimeError, match="UnauthorizedOperation"):
                host_cloud.terminate(other.id, REGION, host_cloud.role_keys())
            # The self-end: the host's own TerminateInstances, as selfend.finish calls it.
            tags = {iid: dict(i.tags) for iid, i in srv.cvm.instances.items()}
            assert host_cloud.end_machine(SelfEnd(provider="tencent", region=REGION)) == host_cloud.END_ACTION
            assert mine.state == "TERMINATING" and other.state == "RUNNING"
            [call] = [c for c in srv.cvm.calls if c["action"] == "TerminateInstances" and c.get("caller")]
            assert call["caller"] == f"role:{ROLE}"
            cvm = [need for need, _ in cvm_needs("TerminateInstances", REGION, fake_tencent_api.OWNER_UIN,
                                                 call["params"], tags, None)]
            seen = [s for s in cos.seen if s.refused != "AccessDenied"]
            denied = cos.denials()
        finally:
            cos.stop()
            meta.stop()
    return seen, denied, cvm


def _without(policies: list[dict], action: str) -> list[dict]:
    out = json.loads(json.dumps(policies))
    for p in out:
        for st in p["statement"]:
            st["action"] = [a for a in st["action"] if a != action]
    return out


def _refused(needs: list[Need], policies: list[dict]) -> list[Need]:
    return [n for n in needs if not any(allowed(p, n) for p in policies)]


def test_every_request_of_the_host_passes_with_only_the_roles_policies(host_run):
    seen, denied, cvm = host_run
    assert [s.path.split("?")[0] for s in denied] == ["/other/x"], denied
    needs = [n for s in seen for n in s.needs] + cvm
    used = {n.action for n in needs}
    assert {"name/cos:PutObject", "name/cos:GetBucket", "name/cvm:TerminateInstances"} <= used, used
    assert not _refused(needs, _policies())


def test_each_action_of_the_host_roles_policies_is_needed(host_run):
    seen, _, cvm = host_run
    needs = [n for s in seen for n in s.needs] + cvm
    actions = sorted({a for p in _policies() for st in p["statement"] for a in st["action"]})
    problems = []
    for action in actions:
        needed = bool(_refused(needs, _without(_policies(), action)))
        if needed and action in UNREACHED:
            problems.append(f"{action} is listed as unreached but a recorded request needs it")
        if not needed and action not in UNREACHED:
            problems.append(f"{action}: no recorded host request needs it; drop it or list why in UNREACHED")
    problems += [f"{a}: listed but not granted" for a in UNREACHED if a not in actions]
    assert not problems, "\n".join(problems)


def test_the_self_end_is_held_to_the_stack_tag(host_run):
    """The check can fail: the same TerminateInstances on an instance without the stack's tag."""
    _, _, cvm = host_run
    [need] = cvm
    untagged = Need(need.action, need.resource, tuple((k, v) for k, v in need.context if k != "qcs:resource_tag"))
    assert allowed(_policies()[1], need) and not allowed(_policies()[1], untagged)


def test_the_batch_workers_grants_are_listed_where_they_do_not_need_them(host_run):
    """Least privilege for a worker host: each action its requests (under batch/) do not need is
    listed with what needs it; each listed one is indeed not needed by them."""
    seen, _, _ = host_run
    worker = [n for s in seen if f"/{PREFIX}/batch/" in s.path or f"prefix={PREFIX}%2Fbatch" in s.path
              or f"prefix={PREFIX}/batch" in s.path for n in s.needs]
    assert {n.action for n in worker} >= {"name/cos:PutObject", "name/cos:GetObject", "name/cos:GetBucket"}
    actions = sorted({a for p in _policies() for st in p["statement"] for a in st["action"]})
    needed = {a: bool(_refused(worker, _without(_policies(), a))) for a in actions}
    unlisted = [a for a, n in needed.items() if not n and a not in NOT_FOR_WORKERS]
    wrongly = [a for a in NOT_FOR_WORKERS if needed.get(a)]
    assert not unlisted and not wrongly, (unlisted, wrongly)
