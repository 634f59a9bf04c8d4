"""A group on this machine is as large as this machine can run: one host a CPU core (a host is an agent
and its trainer, processes of their own), one a GPU where it has GPUs. `up --provider local --nodes 64`
on a small machine is refused before anything is recorded or started: exit 2, one line; the check is
the provider's power (capabilities.LaunchesGroups), asked of its class before any provider is made."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest

from sdcloud.errors import UserError
from sdcloud.offers.groups import MAX_NODES
from sdcloud.providers.capabilities import LaunchesGroups
from sdcloud.providers.loader import provider_class
from sdcloud.providers.local import nodes
from sdcloud.runs.inputs.spec import build_spec

from tests.support.harness_cli import nothing_recorded, refused

CORES = len(os.sched_getaffinity(0))
# A machine with more cores than a group may have hosts (64) cannot be asked for a group too large for it.
pytestmark = pytest.mark.skipif(CORES >= MAX_NODES, reason=f"{CORES} cores: every group of up to {MAX_NODES} fits")


@pytest.mark.parametrize("nodes", [CORES + 1, MAX_NODES])
def test_up_local_with_more_hosts_than_cores_is_refused_and_nothing_starts(capsys, sdcloud_home, nodes):
    line = refused(capsys, ["up", "--provider", "local", "--tier", "sd15-lora", "--nodes", str(nodes), "--yes"],
                   f"at most {CORES} hosts of a group here")
    assert f"{CORES} CPU core" in line and f"--nodes {nodes}:" in line
    nothing_recorded()
    assert not (sdcloud_home / "local").exists() or not any((sdcloud_home / "local").rglob("*.json"))


def test_a_group_this_machine_can_run_is_taken(sdcloud_home):
    most = min(2, CORES)
    assert build_spec(None, {"tier": "sd15-lora", "provider": "local", "nodes": most}).spec.nodes == most
    with pytest.raises(UserError, match=f"--nodes {CORES + 1}: the local provider can run at most {CORES}"):
        build_spec(None, {"tier": "sd15-lora", "provider": "local", "nodes": CORES + 1})


def test_the_cores_counted_are_the_ones_this_process_may_use(tmp_path):
    """`up` started on one core (taskset, a container's CPU limit): a group of 2 is refused, in one line."""
    env = {**os.environ, "SDCLOUD_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "sdcloud.cli", "up", "--provider", "local", "--tier", "sd15-lora",
                           "--nodes", "2", "--yes"], capture_output=True, text=True, timeout=120, env=env,
                          preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "at most 1 hosts of a group here (1 CPU core, one a host)" in lines[0]
    db = tmp_path / "home" / "state.db"
    assert not db.exists() or sqlite3.connect(db).execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


def test_with_gpus_each_host_takes_one():
    assert nodes.group_limit(0) == (CORES, f"{CORES} CPU core{'s' if CORES != 1 else ''}, one a host")
    if CORES > 1:
        assert nodes.group_limit(1) == (1, "1 GPU, one a host")
    assert nodes.group_limit(CORES + 4)[0] == CORES  # more GPUs than cores: the cores bound it


def test_launching_groups_is_a_power_of_the_provider_not_of_its_name():
    powers = {n: issubclass(provider_class(n), LaunchesGroups) for n in ("aws", "tencent", "local", "ssh")}
    assert powers == {"aws": True, "tencent": True, "local": True, "ssh": False}
    assert provider_class("aws").group_limit() is None and provider_class("local").group_limit()[0] == CORES
