"""Budgets: refused before launch against the whole job's predicted cost; warnings at 50% and 80%."""

from __future__ import annotations

import pytest

from sdcloud.cli import main
from sdcloud.costs.budget import DISK_GB, predict, predicted_cost, warnings_due
from sdcloud.offers.catalog import load_catalog
from sdcloud.offers.optimizer import rank
from sdcloud.offers.tiers import get_tier


def test_prediction_is_the_whole_job_not_the_cheapest_estimate():
    tier = get_tier("sdxl-lora")
    ranked = rank(tier, load_catalog(["aws"]), provider="aws", region="us-east-1")
    first = ranked[0]
    # Compute with the reclaim overhead, plus 200 GB of gp3 for the expected hours.
    assert predicted_cost(first) == pytest.approx(first.est_cost + DISK_GB * first.est_hours * 0.08 / 730)
    cost, what = predict(ranked, "spot", deadline_hours=48)
    od = next(e for e in ranked if e.offer.market == "on-demand")
    assert cost == pytest.approx(max(predicted_cost(first), predicted_cost(od)))
    assert cost > first.est_cost


def test_budget_between_the_cheapest_estimate_and_the_prediction_is_refused(capsys, sdcloud_home):
    tier = get_tier("sdxl-lora")
    ranked = rank(tier, load_catalog(["aws"]), provider="aws", region="us-east-1")
    cost, _ = predict(ranked, "spot", deadline_hours=48)
    budget = (ranked[0].est_cost + cost) / 2  # enough for the old check, not for the whole job
    assert ranked[0].est_cost < budget < cost
    code = main(["up", "--tier", "sdxl-lora", "--provider", "aws", "--region", "us-east-1", "--deadline", "48h",
                 "--budget", f"{budget:.4f}", "--yes"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "below the predicted cost of the whole job" in err, err
    assert not (sdcloud_home / "state.db").exists() or "r-" not in err


def test_warnings_once_each_at_50_and_80_percent():
    logged: set[int] = set()
    assert warnings_due(4.9, 10, logged) == []
    assert warnings_due(5.0, 10, logged) == [50]
    logged.add(50)
    assert warnings_due(7.9, 10, logged) == []
    assert warnings_due(9.0, 10, logged) == [80]
    assert warnings_due(9.0, 10, {50, 80}) == []


def test_controller_logs_each_warning_once_across_restarts():
    from sdcloud.runs.driving.budget_watch import budget_warnings
    from sdcloud.runs.driving.controller import Controller
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    state.create_run("r-budget", "sd15-lora", {"tier": "sd15-lora", "provider": "local", "budget": 10.0}, 10)
    ctl = Controller(state, "r-budget")
    for spent in (1.0, 5.5, 6.0, 8.5, 9.0):
        budget_warnings(ctl, spent)
    again = Controller(state, "r-budget")  # a restarted controller does not log them again
    budget_warnings(again, 9.5)
    warns = [e["data"] for e in state.events("r-budget") if e["kind"] == "budget-warning"]
    assert [(w["pct"], w["spent"]) for w in warns] == [(50, 5.5), (80, 8.5)]
