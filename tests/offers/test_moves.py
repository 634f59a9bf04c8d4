"""The price of carrying a checkpoint to another cloud: the source's egress list price and the copy's hours."""

from __future__ import annotations

import pytest

from sdcloud.errors import UserError
from sdcloud.offers.moves import MOVE_MB_S, egress_price, move_cost


def test_a_move_is_priced_at_the_source_clouds_egress_in_usd(monkeypatch):
    monkeypatch.setenv("SDCLOUD_CNY_PER_USD", "7.0")
    out = move_cost("aws", "tencent", 2 * 2**30)
    assert out.egress_usd == pytest.approx(2 * 0.09)
    assert out.transfer_hours == pytest.approx(2 * 2**30 / (MOVE_MB_S * 1e6) / 3600)
    back = move_cost("tencent", "aws", 2 * 2**30)
    assert back.egress_usd == pytest.approx(2 * 0.50 / 7.0)
    assert "0.5 CNY/GB" in back.reason and back.bytes == 2 * 2**30


def test_within_one_cloud_and_from_a_free_host_nothing_is_charged():
    assert move_cost("aws", "aws", 10**9).egress_usd == 0 and move_cost("aws", "aws", 10**9).transfer_hours == 0
    assert egress_price("local") == (0.0, "USD")
    assert move_cost("local", "aws", 10**9).egress_usd == 0


def test_a_given_egress_price_and_rate_replace_the_list_ones(monkeypatch):
    out = move_cost("aws", "tencent", 2**30, egress_usd_per_gb=0.02, transfer_mb_s=100)
    assert out.egress_usd == pytest.approx(0.02) and out.transfer_hours == pytest.approx(2**30 / 1e8 / 3600)
    monkeypatch.setenv("SDCLOUD_MOVE_MB_S", "nope")
    with pytest.raises(UserError, match="SDCLOUD_MOVE_MB_S"):
        move_cost("aws", "tencent", 1)
