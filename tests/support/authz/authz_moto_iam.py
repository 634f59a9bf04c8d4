"""moto's S3 server judging every request by the IAM policies of the key that signed it, as AWS does.

`enforced(url, bucket)` creates the bucket as the account owner, turns moto's IAM authorization on
for the whole process (its ThreadedMotoServer runs in it) and yields `keys_for(policy)`, which makes
an IAM user holding exactly that policy document and returns its keys: a host gets the host role's
policy (stacks/aws/aws_host_policy.py), the test's own store the owner's.

Two corrections to moto: it judges a DeleteObjects request against the bucket's ARN, where AWS
checks s3:DeleteObject on each key ("Actions, resources, and condition keys for Amazon S3"), so
DeleteObjects is authorized here once per key with moto's own authorizer (as in
tests/stacks/test_aws_host_policy.py); and from 5.2 it names the action a request needs after the
API operation (s3:HeadObject), where AWS checks the IAM action (s3:GetObject): `iam_actions_for_s3`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

REGION = "us-east-1"


def owner_policy(bucket: str) -> str:
    """What the user running sdcloud may do with the run's bucket here: everything (the controller's
    own grants are another test's subject)."""
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:*", "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]})


def per_key_delete_of(original: Callable) -> Callable:
    """moto's S3 POST handler, with a DeleteObjects request authorized once per key as AWS does."""

    def per_key_delete(self, request, bucket_name):
        self.path = self._get_path(request)
        if self.is_delete_keys():
            import xmltodict

            objects = xmltodict.parse(self.body, strip_whitespace=False)["Delete"].get("Object", [])
            self.data["Action"] = "DeleteObject"
            for obj in objects if isinstance(objects, list) else [objects]:
                self._authenticate_and_authorize_s3_action(bucket_name=bucket_name, key_name=obj["Key"])
            return self._bucket_response_delete_keys(bucket_name)
        return original(self, request, bucket_name)

    return per_key_delete


# The IAM action AWS checks for an S3 API operation, where the two names differ ("Policy actions for
# Amazon S3 API operations", docs.aws.amazon.com/AmazonS3/latest/API/API_Operations.html: each
# operation's "Permissions" section). moto from 5.2 judges a request by its operation's name
# (s3:HeadObject, s3:ListObjectsV2, s3:UploadPart), which no policy can grant; earlier releases
# judged it by the IAM action. Judged by these names, a policy means here what it means on AWS.
S3_IAM_ACTION_OF_OPERATION = {
    "HeadObject": "GetObject",
    "HeadBucket": "ListBucket",
    "ListObjects": "ListBucket",
    "ListObjectsV2": "ListBucket",
    "ListObjectVersions": "ListBucketVersions",
    "CreateMultipartUpload": "PutObject",
    "UploadPart": "PutObject",
    "UploadPartCopy": "PutObject",
    "CompleteMultipartUpload": "PutObject",
    "CopyObject": "PutObject",
    "ListParts": "ListMultipartUploadParts",
    "ListMultipartUploads": "ListBucketMultipartUploads",
    "DeleteObjects": "DeleteObject",
}


def _judged_as_aws_does(original: Callable) -> Callable:
    """moto's S3 authorization request, made with the IAM action AWS checks for the operation."""

    def init(self, *args, **kwargs):
        action = kwargs.get("action")
        if isinstance(action, str):
            kwargs["action"] = S3_IAM_ACTION_OF_OPERATION.get(action, action)
        original(self, *args, **kwargs)

    return init


@contextmanager
def iam_actions_for_s3() -> Iterator[None]:
    """moto's S3 judging each request by the IAM action AWS checks (S3_IAM_ACTION_OF_OPERATION);
    only the authorization sees the IAM name, the request is still served as its operation."""
    from moto.iam.access_control import S3IAMRequest

    own = "__init__" in vars(S3IAMRequest)
    original = S3IAMRequest.__init__
    S3IAMRequest.__init__ = _judged_as_aws_does(original)
    try:
        yield
    finally:
        if own:
            S3IAMRequest.__init__ = original
        else:
            del S3IAMRequest.__init__


@pytest.fixture(autouse=True)  # for the modules that import it: each of their tests
def fresh_boto3_default_session(monkeypatch):
    """The store's S3 client comes from boto3's default session, which keeps the keys it first
    found: a test that signed with an IAM user's keys must not leave them to the next test."""
    yield
    monkeypatch.undo()
    import boto3

    boto3.DEFAULT_SESSION = None


@contextmanager
def enforced(url: str, bucket: str) -> Iterator[Callable[[str], tuple[str, str]]]:
    import boto3
    from moto.core.authorization import disable_iam_authentication, enable_iam_authentication
    from moto.s3.responses import S3Response

    original = S3Response._bucket_response_post
    per_key_delete = per_key_delete_of(original)

    admin = boto3.Session(aws_access_key_id="admin", aws_secret_access_key="admin", region_name=REGION)
    S3Response._bucket_response_post = per_key_delete
    try:
        with enable_iam_authentication(), iam_actions_for_s3():
            with disable_iam_authentication():  # the setup is the account owner's
                s3 = admin.client("s3", endpoint_url=url)
                if bucket not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
                    s3.create_bucket(Bucket=bucket)
            iam = admin.client("iam", endpoint_url=url)

            def keys_for(policy: str) -> tuple[str, str]:
                name = f"u-{uuid.uuid4().hex[:10]}"  # moto's accounts last the file
                with disable_iam_authentication():
                    iam.create_user(UserName=name)
                    iam.put_user_policy(UserName=name, PolicyName="policy", PolicyDocument=policy)
                    key = iam.create_access_key(UserName=name)["AccessKey"]
                return key["AccessKeyId"], key["SecretAccessKey"]

            yield keys_for
    finally:
        S3Response._bucket_response_post = original
