"""Traces that carry their own prices (the published multi-region format, docs/policies.md "Prices").

Such a trace prices the whole traced machine (here an 8-GPU machine: spot tens of dollars an hour,
on-demand near a hundred), so its zones must be priced by their own on-demand figures: priced by the
`--ondemand-price` default of a single-GPU machine, every policy would "save" a negative share.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from sdcloud.cli import main

GAP = 600


def published(tmp_path, zone: str, avail: list[int], spot: list[float], ondemand: float | None,
              machine: str = "a3-highgpu-8g", currency: str = "USD", unit: str = "h") -> str:
    info = {"region": zone[:-2], "machine_type": machine, "currency": currency, "price": spot[0], "price_unit": unit}
    if ondemand is not None:
        info |= {"on_demand_price": ondemand, "on_demand_price_unit": unit}
    doc = {"metadata": {"gap_seconds": GAP, "start_time": "2025-01-01T00:00:00Z", "zone": zone, "price_info": info},
           "data": [0 if a else 1 for a in avail], "prices": spot}  # that format marks 1 = preempted
    path = tmp_path / f"{zone}_h100_8.json"
    path.write_text(json.dumps(doc))
    return str(path)


def zone_set(tmp_path, n: int = 3, ticks: int = 600, seed: int = 3) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for i, (zone, od) in enumerate([("us-central1-a", 88.25), ("europe-west4-b", 107.1), ("asia-east1-c", 91.4)][:n]):
        avail, up = [], True
        for _ in range(ticks):  # outages of a few hours, as in the published traces
            up = (rng.random() > 0.03) if up else (rng.random() > 0.8)
            avail.append(int(up))
        spot = list(np.round(16 + 50 * rng.random(ticks) * (i + 1) / n, 2))
        out.append(published(tmp_path, zone, avail, spot, od))
    return out


def run(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    got = capsys.readouterr()
    return code, got.out, got.err


BASE = ["simulate", "--job-hours", "24", "--deadline-hours", "36", "--restart-hours", "0.2", "--starts", "12",
        "--tick", "1200", "--json"]


@pytest.mark.parametrize("single", [False, True])
def test_each_zone_priced_by_its_own_figures_gives_savings_between_0_and_1(tmp_path, capsys, single):
    files = zone_set(tmp_path)
    args = BASE + [x for f in files for x in ("--trace", f)] + (["--single-zone"] if single else [])
    code, out, err = run(args, capsys)
    assert code == 0, err
    rows = {r["policy"]: r for r in json.loads(out)}
    for name, row in rows.items():
        if name != "on-demand":
            assert 0 < row["mean_savings"] < 1, (name, row)
    assert rows["on-demand"]["mean_savings"] <= 0  # on-demand all through (plus its one launch) saves nothing
    assert max(rows.values(), key=lambda r: r["mean_savings"])["policy"] == "optimal"
    assert all(rows["optimal"]["mean_cost"] <= r["mean_cost"] + 1e-6 for r in rows.values())


def test_the_flat_default_would_have_been_nonsense(tmp_path, capsys):
    # The same spot series with the on-demand price left out and a single-GPU figure given on purpose:
    # accepted (the user said so), and every spot policy then "saves" less than nothing.
    files = [published(tmp_path, "us-central1-a", [1] * 300, [30.0] * 300, None)]
    code, out, err = run(BASE + ["--trace", files[0], "--ondemand-price", "3.06"], capsys)
    assert code == 0, err
    assert all(r["mean_savings"] < 0 for r in json.loads(out) if r["policy"] != "on-demand")


def test_table_says_each_zone_is_priced_by_its_own_on_demand(tmp_path, capsys):
    files = zone_set(tmp_path, n=2)
    code, out, err = run([a for a in BASE if a != "--json"] + [x for f in files for x in ("--trace", f)], capsys)
    assert code == 0, err
    assert "each zone's own, 88.25-107.1 $/h" in " ".join(out.split())


@pytest.mark.parametrize("second,message", [
    (dict(ondemand=None), "carries its own prices (USD per hour for machine a3-highgpu-8g) but europe-west4-b_h100_8 has none"),
    (dict(ondemand=95.0, currency="EUR"), "different currencies (EUR, USD)"),
    (dict(ondemand=95.0, machine="a2-highgpu-1g"), "different machines (a2-highgpu-1g, a3-highgpu-8g)"),
    (dict(ondemand=95.0, unit="month"), "price_unit must be per hour ('h'), got 'month'"),
])
def test_a_mixed_set_is_refused_with_one_line(tmp_path, capsys, second, message):
    a = published(tmp_path, "us-central1-a", [1] * 300, [30.0] * 300, 88.25)
    b = published(tmp_path, "europe-west4-b", [1] * 300, [40.0] * 300, **second)
    code, out, err = run(BASE + ["--trace", a, "--trace", b], capsys)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1


def test_own_on_demand_beside_a_trace_priced_by_the_flags_is_refused(tmp_path, capsys):
    a = published(tmp_path, "us-central1-a", [1] * 300, [30.0] * 300, 88.25)
    plain = tmp_path / "us-west-2a_v100_1.json"
    plain.write_text(json.dumps({"metadata": {"gap_seconds": GAP}, "data": [1] * 300}))
    code, _, err = run(BASE + ["--trace", a, "--trace", str(plain)], capsys)
    assert code == 2 and "us-west-2a_v100_1 has none" in err and err.count("\n") == 1


def test_a_machine_without_its_on_demand_price_needs_the_flag_on_purpose(tmp_path, capsys):
    a = published(tmp_path, "us-central1-a", [1] * 300, [30.0] * 300, None)
    code, _, err = run(BASE + ["--trace", a], capsys)
    assert code == 2 and "gives no on-demand price" in err and "--ondemand-price" in err


def test_an_on_demand_price_without_spot_prices_is_refused(tmp_path, capsys):
    a = published(tmp_path, "us-central1-a", [1] * 300, [30.0] * 300, 88.25)
    doc = json.loads((tmp_path / "us-central1-a_h100_8.json").read_text())
    del doc["prices"]
    b = tmp_path / "asia-east1-c_h100_8.json"
    b.write_text(json.dumps(doc))
    code, _, err = run(BASE + ["--trace", a, "--trace", str(b)], capsys)
    assert code == 2 and "asia-east1-c_h100_8 gives an on-demand price but no spot prices" in err


def test_a_trace_knows_its_length_in_hours(tmp_path):
    from sdcloud.spot.traces import load_trace

    trace = load_trace(published(tmp_path, "us-central1-a", [1] * 36, [30.0] * 36, 88.25))
    assert trace.hours == pytest.approx(36 * GAP / 3600) and trace.price_basis.machine == "a3-highgpu-8g"
