"""The price of a move to another cloud: every byte it carries at the source's egress price (a provider
trait, by region and by the account's currency site), and the copy's hours at the copying host's rate."""

from __future__ import annotations

import pytest

from sdcloud.errors import UserError
from sdcloud.offers.moves import MOVE_MB_S, NO_EGRESS, Egress, move_cost, move_rate_mb_s
from sdcloud.providers.loader import egress_price


def _toml(provider: str) -> dict:
    import tomllib
    from importlib import resources

    return tomllib.loads(resources.files("sdcloud").joinpath("providers", provider, "storage_prices.toml").read_text())


def test_a_move_is_priced_at_the_source_clouds_egress_in_usd(monkeypatch):
    monkeypatch.setenv("SDCLOUD_CNY_PER_USD", "7.0")
    monkeypatch.setenv("SDCLOUD_TENCENT_SITE", "china")
    out = move_cost("aws", "tencent", 2 * 2**30, egress=egress_price("aws", "us-east-1"))
    assert out.egress_usd == pytest.approx(2 * 0.09)
    assert out.transfer_hours == pytest.approx(2 * 2**30 / (MOVE_MB_S * 1e6) / 3600)
    back = move_cost("tencent", "aws", 2 * 2**30, egress=egress_price("tencent", "ap-guangzhou"))
    assert back.egress_usd == pytest.approx(2 * 0.50 / 7.0)
    assert "0.5 CNY/GB" in back.reason and back.bytes == 2 * 2**30


@pytest.mark.parametrize("region", ["us-east-1", "ap-southeast-1", "sa-east-1", "ap-southeast-2"])
def test_aws_egress_is_the_source_regions_list_price(region):
    listed = _toml("aws")["egress_gb_by_region"][region]
    price = egress_price("aws", region)
    assert price.per_gb == listed and price.currency == "USD" and region in price.basis
    assert move_cost("aws", "tencent", 10 * 2**30, egress=price).egress_usd == pytest.approx(10 * listed)


def test_aws_egress_differs_by_region_and_an_unlisted_region_takes_the_general_figure():
    assert egress_price("aws", "sa-east-1").per_gb > egress_price("aws", "ap-southeast-1").per_gb \
        > egress_price("aws", "us-east-1").per_gb
    assert egress_price("aws", "xx-nowhere-9").per_gb == _toml("aws")["egress_gb"]


def test_a_tencent_international_account_pays_its_usd_list_not_the_mainland_cny(monkeypatch):
    monkeypatch.setenv("SDCLOUD_CNY_PER_USD", "7.0")
    monkeypatch.setenv("SDCLOUD_TENCENT_SITE", "international")
    intl = egress_price("tencent", "ap-guangzhou")
    assert intl.currency == "USD" and intl.per_gb == _toml("tencent")["egress_gb_by_currency"]["USD"]
    assert move_cost("tencent", "aws", 2**30, egress=intl).egress_usd == pytest.approx(intl.per_gb)
    monkeypatch.setenv("SDCLOUD_TENCENT_SITE", "china")
    china = egress_price("tencent", "ap-guangzhou")
    assert china.currency == "CNY" and china.per_gb == _toml("tencent")["egress_gb"]


def test_a_failed_copys_egress_is_in_the_ledger_at_the_regions_price(tmp_path):
    from sdcloud.costs.ledger import record_move, run_cost
    from sdcloud.runs.records.state import StateStore

    state = StateStore(tmp_path / "state.db")
    state.create_run("r-0000egress", "sd15-lora", {"tier": "sd15-lora", "provider": "aws"}, 10)
    record_move(state, "r-0000egress", "aws", 3 * 2**30, 0.0, region="sa-east-1")  # cut: 3 GB read, then a fault
    record_move(state, "r-0000egress", "aws", 2**30, 4.0, region="sa-east-1")
    item = run_cost(state, state.get_run("r-0000egress"))["run_items"]["move egress aws"]
    assert item["detail"]["bytes"] == 4 * 2**30 and item["usd"] == pytest.approx(4 * 0.15)
    assert item["detail"]["region"] == "sa-east-1"


def test_within_one_cloud_and_from_a_free_host_nothing_is_charged():
    assert move_cost("aws", "aws", 10**9).egress_usd == 0 and move_cost("aws", "aws", 10**9).transfer_hours == 0
    assert egress_price("local") == NO_EGRESS
    assert move_cost("local", "aws", 10**9, egress=egress_price("local")).egress_usd == 0


def test_between_two_clouds_an_unpriced_egress_is_refused_rather_than_free():
    with pytest.raises(ValueError, match="egress price"):
        move_cost("aws", "tencent", 10**9)


def test_the_planning_rate_is_the_hosts_network_not_a_laptops(monkeypatch):
    monkeypatch.delenv("SDCLOUD_MOVE_MB_S", raising=False)
    assert move_rate_mb_s(host_gbps=25) == (25 * 125.0, "the host's 25 Gbps")
    assert move_rate_mb_s()[0] == MOVE_MB_S  # no host figure
    sdxl = 7 * 10**9
    fast = move_cost("aws", "tencent", sdxl, egress=Egress(0.09, "USD", "x"), host_gbps=10)
    assert fast.transfer_hours == pytest.approx(sdxl / (1250 * 1e6) / 3600)
    assert "min at 1250 MB/s (the host's 10 Gbps)" in fast.reason
    assert f"{sdxl:,} bytes" in fast.reason and "USD egress" in fast.reason


def test_a_given_egress_price_and_rate_replace_the_list_ones(monkeypatch):
    out = move_cost("aws", "tencent", 2**30, egress_usd_per_gb=0.02, transfer_mb_s=100)
    assert out.egress_usd == pytest.approx(0.02) and out.transfer_hours == pytest.approx(2**30 / 1e8 / 3600)
    monkeypatch.setenv("SDCLOUD_MOVE_MB_S", "nope")
    with pytest.raises(UserError, match="SDCLOUD_MOVE_MB_S"):
        move_cost("aws", "tencent", 1, egress_usd_per_gb=0.02)
