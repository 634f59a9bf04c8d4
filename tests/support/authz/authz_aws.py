"""An IAM policy evaluator for the tests: does an identity policy allow one authorization request?

Why our own: the maintained Python packages that read IAM policies do not evaluate a request against
one with its conditions. policy_sentry writes policies, parliament and policyuniverse lint and
expand them, and moto's evaluator (moto.iam.access_control.IAMPolicy) knows StringEquals only,
passes any other condition operator, and passes a condition whose key the request does not carry:
the grants this project depends on (`Null` on aws:RequestTag, StringLike on s3:prefix,
ec2:CreateAction, iam:PassedToService) would all pass whatever the request.

What it follows (IAM User Guide, "Policy evaluation logic" and "IAM JSON policy elements:
Condition operators", https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html,
.../reference_policies_elements_condition_operators.html), for one identity policy:
- an explicit Deny wins, then an Allow, else the request is denied (implicit deny);
- Action and NotAction match case-insensitively with `*` and `?`; Resource matches case-sensitively;
- every condition operator of a statement must hold, every key of an operator must hold, and a key
  holds when any of the policy's values matches (OR);
- a key the request does not carry fails every operator but `Null` (true when absent), the
  `...IfExists` forms and the negated ones (StringNotEquals, StringNotLike, ArnNotLike, ...: "If the
  policy condition requires that the key is not matched ... and the right key is not present, the
  condition is true", the operators page's "Important" note); `ForAnyValue:` / `ForAllValues:` take
  multi-valued keys (aws:TagKeys): absent, ForAllValues holds and ForAnyValue does not, negated or not;
- operators: String(Not)Equals(IgnoreCase), String(Not)Like, Arn(Not)Equals, Arn(Not)Like, Null, Bool.
An operator it does not know fails the statement: it grants nothing rather than everything.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Request:
    """One authorization request the cloud evaluates: an action on a resource with its context."""
    action: str
    resource: str
    context: dict = field(default_factory=dict, hash=False, compare=False)  # condition key -> str | list[str]
    why: str = ""      # which part of the call this request comes from
    source: str = ""   # the document that says the cloud evaluates it

    def __str__(self) -> str:
        ctx = ", ".join(f"{k}={v}" for k, v in sorted(self.context.items()))
        return f"{self.action} on {self.resource}" + (f" [{ctx}]" if ctx else "") + (f" ({self.why})" if self.why else "")


def _wild(pattern: str, value: str, ignore_case: bool = False) -> bool:
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, value, re.S | (re.I if ignore_case else 0)) is not None


def _listed(value) -> list:
    return value if isinstance(value, list) else [value]


_STRING_OPS = {
    "StringEquals": lambda want, have: want == have,
    "StringEqualsIgnoreCase": lambda want, have: want.lower() == have.lower(),
    "StringLike": lambda want, have: _wild(want, have),
    "ArnEquals": lambda want, have: want == have,
    "ArnLike": lambda want, have: _wild(want, have),
    "Bool": lambda want, have: str(want).lower() == str(have).lower(),
}
_NEGATED = {"StringNotEquals": "StringEquals", "StringNotEqualsIgnoreCase": "StringEqualsIgnoreCase",
            "StringNotLike": "StringLike", "ArnNotEquals": "ArnEquals", "ArnNotLike": "ArnLike"}


def _key_holds(operator: str, wanted, context: dict, key: str) -> bool:
    present = next((k for k in context if k.lower() == key.lower()), None)  # condition key names ignore case
    if operator == "Null":
        return any((str(w).lower() == "true") == (present is None) for w in _listed(wanted))
    qualifier, _, op = operator.rpartition(":")
    if_exists = op.endswith("IfExists")
    op = op.removesuffix("IfExists")
    if present is None:
        return if_exists or qualifier == "ForAllValues" or (not qualifier and op in _NEGATED)
    haves = [str(h) for h in _listed(context[present])]
    negated = op in _NEGATED
    test = _STRING_OPS.get(_NEGATED.get(op, op))
    if test is None:
        return False
    wants = [str(w) for w in _listed(wanted)]
    match = (lambda h: any(test(w, h) for w in wants)) if not negated else (lambda h: not any(test(w, h) for w in wants))
    if qualifier == "ForAllValues":
        return all(match(h) for h in haves)
    if qualifier == "ForAnyValue" or len(haves) == 1:
        return any(match(h) for h in haves)
    return False  # a multi-valued key needs a set operator


def _conditions_hold(condition: dict, context: dict) -> bool:
    return all(_key_holds(op, wanted, context, key) for op, keys in condition.items() for key, wanted in keys.items())


def _statement_applies(st: dict, req: Request) -> bool:
    if "Action" in st:
        if not any(_wild(a, req.action, ignore_case=True) for a in _listed(st["Action"])):
            return False
    elif any(_wild(a, req.action, ignore_case=True) for a in _listed(st.get("NotAction", []))):
        return False
    if "Resource" in st:
        if not any(_wild(r, req.resource) for r in _listed(st["Resource"])):
            return False
    elif any(_wild(r, req.resource) for r in _listed(st.get("NotResource", []))):
        return False
    return _conditions_hold(st.get("Condition", {}), req.context)


def decide(policy: dict | str, req: Request) -> str:
    """"Allow", "ExplicitDeny" or "ImplicitDeny" for one request under one identity policy."""
    doc = json.loads(policy) if isinstance(policy, str) else policy
    allowed = False
    for st in _listed(doc["Statement"]):
        if _statement_applies(st, req):
            if st["Effect"] == "Deny":
                return "ExplicitDeny"
            allowed = True
    return "Allow" if allowed else "ImplicitDeny"


def refused(policy: dict | str, requests: list[Request]) -> list[Request]:
    """The requests the policy does not allow."""
    return [r for r in requests if decide(policy, r) != "Allow"]


def without_action(policy: dict | str, action: str) -> dict:
    """The policy with one action taken out of every statement (a statement left with none goes)."""
    doc = json.loads(policy) if isinstance(policy, str) else json.loads(json.dumps(policy))
    kept = []
    for st in _listed(doc["Statement"]):
        st["Action"] = [a for a in _listed(st["Action"]) if a != action]
        if st["Action"]:
            kept.append(st)
    doc["Statement"] = kept
    return doc


def actions_of(policy: dict | str) -> list[str]:
    doc = json.loads(policy) if isinstance(policy, str) else policy
    return sorted({a for st in _listed(doc["Statement"]) for a in _listed(st["Action"])})
