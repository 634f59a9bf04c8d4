"""Tencent RunInstances errors by meaning, each in a launch that goes through the controller.

The fake (tests/support/fake_tencent_api.py) answers with the documented codes: some from its model (stock,
subnets, roles, balance), the rest injected. What each must lead to:
sold out / not sold here -> the next zone; price too low -> PriceTooLow with the current price;
a quota -> a QuotaError naming it; no balance -> one line and stop; a full subnet -> the next
subnet or zone; a role that cannot be passed -> its own message.
"""

from __future__ import annotations

import pytest


from sdcloud.errors import UserError
from sdcloud.providers import base
from sdcloud.providers.tencent import compute as tencent
from sdcloud.providers.tencent import errors as codes
from sdcloud.runs.driving.controller import Controller, Timing, new_run_id
from sdcloud.runs.records.state import StateStore

from tests.support import fake_tencent_api

REGION = "ap-guangzhou"
INFRA = {"image_id": "img-fake0001", "vpc_id": "vpc-fake", "security_group_id": "sg-fake", "cam_role_name": "sdcloud-host",
         "subnet_ids": {"ap-guangzhou-3": "subnet-3", "ap-guangzhou-4": "subnet-4", "ap-guangzhou-6": "subnet-6"}}


@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.setattr("sdcloud.providers.tencent.session.METADATA_URL", "http://127.0.0.1:9/")
    with fake_tencent_api.serving(monkeypatch, tmp_path, pending_s=0.05, terminating_s=0.1) as srv:
        yield srv


class Run:
    """A Tencent run's controller, stepped one launch at a time."""

    def __init__(self, tmp_path, infra: dict | None = None, market: str = "spot"):
        self.state = StateStore()
        self.state.save_infra("tencent", REGION, infra or INFRA)
        self.run_id = new_run_id()
        spec = {"tier": "sd15-lora", "provider": "tencent", "region": REGION, "model": "tiny", "steps": 20,
                "store": (tmp_path / "bucket").as_uri(), "market": market}
        self.state.create_run(self.run_id, "sd15-lora", spec, 20)
        self.events: list[tuple[str, dict]] = []
        provider = tencent.TencentProvider(poll_interval=0.02, launch_timeout=10, backoff=0.01, backoff_max=0.02)
        self.ctl = Controller(self.state, self.run_id, provider=provider, emit=lambda k, d: self.events.append((k, d)),
                              timing=Timing(poll_seconds=0.1, boot_timeout=30, heartbeat_timeout=30))

    def launch(self) -> None:
        self.ctl._start_attempt()

    def kinds(self) -> list[str]:
        return [k for k, _ in self.events]

    def of(self, kind: str) -> list[dict]:
        return [d for k, d in self.events if k == kind]

    def attempts(self):
        return self.state.attempts(self.run_id)


def _capacity_back(fake) -> None:
    """The fake sells everything again; zone cooldowns are shared by runs (state store), so forget them too."""
    fake.cvm.reset()
    with StateStore().tx() as db:
        db.execute("DELETE FROM zone_cooldowns")


def _fails_over(run: Run, code: str) -> None:
    """The first launch fails with `code` and is not fatal; the next one runs in another zone."""
    run.launch()
    first = run.attempts()[0]
    assert first.end_reason == "launch-failed"
    assert any(code in d.get("error", "") or d.get("code") == code for d in run.of("launch-failed") + run.of("failover"))
    run.launch()
    second = run.attempts()[-1]
    assert second.state == "running" and second.instance_id
    assert (second.zone, second.instance_type) != (first.zone, first.instance_type)


@pytest.mark.parametrize("code", sorted(codes.ZONE_UNAVAILABLE))
def test_every_sold_out_code_fails_over_to_the_next_zone(fake, tmp_path, code):
    fake.cvm.inject("RunInstances", code, times=1)
    _fails_over(Run(tmp_path), code)


def test_spot_out_of_stock_not_sold_and_no_spot_fail_over(fake, tmp_path):
    """The fake's own model refuses with the three codes that used to abort a launch."""
    run = Run(tmp_path)
    run.launch()
    first = run.attempts()[0]
    run.ctl.provider.terminate([first.instance_id], REGION)
    fake.cvm.spot_out_of_stock.add((first.zone, first.instance_type))
    _fails_over(Run(tmp_path), "InvalidParameterValue.InsufficientOffering")
    _capacity_back(fake)
    fake.cvm.not_sold.add((first.zone, first.instance_type))
    _fails_over(Run(tmp_path), "ResourceUnavailable.InstanceType")
    _capacity_back(fake)
    # Not sold as spot at all: every zone of the type fails in turn, never the run; another offer runs.
    fake.cvm.no_spot.add(first.instance_type)
    run = Run(tmp_path)
    for _ in range(8):
        run.launch()
        if run.attempts()[-1].state == "running":
            break
    assert run.attempts()[-1].state == "running" and run.attempts()[-1].instance_type != first.instance_type
    assert {d["code"] for d in run.of("failover")} == {"UnsupportedOperation.NoInstanceTypeSupportSpot"}


def test_cidr_block_is_a_full_subnet_not_sold_out(fake, tmp_path):
    fake.cvm.inject("RunInstances", "ResourceInsufficient.CidrBlock", times=1)
    run = Run(tmp_path)
    run.launch()
    (full,) = run.of("subnet-full")
    assert full["code"] == "ResourceInsufficient.CidrBlock" and not run.of("failover")


def test_a_full_subnet_tries_the_zones_next_subnet(fake, tmp_path):
    infra = {**INFRA, "subnet_ids": {z: [f"subnet-{z[-1]}a", f"subnet-{z[-1]}b"] for z in fake_tencent_api.ZONES[REGION]}}
    fake.cvm.full_subnets.update(f"subnet-{z[-1]}a" for z in fake_tencent_api.ZONES[REGION])
    run = Run(tmp_path, infra)
    run.launch()
    (att,) = run.attempts()
    assert att.state == "running"
    (full,) = run.of("subnet-full")
    assert full["code"] == "FailedOperation.NoAvailableIpAddressCountInSubnet" and full["next_subnet"].endswith("b")
    (inst,) = fake.cvm.live()
    assert inst.request["VirtualPrivateCloud"]["SubnetId"] == full["next_subnet"]


def test_a_full_subnet_without_another_fails_over_to_the_next_zone(fake, tmp_path):
    fake.cvm.full_subnets.add("subnet-3")
    fake.cvm.full_subnets.add("subnet-4")
    fake.cvm.full_subnets.add("subnet-6")
    run = Run(tmp_path)
    run.launch()
    assert run.attempts()[0].end_reason == "launch-failed" and run.of("subnet-full")[0]["next_subnet"] is None
    fake.cvm.full_subnets.clear()
    run.launch()
    assert run.attempts()[-1].state == "running"


def test_price_too_low_reports_the_current_price(fake, tmp_path):
    run = Run(tmp_path)
    for zone in fake_tencent_api.ZONES[REGION]:
        fake.cvm.inject("RunInstances", "InvalidParameterValue.InsufficientPrice", zone=zone,
                        message="The bid price 2.8650 is lower than the current price 3.1200.")
    run.launch()
    (low,) = run.of("price-too-low")
    assert low["current_price"] == pytest.approx(3.12)
    (failed,) = run.of("launch-failed")
    assert "3.12" in failed["error"] and run.attempts()[0].end_reason == "launch-failed"


@pytest.mark.parametrize("code", sorted(codes.QUOTAS) + ["LimitExceeded.SomeNewQuota"])
def test_a_quota_stops_the_run_naming_it(fake, tmp_path, code):
    fake.cvm.inject("RunInstances", code, times=5)
    run = Run(tmp_path)
    with pytest.raises(base.QuotaError) as err:
        run.launch()
    assert code in str(err.value) and "quota" in str(err.value) and "\n" not in str(err.value)
    assert run.state.get_run(run.run_id)["state"] == "failed" and fake.cvm.live() == []


def test_insufficient_balance_is_one_clear_line_and_stops(fake, tmp_path):
    fake.cvm.balance_ok = False
    run = Run(tmp_path)
    with pytest.raises(UserError) as err:
        run.launch()
    msg = str(err.value)
    assert "InvalidAccount.InsufficientBalance" in msg and "balance" in msg and "\n" not in msg
    assert not isinstance(err.value, base.QuotaError)
    assert run.state.get_run(run.run_id)["state"] == "failed"
    assert len([c for c in fake.cvm.calls if c["action"] == "RunInstances"]) == 1  # no other zone tried


def test_a_role_that_cannot_be_passed_has_its_own_message(fake, tmp_path):
    fake.cvm.passable_roles = {"another-role"}
    run = Run(tmp_path)
    with pytest.raises(UserError) as err:
        run.launch()
    msg = str(err.value)
    assert not isinstance(err.value, base.CredentialsError) and "credentials" not in msg
    assert "sdcloud-host" in msg and "PassRole" in msg and "AuthFailure.CamRoleNameAuthenticateFailed" in msg
