"""The cost report of a multi-node run: each node's hours and share of the cost (costs/report.py)."""

from __future__ import annotations

from sdcloud.costs.report import _with_nodes


def test_each_node_bills_every_attempts_hours_at_its_share():
    cost = {"attempts": [{"hours": 0.5}, {"hours": 0.25}], "total_usd": 3.0}
    got = _with_nodes(dict(cost), {"spec": {"nodes": 3}})
    assert got["nodes"] == 3
    assert got["node_hours"] == [{"node": k, "hours": 0.75, "usd": 1.0} for k in range(3)]
    assert "nodes" not in _with_nodes(dict(cost), {"spec": {}})  # a single host: as before
