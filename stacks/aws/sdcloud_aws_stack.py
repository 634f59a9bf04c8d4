"""The sdcloud AWS stack: network, bucket, host role and a launch template for GPU hosts.

`build(cfg)` declares every resource and returns the stack outputs; `__main__.py` only reads the
Pulumi config and exports what `build` returns, so that tests can run `build` under Pulumi mocks.

What it makes (all tagged `sdcloud:managed=true`):
- a VPC with one public subnet per availability zone, an internet gateway and an S3 gateway
  endpoint (free; keeps checkpoint traffic off the internet gateway);
- a security group whose only ingress is SSH from `sshCidr` (none when empty) and, from its own hosts
  only, a multi-node group's rendezvous and NCCL ports; the VPC's
  default security group emptied so that nothing falls back to it;
- a private, encrypted S3 bucket with lifecycle rules for old checkpoints and logs;
- an IAM role and instance profile that can read and write `s3://<bucket>/<prefix>/*` only;
- an optional key pair from the user's public key;
- a launch template: Deep Learning AMI (GPU) resolved through its public SSM parameter, IMDSv2
  required with hop limit 2, instance-store NVMe mapped, encrypted gp3 root volume, and the
  generic host user-data from bootstrap/ (no secrets: credentials come from the role).
"""

from __future__ import annotations

import base64
import ipaddress
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws

# The checks and user-data both stacks share live beside them, in stacks/stack_common.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # stacks/stack_common.py
from stack_common import GROUP_PORTS, check_prefix, check_ssh_cidr, generic_user_data  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # driver_policy.py beside this file
import driver_policy  # noqa: E402  (the cloud driver's policies, readable without Pulumi)
import aws_host_policy  # noqa: E402  (the host role's policy, likewise)

# The Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04): NVIDIA driver and CUDA, no
# framework (the agent installs its own torch). AWS publishes its id under this public parameter.
DEFAULT_AMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
# Instance-store volumes to map. Types with fewer ignore the extra mappings; p4d/p5 have 8.
INSTANCE_STORE_DEVICES = 8
# Object tags the agent sets so that lifecycle rules can tell checkpoints and logs from artifacts
# (S3 lifecycle filters match a key prefix, and checkpoints sit under runs/<id>/ beside artifacts).
CLASS_TAG = "sdcloud-class"


@dataclass
class StackConfig:
    stack: str = "dev"
    region: str = ""
    prefix: str = "sdcloud"
    ssh_cidr: str = ""
    public_key: str = ""
    root_volume_gb: int = 200
    owner_tag: str = ""
    checkpoint_expire_days: int = 30
    agent_source: str = "sdcloud"
    ami_parameter: str = DEFAULT_AMI_PARAMETER
    vpc_cidr: str = "10.77.0.0/16"
    max_zones: int = 6
    force_destroy: bool = False
    extra_tags: dict[str, str] = field(default_factory=dict)
    # The cloud driver's function package (sdcloud/infra/function_package.py), a zip path set by
    # `sdcloud infra up`; empty: no driver function, schedule or their roles.
    driver_package: str = ""

    def validate(self) -> None:
        self.prefix = check_prefix(self.prefix)
        self.ssh_cidr = check_ssh_cidr(self.ssh_cidr)
        if self.root_volume_gb < 30:
            raise ValueError(f"sdcloud:rootVolumeGb must be at least 30 (the Deep Learning AMI needs it), "
                             f"got {self.root_volume_gb}")
        if self.checkpoint_expire_days < 0:
            raise ValueError(f"sdcloud:checkpointExpireDays must be 0 (keep forever) or more, got {self.checkpoint_expire_days}")
        if not 1 <= self.max_zones <= 16:
            raise ValueError(f"sdcloud:maxZones must be between 1 and 16, got {self.max_zones}")




def load_config() -> StackConfig:
    """StackConfig from the Pulumi config of the current stack (namespace `sdcloud`)."""
    conf = pulumi.Config("sdcloud")
    defaults = StackConfig()
    cfg = StackConfig(
        stack=pulumi.get_stack(),
        region=pulumi.Config("aws").get("region") or "",
        prefix=conf.get("prefix") or defaults.prefix,
        ssh_cidr=conf.get("sshCidr") or "",
        public_key=conf.get("publicKey") or "",
        root_volume_gb=conf.get_int("rootVolumeGb") or defaults.root_volume_gb,
        owner_tag=conf.get("ownerTag") or "",
        checkpoint_expire_days=(conf.get_int("checkpointExpireDays") if conf.get("checkpointExpireDays") is not None
                                else defaults.checkpoint_expire_days),
        agent_source=conf.get("agentSource") or defaults.agent_source,
        ami_parameter=conf.get("amiParameter") or defaults.ami_parameter,
        vpc_cidr=conf.get("vpcCidr") or defaults.vpc_cidr,
        max_zones=conf.get_int("maxZones") or defaults.max_zones,
        force_destroy=conf.get_bool("forceDestroy") or False,
        driver_package=conf.get("driverPackage") or "",
    )
    return cfg



def render_user_data(agent_source: str) -> str:
    return generic_user_data(agent_source)


def tags_for(cfg: StackConfig, name: str) -> dict[str, str]:
    tags = {"Name": f"sdcloud-{cfg.stack}-{name}", "sdcloud:managed": "true", "sdcloud:stack": cfg.stack}
    if cfg.owner_tag:
        tags["sdcloud:owner"] = cfg.owner_tag
    return {**tags, **cfg.extra_tags}


# The host role's policy lives in aws_host_policy.py, readable without Pulumi (the tests enforce it).
role_policy_document = aws_host_policy.role_policy_document


def _zones(cfg: StackConfig) -> list[str]:
    # Only the region's own zones: Local and Wavelength zones need an opt-in and carry no GPUs here.
    found = aws.get_availability_zones(state="available",
                                       filters=[{"name": "opt-in-status", "values": ["opt-in-not-required"]}])
    return sorted(found.names)[: cfg.max_zones]


def build(cfg: StackConfig) -> dict[str, Any]:
    """Declare the stack's resources; return the outputs that the providers launch from."""
    cfg.validate()
    region = cfg.region or aws.get_region().region

    # Network: one public subnet per zone (hosts need the internet for pip and SSH).
    vpc = aws.ec2.Vpc("vpc", cidr_block=cfg.vpc_cidr, enable_dns_hostnames=True, enable_dns_support=True,
                      tags=tags_for(cfg, "vpc"))
    # Pulumi adopts the VPC's default security group and strips its allow-all-from-itself rules.
    aws.ec2.DefaultSecurityGroup("default-sg", vpc_id=vpc.id, ingress=[], egress=[], tags=tags_for(cfg, "default-sg"))
    igw = aws.ec2.InternetGateway("igw", vpc_id=vpc.id, tags=tags_for(cfg, "igw"))
    routes = aws.ec2.RouteTable("public", vpc_id=vpc.id, routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": igw.id}],
                                tags=tags_for(cfg, "public"))
    aws.ec2.VpcEndpoint("s3-endpoint", vpc_id=vpc.id, service_name=f"com.amazonaws.{region}.s3",
                        vpc_endpoint_type="Gateway", route_table_ids=[routes.id], tags=tags_for(cfg, "s3-endpoint"))
    blocks = ipaddress.ip_network(cfg.vpc_cidr).subnets(new_prefix=20)
    subnet_ids: dict[str, pulumi.Output[str]] = {}
    for zone in _zones(cfg):
        subnet = aws.ec2.Subnet(f"subnet-{zone}", vpc_id=vpc.id, availability_zone=zone, cidr_block=str(next(blocks)),
                                map_public_ip_on_launch=True, tags=tags_for(cfg, f"subnet-{zone}"))
        aws.ec2.RouteTableAssociation(f"subnet-{zone}-routes", subnet_id=subnet.id, route_table_id=routes.id)
        subnet_ids[zone] = subnet.id

    ingress = []
    if cfg.ssh_cidr:
        family = "ipv6_cidr_blocks" if ipaddress.ip_network(cfg.ssh_cidr).version == 6 else "cidr_blocks"
        ingress.append({"description": "SSH from the sdcloud user", "protocol": "tcp", "from_port": 22, "to_port": 22,
                        family: [cfg.ssh_cidr]})
    # A multi-node group's hosts reach each other's rendezvous and NCCL ports; `self`: only from this group.
    ingress += [{"description": why, "protocol": "tcp", "from_port": low, "to_port": high, "self": True}
                for low, high, why in GROUP_PORTS]
    sg = aws.ec2.SecurityGroup("hosts", vpc_id=vpc.id, description="sdcloud GPU hosts: SSH from the user only",
                               ingress=ingress,
                               egress=[{"protocol": "-1", "from_port": 0, "to_port": 0, "cidr_blocks": ["0.0.0.0/0"],
                                        "ipv6_cidr_blocks": ["::/0"], "description": "downloads, S3, package mirrors"}],
                               tags=tags_for(cfg, "hosts"))

    # Bucket: private, encrypted at rest, old checkpoints and logs expire.
    bucket = aws.s3.Bucket("bucket", bucket_prefix=f"sdcloud-{cfg.stack}-"[:37].lower(), force_destroy=cfg.force_destroy,
                           tags=tags_for(cfg, "bucket"))
    aws.s3.BucketPublicAccessBlock("bucket-private", bucket=bucket.id, block_public_acls=True, block_public_policy=True,
                                   ignore_public_acls=True, restrict_public_buckets=True)
    aws.s3.BucketOwnershipControls("bucket-owner", bucket=bucket.id, rule={"object_ownership": "BucketOwnerEnforced"})
    aws.s3.BucketServerSideEncryptionConfiguration(
        "bucket-encryption", bucket=bucket.id,
        rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": "AES256"}, "bucket_key_enabled": True}])
    rules: list[dict] = [{"id": "abort-incomplete-uploads", "status": "Enabled", "filter": {"prefix": f"{cfg.prefix}/"},
                          "abort_incomplete_multipart_upload": {"days_after_initiation": 2}}]
    if cfg.checkpoint_expire_days:
        for kind in ("checkpoint", "log"):
            rules.append({"id": f"expire-old-{kind}s", "status": "Enabled",
                          "filter": {"and_": {"prefix": f"{cfg.prefix}/runs/", "tags": {CLASS_TAG: kind}}},
                          "expiration": {"days": cfg.checkpoint_expire_days}})
    aws.s3.BucketLifecycleConfiguration("bucket-lifecycle", bucket=bucket.id, rules=rules)

    # Host identity: the bucket prefix, nothing more.
    role = aws.iam.Role("host-role", description="sdcloud GPU hosts: read and write the run prefix of the sdcloud bucket",
                        assume_role_policy=json.dumps({"Version": "2012-10-17", "Statement": [
                            {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}),
                        tags=tags_for(cfg, "host-role"))
    aws.iam.RolePolicy("host-bucket-access", role=role.id,
                       policy=bucket.bucket.apply(lambda name: role_policy_document(name, cfg.prefix)))
    profile = aws.iam.InstanceProfile("host-profile", role=role.name, tags=tags_for(cfg, "host-profile"))

    key_name: pulumi.Input[str] = ""
    if cfg.public_key.strip():
        key = aws.ec2.KeyPair("ssh-key", public_key=cfg.public_key.strip(), tags=tags_for(cfg, "ssh-key"))
        key_name = key.key_name

    image_id = aws.ssm.get_parameter(name=cfg.ami_parameter).value
    user_data = render_user_data(cfg.agent_source)
    devices = [{"device_name": f"/dev/sd{chr(ord('b') + i)}", "virtual_name": f"ephemeral{i}"}
               for i in range(INSTANCE_STORE_DEVICES)]
    instance_tags = tags_for(cfg, "host")
    template = aws.ec2.LaunchTemplate(
        "host-template",
        description="sdcloud GPU host",
        image_id=image_id,
        update_default_version=True,
        iam_instance_profile={"arn": profile.arn},
        vpc_security_group_ids=[sg.id],
        key_name=key_name or None,
        user_data=base64.b64encode(user_data.encode()).decode(),
        metadata_options={"http_endpoint": "enabled", "http_tokens": "required", "http_put_response_hop_limit": 2,
                          "instance_metadata_tags": "enabled"},
        block_device_mappings=[
            # The Ubuntu DLAMI's root device.
            {"device_name": "/dev/sda1", "ebs": {"volume_size": cfg.root_volume_gb, "volume_type": "gp3",
                                                 "encrypted": "true", "delete_on_termination": "true"}},
            *devices,
        ],
        # Spot hosts terminate rather than stop: sdcloud relaunches from the last checkpoint.
        instance_initiated_shutdown_behavior="terminate",
        tag_specifications=[{"resource_type": kind, "tags": instance_tags}
                            for kind in driver_policy.LAUNCH_TAGGED],
        tags=tags_for(cfg, "host-template"),
    )

    outputs: dict[str, Any] = {}
    if cfg.driver_package:
        outputs = _driver(cfg, region, bucket, role)

    return {
        **outputs,
        "bucket": bucket.bucket,
        "prefix": cfg.prefix,
        "launch_template_id": template.id,
        "image_id": image_id,
        "subnet_ids": subnet_ids,
        "vpc_id": vpc.id,
        "security_group_id": sg.id,
        "instance_profile_arn": profile.arn,
        "role_arn": role.arn,
        "key_name": key_name,
        "region": region,
    }


def _driver(cfg: StackConfig, region: str, bucket: aws.s3.Bucket, host_role: aws.iam.Role) -> dict[str, Any]:
    """The cloud driver (issue 27): a Lambda function on an EventBridge Scheduler schedule that takes
    controller steps for runs no laptop drives. Its role may do what a step does, on this stack's
    bucket prefix and on instances tagged `sdcloud:run` (stacks/aws/driver_policy.py)."""
    account = aws.get_caller_identity().account_id
    name = f"sdcloud-{cfg.stack}-driver"[:64]
    # Created here rather than by Lambda on first write, so that it is tagged, expires and goes with the stack.
    logs = aws.cloudwatch.LogGroup("driver-logs", name=f"/aws/lambda/{name}", retention_in_days=14,
                                   tags=tags_for(cfg, "driver-logs"))
    role = aws.iam.Role("driver-role", description="sdcloud cloud driver: a controller step's calls, nothing more",
                        assume_role_policy=driver_policy.assume_role_policy("lambda.amazonaws.com"),
                        tags=tags_for(cfg, "driver-role"))
    access = aws.iam.RolePolicy(
        "driver-access", role=role.id, policy=pulumi.Output.all(bucket.bucket, host_role.arn, logs.arn).apply(
            lambda v: driver_policy.function_policy_document(v[0], cfg.prefix, account, v[1], v[2])))
    function = aws.lambda_.Function(
        "driver", name=name, description="sdcloud cloud driver: steps for runs whose driver lease lapsed",
        role=role.arn, runtime=driver_policy.FUNCTION_RUNTIME, handler=driver_policy.FUNCTION_HANDLER,
        architectures=["x86_64"], code=pulumi.FileArchive(cfg.driver_package),
        timeout=driver_policy.FUNCTION_TIMEOUT, memory_size=driver_policy.FUNCTION_MEMORY_MB,
        environment={"variables": {"SDCLOUD_STORE": bucket.bucket.apply(lambda b: f"s3://{b}/{cfg.prefix}"),
                                   "SDCLOUD_STORE_REGION": region}},
        # After its policy: a function created first can fail its first invocations on a role with no rights yet.
        tags=tags_for(cfg, "driver"), opts=pulumi.ResourceOptions(depends_on=[logs, access]))
    # EventBridge Scheduler invokes the function asynchronously, and Lambda retries a failed
    # asynchronous invocation twice by default: each failing tick would be three invocations,
    # three lease takeovers and three journal writes. The next tick comes within the rate anyway.
    aws.lambda_.FunctionEventInvokeConfig("driver-no-retries", function_name=function.name, maximum_retry_attempts=0)
    invoker = aws.iam.Role("driver-scheduler-role", description="sdcloud cloud driver's schedule: invoke the driver only",
                           assume_role_policy=driver_policy.assume_role_policy("scheduler.amazonaws.com"),
                           tags=tags_for(cfg, "driver-scheduler-role"))
    aws.iam.RolePolicy("driver-invoke", role=invoker.id, policy=function.arn.apply(driver_policy.scheduler_policy_document))
    schedule = aws.scheduler.Schedule(
        "driver-schedule", name=name, description="sdcloud cloud driver: every 5 minutes",
        schedule_expression=driver_policy.SCHEDULE_RATE,
        # OFF: each invocation at its time, so that a lapsed lease waits at most one rate for the driver.
        flexible_time_window={"mode": "OFF"},
        target={"arn": function.arn, "role_arn": invoker.arn, "input": json.dumps(driver_policy.SCHEDULE_INPUT),
                # A missed invocation is not retried: the next one comes within the rate anyway.
                "retry_policy": {"maximum_retry_attempts": 0}},
        state="ENABLED")
    return {"driver_function": function.name, "driver_function_arn": function.arn, "driver_schedule": schedule.name,
            "driver_role_arn": role.arn,
            # `sdcloud batch schedule add --provider aws` targets the function with this role (batch/cloud_schedules.py).
            "driver_scheduler_role_arn": invoker.arn}
