"""A host of a multi-node group launched in one request (AWS: RunInstances with MinCount = MaxCount = N,
one user-data for every host) takes its rank from its launch index, read through IMDSv2 (the fake
metadata service of tests/support/fake_host.py); a cloud that launches host by host keeps the rank
its own config carries."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sdcloud_agent import config as agent_config
from sdcloud_agent.agent_nodes import resolve_rank
from sdcloud_agent.config import ConfigError, from_dict

from tests.support.fake_host import AwsMetadataServer


def group_config(server: AwsMetadataServer | None, nodes: int = 4, **extra) -> agent_config.AgentConfig:
    metadata = {"kind": "aws", "base_url": server.base_url} if server else {"kind": "none"}
    return from_dict({"run_id": "r-1", "store": {"url": "file:///tmp/x"}, "nodes": nodes, "node_rank": 0,
                      "node_rank_from": "launch-index", "metadata": metadata, **extra})


def test_each_host_takes_its_rank_from_its_launch_index_through_imdsv2():
    with AwsMetadataServer() as srv:
        for index in (0, 3, 1):
            srv.launch_index = index
            cfg = group_config(srv)
            resolve_rank(cfg)
            assert cfg.node_rank == index
        # IMDSv2: a token first, then the index with it (a bare GET is refused, 401).
        assert ("PUT", "/latest/api/token") in srv.requests
        assert ("GET", "/latest/meta-data/ami-launch-index") in srv.requests


def test_a_cloud_without_launch_index_keeps_the_rank_of_the_config():
    cfg = group_config(None, node_rank=2)
    resolve_rank(cfg)
    assert cfg.node_rank == 2
    # A single host or a config that names its rank never asks the metadata service.
    with AwsMetadataServer() as srv:
        srv.launch_index = 1
        cfg = group_config(srv, node_rank_from="", node_rank=3)
        resolve_rank(cfg)
        assert cfg.node_rank == 3 and srv.requests == []


def test_a_launch_index_outside_the_group_or_unreadable_is_refused():
    with AwsMetadataServer() as srv:
        srv.launch_index = 4
        with pytest.raises(ConfigError, match="outside the group of 4"):
            resolve_rank(group_config(srv))
    slept: list[float] = []
    cfg = group_config(None)
    cfg.metadata = {"kind": "aws", "base_url": "http://127.0.0.1:9"}  # nothing answers there
    with pytest.raises(ConfigError, match="this host's rank"):
        resolve_rank(cfg, sleep=slept.append)
    assert len(slept) == 4  # bounded: a few tries, then the host fails its boot


def test_an_unknown_rank_source_is_refused_by_the_config():
    with pytest.raises(ConfigError, match="node_rank_from"):
        group_config(None, node_rank_from="hostname")


def test_the_agent_reads_its_rank_before_it_runs(tmp_path):
    """`python -m sdcloud_agent run`, as the user-data starts it: a host whose launch index lies
    outside its group fails at once, saying why, before it touches the bucket."""
    with AwsMetadataServer() as srv:
        srv.launch_index = 7
        path = tmp_path / "agent.json"
        path.write_text(json.dumps({"run_id": "r-1", "store": {"url": (tmp_path / "bucket").as_uri()}, "nodes": 2,
                                    "node_rank_from": "launch-index",
                                    "metadata": {"kind": "aws", "base_url": srv.base_url}}))
        done = subprocess.run([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(path)],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "launch index 7 is outside the group of 2 hosts" in done.stderr
    assert not (tmp_path / "bucket").exists()
