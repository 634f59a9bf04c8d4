"""`batch status` counts a local pool's worker processes as its hosts and prices them at the
[local] price_per_hour, as a local training run's host is priced (issue 23: it said hosts 0, cost 0)."""

from __future__ import annotations

import json

import pytest

from sdcloud.cli import main


def test_local_pool_hosts_are_counted_and_priced(tmp_path, sdcloud_home, capsys):
    from sdcloud.batch import jobs
    from sdcloud.runs.records.state import StateStore

    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text("[local]\nprice_per_hour = 36.0\n")  # a cent a second
    prompts = tmp_path / "p.txt"
    prompts.write_text("".join(f"prompt {n}\n" for n in range(6)))
    res = jobs.submit(jobs.SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(prompts), workers=2,
                                         provider="local", generator="fake", fake_delay=0.2))
    done = jobs.run_local(res["job"], ttl=5.0, poll=0.1)
    assert done["images_done"] == 6
    attempts = StateStore().attempts(res["job"])
    assert len(attempts) == done["workers_started"] >= 2
    assert all(a.end is not None and a.price == 36.0 and a.provider == "local" for a in attempts)
    capsys.readouterr()
    assert main(["batch", "status", res["job"], "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["hosts"] == len(attempts)
    assert st["cost_usd"] == pytest.approx(sum(36.0 * (a.end - a.start) / 3600 for a in attempts), abs=1e-4)
    assert st["cost_usd"] > 0 and st["cost_per_image_usd"] == pytest.approx(st["cost_usd"] / 6, rel=1e-3)
    assert main(["batch", "status", res["job"]]) == 0
    table = capsys.readouterr().out
    assert any("hosts" in line and f" {len(attempts)} " in line for line in table.splitlines()), table
    # The cost report prints the job in its own terms, with the figures `batch status` gives (issue 39).
    assert main(["cost", "report", res["job"], "--format", "json"]) == 0
    (rep,) = json.loads(capsys.readouterr().out)["runs"]
    assert rep["kind"] == "batch" and rep["images_done"] == st["images_done"] == 6
    assert rep["cost_per_image"] == st["cost_per_image_usd"] and rep["total_usd"] == st["cost_usd"]
    assert rep["cost_per_1k_images"] == st["cost_per_1k_images_usd"] == pytest.approx(st["cost_usd"] / 6 * 1000, abs=1e-4)
    assert rep["cost_per_1k_steps"] is None
    assert main(["cost", "report", res["job"]]) == 0
    assert "the one job: total $" in capsys.readouterr().out  # a job is not called a run
    # This machine costs the same on demand: the same worker hours at the same price, nothing saved, nothing lost.
    assert rep["ondemand_usd"] == st["ondemand_usd"] == pytest.approx(st["cost_usd"], abs=1e-4)
    assert rep["savings_usd"] == st["savings_usd"] == 0.0
    assert main(["cost", "report", res["job"]]) == 0
    text = capsys.readouterr().out
    assert f"job {res['job']}" in text and f"run {res['job']}" not in text
    assert "per 1k images" in text and "per 1k steps" not in text and "saved $-" not in text
    assert f"${st['cost_per_image_usd']:.6f} per image" in text


def test_a_job_whose_on_demand_price_is_unknown_claims_no_savings(sdcloud_home):
    """A spot host whose on-demand price was never recorded: on-demand unknown, no negative savings."""
    import time

    from sdcloud.costs.job_terms import in_job_terms
    from sdcloud.costs.ledger import run_cost
    from sdcloud.costs.report import build_report
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    state.create_run("b-0000cafe", "batch-sd15", {"kind": "batch", "provider": "local", "images": 10}, 10)
    state.add_attempt("b-0000cafe", 1, "local", "t1", region="local", zone="local", instance_type="x", market="spot",
                      price=3.6, currency="USD")
    now = time.time()
    state.update_attempt("b-0000cafe", 1, state="ended", start=now - 100, end=now, end_reason="succeeded")
    job = state.get_run("b-0000cafe")
    terms = in_job_terms(state, run_cost(state, job), job, 4)
    assert terms["total_usd"] > 0 and terms["ondemand_usd"] is None and terms["savings_usd"] is None
    assert terms["cost_per_image"] == pytest.approx(terms["total_usd"] / 4, abs=1e-6)
    rep = build_report(state, [job], images={"b-0000cafe": 4})
    assert rep["totals"]["savings_usd"] == 0.0 and rep["totals"]["savings_over_runs"] == 0
    # Recorded, the counterfactual is the same hours on demand.
    state.set_attempt_costs("b-0000cafe", 1, currency="USD", ondemand_price=7.2)
    terms = in_job_terms(state, run_cost(state, job), job, 4)
    assert terms["ondemand_usd"] == pytest.approx(2 * terms["total_usd"], abs=1e-4) and terms["savings_usd"] > 0
