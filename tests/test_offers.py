"""The foundation: tiers, the catalog and the cost-to-finish optimizer, through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sdcloud.offers.catalog import CatalogRow, bundled_rows, load_catalog, write_refreshed
from sdcloud.cli import main
from sdcloud.offers.optimizer import Offer, estimate, rank
from sdcloud.offers.tiers import all_tiers, get_tier


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_tiers_json_lists_every_tier_with_sources(capsys):
    code, out, _ = run_cli(capsys, "tiers", "--json")
    assert code == 0
    tiers = {t["name"]: t for t in json.loads(out)}
    for name in ("sd15-lora", "sdxl-lora", "sd15-dreambooth", "sdxl-dreambooth", "sdxl-finetune", "batch-sd15", "batch-sdxl"):
        t = tiers[name]
        assert 0 < t["min_vram_gb"] <= t["rec_vram_gb"]
        for key in ("min_vram_gb", "rec_vram_gb", "memory_gb", "vcpus", "nvme_gb"):
            assert t["sources"].get(key), f"{name}: no source for {key}"
    assert tiers["sdxl-lora"]["steps"] > 0 and tiers["batch-sdxl"]["images"] > 0


def test_spot_offers_meet_the_tier_and_are_sorted(capsys):
    _, out, _ = run_cli(capsys, "tiers", "--json")
    min_vram = {t["name"]: t["min_vram_gb"] for t in json.loads(out)}["sdxl-lora"]
    code, out, err = run_cli(capsys, "offers", "--tier", "sdxl-lora", "--spot", "--json", "--limit", "0")
    assert code == 0
    rows = json.loads(out)
    assert rows and all(r["vram_gb"] >= min_vram for r in rows)
    assert all(r["market"] == "spot" for r in rows)
    costs = [r["est_cost"] for r in rows]
    assert costs == sorted(costs)
    assert {r["provider"] for r in rows} == {"aws", "tencent"}
    for key in ("provider", "region", "zone", "instance_type", "gpu", "gpu_count", "vram_gb", "vcpus", "memory_gb",
                "nvme_gb", "market", "price_per_hour", "ondemand_price_per_hour", "currency", "est_hours", "est_cost",
                "interruption"):
        assert key in rows[0]
    assert "catalog of" in err and "old" in err  # says how old the catalog is


def test_cheapest_per_hour_is_not_cheapest_to_finish():
    """SD 1.5 LoRA: a T4 is the cheapest per hour but so slow that a faster host finishes for less."""
    tier = get_tier("sd15-lora")
    ranked = rank(tier, load_catalog(["aws"]), market="spot", region="us-east-1")
    cheapest_hourly = min(ranked, key=lambda e: e.offer.price_per_hour_usd)
    assert cheapest_hourly.offer.row.gpu == "T4"
    best = ranked[0]
    assert best.offer.row.gpu != "T4"
    assert best.offer.price_per_hour_usd > cheapest_hourly.offer.price_per_hour_usd
    assert best.est_cost < cheapest_hourly.est_cost
    # The ranking follows cost to finish, and cost = price x hours.
    for e in ranked:
        assert e.est_cost == pytest.approx(e.offer.price_per_hour_usd * e.est_hours)


def test_spot_overhead_grows_with_the_interruption_band():
    tier = get_tier("sd15-lora")
    row = next(r for r in bundled_rows("aws") if r.instance_type == "g5.2xlarge" and r.region == "us-east-1")
    calm = estimate(tier, Offer(_with(row, interruption_band=0), "spot"))
    stormy = estimate(tier, Offer(_with(row, interruption_band=4), "spot"))
    ondemand = estimate(tier, Offer(row, "on-demand"))
    assert ondemand.overhead == 1.0
    assert 1.0 < calm.overhead < stormy.overhead
    assert stormy.est_hours > calm.est_hours > ondemand.est_hours * 0.99


def _with(row: CatalogRow, **changes) -> CatalogRow:
    return CatalogRow(**{**row.as_dict(), **changes})


def test_rows_below_the_tier_are_filtered_and_nvme_is_flagged():
    tier = get_tier("sdxl-dreambooth")  # 24 GB minimum
    ranked = rank(tier, load_catalog(), market="on-demand")
    assert ranked and all(e.offer.row.vram_gb >= 24 for e in ranked)
    assert all(e.offer.row.memory_gb >= tier.memory_gb for e in ranked)
    no_nvme = [e for e in ranked if e.offer.row.nvme_gb == 0]
    assert no_nvme and all(any("NVMe" in w for w in e.warnings) for e in no_nvme)


def test_cny_prices_are_converted_with_a_configurable_rate(monkeypatch):
    tier = get_tier("sd15-lora")
    cat = load_catalog(["tencent"])
    row = next(r for r in cat.rows if r.currency == "CNY")
    monkeypatch.setenv("SDCLOUD_CNY_PER_USD", "7.0")
    a = Offer(row, "on-demand").price_per_hour_usd
    monkeypatch.setenv("SDCLOUD_CNY_PER_USD", "14.0")
    b = Offer(row, "on-demand").price_per_hour_usd
    assert a == pytest.approx(row.ondemand_price / 7.0) and b == pytest.approx(a / 2)
    assert rank(tier, cat, provider="tencent")


def test_cny_rate_from_config_file(sdcloud_home, monkeypatch):
    monkeypatch.delenv("SDCLOUD_CNY_PER_USD", raising=False)
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text("[currency]\ncny_per_usd = 5.0\n")
    row = next(r for r in bundled_rows("tencent") if r.currency == "CNY")
    assert Offer(row, "spot").price_per_hour_usd == pytest.approx(row.spot_price / 5.0)


def test_refreshed_catalog_overrides_the_bundled_one(capsys):
    row = next(r for r in bundled_rows("aws") if r.instance_type == "g5.2xlarge" and r.region == "us-east-1")
    cheap = _with(row, spot_price=0.0001, snapshot_date="2026-11-30", spot_estimate=False)
    write_refreshed("aws", [cheap])
    code, out, err = run_cli(capsys, "offers", "--tier", "sd15-lora", "--provider", "aws", "--spot", "--json", "--limit", "0")
    assert code == 0
    rows = json.loads(out)
    assert len(rows) == 1 and rows[0]["price_per_hour"] == 0.0001
    assert "aws: refreshed catalog" in err


def test_steps_scale_the_estimate(capsys):
    _, out, _ = run_cli(capsys, "offers", "--tier", "sdxl-lora", "--on-demand", "--provider", "aws", "--region", "us-east-1", "--json", "--limit", "0")
    base = {r["instance_type"]: r for r in json.loads(out)}
    _, out, _ = run_cli(capsys, "offers", "--tier", "sdxl-lora", "--on-demand", "--provider", "aws", "--region", "us-east-1", "--steps", "6000", "--json", "--limit", "0")
    double = {r["instance_type"]: r for r in json.loads(out)}
    for it, r in base.items():
        assert double[it]["est_hours"] > 1.8 * (r["est_hours"] - 0.15)


@pytest.mark.parametrize("args, needle", [
    (["--tier", "nope"], "valid tiers: sd15-lora"),
    (["--tier", "sdxl-lora", "--max-price", "-1"], "positive"),
    (["--tier", "sdxl-lora", "--max-price", "cheap"], "number"),
    (["--tier", "sdxl-lora", "--provider", "gcp"], "unknown provider 'gcp'"),
    (["--tier", "sdxl-lora", "--provider", "aws", "--region", "mars-1"], "unknown region 'mars-1'"),
    (["--tier", "sdxl-lora", "--spot", "--max-price", "0.01"], "lowest that qualifies is $"),
    (["--tier", "sdxl-lora", "--steps", "0"], "--steps"),
    (["--tier", "sdxl-lora", "--steps", "-5"], "--steps"),
    (["--tier", "sdxl-lora", "--steps", "many"], "many"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, needle):
    code, out, err = run_cli(capsys, "offers", *args)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and needle in err


def test_max_price_keeps_only_offers_at_or_below_it(capsys):
    code, out, _ = run_cli(capsys, "offers", "--tier", "sd15-lora", "--spot", "--max-price", "0.3", "--json", "--limit", "0")
    assert code == 0
    rows = json.loads(out)
    assert rows and all(r["price_per_hour_usd"] <= 0.3 for r in rows)


def test_help_imports_no_heavy_library():
    code = ("import sys; from sdcloud.cli import main; "
            "rc = main(['--help']); "
            "heavy = [m for m in ('boto3', 'botocore', 'pulumi', 'torch', 'diffusers', 'tencentcloud', 'rich', 'paramiko') if m in sys.modules]; "
            "print(heavy); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_every_catalog_gpu_has_a_throughput_figure():
    from sdcloud.offers.gpus import gpu_table
    table = gpu_table()
    for provider in ("aws", "tencent"):
        for row in bundled_rows(provider):
            assert row.gpu in table, f"{row.instance_type}: GPU {row.gpu} missing from gpus.csv"
            assert row.source


def test_every_price_names_its_basis_source_and_date():
    from sdcloud.offers.catalog import PRICE_BASES
    for provider in ("aws", "tencent"):
        for row in bundled_rows(provider):
            for market in ("spot", "on-demand"):
                price = row.spot_price if market == "spot" else row.ondemand_price
                basis, source = row.market_basis(market), row.market_source(market)
                assert basis in PRICE_BASES and source, (row.instance_type, market)
                if price is None:
                    assert basis == "none" and source.startswith("no "), (row, market)
                    continue
                assert basis != "none"
                if basis == "estimate":
                    assert source.startswith("estimate: ")
                if basis == "derived":
                    assert "median of" in source
                # A date, or the source says that none was published.
                assert row.market_date(market) or "no publication date" in source or source.startswith("estimate: "), (row, market)


def test_all_tiers_rank_something():
    cat = load_catalog()
    for tier in all_tiers().values():
        assert rank(tier, cat), tier.name
