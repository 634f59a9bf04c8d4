"""`up --provider aws,tencent`: a run's clouds, home first, checked before anything is recorded (every
cloud's credentials, no --unattended across clouds, [defaults] providers), `offers` ranking the named
clouds in one table, a fleet that counts only its own cloud's refusals, and the cost lines of a move.
Fast: nothing launches here."""

from __future__ import annotations

import json

import pytest

from sdcloud.cli import main
from tests.support.harness_cli import nothing_recorded, refused


def test_the_spec_keeps_the_clouds_home_first_and_refuses_a_host_that_is_no_cloud(dataset):
    from sdcloud.errors import UserError
    from sdcloud.runs.inputs.spec import build_spec

    plan = build_spec(None, {"tier": "sd15-lora", "provider": "aws, tencent", "dataset": str(dataset), "steps": 10})
    assert plan.spec.provider == "aws" and plan.spec.providers == ["aws", "tencent"]
    with pytest.raises(UserError, match="names aws twice"):  # a repeat is a typo as often as not: refused, not dropped
        build_spec(None, {"tier": "sd15-lora", "provider": "aws, tencent,aws", "dataset": str(dataset), "steps": 10})
    assert plan.traits.name == "aws"
    one = build_spec(None, {"tier": "sd15-lora", "provider": "tencent", "dataset": str(dataset), "steps": 10})
    assert one.spec.providers is None and one.spec.provider == "tencent"
    from_list = build_spec(None, {"tier": "sd15-lora", "providers": ["tencent", "aws"], "dataset": str(dataset), "steps": 10})
    assert from_list.spec.provider == "tencent" and from_list.spec.providers == ["tencent", "aws"]
    with pytest.raises(UserError, match="local cannot share a run"):
        build_spec(None, {"tier": "sd15-lora", "provider": "aws,local", "dataset": str(dataset), "steps": 10})


def test_without_the_other_clouds_credentials_the_run_is_refused_before_anything_is_recorded(capsys, dataset, aws_env):
    err = refused(capsys, ["up", "--tier", "sd15-lora", "--dataset", str(dataset), "--provider", "aws,tencent",
                            "--steps", "10", "--yes"], "provider tencent")
    assert "TENCENTCLOUD_SECRET_ID" in err
    nothing_recorded()
    err = refused(capsys, ["up", "--tier", "sd15-lora", "--dataset", str(dataset), "--provider", "tencent,aws",
                            "--steps", "10", "--yes"], "provider tencent (of tencent,aws)")
    nothing_recorded()


def test_defaults_providers_are_used_and_checked(capsys, sdcloud_home, dataset, aws_env):
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text('[defaults]\nproviders = ["aws", "tencent"]\n')
    refused(capsys, ["up", "--tier", "sd15-lora", "--dataset", str(dataset), "--steps", "10", "--yes"],
             "provider tencent")
    nothing_recorded()
    (sdcloud_home / "config.toml").write_text('[defaults]\nproviders = "aws,moon"\n')
    refused(capsys, ["up", "--tier", "sd15-lora", "--dataset", str(dataset), "--steps", "10"], "must be one of")
    nothing_recorded()


def test_unattended_across_clouds_is_refused_in_one_line(capsys, dataset, monkeypatch):
    err = refused(capsys, ["up", "--tier", "sd15-lora", "--dataset", str(dataset), "--provider", "aws,tencent",
                            "--steps", "10", "--unattended", "--yes"], "--unattended runs in one cloud")
    assert "aws,tencent" in err
    nothing_recorded()


def test_offers_ranks_the_named_clouds_in_one_table(capsys):
    assert main(["offers", "--tier", "sd15-lora", "--provider", "aws,tencent", "--limit", "0", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["provider"] for r in rows} == {"aws", "tencent"}
    costs = [r["est_cost"] for r in rows]
    assert costs == sorted(costs)  # one ranking across both clouds, USD
    assert main(["offers", "--tier", "sd15-lora", "--provider", "tencent", "--limit", "0", "--json"]) == 0
    assert {r["provider"] for r in json.loads(capsys.readouterr().out)} == {"tencent"}


def test_a_fleet_counts_only_its_own_clouds_refused_launches(sdcloud_home):
    from sdcloud.fleet.lifecycle import Fleet, Timing
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    state.create_run("r-00000001", "sd15-lora", {"provider": "aws", "tier": "sd15-lora"}, 10)
    for n in range(1, 4):
        state.add_attempt("r-00000001", n, "aws", f"t{n}", region="us-east-1", market="spot")
        state.update_attempt("r-00000001", n, state="ended", end_reason="launch-failed")
    timing = Timing(poll_seconds=1, boot_timeout=10, heartbeat_timeout=10)
    aws = Fleet("r-00000001", None, "aws", state, [], None, lambda k, d: None, timing)
    other = Fleet("r-00000001", None, "tencent", state, [], None, lambda k, d: None, timing)
    assert aws.failed_launches("spot") == 3 and other.failed_launches("spot") == 0
    state.add_attempt("r-00000001", 4, "tencent", "t4", region="ap-guangzhou", market="spot")
    state.update_attempt("r-00000001", 4, state="ended", end_reason="launch-failed")
    assert other.failed_launches("spot") == 1 and aws.failed_launches("spot") == 0


def test_a_moves_egress_and_transfer_are_their_own_lines_beside_the_artifacts_egress(sdcloud_home, monkeypatch):
    from sdcloud.costs import ledger
    from sdcloud.costs.cloud_moves import lines
    from sdcloud.runs.records.state import StateStore

    monkeypatch.setenv("SDCLOUD_CNY_PER_USD", "7.0")
    state = StateStore()
    state.create_run("r-00000002", "sd15-lora", {"provider": "aws", "providers": ["aws", "tencent"], "tier": "sd15-lora"}, 10)
    ledger.record_move(state, "r-00000002", "aws", 2 * 2**30, 12.5)
    ledger.record_egress(state, "r-00000002", "tencent", 2**30)  # artifacts pulled later: the move stays
    ledger.record_move(state, "r-00000002", "tencent", 2**30, 2.5)  # and back
    cost = ledger.run_cost(state, state.get_run("r-00000002"))
    items = cost["run_items"]
    assert items["move egress aws"]["usd"] == pytest.approx(0.18) and items["move egress aws"]["detail"]["bytes"] == 2 * 2**30
    assert (items["move egress tencent"]["currency"] == "CNY"
            and items["move egress tencent"]["usd"] == pytest.approx(0.5 / 7, abs=1e-4))
    assert items["move transfer"]["detail"] == {"seconds": 15.0, "moves": 2} and items["move transfer"]["usd"] == 0
    assert "egress" in items  # the artifacts' own line kept
    assert cost["estimate_usd"] == pytest.approx(0.18 + 0.5 / 7 + 0.5 / 7, abs=1e-3)
    text = lines(cost)
    assert any(t.startswith("move egress aws: 2 GB at 0.09 USD/GB") for t in text)
    assert "move transfer: 15 s copying checkpoints between clouds" in text


def test_a_fleet_shows_the_policy_every_clouds_zones_in_usd_and_names_the_cloud_of_a_move(sdcloud_home):
    from sdcloud import config
    from sdcloud.fleet.lifecycle import Across, Fleet, Progress, Timing
    from sdcloud.offers.catalog import CatalogRow
    from sdcloud.offers.optimizer import Offer
    from sdcloud.runs.records.state import StateStore
    from sdcloud.spot.policy import SPOT, get_policy

    def offer(provider, zone, spot, od, currency):
        row = CatalogRow(provider=provider, region="r", zone=zone, instance_type="t", gpu="V100", gpu_count=1,
                         vram_gb=16, vcpus=8, memory_gb=61, nvme_gb=0, ondemand_price=od, spot_price=spot,
                         currency=currency, interruption_band=None, snapshot_date="2026-12-01", ondemand_estimate=False,
                         spot_estimate=False, source="test")
        return Offer(row, SPOT)

    state = StateStore()
    state.create_run("r-00000002", "sd15-lora", {"provider": "aws", "tier": "sd15-lora"}, 10)
    state.add_attempt("r-00000002", 1, "aws", "t1", region="r", zone="a", instance_type="t", market="spot")
    state.update_attempt("r-00000002", 1, state="ended", end_reason="preempted")
    timing = Timing(poll_seconds=60, boot_timeout=10, heartbeat_timeout=10)
    home, far = offer("aws", "a", 1.0, 3.0, "USD"), offer("tencent", "b", 1.0, 19.0, "CNY")
    fleet = Fleet("r-00000002", None, "aws", state, [home], get_policy("sdcloud"), lambda k, d: None, timing,
                  elsewhere=[far])
    views = {v.key: v for v in fleet.zone_views(0.0)}
    assert views["tencent/r/b/t"].cloud == "tencent" and views["aws/r/a/t"].cloud == "aws"
    rate = config.usd_per("CNY")
    there = views["tencent/r/b/t"]
    assert there.spot_price == pytest.approx(rate) and there.ondemand_price == pytest.approx(19 * rate)
    assert fleet.cloud_of(far) == "tencent" and fleet.cloud_of(home) is None
    # 1 CNY is far cheaper than 1 USD: after the reclaim the policy moves the run there (told where the checkpoint is).
    progress = Progress(elapsed_hours=1.0, done_hours=1.0, job_hours=10.0, deadline_hours=None)
    kind, chosen = fleet.decide(progress, None, across=Across("aws", 0.01, 0.1))
    assert kind == SPOT and fleet.cloud_of(chosen) == "tencent"
    # Not told (one cloud, or no terms): the other cloud's zone is never the answer.
    kind, chosen = fleet.decide(progress, None)
    assert fleet.cloud_of(chosen) is None
