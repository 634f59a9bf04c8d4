"""Each trace format read by its own convention (docs/policies.md, "Traces"; ../shared/data/README.md).

The spot-traces format marks a tick where spot could be had with a value above 0; the SkyNomad format
(the multi-region sets with `metadata.price_info`) marks it 0, and 1 = preempted. A file may say
which (`metadata.data_means`); a `price_info` file whose data is not 0/1 is refused until it says."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sdcloud.cli import main
from sdcloud.spot.traces import load_trace

GAP = 600
ARGS = ["simulate", "--job-hours", "20", "--deadline-hours", "30", "--restart-hours", "0.2", "--starts", "8",
        "--tick", "1200", "--json"]


def _available(ticks: int, seed: int, share_up: float) -> list[int]:
    """1 = spot could be had: long outages, as the published traces have, `share_up` of the time up."""
    rng = np.random.default_rng(seed)
    out, up = [], True
    for _ in range(ticks):
        up = (rng.random() > 0.04) if up else (rng.random() > 0.04 * share_up / (1 - share_up))
        out.append(int(up))
    return out


def _skynomad(path, zone: str, avail: list[int], od: float = 88.25) -> str:
    info = {"region": zone[:-2], "machine_type": "a3-highgpu-8g", "currency": "USD", "price": 30.0, "price_unit": "h",
            "on_demand_price": od, "on_demand_price_unit": "h"}
    doc = {"metadata": {"gap_seconds": GAP, "start_time": "2025-01-01T00:00:00Z", "zone": zone, "price_info": info},
           "data": [1 - a for a in avail], "prices": [30.0 + (i % 7) for i in range(len(avail))]}
    path.write_text(json.dumps(doc))
    return str(path)


def _converted(src: str, dst) -> str:
    """The same file with its data turned to 1 = available and the convention stated."""
    doc = json.loads(open(src).read())
    doc["data"] = [1 - v for v in doc["data"]]
    doc["metadata"]["data_means"] = "available"
    dst.write_text(json.dumps(doc))
    return str(dst)


def _simulate(files: list[str], capsys) -> list[dict]:
    code = main(ARGS + [x for f in files for x in ("--trace", f)])
    got = capsys.readouterr()
    assert code == 0, got.err
    return json.loads(got.out)


def test_a_skynomad_trace_and_its_1_is_available_copy_give_the_same_result(tmp_path, capsys):
    zones = [("us-central1-a", 0.9, 1), ("europe-west4-b", 0.6, 2)]
    sky = [_skynomad(tmp_path / f"{z}_h100_8.json", z, _available(900, seed, up)) for z, up, seed in zones]
    (tmp_path / "conv").mkdir()
    conv = [_converted(f, tmp_path / "conv" / f.rsplit("/", 1)[1]) for f in sky]
    a, b = _simulate(sky, capsys), _simulate(conv, capsys)
    assert a == b
    assert any(r["mean_savings"] > 0.2 for r in a if r["policy"] != "on-demand")  # mostly available: spot pays


def test_a_skynomad_zone_95_percent_available_reads_as_available(tmp_path):
    avail = [1] * 95 + [0] * 5
    trace = load_trace(_skynomad(tmp_path / "us-central1-a_h100_8.json", "us-central1-a", avail))
    assert trace.avail.mean() == pytest.approx(0.95)
    assert not trace.avail[-1] and trace.avail[0]


def test_the_spot_traces_format_keeps_above_0_as_available(tmp_path):
    path = tmp_path / "us-west-2a_v100_1.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": [0, 3, 16, 0, 1]}))
    assert load_trace(path).avail.tolist() == [False, True, True, False, True]


@pytest.mark.parametrize("means, data, avail", [("preempted", [1, 0, 0, 1], [False, True, True, False]),
                                                ("available", [1, 0, 0, 1], [True, False, False, True]),
                                                ("available", [2, 0, 5, 1], [True, False, True, True])])
def test_a_file_that_states_its_convention_is_read_by_it(tmp_path, means, data, avail):
    path = tmp_path / "z.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 600, "data_means": means, "price_info": {"currency": "USD"}},
                                "data": data}))
    assert load_trace(path).avail.tolist() == avail


@pytest.mark.parametrize("meta, data, says", [
    ({"price_info": {"currency": "USD"}}, [0, 1, 3], "data_means"),
    ({"data_means": "up"}, [0, 1], "'available' or 'preempted'"),
    ({"data_means": "preempted"}, [0, 2], "0 and 1"),
])
def test_an_ambiguous_trace_is_refused_with_how_to_mark_it(tmp_path, capsys, meta, data, says):
    path = tmp_path / "z.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 600, **meta}, "data": data}))
    code = main([*ARGS, "--trace", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err
