"""`sdcloud up --provider ssh` end to end: the CLI, the controller, a real sshd on 127.0.0.1, the
real agent uploaded as a zip, the builtin trainer on the tiny model, and nothing left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.server_seaweed import agent_processes as running_agents
from tests.support.server_sshd import write_hosts

pytestmark = pytest.mark.slow



def agent_processes(workdir) -> list[int]:
    """Agent (and trainer) processes started from this test's host workdir."""
    return running_agents(str(workdir))


def test_up_on_an_ssh_host(sshd, sdcloud_home, tmp_path):  # noqa: F811
    workdir = tmp_path / "host-workdir"
    write_hosts(sdcloud_home / "ssh-hosts.toml", [sshd.host_entry("box", workdir, python=sys.executable)])
    proc = subprocess.run([sys.executable, "-m", "sdcloud.cli", "up", "--provider", "ssh", "--tier", "sd15-lora",
                           "--model", "tiny", "--steps", "12", "--yes", "--json"],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["state"] == "succeeded" and out["step"] == 12, out
    assert out["provider"] == "ssh"
    # A loaded machine may need a second launch; the last attempt is the one that finished.
    last = out["attempts"][-1]
    assert last["zone"] == "box" and last["instance_id"].startswith("box:"), out
    assert last["end_reason"] == "succeeded", out
    assert not agent_processes(workdir), "an agent or trainer is still running on the host"
    # What ran on the host stayed in its workdir: the agent wheel, the private config, the log; all ended.
    token_dirs = [p for p in workdir.iterdir() if p.is_dir()]
    assert token_dirs
    for token_dir in token_dirs:
        assert list(token_dir.glob("sdcloud_agent-0.1.0+*-py3-none-any.whl")) and (token_dir / "agent.log").stat().st_size > 0
        assert (token_dir / "cfg.json").stat().st_mode & 0o777 == 0o600
        assert json.loads((token_dir / "instance.json").read_text()).get("ended")


def test_up_on_an_ssh_host_with_a_local_model_folder(sshd, sdcloud_home, tmp_path):  # noqa: F811
    """A diffusers folder on this machine reaches the host through the bucket (uploaded once by its
    content), is restored into the host's workdir and trained from there."""
    from sdcloud_agent.store import open_store
    from sdcloud_agent.trainers import tiny

    model = tiny.save_pipeline(tmp_path / "laptop" / "my-model")
    workdir = tmp_path / "host-workdir"
    write_hosts(sdcloud_home / "ssh-hosts.toml", [sshd.host_entry("box", workdir, python=sys.executable)])
    proc = subprocess.run([sys.executable, "-m", "sdcloud.cli", "up", "--provider", "ssh", "--tier", "sd15-lora",
                           "--model", str(model), "--trainer-arg", "resolution=32", "--steps", "4", "--yes", "--json"],
                          check=False, capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["state"] == "succeeded" and out["step"] == 4, out
    store = open_store((sdcloud_home / "bucket").resolve().as_uri())
    (tar,) = [o.key for o in store.list("cache/models/") if o.key.startswith("cache/models/local-")]
    assert not [o for o in store.list("cache/") if o.key.endswith(".part")]
    cfgs = [json.loads(p.read_text()) for p in workdir.glob("*/cfg.json")]
    assert cfgs and {c["model"] for c in cfgs} == {f"cache:{tar}"}  # the laptop path never reached the host
    staged = list(workdir.rglob(f"models/{tar.rsplit('/', 1)[1][:-4]}/model_index.json"))
    assert staged, "the host did not restore the model from the bucket"
    assert not agent_processes(workdir)
