"""The tests' IAM evaluator (tests/support/authz/authz_aws.py) on a negated condition operator whose key the
request does not carry: true, as IAM evaluates it (issue 46).

AWS's IAM User Guide, "IAM JSON policy elements: Condition operators"
(https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_condition_operators.html):
its example statement lets a principal tagged job-category=iamuser-admin manage access keys, and its
table says the key's absence is "No match" for StringEquals; the page's "Important" note says that
where the condition requires the key *not* to match (StringNotLike, ArnNotLike, ...) and the key is
absent, the condition is true. ...IfExists and Null are their own cases; the set operators are
judged on the values present (ForAnyValue needs one, ForAllValues holds on none).
"""

from __future__ import annotations

import pytest

from tests.support.authz.authz_aws import Request, decide

KEY = "aws:PrincipalTag/job-category"


def _policy(operator: str) -> dict:
    """The documentation's example statement, with the operator under test."""
    return {"Version": "2012-10-17", "Statement": {
        "Effect": "Allow", "Action": "iam:*AccessKey*", "Resource": "arn:aws:iam::111122223333:user/*",
        "Condition": {operator: {KEY: "iamuser-admin"}}}}


def _request(tag: str | None) -> Request:
    return Request("iam:CreateAccessKey", "arn:aws:iam::111122223333:user/alice", {KEY: tag} if tag else {})


@pytest.mark.parametrize("tag, allowed", [("iamuser-admin", True), ("dev", False), (None, False)])
def test_the_documentation_s_own_table_for_string_equals(tag, allowed):
    assert (decide(_policy("StringEquals"), _request(tag)) == "Allow") is allowed


@pytest.mark.parametrize("operator", ["StringNotEquals", "StringNotEqualsIgnoreCase", "StringNotLike",
                                      "ArnNotEquals", "ArnNotLike"])
def test_a_negated_operator_holds_when_the_key_is_absent(operator):
    assert decide(_policy(operator), _request(None)) == "Allow"
    assert decide(_policy(operator), _request("iamuser-admin")) == "ImplicitDeny"
    assert decide(_policy(operator), _request("dev")) == "Allow"


def test_the_set_operators_and_if_exists_keep_their_own_rules_for_an_absent_key():
    assert decide(_policy("ForAnyValue:StringNotEquals"), _request(None)) == "ImplicitDeny"
    assert decide(_policy("ForAllValues:StringNotEquals"), _request(None)) == "Allow"
    assert decide(_policy("StringEqualsIfExists"), _request(None)) == "Allow"
    deny = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "iam:*", "Resource": "*"},
        {"Effect": "Deny", "Action": "iam:*", "Resource": "*", "Condition": {"StringNotEquals": {KEY: "iamuser-admin"}}}]}
    assert decide(deny, _request(None)) == "ExplicitDeny"  # a Deny on "not admin" stops an untagged principal
