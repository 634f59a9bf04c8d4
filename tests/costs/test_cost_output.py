"""What `cost report` prints for figures at their edges: a run that cost what on-demand would saves
0 in every format (not -0.0000, not -0.2 %), and the HTML report's chart of cost per run spans the
runs' own period (issue 23). Fast: the state store is written directly, as the controller would."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from datetime import datetime, timezone

import matplotlib

matplotlib.use("Agg")

import pytest

from sdcloud.cli import main
from sdcloud.costs import ledger
from sdcloud.offers.catalog import CatalogRow
from sdcloud.offers.optimizer import Offer
from sdcloud.runs.records.state import StateStore

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=timezone.utc).timestamp()
PRICE = 0.05  # USD per hour, the [local] price of the machine


def local_row() -> CatalogRow:
    return CatalogRow(provider="local", region="local", zone="local", instance_type="local", gpu="A10G", gpu_count=1,
                      vram_gb=24, vcpus=8, memory_gb=32, nvme_gb=0, ondemand_price=PRICE, spot_price=PRICE, currency="USD",
                      interruption_band=None, snapshot_date="2026-11-01", ondemand_estimate=False, spot_estimate=False,
                      source="test")


def add_attempt(state, run_id, n, start, end, reason, **costs) -> None:
    state.add_attempt(run_id, n, "local", f"tok{n}", region="local", zone="local", instance_type="local",
                      market="on-demand", price=PRICE, currency="USD")
    state.update_attempt(run_id, n, state="running", start=start, instance_id=f"pid-{n}")
    ledger.started(state, run_id, n, Offer(local_row(), "on-demand"), "on-demand", 0, zone="local", at=start)
    if costs:
        state.set_attempt_costs(run_id, n, **costs)
    state.update_attempt(run_id, n, state="ended", end=end, end_reason=reason)
    ledger.closed(state, run_id, n)


@pytest.fixture
def even_run():
    """Two on-demand attempts on the local machine; the second took 0.2 s to its first step after the
    first was lost. On-demand would have cost those 0.2 s less: $0.0000028, below the last decimal."""
    state = StateStore()
    state.create_run("r-even0001", "sd15-lora", {"tier": "sd15-lora", "provider": "local"}, 20, name="even")
    add_attempt(state, "r-even0001", 1, T0, T0 + 60, "lost", last_step=10, it_per_s=1.0)
    add_attempt(state, "r-even0001", 2, T0 + 70, T0 + 130, "succeeded", first_step_at=T0 + 70.2, start_step=10,
                last_step=20, it_per_s=1.0)
    state.update_run("r-even0001", state="succeeded", step=20)
    # Created at a set time, not now: the chart's axis must not depend on the day the test runs.
    state._db.execute("UPDATE runs SET created = ? WHERE id = ?", (T0, "r-even0001"))
    state._db.commit()
    return state, "r-even0001"


def out_of(capsys, *args) -> str:
    capsys.readouterr()
    assert main(list(args)) == 0
    return capsys.readouterr().out


def test_a_run_that_cost_what_on_demand_would_saved_zero_everywhere(even_run, capsys, tmp_path):
    state, run_id = even_run
    (run,) = json.loads(out_of(capsys, "cost", "report", run_id, "--format", "json"))["runs"]
    assert run["total_usd"] == run["ondemand_usd"]  # equal as printed, to the last decimal
    assert run["savings_usd"] == 0.0 and math.copysign(1.0, run["savings_usd"]) == 1.0
    assert run["savings_pct"] == 0.0 and math.copysign(1.0, run["savings_pct"]) == 1.0
    table = out_of(capsys, "cost", "report", run_id)
    assert "saved $0.0000 (0.0%)" in " ".join(table.split()) and "-0" not in table
    assert "the one run: total $" in table and "all 1 runs" not in table
    (row,) = [r for r in csv.DictReader(io.StringIO(out_of(capsys, "cost", "report", run_id, "--format", "csv")))
              if r["level"] == "run"]
    assert row["savings_usd"] == "0.0000" and row["savings_pct"] == "0.0000"
    page = out_of(capsys, "cost", "report", run_id, "--format", "html")
    assert 'data-field="savings_pct">0.0000<' in page and 'data-field="savings_usd">0.0000<' in page
    assert 'data-total="savings_usd">0.0000<' in page
    from sdcloud.costs.ledger import summary_cost

    assert summary_cost(state, state.get_run(run_id))["savings_pct"] == 0.0


def test_savings_are_computed_from_the_printed_figures():
    assert ledger.savings(1.0, 2.0) == {"savings_usd": 1.0, "savings_pct": 50.0}
    assert ledger.savings(0.0016667, 0.0016639) == {"savings_usd": 0.0, "savings_pct": 0.0}
    assert ledger.savings(0.0018, 0.0017) == {"savings_usd": -0.0001, "savings_pct": -5.9}  # a real loss stays
    assert ledger.savings(0.0, 0.0) == {"savings_usd": 0.0, "savings_pct": None}


def _period_axis(report: dict):
    """The x-range (as UTC datetimes) and the tick labels' text of the 'cost per run over the period' chart."""
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    from sdcloud.costs import html

    fig = html._period_chart(plt, report["runs"])
    lo, hi = (mdates.num2date(x, tz=timezone.utc) for x in fig.axes[0].get_xlim())
    plt.close(fig)
    return lo, hi


def _svg_text(svg: str) -> list[str]:
    """The text of an SVG chart written by matplotlib with text as paths: each string is in a comment."""
    return re.findall(r"<!-- (.*?) -->", svg)


def test_period_chart_of_one_run_spans_about_a_day_around_it(even_run, capsys):
    _, run_id = even_run
    rep = json.loads(out_of(capsys, "cost", "report", run_id, "--format", "json"))
    created = datetime.fromtimestamp(rep["runs"][0]["created"], timezone.utc)
    page = out_of(capsys, "cost", "report", run_id, "--format", "html")
    chart = page.split("Cost per run over the period</figcaption>")[1].split("</figure>")[0]
    years = {int(y) for text in _svg_text(chart) for y in re.findall(r"\b(20\d\d)\b", text)}
    assert years <= {created.year}, years  # its axis names no year but the run's own
    lo, hi = _period_axis(rep)
    assert lo < created < hi
    assert (hi - lo).total_seconds() <= 2 * 86400, (lo, hi)  # not four years around one point


def test_period_chart_spans_the_runs_period(even_run, capsys):
    state, _ = even_run
    for rid in ("r-later000", "r-later001"):  # created 3 and 17 days after the first, below
        state.create_run(rid, "sd15-lora", {"tier": "sd15-lora", "provider": "local"}, 20)
    state._db.execute("UPDATE runs SET created = ? WHERE id = ?", (T0 + 3 * 86400, "r-later000"))
    state._db.execute("UPDATE runs SET created = ? WHERE id = ?", (T0 + 17 * 86400, "r-later001"))
    state._db.commit()
    rep = json.loads(out_of(capsys, "cost", "report", "--all", "--format", "json"))
    first, last = (datetime.fromtimestamp(T0 + d * 86400, timezone.utc) for d in (0, 17))
    lo, hi = _period_axis(rep)
    assert lo < first and hi > last
    # Padded by a little, not by years: within a tenth of the period either side.
    assert (first - lo) <= (last - first) / 10 and (hi - last) <= (last - first) / 10
