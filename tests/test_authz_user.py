"""The user's own calls (up, resume, down and gc with a stack in place), judged against the minimal
user policy sdcloud documents (docs/aws-user-policy.json; docs/testing.md says how to fill it in).

The controller's step is the same code the cloud driver runs (tests/test_authz_aws.py records it
from the stack's launch template, spot and on-demand); here it is recorded as the user makes it,
then `sdcloud gc` reaps a stray. Every call is expanded into what AWS evaluates
(tests/authz_expand.py) and judged with its conditions; each action of the document must be needed
by some recorded call. `sdcloud infra up` is not covered: Pulumi's AWS provider makes the stack's
calls itself (roles, the bucket, the template, the function), with rights the document does not give.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pulumi")
pytest.importorskip("pulumi_aws")

from authz_judge import needs, refusals  # noqa: E402
from authz_record import record_calls  # noqa: E402
from test_authz_aws import REGION, _driver_step, _env, stack  # noqa: E402, F401  (stack: a fixture)
from test_stacks_driver import ACCOUNT, AMI, BUCKET, PREFIX  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "aws-user-policy.json"


def _policy(host_role_arn: str) -> dict:
    """The document filled in as its placeholders say: the account, the stack's bucket and prefix, its host role."""
    text = DOC.read_text()
    for k, v in {"ACCOUNT_ID": ACCOUNT, "BUCKET": BUCKET, "PREFIX": PREFIX, "HOST_ROLE_ARN": host_role_arn}.items():
        text = text.replace(k, v)
    return json.loads(text)


@pytest.fixture(scope="module")
def user(stack, tmp_path_factory):  # noqa: F811
    from moto import mock_aws

    from sdcloud.cli import main
    from sdcloud.offers.catalog import bundled_rows
    from sdcloud.offers.optimizer import Offer
    from sdcloud.providers import get_provider
    from sdcloud.providers.base import LaunchSpec

    tmp = tmp_path_factory.mktemp("authz-user")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
                     "SDCLOUD_HOME": str(tmp / "home"), "AWS_CONFIG_FILE": str(tmp / "no-config")}.items():
            mp.setenv(k, v)
        for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            mp.delenv(k, raising=False)
        step, profile = _driver_step(tmp, mp, stack)
        with mock_aws():
            calls = record_calls(mp)  # the stray's launch too: gc's end is judged by the tags it launched with
            row = next(r for r in bundled_rows("aws") if r.region == REGION and r.instance_type == "g5.xlarge")
            stray = get_provider("aws", image_id=AMI).launch(Offer(row, "on-demand"), LaunchSpec("run-stray", 1),
                                                             "on-demand")
            assert main(["gc", "--provider", "aws", "--region", REGION, "--yes", "--json"]) == 0
            assert any(c.operation == "TerminateInstances" and stray.id in c.params["InstanceIds"] for c in calls)
    env = _env(stack, profile)
    env.instance_tags.clear()
    return step + calls, env, _policy(stack["host_role"])


def test_every_call_of_the_user_passes_the_documented_user_policy(user):
    calls, env, policy = user
    assert {c.operation for c in calls} >= {"RunInstances", "TerminateInstances", "DescribeInstances", "PutObject"}
    found = refusals(calls, policy, env)
    assert not found, "\n".join(found)


def test_each_grant_of_the_user_policy_is_needed(user):
    calls, env, policy = user
    unneeded = sorted(a for a, n in needs(calls, policy, env).items() if not n)
    assert not unneeded, f"no recorded user call needs {unneeded}: drop them from docs/aws-user-policy.json"


def test_the_policy_refuses_an_instance_sdcloud_did_not_launch(user):
    """The check can fail: a TerminateInstances on an instance no recorded launch tagged."""
    from authz_record import Call

    _, env, policy = user
    found = refusals([Call("user", "ec2", "TerminateInstances", {"InstanceIds": ["i-0other"]})], policy, env)
    assert len(found) == 1 and "ec2:TerminateInstances" in found[0] and "i-0other" in found[0], found
