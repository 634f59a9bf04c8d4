"""Each provider's billing rules for compute, one rule per test."""

import pytest

from sdcloud.costs.billing_rules import compute_charge

T = 1_800_000_000.0


def test_aws_bills_a_minimum_of_60_seconds():
    c = compute_charge("aws", "on-demand", T, T + 20, "stopped", 3.6, "USD")
    assert c.amount == pytest.approx(3.6 * 60 / 3600) and c.detail["rule"] == "60 s minimum" and c.source == "list"
    assert compute_charge("aws", "on-demand", T, T + 90, "stopped", 3.6, "USD").amount == pytest.approx(0.09)


def test_aws_spot_interrupted_by_ec2_in_its_first_hour_is_free_but_not_when_stopped_by_the_user():
    assert compute_charge("aws", "spot", T, T + 3599, "preempted", 1.0, "USD", [(T - 10, 1.0)]).amount == 0.0
    assert compute_charge("aws", "spot", T, T + 3599, "stopped", 1.0, "USD", [(T - 10, 1.0)]).amount == pytest.approx(3599 / 3600)
    after = compute_charge("aws", "spot", T, T + 3601, "preempted", 1.0, "USD", [(T - 10, 1.0)])
    assert after.amount == pytest.approx(3601 / 3600) and after.source == "price-history"


def test_tencent_spot_from_samples_per_second_no_minimum_and_charged_when_reclaimed():
    c = compute_charge("tencent", "spot", T, T + 1800, "preempted", 3.0, "CNY", [(T, 3.0), (T + 900, 5.0)])
    assert c.amount == pytest.approx(3.0 * 0.25 + 5.0 * 0.25) and c.source == "samples" and c.currency == "CNY"
    assert compute_charge("tencent", "on-demand", T, T + 20, "stopped", 9.0, "CNY").amount == pytest.approx(9.0 * 20 / 3600)


def test_spot_without_history_falls_back_to_the_launch_quote():
    c = compute_charge("aws", "spot", T, T + 7200, "succeeded", 0.5, "USD", [])
    assert c.amount == pytest.approx(1.0) and c.source == "quote"


def test_local_and_ssh_are_free_without_a_price():
    assert compute_charge("local", "on-demand", T, T + 7200, "succeeded", None, "USD").source == "free"
    assert compute_charge("ssh", "on-demand", T, T + 7200, "succeeded", 0.35, "USD").amount == pytest.approx(0.7)
