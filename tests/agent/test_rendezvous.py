"""A multi-node attempt's rendezvous through the run's bucket (sdcloud_agent/rendezvous.py) and the
agent config's node fields."""

from __future__ import annotations

import json
import threading

import pytest

from sdcloud_agent import rendezvous
from sdcloud_agent.config import ConfigError, from_dict
from sdcloud_agent.store import open_store


def _store(tmp_path):
    return open_store(f"file://{tmp_path}/bucket")


def test_rank0_publishes_and_another_rank_reads_it_under_the_runs_prefix(tmp_path):
    store = _store(tmp_path)
    rendezvous.publish(store, 3, "10.0.0.7", 29511, 2, run_prefix="runs/r1")
    doc = json.loads(store.get("runs/r1/rendezvous/3.json"))
    assert (doc["addr"], doc["port"], doc["nodes"], doc["attempt"]) == ("10.0.0.7", 29511, 2, 3)
    got = rendezvous.wait_for(store, 3, timeout_s=1, run_prefix="runs/r1")
    assert got == rendezvous.Rendezvous("10.0.0.7", 29511, 2, 3)
    assert got.env(1) == {"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29511", "WORLD_SIZE": "2", "RANK": "1",
                          "LOCAL_RANK": "0", "NODE_RANK": "1"}


def test_a_rank_waits_for_rank0_published_later(tmp_path):
    store = _store(tmp_path)
    later = threading.Timer(0.3, rendezvous.publish, args=(store, 1, "127.0.0.1", 29600, 2),
                            kwargs={"run_prefix": "runs/r"})
    later.start()
    try:
        got = rendezvous.wait_for(store, 1, timeout_s=10, run_prefix="runs/r", poll_s=0.05)
    finally:
        later.cancel()
    assert (got.addr, got.port) == ("127.0.0.1", 29600)


def test_an_older_attempts_rendezvous_is_never_joined_and_the_wait_times_out_with_the_reason(tmp_path):
    store = _store(tmp_path)
    rendezvous.publish(store, 1, "10.0.0.1", 29500, 2, run_prefix="runs/r")
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    with pytest.raises(rendezvous.RendezvousTimeout) as err:
        rendezvous.wait_for(store, 2, timeout_s=30, run_prefix="runs/r", clock=lambda: now[0], sleep=sleep)
    assert now[0] >= 30
    assert "rank 0 of attempt 2 did not publish its address within 30s" in str(err.value)
    assert "runs/r/rendezvous/2.json" in str(err.value)


def test_a_host_being_taken_away_stops_waiting(tmp_path):
    with pytest.raises(rendezvous.RendezvousTimeout, match="stopped while waiting"):
        rendezvous.wait_for(_store(tmp_path), 1, timeout_s=60, stop=lambda: True, sleep=lambda s: None)


def test_publish_refuses_a_bad_port():
    with pytest.raises(ValueError):
        rendezvous.publish(None, 1, "10.0.0.1", 0, 2)


def test_the_agent_config_carries_nodes_rank_and_port_with_defaults_and_checks():
    base = {"run_id": "r", "store": "file:///tmp/x"}
    cfg = from_dict(dict(base))
    assert (cfg.nodes, cfg.node_rank, cfg.rendezvous_port) == (1, 0, 29500)
    cfg = from_dict({**base, "nodes": 4, "node_rank": 3, "rendezvous_port": 29612})
    assert (cfg.nodes, cfg.node_rank, cfg.rendezvous_port) == (4, 3, 29612)
    with pytest.raises(ConfigError, match="node_rank"):
        from_dict({**base, "nodes": 2, "node_rank": 2})
    with pytest.raises(ConfigError, match="rendezvous_port"):
        from_dict({**base, "rendezvous_port": 70000})
