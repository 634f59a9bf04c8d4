"""The largest multi-node group (`--nodes` at its limit) against each cloud's documented limits
(sdcloud/providers/<name>/limits.py): every host's user-data (its own rank in it), every host's tags
(its rank among them), and each host's idempotency token, whole and distinct, within the request's."""

from __future__ import annotations

import pytest

from sdcloud.offers.groups import MAX_NODES
from sdcloud.providers.groups import host_spec
from sdcloud.runs.inputs import spec as run_spec

from tests.providers import test_limits as lim_tests
from sdcloud.providers.traits import traits
from tests.providers.test_limits import CLOUDS, REQUESTS, longest_region, tag_problems, user_data_problems

TOKEN_CHARS = 64  # EC2 RunInstances ClientToken and CVM RunInstances ClientToken: at most 64 ASCII characters


@pytest.fixture
def largest_group(monkeypatch):
    from sdcloud.runs.inputs import carry

    monkeypatch.setattr(carry, "carry_trainer_sources", lambda store, agent: "present")
    real = lim_tests.build_spec
    monkeypatch.setattr(lim_tests, "build_spec", lambda path, flags: real(path, {**flags, "nodes": MAX_NODES}))
    assert run_spec.MAX_NODES == MAX_NODES  # `up --nodes` and `offers --nodes` take the same limit


@pytest.mark.parametrize("provider", [p for p in CLOUDS if traits(p).market.multi_node])
def test_every_host_of_the_largest_group_fits_the_cloud(provider, largest_group, tmp_path, sdcloud_home):
    spec = lim_tests.largest_launch(provider, "sdxl-finetune", "kohya", tmp_path, sdcloud_home)
    assert len(spec.node_user_data) == MAX_NODES
    # The one user-data of a group launched in one request (AWS): every host reads its rank from its launch index.
    assert '"node_rank_from":"launch-index"' in spec.user_data and user_data_problems(provider, spec.user_data) == []
    region = longest_region(provider)
    tokens = set()
    for rank in (0, 1, MAX_NODES - 1):
        host = host_spec(spec, rank)
        assert f'"node_rank":{rank},' in host.user_data and f'"nodes":{MAX_NODES},' in host.user_data
        assert '"rendezvous_port":29500' in host.user_data
        assert user_data_problems(provider, host.user_data) == []
        params, tags = REQUESTS[provider](host, region)
        assert tags["instance"]["sdcloud:node"] == str(rank)
        assert [p for kind, t in tags.items() for p in tag_problems(provider, t, kind)] == []
        token = params["ClientToken"]
        assert len(token) <= TOKEN_CHARS and f"-n{rank}" in token  # whole: not cut into another rank's
        tokens.add(token)
    assert len(tokens) == 3
