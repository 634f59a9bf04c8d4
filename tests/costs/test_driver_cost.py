"""The cloud driver's invocations appear in a run's cost (sdcloud/costs/driver.py): counted from the
run's `driver-took-over` events, priced per invocation at the function's configured size."""

from __future__ import annotations

import pytest

from sdcloud.costs import driver as drv
from sdcloud.providers.traits import traits


def _run(tmp_path, takeovers: list[str]):
    from sdcloud.runs.records.state import StateStore

    state = StateStore(tmp_path / "state.db")
    state.create_run("run-d", "sd15-lora", {"provider": "aws", "region": "us-east-1", "tier": "sd15-lora"}, 10)
    for name in takeovers:
        state.event("run-d", "driver-took-over", {"driver": name})
    state.event("run-d", "launched", {"instance_id": "i-1"})
    return state


def test_each_lambda_invocation_is_priced_at_the_functions_size(tmp_path):
    from sdcloud.costs.ledger import run_cost

    state = _run(tmp_path, ["aws-lambda", "aws-lambda", "aws-lambda", "laptop-1234"])
    cost = run_cost(state, state.get_run("run-d"), now=1e10)
    item = cost["run_items"]["driver"]
    fn = traits("aws").function
    per_call = 0.20 / 1e6 + (fn.timeout_seconds - fn.safety_seconds) * fn.memory_gb * 0.0000166667
    assert item["usd"] == pytest.approx(3 * per_call, abs=1e-4)
    assert item["detail"]["drivers"] == {"aws-lambda": {"invocations": 3, "gb_seconds": 315.0,
                                                        "usd": round(3 * per_call, 6)}}
    assert cost["estimate_usd"] == pytest.approx(item["usd"], abs=1e-4)  # no attempt yet: the driver alone


def test_scf_invocations_are_counted_but_not_priced_without_a_cited_price(tmp_path):
    item = drv.driver_item(_run(tmp_path, ["tencent-scf"] * 2).events("run-d"))
    assert item["usd"] == 0.0 and item["source"] == "unpriced"
    assert item["detail"]["drivers"]["tencent-scf"]["invocations"] == 2
    assert item["detail"]["unpriced"] == ["tencent-scf"]


def test_no_item_for_a_run_no_cloud_driver_took(tmp_path):
    from sdcloud.costs.ledger import run_cost

    state = _run(tmp_path, ["laptop-1"])
    assert "driver" not in run_cost(state, state.get_run("run-d"), now=1e10)["run_items"]


def test_the_report_prints_the_drivers_line(tmp_path, capsys):
    from sdcloud.costs.report import build_report, print_tables

    state = _run(tmp_path, ["aws-lambda"] * 12)
    print_tables(build_report(state, [state.get_run("run-d")], now=1e10))
    assert "cloud driver 12 invocations $0.0210" in capsys.readouterr().out.replace("\n", " ")
