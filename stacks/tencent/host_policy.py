"""The CVM role's CAM policy: what a host may do in the run bucket, and nothing more.

Kept apart from the stack program (no Pulumi import), so that the tests' COS layer can judge every
request a host sends against exactly this document (tests/support/authz/authz_cam.py).

Each action is one the host code calls (COS action names: https://cloud.tencent.com/document/product/436/31923):
- PutObject, GetObject, HeadObject: the agent's store, the boot's s3lite, the batch worker;
- PutObjectCopy: every cache write is put `.part`, copy, delete (product/436/10881 names the copy's
  action); UploadPartCopy: boto3 copies an object of 8 MiB and more in parts (product/436/8287);
- DeleteObject, DeleteMultipleObjects: the store deletes with DELETE Multiple Objects, which needs
  both, DeleteObject checked per key (product/436/8289);
- InitiateMultipartUpload, UploadPart, CompleteMultipartUpload, AbortMultipartUpload: uploads over
  the part size (and their clean-up when one fails);
- GetBucket: listing, held to keys under the prefix by its condition.
No tagging actions: the store tags objects on AWS only (COS lifecycle rules cannot filter on tags).
"""

from __future__ import annotations

import json

OBJECT_ACTIONS = (
    "name/cos:GetObject", "name/cos:HeadObject", "name/cos:PutObject", "name/cos:PutObjectCopy",
    "name/cos:DeleteObject",
    "name/cos:InitiateMultipartUpload", "name/cos:UploadPart", "name/cos:UploadPartCopy",
    "name/cos:CompleteMultipartUpload", "name/cos:AbortMultipartUpload",
)


def role_policy_document(region: str, app_id: str, bucket: str, prefix: str) -> str:
    """The CVM role's policy: objects under `<prefix>/` of one COS bucket, and nothing else."""
    base = f"qcs::cos:{region}:uid/{app_id}:{bucket}"
    return json.dumps({
        "version": "2.0",
        "statement": [
            {"effect": "allow", "action": list(OBJECT_ACTIONS), "resource": [f"{base}/{prefix}/*"]},
            # Listing is a bucket action; the condition keeps it to keys under the prefix.
            {"effect": "allow", "action": ["name/cos:GetBucket"], "resource": [f"{base}/*"],
             "condition": {"string_like": {"cos:prefix": [f"{prefix}/*", prefix]}}},
            # A batch delete is a bucket action too; each key in it is checked for DeleteObject above.
            {"effect": "allow", "action": ["name/cos:DeleteMultipleObjects"], "resource": [f"{base}/*"]},
        ],
    }, indent=1)


def self_end_policy_document(stack_tag: tuple[str, str]) -> str:
    """The CVM role's second policy: TerminateInstances on instances that carry the stack's tag only.

    A host whose work is over and whose controller is gone ends itself with its own
    TerminateInstances (docs/host-agent.md, "Self-end"). The tag condition is CAM's authorization by
    tag (https://intl.cloud.tencent.com/document/product/598/47827): `qcs:resource_tag` holds the
    resource's tags as `key&value`, so the role cannot end any other instance of the account.
    """
    key, value = stack_tag
    return json.dumps({
        "version": "2.0",
        "statement": [
            {"effect": "allow", "action": ["name/cvm:TerminateInstances"], "resource": ["*"],
             "condition": {"for_any_value:string_equal": {"qcs:resource_tag": [f"{key}&{value}"]}}},
        ],
    }, indent=1)
