"""`--nodes N`: the run spec's field, its checks, and the agent config each host of the group gets."""

from __future__ import annotations

import pytest

from sdcloud.errors import UserError


def test_nodes_flows_from_the_flag_to_the_spec_and_the_agent_config(sdcloud_home):
    from sdcloud.runs.inputs.agent_config import agent_config
    from sdcloud.runs.inputs.spec import build_spec

    plan = build_spec(None, {"tier": "sd15-lora", "provider": "local", "nodes": "2"})
    assert plan.spec.nodes == 2
    cfg = agent_config(plan, "r1", 1, 10, {"url": "file:///tmp/b"})
    assert (cfg["nodes"], cfg["node_rank"], cfg["rendezvous_port"]) == (2, 0, 29500)
    assert build_spec(None, {"tier": "sd15-lora"}).spec.nodes == 1


def test_several_hosts_on_the_users_own_boxes_are_refused_before_launch(sdcloud_home):
    from sdcloud.runs.inputs.spec import build_spec

    with pytest.raises(UserError, match="--nodes 2: the ssh provider runs each run on one box of yours"):
        build_spec(None, {"tier": "sd15-lora", "provider": "ssh", "nodes": "2"})


@pytest.mark.parametrize("bad", ["0", "-1", "two", "65"])
def test_a_bad_node_count_is_refused_before_launch(sdcloud_home, bad):
    from sdcloud.runs.inputs.spec import build_spec

    with pytest.raises(UserError, match="--nodes"):
        build_spec(None, {"tier": "sd15-lora", "nodes": bad})


def test_each_host_of_a_group_caps_its_life_by_the_groups_burn(sdcloud_home):
    from sdcloud.runs.inputs.agent_config import self_end_config
    from sdcloud.runs.inputs.spec import build_spec

    spec = build_spec(None, {"tier": "sd15-lora", "provider": "aws", "nodes": "4", "budget": "10"}).spec
    se = self_end_config(spec, 0.0, 1.5, lambda: 2.0, 1.0, 1.0)
    assert se["price_per_hour"] == 6.0 and se["budget_left"] == 8.0


def test_a_group_across_clouds_is_refused_before_anything_is_recorded(sdcloud_home):
    from sdcloud.runs.inputs.spec import build_spec

    with pytest.raises(UserError, match="a group of hosts trains in one cloud"):
        build_spec(None, {"tier": "sdxl-finetune", "provider": "aws,tencent", "nodes": 2})
