"""A multi-node run's cost report: each host billed (compute and disk N times, the bucket once), each
node's hours and cost, the group's totals and price; the same run on one host costs exactly 1/N of the
hosts' part."""

from __future__ import annotations

import json

import pytest

from sdcloud.cli import main
from sdcloud.costs import ledger
from sdcloud.offers.optimizer import Offer
from sdcloud.runs.records.state import StateStore

from tests.costs.test_cost_report import DISK_GB, OD, T0, row


def _run(state: StateStore, run_id: str, nodes: int, seconds: float = 7200) -> dict:
    spec = {"tier": "sdxl-finetune", "provider": "aws", "region": "us-east-1", "nodes": nodes}
    state.create_run(run_id, "sdxl-finetune", spec, 1000)
    state.update_run(run_id, step=1000, state="succeeded")
    # The fleet records a group's attempt at the group's price (fleet/lifecycle.py).
    state.add_attempt(run_id, 1, "aws", "tok", region="us-east-1", zone="us-east-1a", instance_type="g5.xlarge",
                      market="on-demand", price=OD * nodes, currency="USD")
    state.update_attempt(run_id, 1, state="running", start=T0, instance_id="i-a+i-b" if nodes > 1 else "i-a")
    ledger.started(state, run_id, 1, Offer(row("us-east-1a"), "on-demand"), "on-demand", DISK_GB, zone="us-east-1a", at=T0)
    state.update_attempt(run_id, 1, state="ended", end=T0 + seconds, end_reason="succeeded")
    ledger.closed(state, run_id, 1)
    return ledger.run_cost(state, state.get_run(run_id))


def test_each_node_is_billed_and_the_group_adds_up(capsys):
    state = StateStore()
    one, two = _run(state, "r-one", 1), _run(state, "r-two", 2)
    (a1,), (a2,) = one["attempts"], two["attempts"]
    for item in ("compute", "disk"):  # amounts in a report are rounded to 4 decimals
        assert a2["items"][item]["usd"] == pytest.approx(2 * a1["items"][item]["usd"], abs=2e-4)
    for item in ("bucket", "requests"):  # the run's bucket is one, whatever the hosts
        assert a2["items"][item]["usd"] == pytest.approx(a1["items"][item]["usd"])
    assert a2["items"]["compute"]["usd"] == pytest.approx(2 * OD * 2)  # 2 hosts x 2 h x the list price
    assert one["nodes"] is None
    view = two["nodes"]
    assert view["nodes"] == 2 and [n["node"] for n in view["per_node"]] == [0, 1]
    per_host = a1["items"]["compute"]["usd"] + a1["items"]["disk"]["usd"]
    assert all(n["hours"] == pytest.approx(2.0) and n["usd"] == pytest.approx(per_host, abs=1e-4)
               for n in view["per_node"])
    assert view["node_hours"] == pytest.approx(4.0)
    assert view["group_price_per_hour_usd"] == pytest.approx(2 * OD)
    # The on-demand counterfactual is the group's too: no savings invented by pricing one host.
    assert two["ondemand_usd"] == pytest.approx(two["estimate_usd"], abs=1e-3)
    # The report: JSON carries the nodes, the table names each node and the group.
    capsys.readouterr()
    assert main(["cost", "report", "r-two", "--format", "json"]) == 0
    [report] = json.loads(capsys.readouterr().out)["runs"]
    assert report["nodes"]["per_node"][1]["hours"] == pytest.approx(2.0)
    assert main(["cost", "report", "r-two"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "2 nodes: node 0: 2.00 h" in out and "node 1: 2.00 h" in out and "4.00 node-hours" in out


@pytest.mark.parametrize("seconds", [59.64, 30.0, 61.0])
def test_a_short_on_demand_group_saves_nothing_rather_than_a_negative_amount(capsys, seconds):
    """A 2-node on-demand run of a minute said "saved $-0.0001 (-0.6%)": each host was billed EC2's 60 s
    minimum and its on-demand counterfactual was not. Both are priced under the same rules now."""
    state = StateStore()
    cost = _run(state, "r-short", 2, seconds)
    [a] = cost["attempts"]
    assert a["items"]["compute"]["detail"]["billed_seconds"] == pytest.approx(max(60.0, seconds))
    assert cost["ondemand_usd"] == pytest.approx(cost["total_usd"])
    assert cost["savings_usd"] == 0.0 and cost["savings_pct"] == 0.0
    capsys.readouterr()
    assert main(["cost", "report", "r-short"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "saved $0.0000 (0.0%)" in out and "saved $-" not in out and "(-" not in out
