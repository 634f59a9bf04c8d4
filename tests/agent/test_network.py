"""The run's `network` setting: where a host gets the package index, the model hub and torch's
wheels. Checked in the agent's config; applied to the agent's and the boot's environment, so that
the model phase fetches from the configured hub (a local one here) and nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sdcloud_agent import gpu, network
from sdcloud_agent.config import ConfigError, from_dict

from tests.support.fake_hub import REPO_SDXL, FakeHub, sdxl_shaped


def test_the_setting_is_checked_in_the_config():
    cfg = from_dict({"run_id": "r", "store": "file:///tmp/b",
                     "network": {"pip_index_url": "https://pypi.mirror.example/simple", "hf_endpoint": "https://hub.mirror.example"}})
    assert cfg.network["hf_endpoint"] == "https://hub.mirror.example"
    with pytest.raises(ConfigError, match="no setting 'apt'"):
        from_dict({"run_id": "r", "store": "file:///tmp/b", "network": {"apt": "https://x"}})
    with pytest.raises(ConfigError, match="http\\(s\\) URL"):
        from_dict({"run_id": "r", "store": "file:///tmp/b", "network": {"hf_endpoint": "hub.example"}})


def test_apply_sets_what_pip_huggingface_hub_and_the_torch_index_read(monkeypatch):
    env: dict[str, str] = {}
    got = network.apply({"pip_index_url": "https://pypi.m/simple", "hf_endpoint": "https://hf.m",
                         "torch_index_url": "https://torch.m/whl/"}, env)
    assert got == env == {"PIP_INDEX_URL": "https://pypi.m/simple", "HF_ENDPOINT": "https://hf.m",
                          "SDCLOUD_TORCH_INDEX_URL": "https://torch.m/whl/"}
    assert network.apply({}, env) == {} and network.apply(None, env) == {}
    monkeypatch.delenv("SDCLOUD_TORCH_INDEX_URL", raising=False)
    assert gpu.torch_index("cu126") == "https://download.pytorch.org/whl/cu126"
    monkeypatch.setenv("SDCLOUD_TORCH_INDEX_URL", "https://torch.m/whl/")
    assert gpu.torch_index("cu130") == "https://torch.m/whl/cu130"


STAGE = """
import json, sys
from pathlib import Path
from sdcloud_agent import models, network
from sdcloud_agent.config import from_dict
from sdcloud_agent.store import LocalStore
cfg = from_dict(json.loads(sys.argv[1]))
network.apply(cfg.network)
print(json.dumps(models.stage(cfg.model, LocalStore(sys.argv[2]), Path(sys.argv[3]))))
"""


def test_the_model_phase_fetches_from_the_configured_hub(tmp_path):
    """No HF_ENDPOINT in the environment: the config's hf_endpoint alone leads to the local hub."""
    with FakeHub({REPO_SDXL: sdxl_shaped(100_000)}) as hub:
        cfg = {"run_id": "r", "store": "file:///unused", "model": REPO_SDXL, "network": {"hf_endpoint": hub.endpoint}}
        env = {k: v for k, v in os.environ.items() if k not in ("HF_ENDPOINT", "HF_HUB_OFFLINE")}
        env.update({"HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1", "NO_PROXY": "127.0.0.1"})
        p = subprocess.run([sys.executable, "-c", STAGE, json.dumps(cfg), str(tmp_path / "bucket"), str(tmp_path / "host")],
                           env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        assert json.loads(p.stdout.strip().splitlines()[-1])[1] == "fetched"
        assert hub.bytes_fetched() > 0


def _agent_config(user_data: str) -> dict:
    start = user_data.index("<<'SDCLOUD_CONFIG'\n") + len("<<'SDCLOUD_CONFIG'\n")
    return json.loads(user_data[start:user_data.index("\nSDCLOUD_CONFIG\n", start)])


def test_config_toml_names_the_mirrors_hosts_use(sdcloud_home, tmp_path):
    from sdcloud.runs.driving.hostboot import cloud_user_data
    from sdcloud_agent.store import LocalStore

    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text(
        '[network]\npip_index_url = "https://pypi.mirror.example/simple"\n'
        '[network.regions."ap-guangzhou"]\nhf_endpoint = "https://hub.mirror.example"\n')
    store = LocalStore(tmp_path / "bucket")
    agent = {"run_id": "r", "store": {"url": "cos://b-1250000000/p", "region": "ap-guangzhou"}}
    cfg = _agent_config(cloud_user_data("tencent", store, agent, {"region": "ap-guangzhou"}))
    assert cfg["network"] == {"pip_index_url": "https://pypi.mirror.example/simple", "hf_endpoint": "https://hub.mirror.example",
                              "trainer_sources": "bucket"}  # the last from the mainland profile
    cfg = _agent_config(cloud_user_data("aws", store, {"run_id": "r", "store": {"url": "s3://b/p"}}, {"region": "us-east-1"}))
    assert cfg["network"] == {"pip_index_url": "https://pypi.mirror.example/simple"}


def test_no_config_means_no_network_setting_and_a_bad_one_is_one_line(sdcloud_home, tmp_path):
    from sdcloud.errors import UserError
    from sdcloud.runs.driving.hostboot import cloud_user_data
    from sdcloud_agent.store import LocalStore

    store = LocalStore(tmp_path / "bucket")
    assert "network" not in _agent_config(cloud_user_data("aws", store, {"run_id": "r", "store": {"url": "s3://b/p"}}))
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text('[network]\nhub = "https://x"\n')
    with pytest.raises(UserError, match="no setting 'hub'"):
        cloud_user_data("aws", store, {"run_id": "r", "store": {"url": "s3://b/p"}})
