"""A multi-node group on CVM (the fake API through the real SDK): `--nodes 2` launches two hosts in one zone
(CVM has no cluster placement: docs/training.md), each with its rank in its user-data; a reclaim of one
ends both; gc finds nothing."""

from __future__ import annotations

import base64
import json

from sdcloud.cli import main
from sdcloud.fleet.lifecycle import Fleet, Timing
from sdcloud.offers.optimizer import Offer
from sdcloud.providers.base import TAG_NODE, LaunchSpec
from sdcloud.providers.groups import members
from sdcloud.runs.records.state import StateStore
from sdcloud.spot.policy import get_policy

from tests.providers.tencent.test_tencent import INFRA, REGION, fake, provider, row  # noqa: F401  (fake: a fixture)


def group_spec(run_id: str = "run-g", attempt: int = 1, nodes: int = 2) -> LaunchSpec:
    agent = {"run": run_id, "attempt": attempt, "nodes": nodes, "node_rank": 0, "rendezvous_port": 29500}
    data = ["#!/bin/sh\n" + json.dumps({**agent, "node_rank": r}) for r in range(nodes)]
    return LaunchSpec(run_id=run_id, attempt=attempt, infra=dict(INFRA), user_data=data[0], agent_config=agent,
                      node_user_data=data)


def test_two_nodes_launch_in_one_zone_each_with_its_rank(fake):  # noqa: F811
    inst = provider().launch(Offer(row(), "spot"), group_spec(), "spot")
    ids = members(inst.id)
    live = {i.id: i for i in fake.cvm.live()}
    assert set(live) == set(ids) and len({live[i].zone for i in ids}) == 1
    for rank, iid in enumerate(ids):
        assert live[iid].tags[TAG_NODE] == str(rank)
        text = base64.b64decode(live[iid].user_data).decode()
        assert f'"node_rank": {rank}' in text and '"nodes": 2' in text and '"rendezvous_port": 29500' in text
    # A second launch of the same attempt adopts both hosts.
    assert provider().launch(Offer(row(), "spot"), group_spec(), "spot").id == inst.id
    assert len(fake.cvm.live()) == 2


def test_a_reclaim_of_one_host_ends_both_and_gc_finds_nothing(fake, sdcloud_home, capsys):  # noqa: F811
    state = StateStore(sdcloud_home / "state.db")
    state.create_run("run-g", "sdxl-finetune", {"tier": "sdxl-finetune", "provider": "tencent", "nodes": 2}, 100)
    prov = provider()
    fleet = Fleet("run-g", prov, "tencent", state, [Offer(row(), "spot")], get_policy("sdcloud"), lambda k, d: None,
                  Timing(poll_seconds=1, boot_timeout=600, heartbeat_timeout=600))
    inst = fleet.launch("spot", Offer(row(), "spot"), lambda n: group_spec(attempt=n))
    fake.cvm.reclaim(members(inst.id)[0])  # the spot market takes rank 0's host
    assert fleet.check(fleet.current(), "training", heartbeat=None) == "preempted"
    assert fake.cvm.live() == []  # rank 1's host ended with it: the group is one unit
    state.update_run("run-g", state="failed")
    state.close()
    assert main(["gc", "--provider", "tencent", "--region", REGION, "--yes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["found"] == 0
