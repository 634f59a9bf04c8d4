"""What the clouds evaluate for each API call sdcloud makes, as data: one recorded call becomes the
authorization requests the cloud checks, each citing the document that says so.

A call is not one action. EC2 authorizes RunInstances once per resource type it creates or uses,
ec2:CreateTags for every type the request or its launch template tags, iam:PassRole for the
instance profile's role, and the Spot service-linked role on an account's first spot launch; S3
checks a copy's source and destination, each key of a batch delete, and the tagging a PUT carries;
CVM checks cam:PassRole for CamRoleName and the instance's tags on TerminateInstances. A call the
table does not know raises KeyError: the table grows with the code, never silently.

AWS_TABLE and COS_TABLE map (service, operation) to (expander, source); `expand_aws` and `cos_needs`
apply them; `cvm_needs` does the CVM actions (the Tencent fake asks it on every call).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from tests.support.authz.authz_aws import Request
from tests.support.authz.authz_cam import Need

EC2_TAGGING = ("EC2 User Guide, 'Grant permission to tag Amazon EC2 resources during creation' "
               "(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/supported-iam-actions-tagging.html): "
               "ec2:CreateTags is evaluated for each resource type the request or its launch template tags")
EC2_RUN = ("EC2 User Guide, example policies, 'Launch instances (RunInstances)' "
           "(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ExamplePolicies_EC2.html#iam-example-runinstances): "
           "RunInstances is evaluated on the instance, volume, network interface, subnet, security group, image, "
           "key pair and launch template it uses; the spot-instances-request only when the launch tags it")
PASS_ROLE = ("IAM User Guide, 'Grant a user permissions to pass a role to an AWS service' "
             "(https://docs.aws.amazon.com/IAM/latest/UserGuide/id_roles_use_passrole.html), with iam:PassedToService")
SPOT_SLR = ("EC2 User Guide, 'Service-linked role for Spot Instances' "
            "(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/service-linked-roles-spot-instance-requests.html): "
            "the first spot launch of an account creates AWSServiceRoleForEC2Spot with the caller's rights")
EC2_ACTIONS = ("Service Authorization Reference, Amazon EC2 "
               "(https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2.html)")
S3_ACTIONS = ("Service Authorization Reference, Amazon S3 "
              "(https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazons3.html)")
S3_TAGGING = "S3 API Reference, PutObject: a request with x-amz-tagging needs s3:PutObjectTagging too"
S3_COPY = "S3 API Reference, CopyObject / UploadPartCopy: s3:GetObject on the source, s3:PutObject on the destination"
S3_DELETE_MANY = "S3 API Reference, DeleteObjects: s3:DeleteObject on each key"
S3_LIST = "S3 User Guide, bucket policy examples: s3:ListBucket with the s3:prefix condition key"
SSM_ACTIONS = ("Service Authorization Reference, AWS Systems Manager "
               "(https://docs.aws.amazon.com/service-authorization/latest/reference/list_awssystemsmanager.html)")
STS_IDENTITY = "STS API Reference, GetCallerIdentity: no permissions are required"
CVM_TAGS = ("CAM, 'Authorization by Tag' (https://intl.cloud.tencent.com/document/product/598/47827): "
            "qcs:resource_tag holds an instance's tags as key&value")
CVM_PASS_ROLE = ("CVM API, RunInstances, CamRoleName (https://www.tencentcloud.com/document/api/213/15730): "
                 "the caller needs cam:PassRole on the role (else AuthFailure.CamRoleNameAuthenticateFailed)")
CVM_API = ("CAM, 'CAM-enabled API' (https://www.tencentcloud.com/document/product/598/32228): describe and "
           "inquiry actions are operation-level (resource *)")
COS_ACTIONS = "COS, 'CAM-enabled actions' (https://cloud.tencent.com/document/product/436/31923)"
COS_COPY = "COS PUT Object - Copy (product/436/10881), Upload Part - Copy (product/436/8287): GetObject on the source"
COS_DELETE_MANY = "COS DELETE Multiple Objects (product/436/8289): DeleteMultipleObjects, then DeleteObject per key"


@dataclass
class AwsEnv:
    """What AWS knows beyond the call: the account, the stack's launch template, instances' tags."""
    account: str
    region: str
    template_tagged: tuple[str, ...] = ()   # resource types the stack's template tags at every launch
    template_tags: dict = field(default_factory=dict)
    template_role_arn: str = ""             # the role of the template's instance profile
    profile_roles: dict = field(default_factory=dict)  # instance profile ARN or name -> role ARN
    instance_tags: dict = field(default_factory=dict)  # instance id -> tags (filled from launches)


def _tag_context(tags: dict) -> dict:
    ctx = {f"aws:RequestTag/{k}": v for k, v in tags.items()}
    if tags:
        ctx["aws:TagKeys"] = sorted(tags)
    return ctx


def _run_instances(p: dict, env: AwsEnv) -> list[Request]:
    arn = lambda kind, rid="*": f"arn:aws:ec2:{env.region}:{env.account}:{kind}/{rid}"  # noqa: E731
    tagged: dict[str, dict] = {kind: dict(env.template_tags) for kind in env.template_tagged} if p.get("LaunchTemplate") else {}
    for spec in p.get("TagSpecifications") or []:
        tagged.setdefault(spec["ResourceType"], {}).update({t["Key"]: t["Value"] for t in spec["Tags"]})
    spot = (p.get("InstanceMarketOptions") or {}).get("MarketType") == "spot"
    market = {"ec2:InstanceMarketType": "spot" if spot else "on-demand"}
    out = [Request("ec2:RunInstances", arn(kind), {**market, **_tag_context(tagged.get(kind, {}))},
                   f"RunInstances uses a {kind}", EC2_RUN) for kind in ("instance", "volume", "network-interface")]
    out.append(Request("ec2:RunInstances", arn("subnet", p.get("SubnetId", "*")), {}, "RunInstances uses a subnet", EC2_RUN))
    for sg in p.get("SecurityGroupIds") or ["*"]:
        out.append(Request("ec2:RunInstances", arn("security-group", sg), {}, "RunInstances uses a security group", EC2_RUN))
    out.append(Request("ec2:RunInstances", f"arn:aws:ec2:{env.region}::image/{p.get('ImageId', '*')}", {},
                       "RunInstances uses an image", EC2_RUN))
    if p.get("KeyName"):
        out.append(Request("ec2:RunInstances", arn("key-pair", p["KeyName"]), {}, "RunInstances names a key pair", EC2_RUN))
    if (p.get("Placement") or {}).get("GroupName"):
        out.append(Request("ec2:RunInstances", arn("placement-group", p["Placement"]["GroupName"]), {},
                           "RunInstances places the instance in a placement group", EC2_RUN))
    if p.get("LaunchTemplate"):
        lt = p["LaunchTemplate"].get("LaunchTemplateId") or "*"
        out.append(Request("ec2:RunInstances", arn("launch-template", lt), {}, "RunInstances uses a launch template", EC2_RUN))
    if "spot-instances-request" in tagged:
        out.append(Request("ec2:RunInstances", arn("spot-instances-request"), _tag_context(tagged["spot-instances-request"]),
                           "RunInstances creates a tagged spot request", EC2_RUN))
    for kind, tags in sorted(tagged.items()):
        origin = ("the request" if any(s["ResourceType"] == kind for s in p.get("TagSpecifications") or [])
                  else "the launch template")
        out.append(Request("ec2:CreateTags", arn(kind), {"ec2:CreateAction": "RunInstances", **_tag_context(tags)},
                           f"{origin} tags the {kind}", EC2_TAGGING))
    profile = (p.get("IamInstanceProfile") or {})
    role = env.profile_roles.get(profile.get("Arn") or profile.get("Name") or "") or (
        env.template_role_arn if (profile or p.get("LaunchTemplate")) else "")
    if role:
        out.append(Request("iam:PassRole", role, {"iam:PassedToService": "ec2.amazonaws.com"},
                           "RunInstances hands the instance profile's role to EC2", PASS_ROLE))
    if spot:
        out.append(Request("iam:CreateServiceLinkedRole",
                           f"arn:aws:iam::{env.account}:role/aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot",
                           {"iam:AWSServiceName": "spot.amazonaws.com"}, "an account's first spot launch", SPOT_SLR))
    return out


def _create_placement_group(p: dict, env: AwsEnv) -> list[Request]:
    arn = f"arn:aws:ec2:{env.region}:{env.account}:placement-group/{p['GroupName']}"
    out = [Request("ec2:CreatePlacementGroup", arn, {}, "a cluster placement group", EC2_ACTIONS)]
    for spec in p.get("TagSpecifications") or []:
        tags = {t["Key"]: t["Value"] for t in spec["Tags"]}
        out.append(Request("ec2:CreateTags", arn, {"ec2:CreateAction": "CreatePlacementGroup", **_tag_context(tags)},
                           "the request tags the placement group", EC2_TAGGING))
    return out


def _terminate(p: dict, env: AwsEnv) -> list[Request]:
    return [Request("ec2:TerminateInstances", f"arn:aws:ec2:{env.region}:{env.account}:instance/{iid}",
                    {f"aws:ResourceTag/{k}": v for k, v in env.instance_tags.get(iid, {}).items()},
                    f"ends {iid}", EC2_ACTIONS) for iid in p["InstanceIds"]]


def _obj(p: dict, key: str | None = None) -> str:
    return f"arn:aws:s3:::{p['Bucket']}/{p['Key'] if key is None else key}"


def _copy_source(p: dict) -> str:
    src = p["CopySource"]
    if isinstance(src, dict):
        return f"arn:aws:s3:::{src['Bucket']}/{src['Key']}"
    return "arn:aws:s3:::" + src.lstrip("/").split("?versionId=")[0]


def _put(p: dict, _env: AwsEnv) -> list[Request]:
    out = [Request("s3:PutObject", _obj(p), {}, "PUT", S3_ACTIONS)]
    if p.get("Tagging"):
        out.append(Request("s3:PutObjectTagging", _obj(p), {}, "the PUT carries x-amz-tagging", S3_TAGGING))
    return out


def _copy(p: dict, env: AwsEnv) -> list[Request]:
    return [Request("s3:GetObject", _copy_source(p), {}, "the copy's source", S3_COPY),
            *_put(p, env)[:1 if p.get("TaggingDirective") != "REPLACE" else 2]]


def _list(p: dict, _env: AwsEnv) -> list[Request]:
    ctx = {"s3:prefix": p["Prefix"]} if "Prefix" in p else {}
    return [Request("s3:ListBucket", f"arn:aws:s3:::{p['Bucket']}", ctx, "list", S3_LIST)]


def _one(action: str, source: str, resource: Callable[[dict, AwsEnv], str] = lambda p, e: "*") -> Callable:
    return lambda p, env: [Request(action, resource(p, env), {}, action.split(":")[1], source)]


AWS_TABLE: dict[tuple[str, str], tuple[Callable[[dict, AwsEnv], list[Request]], str]] = {
    ("ec2", "RunInstances"): (_run_instances, EC2_RUN),
    ("ec2", "TerminateInstances"): (_terminate, EC2_ACTIONS),
    ("ec2", "CreatePlacementGroup"): (_create_placement_group, EC2_TAGGING),
    ("ec2", "DeletePlacementGroup"): (_one("ec2:DeletePlacementGroup", EC2_ACTIONS, lambda p, e:
                                           f"arn:aws:ec2:{e.region}:{e.account}:placement-group/{p['GroupName']}"),
                                      EC2_ACTIONS),
    **{("ec2", op): (_one(f"ec2:{op}", EC2_ACTIONS), EC2_ACTIONS) for op in (
        "DescribeInstances", "DescribeAvailabilityZones", "DescribeSpotPriceHistory", "DescribeImages",
        "DescribeInstanceTypes", "DescribeInstanceTypeOfferings", "DescribeRegions", "DescribeTags",
        "DescribePlacementGroups")},
    ("ssm", "GetParameter"): (_one("ssm:GetParameter", SSM_ACTIONS,
                                   lambda p, e: f"arn:aws:ssm:{e.region}::parameter{p['Name']}"), SSM_ACTIONS),
    ("sts", "GetCallerIdentity"): (lambda p, e: [], STS_IDENTITY),
    ("s3", "GetObject"): (_one("s3:GetObject", S3_ACTIONS, lambda p, e: _obj(p)), S3_ACTIONS),
    ("s3", "HeadObject"): (_one("s3:GetObject", S3_ACTIONS, lambda p, e: _obj(p)), S3_ACTIONS),
    ("s3", "PutObject"): (_put, S3_TAGGING),
    ("s3", "CreateMultipartUpload"): (_put, S3_TAGGING),
    ("s3", "UploadPart"): (_one("s3:PutObject", S3_ACTIONS, lambda p, e: _obj(p)), S3_ACTIONS),
    ("s3", "CompleteMultipartUpload"): (_one("s3:PutObject", S3_ACTIONS, lambda p, e: _obj(p)), S3_ACTIONS),
    ("s3", "AbortMultipartUpload"): (_one("s3:AbortMultipartUpload", S3_ACTIONS, lambda p, e: _obj(p)), S3_ACTIONS),
    ("s3", "ListParts"): (_one("s3:ListMultipartUploadParts", S3_ACTIONS, lambda p, e: _obj(p)), S3_ACTIONS),
    ("s3", "CopyObject"): (_copy, S3_COPY),
    ("s3", "UploadPartCopy"): (lambda p, e: _copy(p, e)[:2], S3_COPY),
    ("s3", "DeleteObject"): (_one("s3:DeleteObject", S3_ACTIONS, lambda p, e: _obj(p)), S3_ACTIONS),
    ("s3", "DeleteObjects"): (lambda p, e: [Request("s3:DeleteObject", _obj(p, o["Key"]), {}, "a key of a batch delete",
                                                    S3_DELETE_MANY) for o in p["Delete"]["Objects"]], S3_DELETE_MANY),
    ("s3", "ListObjectsV2"): (_list, S3_LIST),
    ("s3", "ListObjects"): (_list, S3_LIST),
    ("s3", "HeadBucket"): (_one("s3:ListBucket", S3_ACTIONS, lambda p, e: f"arn:aws:s3:::{p['Bucket']}"), S3_ACTIONS),
    ("s3", "GetObjectTagging"): (_one("s3:GetObjectTagging", S3_ACTIONS, lambda p, e: _obj(p)), S3_ACTIONS),
    ("s3", "PutObjectTagging"): (_one("s3:PutObjectTagging", S3_ACTIONS, lambda p, e: _obj(p)), S3_ACTIONS),
}


def expand_aws(service: str, op: str, params: dict, env: AwsEnv, result: dict | None = None) -> list[Request]:
    """The requests AWS evaluates for one call; a launch's instances' tags are kept for their end."""
    expander, _source = AWS_TABLE[(service, op)]
    out = expander(params, env)
    if (service, op) == ("ec2", "RunInstances"):
        tags = dict(env.template_tags) if params.get("LaunchTemplate") and "instance" in env.template_tagged else {}
        for spec in params.get("TagSpecifications") or []:
            if spec["ResourceType"] == "instance":
                tags.update({t["Key"]: t["Value"] for t in spec["Tags"]})
        for iid in (result or {}).get("InstanceIds", []):
            env.instance_tags[iid] = tags
    return out


# ---- Tencent Cloud ----------------------------------------------------------------------------------

def cvm_needs(action: str, region: str, owner_uin: str, params: dict, instance_tags: dict[str, dict],
              template: dict | None = None) -> list[tuple[Need, str]]:
    """(need, source) pairs CAM evaluates for one CVM API call. `instance_tags` gives the tags of the
    instances the call names; `template` is the launch template's RunInstances fields, if the call uses one."""
    res = lambda iid: f"qcs::cvm:{region}:uin/{owner_uin}:instance/{iid}"  # noqa: E731
    if action == "RunInstances":
        merged = {**(template or {}), **params}
        tags = [f"{t['Key']}&{t['Value']}" for spec in merged.get("TagSpecification") or []
                if spec.get("ResourceType") == "instance" for t in spec.get("Tags") or []]
        out = [(Need("name/cvm:RunInstances", res("*"), (("qcs:request_tag", tuple(tags)),)), CVM_TAGS)]
        if merged.get("CamRoleName"):
            out.append((Need("name/cam:PassRole", f"qcs::cam::uin/{owner_uin}:roleName/{merged['CamRoleName']}"),
                        CVM_PASS_ROLE))
        return out
    ids = params.get("InstanceIds") if action == "TerminateInstances" else None
    if ids:
        return [(Need(f"name/cvm:{action}", res(iid), (("qcs:resource_tag", tuple(
            f"{k}&{v}" for k, v in instance_tags.get(iid, {}).items())),)), CVM_TAGS) for iid in ids]
    return [(Need(f"name/cvm:{action}", "*"), CVM_API)]


def _cos(action: str, key: Callable[[dict], str] | None = None) -> Callable[[dict, str], list[Need]]:
    return lambda p, base: [Need(f"name/cos:{action}", f"{base}/{key(p)}" if key else f"{base}/")]


def _cos_copy(action: str) -> Callable[[dict, str], list[Need]]:
    def needs(p: dict, base: str) -> list[Need]:
        src = p["CopySource"]
        sb, sk = (src["Bucket"], src["Key"]) if isinstance(src, dict) else src.lstrip("/").split("/", 1)
        return [Need(f"name/cos:{action}", f"{base}/{p['Key']}"),
                Need("name/cos:GetObject", f"{base.rsplit(':', 1)[0]}:{sb}/{sk}")]
    return needs


COS_TABLE: dict[str, tuple[Callable[[dict, str], list[Need]], str]] = {
    "GetObject": (_cos("GetObject", lambda p: p["Key"]), COS_ACTIONS),
    "HeadObject": (_cos("HeadObject", lambda p: p["Key"]), COS_ACTIONS),
    "PutObject": (_cos("PutObject", lambda p: p["Key"]), COS_ACTIONS),
    "CopyObject": (_cos_copy("PutObjectCopy"), COS_COPY),
    "UploadPartCopy": (_cos_copy("UploadPartCopy"), COS_COPY),
    "CreateMultipartUpload": (_cos("InitiateMultipartUpload", lambda p: p["Key"]), COS_ACTIONS),
    "UploadPart": (_cos("UploadPart", lambda p: p["Key"]), COS_ACTIONS),
    "CompleteMultipartUpload": (_cos("CompleteMultipartUpload", lambda p: p["Key"]), COS_ACTIONS),
    "AbortMultipartUpload": (_cos("AbortMultipartUpload", lambda p: p["Key"]), COS_ACTIONS),
    "ListParts": (_cos("ListParts", lambda p: p["Key"]), COS_ACTIONS),
    "DeleteObject": (_cos("DeleteObject", lambda p: p["Key"]), COS_ACTIONS),
    "DeleteObjects": (lambda p, base: [Need("name/cos:DeleteMultipleObjects", f"{base}/")] + [
        Need("name/cos:DeleteObject", f"{base}/{o['Key']}") for o in p["Delete"]["Objects"]], COS_DELETE_MANY),
    "ListObjectsV2": (lambda p, base: [Need("name/cos:GetBucket", f"{base}/", (("cos:prefix", p.get("Prefix", "")),))],
                      COS_ACTIONS),
    "HeadBucket": (_cos("HeadBucket"), COS_ACTIONS),
}


def cos_needs(op: str, params: dict, region: str, app_id: str) -> list[Need]:
    """The CAM needs of one S3-API call sent to COS (the store speaks S3 to COS too)."""
    expander, _source = COS_TABLE[op]
    return expander(params, f"qcs::cos:{region}:uid/{app_id}:{params['Bucket']}")
