"""The sdcloud Tencent Cloud stack: network, COS bucket, CVM role and launch templates for GPU hosts.

`build(cfg)` declares every resource and returns the stack outputs; `__main__.py` only reads the
Pulumi config and exports what `build` returns, so that tests can run `build` under Pulumi mocks.

What it makes (all taggable resources tagged `sdcloud:managed=true`):
- a VPC with one subnet per CVM availability zone;
- a security group whose only ingress is SSH from `sshCidr` (none when empty) and, from its own
  hosts only, a multi-node group's rendezvous and NCCL ports;
- a private COS bucket, encrypted at rest (SSE-COS), with a lifecycle rule for stale uploads;
- a CAM role that CVM assumes, allowed to read and write `<bucket>/<prefix>/*` only;
- an optional key pair from the user's public key;
- one launch template per zone (Tencent templates are bound to a zone): a public Ubuntu image,
  the NVIDIA driver installed by user-data when the image lacks it, LOCAL_NVME data disks where
  the instance type has them, and the generic host user-data from bootstrap/ (no secrets).
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import tencentcloud_iac_pulumi as tencentcloud

# The checks and user-data both stacks share live beside them, in stacks/stack_common.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # stacks/stack_common.py
from stack_common import GROUP_PORTS, check_prefix, check_ssh_cidr, generic_user_data  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # host_policy.py beside this file
from host_policy import role_policy_document, self_end_policy_document  # noqa: E402,F401  (the CVM role's policies)
import scf_policy  # noqa: E402  (the cloud driver's policy, readable without Pulumi)

DEFAULT_IMAGE_REGEX = r"^Ubuntu Server 22\.04 LTS 64"
DEFAULT_DRIVER = "535-server"
APT_LOCK_WAIT = 600  # seconds apt-get waits for the dpkg lock (as the generic user-data does)


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
    image_id: str = ""  # empty: the newest public image matching image_regex
    image_regex: str = DEFAULT_IMAGE_REGEX
    instance_type: str = ""  # empty: the provider sets the type at launch
    local_nvme_disks: list[int] = field(default_factory=list)  # GB per LOCAL_NVME disk of instance_type
    nvidia_driver: str = DEFAULT_DRIVER
    vpc_cidr: str = "10.78.0.0/16"
    zones: list[str] = field(default_factory=list)  # empty: every available CVM zone, up to max_zones
    max_zones: int = 8
    bandwidth_mbps: int = 100
    force_destroy: bool = False
    # The cloud driver's function package (sdcloud/infra/function_package.py), a zip path set by
    # `sdcloud infra up`; empty: no driver function, timer or role.
    driver_package: str = ""

    def validate(self) -> None:
        self.prefix = check_prefix(self.prefix)
        self.ssh_cidr = check_ssh_cidr(self.ssh_cidr)
        if self.root_volume_gb < 50:
            raise ValueError(f"sdcloud:rootVolumeGb must be at least 50 (driver and CUDA wheels), got {self.root_volume_gb}")
        if any(int(gb) <= 0 for gb in self.local_nvme_disks):
            raise ValueError(f"sdcloud:localNvmeDisks must be sizes in GB, got {self.local_nvme_disks}")
        if self.local_nvme_disks and not self.instance_type:
            raise ValueError("sdcloud:localNvmeDisks needs sdcloud:instanceType: local disks come with the instance type")
        if not re.fullmatch(r"[0-9]{3}(-server)?|", self.nvidia_driver):
            raise ValueError(f"sdcloud:nvidiaDriver must look like 535 or 535-server, got {self.nvidia_driver!r}")




def load_config() -> StackConfig:
    conf = pulumi.Config("sdcloud")
    d = StackConfig()
    zones = conf.get("zones") or ""
    return StackConfig(
        stack=pulumi.get_stack(),
        region=pulumi.Config("tencentcloud").get("region") or "",
        prefix=conf.get("prefix") or d.prefix,
        ssh_cidr=conf.get("sshCidr") or "",
        public_key=conf.get("publicKey") or "",
        root_volume_gb=conf.get_int("rootVolumeGb") or d.root_volume_gb,
        owner_tag=conf.get("ownerTag") or "",
        checkpoint_expire_days=(conf.get_int("checkpointExpireDays") if conf.get("checkpointExpireDays") is not None
                                else d.checkpoint_expire_days),
        agent_source=conf.get("agentSource") or d.agent_source,
        image_id=conf.get("imageId") or "",
        image_regex=conf.get("imageRegex") or d.image_regex,
        instance_type=conf.get("instanceType") or "",
        local_nvme_disks=[int(x) for x in (conf.get_object("localNvmeDisks") or [])],
        nvidia_driver=conf.get("nvidiaDriver") or d.nvidia_driver,
        vpc_cidr=conf.get("vpcCidr") or d.vpc_cidr,
        zones=[z.strip() for z in zones.split(",") if z.strip()],
        max_zones=conf.get_int("maxZones") or d.max_zones,
        bandwidth_mbps=conf.get_int("bandwidthMbps") or d.bandwidth_mbps,
        force_destroy=conf.get_bool("forceDestroy") or False,
        driver_package=conf.get("driverPackage") or "",
    )


def driver_block(driver: str) -> str:
    """Shell that installs the NVIDIA driver when the image has none (Tencent's plain images don't)."""
    if not driver:
        return ""
    return f"""# NVIDIA driver (the public image has none); the agent's torch wheel brings its own CUDA runtime.
if ! command -v nvidia-smi >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  # nouveau would hold the GPU: blacklisted before the install (its initramfs update leaves it out).
  printf 'blacklist nouveau\noptions nouveau modeset=0\n' > /etc/modprobe.d/sdcloud-blacklist-nouveau.conf
  modprobe -r nouveau 2>/dev/null || true
  # Wait for the dpkg lock: unattended upgrades hold it in a new instance's first minutes.
  apt-get -o DPkg::Lock::Timeout={APT_LOCK_WAIT} update -q
  # DKMS builds the driver's module for the running kernel: its headers come first.
  apt-get -o DPkg::Lock::Timeout={APT_LOCK_WAIT} install -y -q "linux-headers-$(uname -r)" nvidia-driver-{driver} \
nvidia-utils-{driver} python3-venv
  modprobe nvidia || true
fi
"""


def render_user_data(agent_source: str, driver: str) -> str:
    """The generic host user-data from bootstrap/, with the driver install before the agent."""
    text = generic_user_data(agent_source)
    lines = text.splitlines(keepends=True)
    # After the logging redirect, so that the driver install shows in the bootstrap log.
    at = next((i + 1 for i, line in enumerate(lines) if line.startswith("exec ")), 1)
    return "".join(lines[:at]) + driver_block(driver) + "".join(lines[at:])


def tags_for(cfg: StackConfig, name: str) -> dict[str, str]:
    tags = {"Name": f"sdcloud-{cfg.stack}-{name}", "sdcloud:managed": "true", "sdcloud:stack": cfg.stack}
    if cfg.owner_tag:
        tags["sdcloud:owner"] = cfg.owner_tag
    return tags


def _slug(text: str, limit: int) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:limit].strip("-") or "default"


def _zones(cfg: StackConfig) -> list[str]:
    if cfg.zones:
        return cfg.zones[: cfg.max_zones]
    found = tencentcloud.availability.get_zones_by_product(product="cvm")
    return sorted(z.name for z in found.zones if z.state == "AVAILABLE")[: cfg.max_zones]


def _image_id(cfg: StackConfig) -> str:
    if cfg.image_id:
        return cfg.image_id
    found = tencentcloud.images.get_instance(image_types=["PUBLIC_IMAGE"], image_name_regex=cfg.image_regex,
                                             instance_type=cfg.instance_type or None)
    if not found.images:
        raise ValueError(f"no public image matches {cfg.image_regex!r}: set sdcloud:imageId")
    return found.images[0].image_id


def build(cfg: StackConfig) -> dict[str, Any]:
    """Declare the stack's resources; return the outputs that the providers launch from."""
    cfg.validate()
    region = cfg.region or "ap-guangzhou"
    app_id = tencentcloud.user.get_info().app_id

    vpc = tencentcloud.vpc.Instance("vpc", name=f"sdcloud-{cfg.stack}", cidr_block=cfg.vpc_cidr, tags=tags_for(cfg, "vpc"))
    blocks = ipaddress.ip_network(cfg.vpc_cidr).subnets(new_prefix=20)
    subnet_ids: dict[str, pulumi.Output[str]] = {}
    zones = _zones(cfg)
    for zone in zones:
        subnet = tencentcloud.subnet.Instance(f"subnet-{zone}", name=f"sdcloud-{cfg.stack}-{zone}", vpc_id=vpc.id,
                                              availability_zone=zone, cidr_block=str(next(blocks)),
                                              tags=tags_for(cfg, f"subnet-{zone}"))
        subnet_ids[zone] = subnet.id

    sg = tencentcloud.security.Group("hosts", name=f"sdcloud-{cfg.stack}-hosts",
                                     description="sdcloud GPU hosts: SSH from the user only", tags=tags_for(cfg, "hosts"))
    ingresses = []
    if cfg.ssh_cidr:
        family = "ipv6_cidr_block" if ipaddress.ip_network(cfg.ssh_cidr).version == 6 else "cidr_block"
        ingresses.append({"action": "ACCEPT", "protocol": "TCP", "port": "22", family: cfg.ssh_cidr,
                          "description": "SSH from the sdcloud user"})
    # A multi-node group's hosts reach each other's rendezvous and NCCL ports, from this group only.
    ingresses += [{"action": "ACCEPT", "protocol": "TCP", "port": f"{low}" if low == high else f"{low}-{high}",
                   "source_security_id": sg.id, "description": why} for low, high, why in GROUP_PORTS]
    # A Tencent security group denies what no rule accepts, both ways: allow all egress.
    tencentcloud.security.GroupRuleSet(
        "hosts-rules", security_group_id=sg.id, ingresses=ingresses,
        egresses=[{"action": "ACCEPT", "protocol": "ALL", "port": "ALL", "cidr_block": "0.0.0.0/0",
                   "description": "downloads, COS, package mirrors"}])

    bucket_name = pulumi.Output.from_input(app_id).apply(lambda a: f"sdcloud-{_slug(cfg.stack, 49 - len(a) - 8)}-{a}")
    rules: list[dict] = [{"id": "abort-incomplete-uploads", "filter_prefix": f"{cfg.prefix}/",
                          "abort_incomplete_multipart_upload": {"days_after_initiation": 2}}]
    bucket = tencentcloud.cos.Bucket("bucket", bucket=bucket_name, acl="private", encryption_algorithm="AES256",
                                     force_clean=cfg.force_destroy, lifecycle_rules=rules, tags=tags_for(cfg, "bucket"))

    role = tencentcloud.cam.Role(
        "host-role", name=f"sdcloud-{_slug(cfg.stack, 40)}-host", console_login=False,
        description="sdcloud GPU hosts: read and write the run prefix of the sdcloud bucket",
        document=json.dumps({"version": "2.0", "statement": [
            {"action": ["name/sts:AssumeRole"], "effect": "allow", "principal": {"service": ["cvm.qcloud.com"]}}]}),
        tags=tags_for(cfg, "host-role"))
    policy = tencentcloud.cam.Policy(
        "host-bucket-access", name=f"sdcloud-{_slug(cfg.stack, 40)}-bucket",
        description="sdcloud hosts: objects under the run prefix",
        document=pulumi.Output.all(app_id, bucket.bucket).apply(
            lambda v: role_policy_document(region, v[0], v[1], cfg.prefix)))
    tencentcloud.cam.RolePolicyAttachment("host-bucket-access", role_id=role.id, policy_id=policy.id)
    # A finished host whose controller is gone ends itself: TerminateInstances, on this stack's hosts only.
    self_end = tencentcloud.cam.Policy(
        "host-self-end", name=f"sdcloud-{_slug(cfg.stack, 40)}-self-end",
        description="sdcloud hosts: terminate an instance tagged with this stack (a host ending itself)",
        document=self_end_policy_document(("sdcloud:stack", cfg.stack)))
    tencentcloud.cam.RolePolicyAttachment("host-self-end", role_id=role.id, policy_id=self_end.id)

    key_id: pulumi.Input[str] = ""
    if cfg.public_key.strip():
        key = tencentcloud.key.Pair("ssh-key", key_name=f"sdcloud_{re.sub(r'[^A-Za-z0-9_]', '_', cfg.stack)}"[:25],
                                    public_key=cfg.public_key.strip(), tags=tags_for(cfg, "ssh-key"))
        key_id = key.id

    image_id = _image_id(cfg)
    user_data = base64.b64encode(render_user_data(cfg.agent_source, cfg.nvidia_driver).encode()).decode()
    data_disks = [{"disk_type": "LOCAL_NVME", "disk_size": int(gb), "delete_with_instance": True}
                  for gb in cfg.local_nvme_disks]
    host_tags = tags_for(cfg, "host")
    template_ids: dict[str, pulumi.Output[str]] = {}
    for zone in zones:
        template = tencentcloud.cvm.LaunchTemplate(
            f"host-template-{zone}",
            launch_template_name=f"sdcloud-{cfg.stack}-{zone}",
            placement={"zone": zone, "project_id": 0},
            image_id=image_id,
            instance_type=cfg.instance_type or None,
            cam_role_name=role.name,
            security_group_ids=[sg.id],
            virtual_private_cloud={"vpc_id": vpc.id, "subnet_id": subnet_ids[zone]},
            internet_accessible={"internet_charge_type": "TRAFFIC_POSTPAID_BY_HOUR",
                                 "internet_max_bandwidth_out": cfg.bandwidth_mbps, "public_ip_assigned": True},
            system_disk={"disk_type": "CLOUD_BSSD", "disk_size": cfg.root_volume_gb},
            data_disks=data_disks or None,
            login_settings={"key_ids": [key_id]} if cfg.public_key.strip() else None,
            user_data=user_data,
            tag_specifications=[{"resource_type": "instance",
                                 "tags": [{"key": k, "value": v} for k, v in host_tags.items()]}],
            tags=tags_for(cfg, f"host-template-{zone}"),
        )
        template_ids[zone] = template.id

    driver: dict[str, Any] = {}
    if cfg.driver_package:
        driver = _driver(cfg, region, app_id, bucket, role)

    return {
        **driver,
        "bucket": bucket.bucket,
        "prefix": cfg.prefix,
        "region": region,
        "endpoint": f"https://cos.{region}.myqcloud.com",
        "app_id": app_id,
        "vpc_id": vpc.id,
        "subnet_ids": subnet_ids,
        "security_group_id": sg.id,
        "role_name": role.name,
        "launch_template_ids": template_ids,
        "launch_template_id": template_ids[zones[0]] if zones else "",
        # The template's instance tags: a run's RunInstances sends its own tags, which replace the
        # template's, so it sends these with them.
        "host_tags": host_tags,
        "image_id": image_id,
        "key_id": key_id,
        "instance_defaults": {"instance_type": cfg.instance_type, "system_disk_gb": cfg.root_volume_gb,
                              "system_disk_type": "CLOUD_BSSD", "bandwidth_mbps": cfg.bandwidth_mbps,
                              "local_nvme_disks": list(cfg.local_nvme_disks)},
    }


def _driver(cfg: StackConfig, region: str, app_id: Any, bucket: Any, host_role: Any) -> dict[str, Any]:
    """The cloud driver (issue 27): an SCF function on SCF's own Python runtime (scf_policy.FUNCTION_RUNTIME,
    the provider's traits) on a 5-minute timer that takes controller steps for runs no laptop drives.
    Its CAM role may do what a step does, on this stack's bucket prefix and, for TerminateInstances,
    on instances with the stack's tag (stacks/tencent/scf_policy.py)."""
    owner_uin = tencentcloud.user.get_info().owner_uin
    slug = _slug(cfg.stack, 40)
    role = tencentcloud.cam.Role(
        "driver-role", name=f"sdcloud-{slug}-driver", console_login=False,
        description="sdcloud cloud driver: a controller step's calls, nothing more",
        document=scf_policy.assume_role_document(), tags=tags_for(cfg, "driver-role"))
    policy = tencentcloud.cam.Policy(
        "driver-access", name=f"sdcloud-{slug}-driver",
        description="sdcloud cloud driver: the run prefix, launches, and ending this stack's instances",
        document=pulumi.Output.all(app_id, bucket.bucket, host_role.name).apply(
            lambda v: scf_policy.function_policy_document(region, v[0], v[1], cfg.prefix, owner_uin, v[2],
                                                             ("sdcloud:stack", cfg.stack))))
    attached = tencentcloud.cam.RolePolicyAttachment("driver-access", role_id=role.id, policy_id=policy.id)
    # The package goes to the stack's bucket and the function is created from there: a TencentCloud
    # API 3.0 POST takes at most 10 MB and the package inline (base64) weighs about 25 MB
    # (sdcloud/providers/tencent/limits.py). Its key is outside the run prefix, where neither the
    # hosts' role nor the function's may write: nothing that runs in the cloud can replace the
    # driver's code. The name carries the package's version, so a new control plane is a new object.
    code = tencentcloud.cos.BucketObject(
        "driver-code", bucket=bucket.bucket, key=scf_policy.code_key(Path(cfg.driver_package).name),
        source=cfg.driver_package, acl="private", tags=tags_for(cfg, "driver-code"))
    function = tencentcloud.scf.Function(
        "driver", name=f"sdcloud-{slug}-driver", description="sdcloud cloud driver: steps for runs whose lease lapsed",
        runtime=scf_policy.FUNCTION_RUNTIME, handler=scf_policy.FUNCTION_HANDLER,
        # The provider drops the bucket's -APPID and sends these as CreateFunction's Code.CosBucketName,
        # Code.CosObjectName (which starts with "/") and Code.CosBucketRegion.
        cos_bucket_name=bucket.bucket, cos_object_name=code.key.apply(lambda key: f"/{key}"),
        cos_bucket_region=region,
        timeout=scf_policy.FUNCTION_TIMEOUT, mem_size=scf_policy.FUNCTION_MEMORY_MB, role=role.name,
        # Public network on, no VPC: a step calls the CVM API (cvm.tencentcloudapi.com) and COS
        # (cos.<region>.myqcloud.com) at their public names; a function in a VPC would need a NAT
        # gateway for both, billed by the hour (docs/stacks.md).
        enable_public_net=True,
        environment={"SDCLOUD_STORE": bucket.bucket.apply(lambda b: f"s3://{b}/{cfg.prefix}"),
                     "SDCLOUD_STORE_ENDPOINT": f"https://cos.{region}.myqcloud.com",
                     "SDCLOUD_STORE_REGION": region, "SDCLOUD_STORE_ADDRESSING": "virtual"},
        triggers=[{"name": "sdcloud-driver", "type": "timer", "trigger_desc": scf_policy.TIMER_CRON}],
        # After its policy: the timer's first invocations would otherwise meet a role with no rights yet.
        tags=tags_for(cfg, "driver"), opts=pulumi.ResourceOptions(depends_on=[attached, code]))
    return {"driver_function": function.name, "driver_role_name": role.name, "driver_code": code.key}
