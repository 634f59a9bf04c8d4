"""The cloud driver's IAM policies on AWS: what the Lambda function may do, and what the scheduler may.

Kept apart from the stack program (no Pulumi import), so that tests judge the API calls a
controller step makes against exactly these documents (tests/stacks/test_stacks_driver.py).

The function takes controller steps (sdcloud/driver/unattended.py), so its role may do what a step
does and nothing more:
- the run bucket, under the stack's prefix only: read and write the journal, the driver lease
  (conditional PUTs: If-None-Match / If-Match need s3:PutObject only), the agent's config and
  wheel, status and events (no step writes the checkpoints or logs that the store tags, so no
  s3:PutObjectTagging); delete (lease release, the active index); list under the prefix;
- EC2: launch (RunInstances, with tags on create, from the stack's launch template), describe
  (instances, zones, spot prices for the zone order and the ledger, the image's root device when
  no template), and terminate, on instances that carry `sdcloud:run` only; the AMI's public SSM
  parameter when the stack gave no image;
- iam:PassRole for the host role, to EC2 only (RunInstances hands it to the instance);
- CloudWatch Logs for the function's own log group (the platform writes the function's output
  with the role; no step calls it).
IAM action names: https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2.html
and .../list_amazons3.html; tag conditions on EC2:
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/supported-iam-actions-tagging.html
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

try:
    from sdcloud.providers.aws import TRAITS
    from sdcloud.providers.aws.function import HANDLER
except ImportError:  # `pulumi up` from a checkout where sdcloud is not installed: the package beside stacks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from sdcloud.providers.aws import TRAITS
    from sdcloud.providers.aws.function import HANDLER

RUN_TAG = "sdcloud:run"  # sdcloud/providers/base.py TAG_RUN: every instance a run launches carries it
# The resource types the host template's tag specifications tag at every launch (the stack reads
# this list), and therefore the types the function's ec2:CreateTags grant must cover.
LAUNCH_TAGGED = ("instance", "volume", "network-interface")
# The function's figures are the provider's own (sdcloud/providers/aws/__init__.py TRAITS.function):
# the handler's margin and the cost report read the same copy. Its timeout is below the schedule's
# period, so that two invocations never overlap (the lease would refuse the second anyway), and long
# enough for a few polls of a step after the journal is read back.
FUNCTION = TRAITS.function
assert FUNCTION is not None
SCHEDULE_SECONDS = FUNCTION.schedule_seconds
SCHEDULE_RATE = f"rate({SCHEDULE_SECONDS // 60} minutes)"
FUNCTION_TIMEOUT = FUNCTION.timeout_seconds
FUNCTION_MEMORY_MB = FUNCTION.memory_mb
FUNCTION_RUNTIME = FUNCTION.runtime
FUNCTION_HANDLER = HANDLER  # the platform's own word for it (sdcloud/providers/aws/function.py)
SCHEDULE_INPUT = {"sdcloud": "drive"}
AMI_PARAMETERS = "parameter/aws/service/deeplearning/*"
PLACEMENT_GROUPS = "sdcloud-*"  # sdcloud/providers/aws/group.py names each after its launch token

# Each API operation a controller step sends (boto3's service and operation names) and the IAM
# actions it needs. The test maps recorded calls through this table and compares with the policy.
STEP_CALLS: dict[tuple[str, str], tuple[str, ...]] = {
    ("s3", "GetObject"): ("s3:GetObject",),
    ("s3", "HeadObject"): ("s3:GetObject",),
    ("s3", "PutObject"): ("s3:PutObject",),
    ("s3", "CopyObject"): ("s3:GetObject", "s3:PutObject"),
    ("s3", "DeleteObject"): ("s3:DeleteObject",),
    ("s3", "DeleteObjects"): ("s3:DeleteObject",),
    ("s3", "ListObjectsV2"): ("s3:ListBucket",),
    # A spot launch in an account that never launched spot makes AWS create the Spot service-linked
    # role with the caller's rights (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/service-linked-roles-spot-instance-requests.html).
    ("ec2", "RunInstances"): ("ec2:RunInstances", "ec2:CreateTags", "iam:PassRole", "iam:CreateServiceLinkedRole"),
    ("ec2", "DescribeInstances"): ("ec2:DescribeInstances",),
    ("ec2", "DescribeAvailabilityZones"): ("ec2:DescribeAvailabilityZones",),
    ("ec2", "DescribeSpotPriceHistory"): ("ec2:DescribeSpotPriceHistory",),
    ("ec2", "DescribeImages"): ("ec2:DescribeImages",),
    ("ec2", "TerminateInstances"): ("ec2:TerminateInstances",),
    # A multi-node group's cluster placement group (sdcloud/providers/aws/group.py), made tagged, then deleted.
    ("ec2", "CreatePlacementGroup"): ("ec2:CreatePlacementGroup", "ec2:CreateTags"),
    ("ec2", "DeletePlacementGroup"): ("ec2:DeletePlacementGroup",),
    # ...and the run's earlier placement groups found (still held when their group ended) before its next launches.
    ("ec2", "DescribePlacementGroups"): ("ec2:DescribePlacementGroups",),
    ("ssm", "GetParameter"): ("ssm:GetParameter",),
}
# Written by the platform with the function's role, not by a step.
LOG_ACTIONS = ("logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents")


def step_actions() -> set[str]:
    return {a for actions in STEP_CALLS.values() for a in actions}


def assume_role_policy(service: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]})


def function_policy_document(bucket: str, prefix: str, account_id: str, host_role_arn: str, log_group_arn: str) -> str:
    """The function role's policy: a controller step's calls, on the run bucket's prefix and sdcloud's instances."""
    instances = f"arn:aws:ec2:*:{account_id}:instance/*"
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "RunObjects", "Effect": "Allow",
             "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
             "Resource": [f"arn:aws:s3:::{bucket}/{prefix}/*"]},
            {"Sid": "ListPrefix", "Effect": "Allow", "Action": ["s3:ListBucket"],
             "Resource": [f"arn:aws:s3:::{bucket}"],
             "Condition": {"StringLike": {"s3:prefix": [f"{prefix}/*", prefix]}}},
            # The instance a step launches must carry the run tag in the request itself.
            {"Sid": "LaunchTaggedInstances", "Effect": "Allow", "Action": ["ec2:RunInstances"],
             "Resource": [instances], "Condition": {"Null": {f"aws:RequestTag/{RUN_TAG}": "false"}}},
            # The other resources RunInstances names: the stack's template, subnet, group, image, key, disks.
            {"Sid": "LaunchFrom", "Effect": "Allow", "Action": ["ec2:RunInstances"],
             "Resource": [f"arn:aws:ec2:*:{account_id}:{kind}/*" for kind in
                          ("launch-template", "subnet", "security-group", "network-interface", "volume", "key-pair",
                           "placement-group")]
             + ["arn:aws:ec2:*::image/*"]},
            # Tags only as part of the launch (no retagging someone else's instance into sdcloud's).
            # EC2 checks ec2:CreateTags for every resource type a launch tags, those the launch
            # template's tag specifications tag included (EC2 User Guide, "Grant permission to tag
            # Amazon EC2 resources during creation"), so the grant covers each of LAUNCH_TAGGED.
            {"Sid": "TagOnLaunch", "Effect": "Allow", "Action": ["ec2:CreateTags"],
             "Resource": [f"arn:aws:ec2:*:{account_id}:{kind}/*" for kind in LAUNCH_TAGGED],
             "Condition": {"StringEquals": {"ec2:CreateAction": "RunInstances"}}},
            {"Sid": "EndSdcloudInstances", "Effect": "Allow", "Action": ["ec2:TerminateInstances"],
             "Resource": [instances], "Condition": {"Null": {f"aws:ResourceTag/{RUN_TAG}": "false"}}},
            # A multi-node group's cluster placement group: sdcloud's own names only, tagged with the run
            # when made (the tag is checked as ec2:CreateTags with the CreatePlacementGroup action).
            {"Sid": "GroupPlacement", "Effect": "Allow", "Action": ["ec2:CreatePlacementGroup", "ec2:DeletePlacementGroup"],
             "Resource": [f"arn:aws:ec2:*:{account_id}:placement-group/{PLACEMENT_GROUPS}"]},
            {"Sid": "TagPlacementGroup", "Effect": "Allow", "Action": ["ec2:CreateTags"],
             "Resource": [f"arn:aws:ec2:*:{account_id}:placement-group/{PLACEMENT_GROUPS}"],
             "Condition": {"StringEquals": {"ec2:CreateAction": "CreatePlacementGroup"}}},
            # Describe actions take no resource ARN; read-only.
            {"Sid": "Describe", "Effect": "Allow",
             "Action": ["ec2:DescribeInstances", "ec2:DescribeAvailabilityZones", "ec2:DescribeSpotPriceHistory",
                        "ec2:DescribeImages", "ec2:DescribePlacementGroups"],
             "Resource": "*"},
            {"Sid": "ImageParameter", "Effect": "Allow", "Action": ["ssm:GetParameter"],
             "Resource": [f"arn:aws:ssm:*::{AMI_PARAMETERS}"]},
            {"Sid": "PassHostRole", "Effect": "Allow", "Action": ["iam:PassRole"], "Resource": [host_role_arn],
             "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}},
            # Only Spot's own service-linked role, which the first spot launch of an account creates.
            {"Sid": "SpotServiceLinkedRole", "Effect": "Allow", "Action": ["iam:CreateServiceLinkedRole"],
             "Resource": [f"arn:aws:iam::{account_id}:role/aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot"],
             "Condition": {"StringLike": {"iam:AWSServiceName": "spot.amazonaws.com"}}},
            {"Sid": "OwnLogs", "Effect": "Allow", "Action": list(LOG_ACTIONS),
             "Resource": [log_group_arn, f"{log_group_arn}:*"]},
        ],
    }, indent=1)


def scheduler_policy_document(function_arn: str) -> str:
    """The schedule's role: invoke the driver function, nothing else."""
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Sid": "InvokeDriver", "Effect": "Allow", "Action": ["lambda:InvokeFunction"],
         "Resource": [function_arn, f"{function_arn}:*"]}]}, indent=1)
