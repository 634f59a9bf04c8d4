"""Vast.ai through the CLI a user runs: offers from the bundled snapshot with no key (bids, rates, bandwidth),
three clouds ranked in one table, and `up` refused in one line without a key."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sdcloud.cli import main
from sdcloud.offers.catalog import bundled_rows
from sdcloud.offers.optimizer import Offer, estimate
from sdcloud.offers.tiers import get_tier
from sdcloud.providers.vast import bids

from tests.support.harness_cli import nothing_recorded, refused


@pytest.fixture(autouse=True)
def no_key(monkeypatch):
    monkeypatch.delenv("VAST_API_KEY", raising=False)


def _offers(capsys, *args: str) -> list[dict]:
    assert main(["offers", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_sdxl_lora_offers_with_no_key_list_4090_and_l40s_with_rate_bid_and_bandwidth(capsys):
    rows = _offers(capsys, "--provider", "vast", "--tier", "sdxl-lora", "--limit", "0")
    gpus = {r["gpu"] for r in rows}
    assert {"RTX4090", "L40S"} <= gpus
    for r in (r for r in rows if r["gpu"] in ("RTX4090", "L40S")):
        assert r["rate"] > 0 and r["rate_source"]
        assert r["bandwidth"]["transfer_usd"] > 0 and r["bandwidth"]["storage_usd"] > 0
        if r["market"] == "spot":
            assert r["min_bid"] < r["bid"] == r["price_per_hour"] < r["ondemand_price_per_hour"]
            assert r["price_basis"] == "estimate" and r["price_source"].startswith("estimate:")


def test_a_16_gb_card_is_not_offered_below_its_tiers_floor(capsys):
    sdxl = {r["gpu"] for r in _offers(capsys, "--provider", "vast", "--tier", "sdxl-lora", "--limit", "0")}
    sd15 = {r["gpu"] for r in _offers(capsys, "--provider", "vast", "--tier", "sd15-lora", "--limit", "0")}
    assert "RTX4060Ti" in sd15 and "RTX4060Ti" not in sdxl  # 16,380 MiB is under sdxl-lora's 16 GiB floor


def test_bandwidth_and_disk_are_in_the_cost_to_finish():
    tier = get_tier("sdxl-lora")
    row = next(r for r in bundled_rows("vast") if r.gpu == "RTX4090" and r.gpu_count == 1)
    priced = estimate(tier, Offer(row, "spot"))
    free = estimate(tier, Offer(replace(row, upload_usd_per_gb=0, download_usd_per_gb=0, storage_usd_per_gb_month=0), "spot"))
    assert free.bandwidth is None and priced.bandwidth is not None
    assert priced.est_cost == pytest.approx(free.est_cost + priced.bandwidth.usd)
    assert priced.bandwidth.down_gb > priced.bandwidth.up_gb > 0  # the model in, LoRA checkpoints out


def test_the_bundled_bid_is_the_estimated_minimum_plus_the_margin():
    for r in bundled_rows("vast"):
        assert r.min_bid == pytest.approx(round(r.ondemand_price * bids.SNAPSHOT_MIN_BID_SHARE, 4))
        assert r.spot_price == pytest.approx(bids.bid_for(r.min_bid, margin=bids.DEFAULT_BID_MARGIN))


def test_three_clouds_rank_in_one_usd_table_at_80_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["offers", "--provider", "aws,tencent,vast", "--tier", "sd15-lora", "--limit", "0"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    body = [line for line in out.splitlines() if line.startswith("│")]
    assert all(any(f" {p} " in line for line in body) for p in ("aws", "tencent", "vast"))
    rows = _offers(capsys, "--provider", "aws,tencent,vast", "--tier", "sd15-lora", "--limit", "0")
    assert {r["provider"] for r in rows} == {"aws", "tencent", "vast"} and {r["est_cost_currency"] for r in rows} == {"USD"}
    assert [r["est_cost"] for r in rows] == sorted(r["est_cost"] for r in rows)


def test_up_on_vast_without_a_key_is_one_line_naming_it_and_records_nothing(capsys, sdcloud_home):
    line = refused(capsys, ["up", "--tier", "sd15-lora", "--provider", "vast", "--store", "s3://my-bucket/runs", "--yes"],
                   "VAST_API_KEY")
    assert "api_key" in line
    nothing_recorded()


def test_a_group_of_hosts_is_refused_on_single_machines(capsys, sdcloud_home):
    refused(capsys, ["up", "--tier", "sd15-lora", "--provider", "vast", "--nodes", "2", "--store", "s3://b/runs", "--yes"],
            "single machines")
    nothing_recorded()


def test_a_copy_of_the_key_in_config_is_masked_in_config_show(capsys, sdcloud_home):
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text('[vast]\napi_key = "0123456789abcdef0123456789abcdef"\nbid_margin = 0.2\n')
    assert main(["config", "show", "--json"]) == 0
    out = capsys.readouterr().out
    assert "0123456789abcdef0123456789abcdef" not in out and "bid_margin" in out
