"""The cloud driver's CAM policy on Tencent Cloud: what the SCF function may do, and nothing more.

Kept apart from the stack program (no Pulumi import), so that tests judge the calls a controller
step makes against exactly this document (tests/stacks/test_stacks_driver.py).

The function takes controller steps (sdcloud/driver/unattended.py), so its role may do what a step does:
- the run bucket, under the stack's prefix only (COS action names:
  https://cloud.tencent.com/document/product/436/31923): read, write (the journal, the driver lease
  as create-only objects, the agent's config and wheel), delete (DELETE Multiple Objects needs
  DeleteMultipleObjects on the bucket and DeleteObject per key: product/436/8289), list under the prefix;
- CVM: what the Tencent provider calls on a step (launch with its price inquiry, describe, zones
  and their configurations for the zone order, terminate), TerminateInstances only on instances
  carrying the stack's tag (CAM authorization by tag, https://intl.cloud.tencent.com/document/product/598/47827);
- cam:PassRole for the host role only, which RunInstances hands to the instance (CamRoleName).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

try:
    from sdcloud.providers.tencent import TRAITS
    from sdcloud.providers.tencent.function import HANDLER
except ImportError:  # `pulumi up` from a checkout where sdcloud is not installed: the package beside stacks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from sdcloud.providers.tencent import TRAITS
    from sdcloud.providers.tencent.function import HANDLER

# The function's figures are the provider's own (sdcloud/providers/tencent/__init__.py TRAITS.function):
# the handler's margin and the cost report read the same copy. The timeout is below the timer's
# period: invocations never overlap. The runtime is SCF's Python3.10; the package carries the two
# 3.11 names the control plane uses (sdcloud/providers/tencent/function.py, docs/stacks.md).
FUNCTION = TRAITS.function
assert FUNCTION is not None
SCHEDULE_SECONDS = FUNCTION.schedule_seconds
# SCF timer triggers take seven fields: second minute hour day month weekday year
# (https://cloud.tencent.com/document/product/583/9708).
TIMER_CRON = f"0 */{SCHEDULE_SECONDS // 60} * * * * *"
FUNCTION_TIMEOUT = FUNCTION.timeout_seconds
FUNCTION_MEMORY_MB = FUNCTION.memory_mb
FUNCTION_RUNTIME = FUNCTION.runtime
FUNCTION_HANDLER = HANDLER  # the entry SCF loads (sdcloud/providers/tencent/function.py)
# Where the stack puts the function's package in its bucket: outside the run prefix, so that no
# role of the stack's may write it (the function's code is not the function's to change).
CODE_FOLDER = "sdcloud-driver-code"


def code_key(filename: str) -> str:
    """The package's key in the bucket. Its name's `+` (the version's local part, `<base>+<sha12>`)
    becomes `-`: COS reads a `+` in a key of a form or URL as a space, and SCF fetches the code by
    Code.CosObjectName, so a key without one is the same object for every reader."""
    return f"{CODE_FOLDER}/{filename.replace('+', '-')}"

# The S3 API operations the store sends to COS, and the COS actions each needs.
STORE_CALLS: dict[str, tuple[str, ...]] = {
    "GetObject": ("name/cos:GetObject",),
    "HeadObject": ("name/cos:HeadObject",),
    "PutObject": ("name/cos:PutObject",),
    "CopyObject": ("name/cos:GetObject", "name/cos:PutObjectCopy"),
    "DeleteObject": ("name/cos:DeleteObject",),
    "DeleteObjects": ("name/cos:DeleteMultipleObjects", "name/cos:DeleteObject"),
    "ListObjectsV2": ("name/cos:GetBucket",),
}
# Every action STORE_CALLS names on an object: a copy (CopyObject) needs PutObjectCopy beside GetObject.
OBJECT_ACTIONS = ("name/cos:GetObject", "name/cos:HeadObject", "name/cos:PutObject", "name/cos:PutObjectCopy",
                  "name/cos:DeleteObject")
# The CVM API actions the Tencent provider calls on a step's paths (sdcloud/providers/tencent/compute.py).
CVM_ACTIONS = ("name/cvm:RunInstances", "name/cvm:InquiryPriceRunInstances", "name/cvm:DescribeInstances",
               "name/cvm:DescribeZones", "name/cvm:DescribeZoneInstanceConfigInfos")


def assume_role_document() -> str:
    return json.dumps({"version": "2.0", "statement": [
        {"action": ["name/sts:AssumeRole"], "effect": "allow", "principal": {"service": ["scf.qcloud.com"]}}]})


def function_policy_document(region: str, app_id: str, bucket: str, prefix: str, owner_uin: str,
                             host_role_name: str, stack_tag: tuple[str, str]) -> str:
    """The SCF role's policy: the bucket prefix, a step's CVM calls, TerminateInstances on the stack's instances."""
    base = f"qcs::cos:{region}:uid/{app_id}:{bucket}"
    key, value = stack_tag
    return json.dumps({
        "version": "2.0",
        "statement": [
            {"effect": "allow", "action": list(OBJECT_ACTIONS), "resource": [f"{base}/{prefix}/*"]},
            {"effect": "allow", "action": ["name/cos:GetBucket"], "resource": [f"{base}/*"],
             "condition": {"string_like": {"cos:prefix": [f"{prefix}/*", prefix]}}},
            {"effect": "allow", "action": ["name/cos:DeleteMultipleObjects"], "resource": [f"{base}/*"]},
            # Describe and inquiry actions take no instance resource; RunInstances names the new one.
            {"effect": "allow", "action": list(CVM_ACTIONS), "resource": ["*"]},
            {"effect": "allow", "action": ["name/cvm:TerminateInstances"], "resource": ["*"],
             "condition": {"for_any_value:string_equal": {"qcs:resource_tag": [f"{key}&{value}"]}}},
            {"effect": "allow", "action": ["name/cam:PassRole"],
             "resource": [f"qcs::cam::uin/{owner_uin}:roleName/{host_role_name}"]},
        ],
    }, indent=1)
