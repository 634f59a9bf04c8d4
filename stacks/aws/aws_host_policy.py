"""The AWS host role's policy, readable without Pulumi: the stack attaches it to the host role
(sdcloud_aws_stack.py) and the tests give an IAM user exactly this policy and run the agent's
store against moto with that user's keys (tests/stacks/test_aws_host_policy.py), so that a call the
stack does not grant fails there as it would on AWS.

What the host's store calls need (AWS's "Actions, resources, and condition keys for Amazon S3"):
GetObject (GET, HEAD, ranged GETs, and the source of a CopyObject), PutObject (PUT, CopyObject's
destination, conditional PUTs with If-None-Match / If-Match, multipart create/upload/complete),
PutObjectTagging (the sdcloud-class tag that checkpoint and log uploads carry), DeleteObject
(DELETE and DeleteObjects, per key), AbortMultipartUpload (a cancelled upload), and ListBucket
(ListObjectsV2) held to the prefix. Nothing else: no host code lists parts, reads tags or calls EC2
(tests/stacks/test_authz_aws.py takes each action out in turn and shows a recorded host call refused).
"""

from __future__ import annotations

import json

OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:PutObjectTagging")


def role_policy_document(bucket: str, prefix: str) -> str:
    """The host role's policy: objects under `<prefix>/` of one bucket, and nothing else of S3."""
    objects = f"arn:aws:s3:::{bucket}/{prefix}/*"
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ObjectsUnderPrefix", "Effect": "Allow", "Action": list(OBJECT_ACTIONS), "Resource": [objects]},
            # Listing is a bucket action; the condition keeps it to keys under the prefix.
            {"Sid": "ListPrefix", "Effect": "Allow", "Action": ["s3:ListBucket"],
             "Resource": [f"arn:aws:s3:::{bucket}"],
             "Condition": {"StringLike": {"s3:prefix": [f"{prefix}/*", prefix]}}},
        ],
    }, indent=1)
