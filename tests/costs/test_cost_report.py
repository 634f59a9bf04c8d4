"""The acceptance "costed run": two spot attempts and one on-demand, a spot price that changes
mid-attempt, one reclaim inside the first hour and one after it. Every figure is computed here by
hand from the billing rules in docs/costs.md; JSON, CSV, the table and the HTML must agree."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import datetime, timezone

import pytest

from sdcloud.cli import main
from sdcloud.costs import ledger
from sdcloud.offers.catalog import CatalogRow
from sdcloud.offers.optimizer import Offer
from sdcloud.runs.records.state import StateStore
from sdcloud_agent.store import open_store

T0 = datetime(2026, 11, 2, 0, 0, tzinfo=timezone.utc).timestamp()
GIB = 2**30
OD = 1.006  # g5.xlarge us-east-1 on-demand list, $/h (the figure the offer carries)
DISK_GB = 200
# sdcloud/providers/aws/storage_prices.toml
GP3, S3GB, PUT, GET = 0.08, 0.023, 0.005, 0.0004


def row(zone: str) -> CatalogRow:
    return CatalogRow(provider="aws", region="us-east-1", zone=zone, instance_type="g5.xlarge", gpu="A10G", gpu_count=1,
                      vram_gb=24, vcpus=4, memory_gb=16, nvme_gb=250, ondemand_price=OD, spot_price=0.40, currency="USD",
                      interruption_band=2, snapshot_date="2026-11-01", ondemand_estimate=False, spot_estimate=False,
                      source="test")


class HistoryProvider:
    """The one provider call the ledger makes: EC2's spot price history of a zone (as AwsProvider returns it)."""

    def __init__(self, history: dict[str, list[tuple[float, float]]]):
        self.history = history
        self.calls = []

    def price_history(self, instance_type, zone, start, end):
        self.calls.append((instance_type, zone, start.timestamp(), end.timestamp()))
        return [(datetime.fromtimestamp(t, timezone.utc), p) for t, p in self.history[zone]
                if start.timestamp() <= t <= end.timestamp()]


def sparse(store_root, key: str, size: int) -> None:
    path = store_root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)


def status(n, step, at, rate=0.5):
    return {"attempt": n, "phase": "training", "step": step, "time": at, "it_per_s": rate}


@pytest.fixture
def costed_run(tmp_path):
    state = StateStore()
    run_id = "r-costed1"
    state.create_run(run_id, "sd15-lora", {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1"}, 3000, "costed")
    state.update_run(run_id, step=3000, state="succeeded")
    # created at T0, so that the "day" grouping is known
    state._db.execute("UPDATE runs SET created = ? WHERE id = ?", (T0, run_id))
    root = tmp_path / "bucket"
    store = open_store(root.as_uri())
    provider = HistoryProvider({
        # attempt 1's zone: one price in force since before its start
        "us-east-1a": [(T0 - 3000, 0.40)],
        # attempt 2's zone: 0.30 at its start, 0.45 from 30 minutes in
        "us-east-1b": [(T0 + 1200, 0.30), (T0 + 3000 + 1800, 0.45)],
    })
    plan = [
        # n, zone, market, start, end, end_reason, statuses, bucket objects at its end
        (1, "us-east-1a", "spot", T0, T0 + 2400, "preempted",
         [status(1, 0, T0 + 300), status(1, 1050, T0 + 2390)],
         [("dataset/a", GIB), ("checkpoints/1", GIB), ("status.json", 100)]),
        (2, "us-east-1b", "spot", T0 + 3000, T0 + 3000 + 7200, "preempted",
         [status(2, 1000, T0 + 3600), status(2, 2500, T0 + 10150)], [("checkpoints/2", GIB), ("checkpoints/3", GIB), ("x", 0)]),
        (3, "us-east-1b", "on-demand", T0 + 10800, T0 + 14400, "succeeded",
         [status(3, 2400, T0 + 11040), status(3, 3000, T0 + 14300)], [("artifacts/model", GIB), ("logs/3", 0)]),
    ]
    for n, zone, market, start, end, reason, statuses, objs in plan:
        state.add_attempt(run_id, n, "aws", f"tok{n}", region="us-east-1", zone=zone, instance_type="g5.xlarge",
                          market=market, price=0.40 if market == "spot" else OD, currency="USD")
        state.update_attempt(run_id, n, state="running", start=start, instance_id=f"i-{n}")
        ledger.started(state, run_id, n, Offer(row(zone), market), market, DISK_GB, zone=zone, at=start)
        att = state.attempts(run_id)[n - 1]
        for st in statuses:
            ledger.observe(state, run_id, att, st, now=st["time"])
        for key, size in objs:
            sparse(root, f"runs/{run_id}/{key}", size)
        state.update_attempt(run_id, n, state="ended", end=end, end_reason=reason)
        ledger.closed(state, run_id, n, provider, store)
    return state, run_id, provider


def by_hand() -> dict:
    """Every figure of the costed run, from the rules alone."""
    s1, s2, s3 = 2400.0, 7200.0, 3600.0
    compute = [0.0,  # spot interrupted by EC2 in its first hour: no compute charge
               (0.30 * 1800 + 0.45 * 5400) / 3600,  # its zone's history over its own seconds: 0.825
               OD * s3 / 3600]
    disk = [DISK_GB * s / 3600 * GP3 / 730 for s in (s1, s2, s3)]
    sizes = [0, 2 * GIB + 100, 4 * GIB + 100, 5 * GIB + 100]
    objects = [0, 3, 6, 8]
    secs = [s1, s2, s3]
    bucket = [(sizes[i] + sizes[i + 1]) / 2 / GIB * secs[i] / 3600 * S3GB / 730 for i in range(3)]
    requests = [((objects[i + 1] - objects[i]) + secs[i] // 10) / 1000 * PUT + (secs[i] // 5) / 1000 * GET for i in range(3)]
    cost = [compute[i] + disk[i] + bucket[i] + requests[i] for i in range(3)]
    # Time lost: attempt 2 booted 600 s and redid 1050 - 1000 = 50 steps at 0.5 it/s; attempt 3 booted
    # 240 s and redid 2500 - 2400 = 100 steps.
    lost_s = [0.0, 600 + 50 / 0.5, 240 + 100 / 0.5]
    useful = [secs[i] - lost_s[i] for i in range(3)]
    disk_h = [disk[i] / (secs[i] / 3600) for i in range(3)]
    od = [OD * useful[i] / 3600 + disk_h[i] * useful[i] / 3600 + bucket[i] + requests[i] for i in range(3)]
    rate = [0.0, compute[1] / 2, OD]
    lost_usd = sum(lost_s[i] / 3600 * (rate[i] + disk_h[i]) for i in range(3))
    total = sum(cost)
    return {"compute": compute, "disk": disk, "bucket": bucket, "requests": requests, "cost": cost, "od": od,
            "lost_h": [x / 3600 for x in lost_s], "total": total, "ondemand": sum(od), "savings": sum(od) - total,
            "lost_hours": sum(lost_s) / 3600, "lost_usd": lost_usd, "per_1k": total / 3000 * 1000,
            "hours": sum(secs) / 3600}


def cli_out(capsys, *args) -> str:
    capsys.readouterr()
    assert main(list(args)) == 0
    return capsys.readouterr().out


def test_costed_run_every_figure_by_hand(costed_run, capsys):
    state, run_id, provider = costed_run
    hand = by_hand()
    rep = json.loads(cli_out(capsys, "cost", "report", run_id, "--format", "json"))
    (run,) = rep["runs"]
    assert [a["n"] for a in run["attempts"]] == [1, 2, 3]
    for i, a in enumerate(run["attempts"]):
        for item in ("compute", "disk", "bucket", "requests"):
            assert a["items"][item]["usd"] == pytest.approx(hand[item][i], abs=1e-4), (i, item)
            assert a["items"][item]["amount"] == pytest.approx(hand[item][i], abs=1e-6), (i, item)
        assert a["cost_usd"] == pytest.approx(hand["cost"][i], abs=1e-4)
        assert a["ondemand_usd"] == pytest.approx(hand["od"][i], abs=1e-4)
    sources = [a["items"]["compute"]["source"] for a in run["attempts"]]
    assert sources == ["rule", "price-history", "list"]
    assert run["attempts"][1]["items"]["compute"]["detail"]["price_per_hour"] == pytest.approx(0.4125)
    assert run["attempts"][1]["overhead"] == {"after_attempt": 1, "boot_seconds": 600.0, "redone_steps": 50,
                                              "redo_seconds": 100.0, "lost_hours": round(700 / 3600, 4)}
    assert run["attempts"][2]["overhead"]["redone_steps"] == 100
    assert run["reclaims"] == 2
    assert run["estimate_usd"] == pytest.approx(hand["total"], abs=1e-4)
    assert run["total_usd"] == run["estimate_usd"] and run["total_source"] == "estimate"
    assert run["ondemand_usd"] == pytest.approx(hand["ondemand"], abs=1e-4)
    assert run["savings_usd"] == pytest.approx(hand["savings"], abs=1e-4)
    assert run["savings_pct"] == pytest.approx(100 * (1 - hand["total"] / hand["ondemand"]), abs=0.05)
    assert run["lost_hours"] == pytest.approx(hand["lost_hours"], abs=1e-4)
    assert run["lost_fraction"] == pytest.approx(hand["lost_hours"] / hand["hours"], abs=1e-4)
    assert run["lost_usd"] == pytest.approx(hand["lost_usd"], abs=1e-4)
    assert run["cost_per_1k_steps"] == pytest.approx(hand["per_1k"], abs=1e-4)
    # The ledger asked EC2 for each spot attempt's own zone and hours (from an hour before, for the price in force).
    assert [(z, s, e) for _, z, s, e in provider.calls] == [("us-east-1a", T0 - 3600, T0 + 2400),
                                                           ("us-east-1b", T0 + 3000 - 3600, T0 + 10200)]
    # The attempt's price is the integrated one, as the end-of-run summary shows it.
    assert state.attempts(run_id)[1].price == pytest.approx(0.4125)


def test_json_csv_table_and_html_carry_the_same_numbers(costed_run, capsys, tmp_path):
    state, run_id, _ = costed_run
    rep = json.loads(cli_out(capsys, "cost", "report", run_id, "--format", "json"))
    (run,) = rep["runs"]
    rows = list(csv.DictReader(io.StringIO(cli_out(capsys, "cost", "report", run_id, "--format", "csv"))))
    attempts = [r for r in rows if r["level"] == "attempt"]
    (run_row,) = [r for r in rows if r["level"] == "run"]
    for a, r in zip(run["attempts"], attempts, strict=True):
        assert float(r["cost_usd"]) == a["cost_usd"] and float(r["ondemand_usd"]) == a["ondemand_usd"]
        assert float(r["compute_usd"]) == a["items"]["compute"]["usd"] and r["compute_source"] == a["items"]["compute"]["source"]
    for k in ("total_usd", "ondemand_usd", "savings_usd", "lost_hours", "cost_per_1k_steps"):
        assert float(run_row[k]) == run[k], k
    table = cli_out(capsys, "cost", "report", run_id)
    for a in run["attempts"]:
        assert f"{a['cost_usd']:.4f}" in table and f"{a['ondemand_usd']:.4f}" in table
    assert f"total ${run['total_usd']:.4f}" in table and f"on-demand ${run['ondemand_usd']:.4f}" in table
    assert f"saved ${run['savings_usd']:.4f}" in table
    out = tmp_path / "report.html"
    assert main(["cost", "report", run_id, "--format", "html", "--output", str(out)]) == 0
    page = out.read_text()
    for k in ("total_usd", "ondemand_usd", "savings_usd", "lost_hours"):
        assert re.search(rf'data-total="{k}">{run[k]:.4f}<', page), k
    # Self-contained: four inline charts, nothing loaded from elsewhere.
    assert page.count("<svg") == 4 and "<script" not in page
    assert not re.search(r'(src|href)="(https?:)?//|url\((https?:)?//|<link ', page)


def test_billed_amount_is_preferred(costed_run, capsys):
    state, run_id, _ = costed_run
    state.set_billed(run_id, "aws", 2.5, "USD", 2.5, "aws-cost-explorer")
    (run,) = json.loads(cli_out(capsys, "cost", "report", run_id, "--format", "json"))["runs"]
    hand = by_hand()
    # The bill covers hosts and disks; the bucket and requests stay estimated and are added.
    unbilled = sum(hand["bucket"]) + sum(hand["requests"])
    assert run["billed_usd"] == 2.5 and run["total_source"] == "billed"
    assert run["total_usd"] == pytest.approx(2.5 + unbilled, abs=1e-4)
    assert run["savings_usd"] == pytest.approx(run["ondemand_usd"] - 2.5 - unbilled, abs=1e-4)


def test_by_tier_provider_and_day(costed_run, capsys):
    state, run_id, _ = costed_run
    state.create_run("r-other", "sdxl-lora", {"tier": "sdxl-lora", "provider": "local"}, 10)
    rep = json.loads(cli_out(capsys, "cost", "report", "--all", "--by", "tier", "--format", "json"))
    assert [g["key"] for g in rep["groups"]] == ["sd15-lora", "sdxl-lora"]
    rep = json.loads(cli_out(capsys, "cost", "report", "--all", "--by", "day", "--format", "json"))
    assert rep["groups"][0]["key"] == "2026-11-02"
    assert rep["groups"][0]["total_usd"] == rep["runs"][0]["total_usd"]
    # --since counts from now: the 2026-11-02 run is in a 7-day window only if it was active in it.
    recent = json.loads(cli_out(capsys, "cost", "report", "--since", "1h", "--format", "json"))
    assert {r["run"] for r in recent["runs"]} == {"r-other", run_id}  # both were written just now


@pytest.mark.parametrize("args, message", [
    (["cost", "report", "r-nope"], "no run 'r-nope'"),
    (["cost", "report", "--since", "soon"], "--since"),
    (["cost", "report", "--all", "--format", "pdf"], "--format must be one of"),
    (["cost", "report", "--all", "--format", "json", "--output", "/nonexistent-dir/x.json"], "does not exist"),
    (["cost", "report", "--all", "--by", "week"], "--by must be one of"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_unwritable_output(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    import os

    if os.access(ro, os.W_OK):  # root writes anywhere: use a path below a file instead
        (tmp_path / "file").write_text("")
        target = str(tmp_path / "file" / "x.csv")
    else:
        target = str(ro / "x.csv")
    assert main(["cost", "report", "--all", "--format", "csv", "--output", target]) == 2
    assert capsys.readouterr().err.startswith("error: --output")


def test_egress_is_a_run_item_that_adds_up(costed_run, capsys):
    state, run_id, _ = costed_run
    before = json.loads(cli_out(capsys, "cost", "report", run_id, "--format", "json"))["runs"][0]
    ledger.record_egress(state, run_id, "aws", 2 * GIB)
    ledger.record_egress(state, run_id, "aws", GIB)  # pulled again: bytes add up
    (run,) = json.loads(cli_out(capsys, "cost", "report", run_id, "--format", "json"))["runs"]
    assert run["run_items"]["egress"]["detail"]["bytes"] == 3 * GIB
    assert run["run_items"]["egress"]["usd"] == pytest.approx(3 * 0.09)
    assert run["estimate_usd"] == pytest.approx(before["estimate_usd"] + 0.27, abs=1e-4)


def test_end_of_run_summary_uses_the_ledger(costed_run):
    from sdcloud.runs.driving.controller import summary

    state, run_id, _ = costed_run
    s = summary(state, run_id)
    hand = by_hand()
    assert [a["cost"] for a in s["attempts"]] == [round(c, 4) for c in hand["cost"]]
    assert s["cost"]["total"] == pytest.approx(hand["total"], abs=1e-4)
    assert s["cost"]["ondemand_equivalent"] == pytest.approx(hand["ondemand"], abs=1e-4)
    assert s["cost"]["reclaims"] == 2


def test_a_host_lost_from_sight_is_not_counted_a_reclaim(costed_run):
    """Reclaims are the ones a cloud (or the simulation) announced: an attempt whose host was lost
    (its heartbeat stopped, its instance unknown here) is not one."""
    from sdcloud.runs.driving.controller import summary

    state, run_id, _ = costed_run
    state.update_attempt(run_id, 2, end_reason="lost")
    assert summary(state, run_id)["cost"]["reclaims"] == 1
