"""Records the AWS API calls code makes in a test, and judges them against the cloud driver's policy.

Use it around the cloud driver's handler in any moto test: `calls = record_aws_calls(monkeypatch)`,
run the handler, then `assert_allowed(calls, policy, bucket, prefix)` with the policy document the
stack declares (stacks/aws/driver_policy.function_policy_document). Every call must be one the
policy table knows (driver_policy.STEP_CALLS), its actions granted, its S3 keys under the prefix
and its launches tagged `sdcloud:run`.
"""

from __future__ import annotations


from tests.support.harness_stacks import stack_module

driver_policy = stack_module("aws", "driver_policy")


def record_aws_calls(monkeypatch) -> list[tuple[str, str, dict]]:
    """(service, operation, params) of every botocore request from now on, in this process."""
    import botocore.client

    calls: list[tuple[str, str, dict]] = []
    original = botocore.client.BaseClient._make_api_call

    def recording(self, operation_name, api_params):
        calls.append((self.meta.service_model.endpoint_prefix, operation_name, dict(api_params)))
        return original(self, operation_name, api_params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recording)
    return calls


def granted_actions(policy: dict) -> set[str]:
    out: set[str] = set()
    for st in policy["Statement"]:
        out |= set(st["Action"] if isinstance(st["Action"], list) else [st["Action"]])
    return out


def needed_actions(calls: list[tuple[str, str, dict]]) -> set[str]:
    unmapped = sorted({(svc, op) for svc, op, _ in calls} - set(driver_policy.STEP_CALLS))
    assert not unmapped, f"calls the driver's policy table does not know: {unmapped}"
    return {a for svc, op, _ in calls for a in driver_policy.STEP_CALLS[(svc, op)]}


def assert_allowed(calls: list[tuple[str, str, dict]], policy: dict, bucket: str, prefix: str) -> None:
    missing = needed_actions(calls) - granted_actions(policy)
    assert not missing, f"the driver's role lacks {sorted(missing)}"
    for svc, op, params in calls:
        if svc == "s3":
            assert params["Bucket"] == bucket, (op, params["Bucket"])
            keys = ([o["Key"] for o in params["Delete"]["Objects"]] if op == "DeleteObjects"
                    else [params["Prefix"]] if op == "ListObjectsV2" else [params["Key"]])
            assert all(k.startswith(f"{prefix}/") for k in keys), (op, keys)
        if (svc, op) == ("ec2", "RunInstances"):
            specs = params["TagSpecifications"]
            tagged = {t["Key"] for spec in specs for t in spec["Tags"] if spec["ResourceType"] == "instance"}
            assert driver_policy.RUN_TAG in tagged, "a launch without the run tag is refused by the policy"
            assert {spec["ResourceType"] for spec in specs} <= {"instance", "volume"}
        if (svc, op) == ("ssm", "GetParameter"):
            assert params["Name"].startswith("/aws/service/deeplearning/"), params["Name"]
