"""Local NVMe: find instance-store disks in `lsblk --json`, RAID0 several, format and mount them.

Planning is pure (tested on recorded lsblk outputs); applying runs the commands. With no usable
local disk the agent falls back to the root disk with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

log = logging.getLogger("sdcloud_agent.nvme")

LSBLK = ["lsblk", "--json", "--bytes", "-o", "NAME,SIZE,TYPE,MODEL,SERIAL,MOUNTPOINT,FSTYPE"]
DLAMI_NVME = "/opt/dlami/nvme"
DEFAULT_MOUNT = "/mnt/nvme"
RAID_DEVICE = "/dev/md/sdcloud"
# Network disks that show up as NVMe on Nitro (EBS) must never be wiped.
NETWORK_MODELS = ("elastic block store",)


@dataclass
class Plan:
    action: str  # "raid0", "single", "mounted" (already set up), "root" (fall back to the root disk)
    mount: str
    devices: list[str] = field(default_factory=list)
    size_bytes: int = 0
    warning: str = ""


def _mountpoints(dev: dict) -> list[str]:
    mps = dev.get("mountpoints")
    if mps is None:
        mps = [dev.get("mountpoint")]
    return [m for m in mps if m]


def _walk(dev: dict):
    yield dev
    for child in dev.get("children") or []:
        yield from _walk(child)


def _size(dev: dict) -> int:
    s = dev.get("size", 0)
    if isinstance(s, str):
        s = s.strip()
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
        if s and s[-1].upper() in units:
            return int(float(s[:-1]) * units[s[-1].upper()])
        return int(s or 0)
    return int(s or 0)


def plan(lsblk: dict | str, mount: str = DEFAULT_MOUNT) -> Plan:
    """Decide what to do with the disks of one host from its `lsblk --json` output."""
    doc = json.loads(lsblk) if isinstance(lsblk, str) else lsblk
    disks = [d for d in doc.get("blockdevices", []) if d.get("type") == "disk"]
    # Already set up (an agent restart on the same boot): something is mounted at the mount point.
    for d in disks:
        for node in _walk(d):
            if mount in _mountpoints(node):
                members = [f"/dev/{x['name']}" for x in disks
                           if any(n is node for n in _walk(x))]
                return Plan("mounted", mount, members, _size(node))
    candidates = []
    for d in disks:
        name = d.get("name", "")
        model = (d.get("model") or "").strip().lower()
        if not name.startswith("nvme"):
            continue
        if any(m in model for m in NETWORK_MODELS):
            continue
        nodes = list(_walk(d))
        if any(_mountpoints(n) for n in nodes) or d.get("children") or d.get("fstype"):
            continue  # the root disk, or a disk someone already uses
        candidates.append(d)
    if not candidates:
        return Plan("root", mount, [], 0, "no local NVMe disk found: using the root disk (slower staging and checkpoints)")
    devices = [f"/dev/{d['name']}" for d in sorted(candidates, key=lambda d: d["name"])]
    size = sum(_size(d) for d in candidates)
    return Plan("raid0" if len(devices) > 1 else "single", mount, devices, size)


def commands(p: Plan) -> list[list[str]]:
    """The commands that carry out a plan (none for 'mounted' and 'root')."""
    if p.action not in ("raid0", "single"):
        return []
    target = p.devices[0]
    cmds: list[list[str]] = []
    if p.action == "raid0":
        target = RAID_DEVICE
        cmds.append(["mdadm", "--create", RAID_DEVICE, "--run", "--force", "--level=0", "--chunk=256",
                     f"--raid-devices={len(p.devices)}", *p.devices])
    # No discard at mkfs: instance store comes zeroed and a full-disk TRIM takes minutes.
    cmds.append(["mkfs.ext4", "-F", "-q", "-m", "0", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1", target])
    cmds.append(["mkdir", "-p", p.mount])
    cmds.append(["mount", "-o", "noatime,nodiratime", target, p.mount])
    return cmds


def read_lsblk(run: Callable = subprocess.run) -> dict:
    out = run(LSBLK, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def setup(mount: str = DEFAULT_MOUNT, run: Callable = subprocess.run) -> tuple[Path | None, Plan]:
    """Prepare local NVMe; returns (mount point or None to use the root disk, the plan)."""
    if mount == DEFAULT_MOUNT and run is subprocess.run and os.path.ismount(DLAMI_NVME):
        # The Deep Learning AMI has already striped and mounted the instance's NVMe there.
        log.info("local NVMe mounted by the image at %s", DLAMI_NVME)
        return Path(DLAMI_NVME), Plan("mounted", DLAMI_NVME)
    if shutil.which("lsblk") is None and run is subprocess.run:
        p = Plan("root", mount, warning="lsblk not found: using the root disk")
        log.warning(p.warning)
        return None, p
    p = plan(read_lsblk(run), mount)
    if p.action == "root":
        log.warning(p.warning)
        return None, p
    if p.action == "mounted":
        log.info("local NVMe already mounted at %s", mount)
        return Path(mount), p
    log.info("local NVMe: %s of %s (%.0f GB) at %s", p.action, " ".join(p.devices), p.size_bytes / 1e9, mount)
    try:
        for cmd in commands(p):
            run(cmd, check=True, capture_output=True, text=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        p.warning = f"NVMe setup failed ({detail.strip()[:200]}): using the root disk"
        log.warning(p.warning)
        return None, p
    return Path(mount), p
