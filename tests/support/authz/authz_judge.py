"""Judging recorded AWS calls against a principal's policy: each call expanded into what AWS
evaluates (tests/support/authz/authz_expand.py) and each request decided with its conditions (tests/support/authz/authz_aws.py).

`refusals` names every request a policy refuses, with the call it comes from and its source;
`unneeded` takes each action out of the policy in turn and returns those no recorded call needs
(least privilege: the test lists each with its reason or the grant goes). `host_policy` is the AWS
host role's policy as the stack attaches it (stacks/aws/aws_host_policy.py), read, not copied.
"""

from __future__ import annotations

import json

from tests.support.authz.authz_aws import actions_of, refused, without_action
from tests.support.authz.authz_expand import AwsEnv, expand_aws
from tests.support.authz.authz_record import Call
from tests.support.harness_stacks import stack_module

ACCOUNT = "123456789012"


def host_policy(bucket: str, prefix: str) -> dict:
    role_policy_document = stack_module("aws", "aws_host_policy").role_policy_document

    return json.loads(role_policy_document(bucket, prefix))


def refusals(calls: list[Call], policy: dict, env: AwsEnv | None = None) -> list[str]:
    env = env or AwsEnv(account=ACCOUNT, region="us-east-1")
    env.instance_tags.clear()
    out = []
    for c in calls:
        for req in refused(policy, expand_aws(c.service, c.operation, c.params, env, c.result)):
            out.append(f"{c.principal} {c.service}:{c.operation} needs {req}, which the policy does not allow"
                       f" — source: {req.source}")
    return out


def needs(calls: list[Call], policy: dict, env: AwsEnv | None = None) -> dict[str, bool]:
    """Each action of the policy: does some recorded call fail without it?"""
    return {a: bool(refusals(calls, without_action(policy, a), env)) for a in actions_of(policy)}


def unneeded(calls: list[Call], policy: dict, env: AwsEnv | None = None) -> set[str]:
    return {a for a, needed in needs(calls, policy, env).items() if not needed}
