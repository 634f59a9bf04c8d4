"""`sdcloud cost reconcile` against moto's Cost Explorer (results set through moto's API) and the
Tencent billing fake's DescribeBillDetail: billed amounts are stored, preferred by `cost report`,
and a run whose bill differs by more than the threshold is flagged."""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import datetime, timezone

import pytest

from sdcloud.cli import main
from sdcloud.costs import ledger
from sdcloud.offers.catalog import CatalogRow
from sdcloud.offers.optimizer import Offer
from sdcloud.runs.records.state import StateStore

NOW = time.time()
START, END = NOW - 7200, NOW - 3600


def offer(provider: str, itype: str, od: float, spot: float, currency: str, market: str) -> Offer:
    region = "us-east-1" if provider == "aws" else "ap-guangzhou"
    row = CatalogRow(provider=provider, region=region, zone="", instance_type=itype, gpu="A10G", gpu_count=1, vram_gb=24,
                     vcpus=4, memory_gb=16, nvme_gb=0, ondemand_price=od, spot_price=spot, currency=currency,
                     interruption_band=None, snapshot_date="2026-11-01", ondemand_estimate=False, spot_estimate=False,
                     source="test")
    return Offer(row, market)


def one_hour_run(state: StateStore, run_id: str, provider: str, market: str, of: Offer, zone: str) -> None:
    state.create_run(run_id, "sd15-lora", {"tier": "sd15-lora", "provider": provider}, 100)
    state.add_attempt(run_id, 1, provider, f"tok-{run_id}", region=of.row.region, zone=zone, instance_type=of.row.instance_type,
                      market=market, price=of.price_per_hour_usd, currency="USD")
    state.update_attempt(run_id, 1, state="running", start=START, instance_id=f"ins-{run_id}")
    ledger.started(state, run_id, 1, of, market, 200, zone=zone, at=START)
    state.update_attempt(run_id, 1, state="ended", end=END, end_reason="succeeded")
    ledger.closed(state, run_id, 1)


def set_ce_results(endpoint: str, groups: dict[str, str]) -> None:
    day = datetime.fromtimestamp(NOW, timezone.utc).strftime("%Y-%m-%d")
    result = {"ResultsByTime": [{"TimePeriod": {"Start": day, "End": day}, "Total": {}, "Estimated": True,
                                 "Groups": [{"Keys": [f"sdcloud:run${rid}"],
                                             "Metrics": {"UnblendedCost": {"Amount": amt, "Unit": "USD"}}}
                                            for rid, amt in groups.items()]}],
              "DimensionValueAttributes": []}
    req = urllib.request.Request(f"{endpoint}/moto-api/static/ce/cost-and-usage-results", method="POST",
                                 data=json.dumps({"results": [result]}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 201


def test_aws_cost_explorer_and_tencent_bill_detail(moto_server, monkeypatch, capsys):
    from tests.support.clouds.fake_tencent_billing import BillingServer
    from tests.support.fake_tencent_api import SECRET_ID, SECRET_KEY

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": moto_server, "TENCENTCLOUD_SECRET_ID": SECRET_ID,
                 "TENCENTCLOUD_SECRET_KEY": SECRET_KEY}.items():
        monkeypatch.setenv(k, v)
    state = StateStore()
    aws_od = offer("aws", "g5.xlarge", 1.006, 0.4, "USD", "on-demand")
    one_hour_run(state, "r-aws-ok", "aws", "on-demand", aws_od, "us-east-1a")
    one_hour_run(state, "r-aws-off", "aws", "on-demand", aws_od, "us-east-1a")
    one_hour_run(state, "r-aws-none", "aws", "on-demand", aws_od, "us-east-1a")
    tc = offer("tencent", "GN7.2XLARGE32", 9.55, 2.87, "CNY", "spot")
    one_hour_run(state, "r-tc", "tencent", "spot", tc, "ap-guangzhou-3")
    # compute + disk, by hand: 1.006 $/h for 1 h + 200 GB of gp3 for 1 h at 0.08 $/GB-month of 730 h
    aws_est = 1.006 + 200 * 0.08 / 730
    tc_est_cny = 2.87 + 200 * 0.35 / 730
    set_ce_results(moto_server, {"r-aws-ok": "1.05", "r-aws-off": "5.00"})
    fmt = "%Y-%m-%d %H:%M:%S"
    with BillingServer() as srv:
        monkeypatch.setenv("SDCLOUD_TENCENT_BILLING_ENDPOINT", srv.endpoint)
        srv.billing.add_line("ins-r-tc", 2.90, datetime.fromtimestamp(START, timezone.utc).strftime(fmt),
                             datetime.fromtimestamp(END, timezone.utc).strftime(fmt))
        srv.billing.add_line("ins-someone-else", 99.0, datetime.fromtimestamp(START, timezone.utc).strftime(fmt),
                             datetime.fromtimestamp(END, timezone.utc).strftime(fmt))
        capsys.readouterr()
        assert main(["cost", "reconcile", "--since", "30d", "--json"]) == 0
        rows = {r["run"]: r for r in json.loads(capsys.readouterr().out)}
        assert all(c["ResourceId"] == "ins-r-tc" for c in srv.billing.calls) and srv.billing.calls
    assert rows["r-aws-ok"]["estimate_usd"] == pytest.approx(aws_est, abs=1e-4)
    assert rows["r-aws-ok"]["billed_usd"] == 1.05 and rows["r-aws-ok"]["flag"] is None
    assert rows["r-aws-off"]["billed_usd"] == 5.0 and rows["r-aws-off"]["flag"] == "off"
    assert rows["r-aws-off"]["difference_pct"] == pytest.approx(100 * (5.0 - aws_est) / aws_est, abs=0.05)
    assert rows["r-aws-none"]["billed_usd"] is None and rows["r-aws-none"]["flag"] == "no bill yet"
    usd_per_cny = 1 / 7.1
    assert rows["r-tc"]["estimate_usd"] == pytest.approx(tc_est_cny * usd_per_cny, abs=1e-4)
    assert rows["r-tc"]["billed_usd"] == pytest.approx(2.90 * usd_per_cny, abs=1e-4) and rows["r-tc"]["flag"] is None
    # Stored beside the estimate and preferred by the report (in the bill's own currency too).
    assert state.billed("r-tc")[0]["amount"] == 2.90 and state.billed("r-tc")[0]["currency"] == "CNY"
    capsys.readouterr()
    assert main(["cost", "report", "r-aws-off", "--format", "json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["billed_usd"] == 5.0 and run["total_source"] == "billed"
    assert run["total_usd"] == pytest.approx(5.0 + run["unbilled_usd"], abs=1e-4)


def test_reconcile_bad_input(capsys):
    assert main(["cost", "reconcile", "--since", "lately"]) == 2
    assert main(["cost", "reconcile", "--threshold", "x"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)


def test_bill_detail_months_and_refusals():
    from tests.support.clouds.fake_tencent_billing import FakeBilling
    from tests.support.fake_tencent_api import ApiError

    from sdcloud.providers.tencent.billing import _months

    # One call per calendar month an attempt touches: the API refuses a range across months.
    t0 = datetime(2026, 11, 30, 23, 0, tzinfo=timezone.utc).timestamp()
    assert _months(t0, t0 + 7200) == [("2026-11-30 23:00:00", "2026-11-30 23:59:59"),
                                     ("2026-12-01 00:00:00", "2026-12-01 01:00:00")]
    fake = FakeBilling()
    with pytest.raises(ApiError) as exc:
        fake.handle("DescribeBillDetail", {"Offset": 0, "Limit": 100, "BeginTime": "2026-11-30 23:00:00",
                                           "EndTime": "2026-12-01 01:00:00"})
    assert exc.value.code == "InvalidParameterValue"
    with pytest.raises(ApiError) as exc:
        fake.handle("DescribeBillDetail", {"Offset": 0, "Limit": 100, "BeginTime": "2026-11-30 23:00:00",
                                           "EndTime": "2026-11-30 23:30:00", "InstanceId": "x"})
    assert exc.value.code == "UnknownParameter"
