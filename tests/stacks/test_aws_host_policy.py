"""The agent's store with credentials whose only rights are the AWS stack's host role policy.

moto enforces IAM here: an IAM user holds exactly `role_policy_document` from
stacks/aws/aws_host_policy.py (what the stack attaches to the host role), and the agent's store
signs with that user's keys. Every call a host makes passes; a call the stack does not grant (a key
outside the prefix, an action taken out of the policy) is refused with AccessDenied, as on AWS.

One correction to moto: it judges a DeleteObjects request against the bucket's ARN, where AWS
checks s3:DeleteObject on each key ("Actions, resources, and condition keys for Amazon S3":
DeleteObjects needs s3:DeleteObject on the objects). `authz_moto_iam.per_key_delete_of` asks moto's own
authorizer once per key instead. Uploads go through s3transfer: the CRT engine (which the store
takes on AWS when awscrt is installed) sends its requests itself, past moto's interception.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.harness_stacks import stack_module

_host_policy = stack_module("aws", "aws_host_policy")
OBJECT_ACTIONS, role_policy_document = _host_policy.OBJECT_ACTIONS, _host_policy.role_policy_document

BUCKET, PREFIX, REGION = "sdcloud-host-policy", "sdcloud", "us-east-1"
MiB = 1024 * 1024


@pytest.fixture
def aws_iam(monkeypatch):
    """moto with IAM enforced after the setup calls; yields a function that makes a user with a
    policy document and returns a store signed with its keys."""
    import boto3
    from moto import mock_aws
    from moto.core.authorization import disable_iam_authentication, enable_iam_authentication
    from moto.s3.responses import S3Response

    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "SDCLOUD_STORE_ENDPOINT", "AWS_PROFILE",
                "AWS_SESSION_TOKEN", "AWS_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "admin")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "admin")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)

    from tests.support.authz.authz_moto_iam import iam_actions_for_s3, per_key_delete_of

    monkeypatch.setattr(S3Response, "_bucket_response_post", per_key_delete_of(S3Response._bucket_response_post))
    with mock_aws(config={"iam": {"load_aws_managed_policies": False}}), enable_iam_authentication(), \
            iam_actions_for_s3():
        admin = boto3.Session(aws_access_key_id="admin", aws_secret_access_key="admin", region_name=REGION)
        with disable_iam_authentication():  # the setup is the account owner's, not the host's
            admin.client("s3").create_bucket(Bucket=BUCKET)
        iam = admin.client("iam")
        users = []

        def store_for(policy: str):
            from sdcloud_agent.store import open_store

            name = f"host{len(users)}"
            with disable_iam_authentication():
                iam.create_user(UserName=name)
                iam.put_user_policy(UserName=name, PolicyName="sdcloud-host", PolicyDocument=policy)
                key = iam.create_access_key(UserName=name)["AccessKey"]
            users.append(name)
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
            boto3.setup_default_session()  # the store's client reads the keys afresh
            # From here on every request is judged against the policies of the key that signed it.
            return open_store({"url": f"s3://{BUCKET}/{PREFIX}", "region": REGION, "engine": "s3transfer",
                               "part_size": 5 * MiB})

        yield store_for
    boto3.setup_default_session()


def _host_calls(store, tmp_path: Path) -> list[str]:
    """What a host does with its store, in the order a run does it; the names of the calls made."""
    done = []
    store.put("runs/r1/status.json", b'{"phase": "training"}'); done.append("put")
    assert store.get("runs/r1/status.json").startswith(b"{"); done.append("get")
    assert store.head("runs/r1/status.json").size > 0; done.append("head")
    assert store.create("runs/r1/lease/attempt-1", b"1") is True; done.append("create (If-None-Match)")
    assert store.create("runs/r1/lease/attempt-1", b"2") is False; done.append("create again")
    got = store.get_versioned("runs/r1/status.json")
    assert got is not None and store.put_if_match("runs/r1/status.json", b"{}", got[1]) is not None
    done.append("put_if_match (If-Match)")
    big = tmp_path / "ckpt.bin"
    big.write_bytes(os.urandom(11 * MiB))  # three parts of 5 MiB: a multipart upload
    store.put_file("runs/r1/checkpoints/step-10/model.safetensors", big); done.append("put_file multipart, tagged")
    assert store.get_file("runs/r1/checkpoints/step-10/model.safetensors", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == big.read_bytes(); done.append("get_file")
    store.put("cache/env/x.part", b"env"); store.copy("cache/env/x.part", "cache/env/x"); done.append("copy")
    assert {o.key for o in store.list("runs/r1/")} >= {"runs/r1/status.json", "runs/r1/lease/attempt-1"}
    done.append("list")
    store.delete(["cache/env/x.part", "runs/r1/lease/attempt-1"]); done.append("delete many")
    store.delete("cache/env/x"); done.append("delete")
    assert store.head("cache/env/x") is None
    return done


def test_every_call_a_host_makes_passes_with_only_the_stacks_policy(aws_iam, tmp_path):
    store = aws_iam(role_policy_document(BUCKET, PREFIX))
    assert len(_host_calls(store, tmp_path)) == 12


def test_a_call_the_stack_does_not_grant_is_refused(aws_iam):
    from sdcloud_agent.store import StoreError, open_store

    aws_iam(role_policy_document(BUCKET, PREFIX))
    outside = open_store({"url": f"s3://{BUCKET}/other", "region": REGION, "engine": "s3transfer"})
    for call in (lambda: outside.put("x", b"1"), lambda: outside.get("x"), lambda: outside.delete(["x"])):
        with pytest.raises(Exception) as exc:
            call()
        assert "AccessDenied" in str(exc.value) or isinstance(exc.value, StoreError), exc.value
    import boto3

    with pytest.raises(Exception, match="AccessDenied"):
        boto3.client("s3", region_name=REGION).delete_bucket(Bucket=BUCKET)


@pytest.mark.parametrize("dropped", ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"])
def test_each_grant_the_store_uses_is_needed(aws_iam, tmp_path, dropped):
    """Take one action out of the stack's policy: some host call is then refused (the tests can fail).
    Not s3:PutObjectTagging: AWS wants it for a PUT that carries x-amz-tagging (the checkpoints'
    sdcloud-class tag), moto does not check it; tests/stacks/test_authz_aws.py judges that one."""
    doc = json.loads(role_policy_document(BUCKET, PREFIX))
    stmt = doc["Statement"][0]
    assert stmt["Sid"] == "ObjectsUnderPrefix" and set(stmt["Action"]) == set(OBJECT_ACTIONS)
    stmt["Action"] = [a for a in stmt["Action"] if a != dropped]
    store = aws_iam(json.dumps(doc))
    with pytest.raises(Exception, match="AccessDenied|refused|403|Forbidden"):
        _host_calls(store, tmp_path)
