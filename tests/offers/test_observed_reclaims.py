"""The ranking uses what runs measured (offers/optimizer.py, speeds/book.py): the reclaim rate runs
observed per zone on spot, beside the catalog's band, and the restart a reclaim really cost (launch
to the first trained step after the resume); `offers --json/--explain` say which source each row used."""

from __future__ import annotations

import json

import pytest

from sdcloud.cli import main
from sdcloud.offers.catalog import BAND_RECLAIMS_PER_HOUR, load_catalog
from sdcloud.offers.optimizer import PRIOR_SPOT_HOURS, RESTART_HOURS, rank
from sdcloud.offers.tiers import get_tier
from sdcloud.runs.records.state import StateStore
from sdcloud.speeds import records
from sdcloud.speeds.book import Book, load_book


def _spot_rows(tier):
    """Two spot offers of one instance type in two regions, as the bundled catalog has them (a row per
    region: the reclaims observed in a region's zones stand for it)."""
    ranked = rank(tier, load_catalog(["aws"]), market="spot")
    by_type: dict = {}
    for e in ranked:
        by_type.setdefault(e.offer.row.instance_type, []).append(e)
    pair = next(v for v in by_type.values() if len(v) >= 2)
    return pair[0], pair[1]


def _zone(est) -> str:
    return f"{est.offer.row.region}a"


def _observed(state, run: str, n: int, zone: str, hours: float, reclaimed: bool, restart_s: float | None = None,
              tier: str = "sdxl-lora", recipe: str = "") -> None:
    records.put_observed(state, run, n, provider="aws", instance_type="g6e.xlarge", gpu="L40S", gpu_count=1,
                         tier=tier, trainer="builtin", recipe=recipe, zone=zone, market="spot", hours=hours,
                         reclaimed=int(reclaimed), restart_s=restart_s)


def test_a_region_whose_zones_were_reclaimed_often_moves_down_the_ranking(sdcloud_home):
    tier = get_tier("sdxl-lora")
    a, b = _spot_rows(tier)
    state = StateStore()
    for n in range(1, 9):  # eight reclaims in 2 spot hours in a zone of a's region
        _observed(state, "r-z1", n, _zone(a), 0.25, True)
    book = load_book(state)
    ranked = rank(tier, load_catalog(["aws"]), market="spot", book=book)
    got = {e.offer.key: e for e in ranked}
    ea, eb = got[a.offer.key], got[b.offer.key]
    prior = BAND_RECLAIMS_PER_HOUR[a.offer.band]
    assert ea.reclaims_per_hour == pytest.approx((8 + prior * PRIOR_SPOT_HOURS) / (2.0 + PRIOR_SPOT_HOURS))
    assert ea.reclaim_source.startswith("observed: 8 reclaims in 2.00 spot h")
    assert eb.reclaim_source.startswith("band") and eb.reclaims_per_hour == BAND_RECLAIMS_PER_HOUR[b.offer.band]
    assert (eb.overhead, eb.est_cost) == (b.overhead, b.est_cost), "another region's offer is as it was"
    assert ea.overhead > a.overhead and ea.est_cost > a.est_cost
    keys = [e.offer.key for e in ranked]
    assert keys.index(a.offer.key) > [e.offer.key for e in rank(tier, load_catalog(["aws"]), market="spot")].index(
        a.offer.key), "it moved down the ranking"


def test_a_region_whose_zones_held_for_hours_costs_less_than_its_band_says(sdcloud_home):
    tier = get_tier("sdxl-lora")
    a, _ = _spot_rows(tier)
    state = StateStore()
    _observed(state, "r-z2", 1, _zone(a), 20.0, False)
    got = {e.offer.key: e for e in rank(tier, load_catalog(["aws"]), market="spot", book=load_book(state))}
    assert got[a.offer.key].reclaims_per_hour < BAND_RECLAIMS_PER_HOUR[a.offer.band]
    assert got[a.offer.key].overhead < a.overhead


def test_on_demand_hours_and_other_providers_zones_count_for_nothing():
    book = Book([records.SpeedRow(1, records.OBSERVED, "aws", "g6e.xlarge", "L40S", 1, "sdxl-lora", "", "", "us-east-1a",
                                  "on-demand", None, None, None, None, 5.0, True, "r", 1, "", 1.0)])
    assert book.reclaims("aws", "us-east-1a") is None
    assert book.reclaims("tencent", "us-east-1a") is None
    assert book.reclaims("aws", "", "us-east-1") is None, "a region's offer: its zones' spot hours only"


def test_the_restart_runs_measured_replaces_the_assumed_one(sdcloud_home):
    tier = get_tier("sdxl-lora")
    a, _ = _spot_rows(tier)
    state = StateStore()
    _observed(state, "r-z3", 2, _zone(a), 0.3, False, restart_s=540.0)
    _observed(state, "r-z4", 2, _zone(a), 0.3, False, restart_s=660.0)
    _observed(state, "r-z5", 2, _zone(a), 0.3, False, restart_s=9.0, recipe="tiny")  # says nothing of SDXL
    got = {e.offer.key: e for e in rank(tier, load_catalog(["aws"]), market="spot", book=load_book(state))}
    e = got[a.offer.key]
    assert e.restart_hours == pytest.approx(600.0 / 3600.0) and e.restart_source == "observed: median of 2 restarts"
    assert a.restart_hours == RESTART_HOURS and a.restart_source == "assumed"


def test_offers_json_and_explain_name_the_reclaim_source(capsys, sdcloud_home):
    tier = get_tier("sdxl-lora")
    a, _ = _spot_rows(tier)
    state = StateStore()
    _observed(state, "r-z6", 1, _zone(a), 1.0, True)
    state.close()
    assert main(["offers", "--tier", "sdxl-lora", "--provider", "aws", "--spot", "--json", "--limit", "0"]) in (0, None)
    rows = json.loads(capsys.readouterr().out)
    mine = [r for r in rows if (r["region"], r["instance_type"]) == (a.offer.row.region, a.offer.row.instance_type)]
    assert mine and mine[0]["reclaim_source"].startswith("observed: 1 reclaim in 1.00 spot h")
    assert all(r["reclaim_source"].startswith(("band", "observed")) for r in rows)
    assert main(["offers", "--tier", "sdxl-lora", "--provider", "aws", "--spot", "--explain", "--wide",
                 "--limit", "0"]) in (0, None)
    assert "observed: 1 reclaim in 1.00 spot h" in " ".join(capsys.readouterr().out.split())


def test_the_fleet_policy_is_given_the_measured_restart(sdcloud_home):
    """The restart the policy weighs (fleet/lifecycle.py Fleet.restart_hours): what runs measured for
    the owner's tier on its provider, else the assumption."""
    from types import SimpleNamespace

    from sdcloud.fleet.lifecycle import Fleet

    state = StateStore()
    state.create_run("r-own1", "sdxl-lora", {"tier": "sdxl-lora", "provider": "aws"}, 100)

    def fleet() -> Fleet:
        f = Fleet.__new__(Fleet)
        f.records, f.owner_id, f.provider_name = state, "r-own1", "aws"
        return f

    assert fleet().restart_hours == RESTART_HOURS
    _observed(state, "r-z7", 2, "us-east-1a", 0.3, False, restart_s=540.0)
    assert fleet().restart_hours == pytest.approx(0.15)
    _observed(state, "r-z8", 2, "us-east-1a", 0.3, False, restart_s=1260.0)
    assert fleet().restart_hours == pytest.approx(900.0 / 3600.0)
    # Records that are not a state store (another cloud's share of a batch job): the assumption.
    other = Fleet.__new__(Fleet)
    other.records, other.owner_id, other.provider_name = SimpleNamespace(), "r-own1", "aws"
    assert other.restart_hours == RESTART_HOURS


def test_a_batch_workers_images_per_second_come_from_its_done_markers(sdcloud_home):
    from types import SimpleNamespace

    from sdcloud.speeds.observe import batch_rates, learn_batch

    markers = [{"images": [{"worker": "b-1-a1", "seconds": 0.5}, {"worker": "b-1-a1", "seconds": 0.5},
                           {"worker": "b-1-a2", "seconds": 0.25, "reused": True}]},
               {"images": [{"worker": "b-1-a1", "seconds": 1.0}, {"worker": "b-1-a2", "seconds": 0.2},
                           {"worker": "b-1-a2", "seconds": 0.2}, {"worker": "b-1-a2", "seconds": 0.2}]}]
    got = batch_rates(markers)
    assert got == {"b-1-a1": (3, 2.0), "b-1-a2": (3, pytest.approx(0.6))}
    state = StateStore()
    done = SimpleNamespace(n=1, provider="aws", instance_type="g5.xlarge", zone="us-east-1a", market="spot",
                           end_reason="done", hours=0.5)
    kept = learn_batch(state, "b-1", done, got["b-1-a1"], tier="batch-sd15", gpu="A10G", recipe="")
    assert kept["rate"] == 1.5 and kept["gpu_count"] == 1 and kept["reclaimed"] == 0
    gone = SimpleNamespace(**{**done.__dict__, "n": 2, "end_reason": "preempted"})
    assert learn_batch(state, "b-1", gone, None, tier="batch-sd15", gpu="A10G", recipe="")["reclaimed"] == 1
    idle = SimpleNamespace(**{**done.__dict__, "n": 3})
    assert learn_batch(state, "b-1", idle, None, tier="batch-sd15", gpu="A10G", recipe="") is None
    book = load_book(state)
    rate = book.rate(get_tier("batch-sd15"), "aws", "g5.xlarge", "A10G", 1)
    assert rate is not None and rate.value == 1.5 and rate.source.startswith("observed")
    assert book.reclaims("aws", "us-east-1a") == (1, 1.0)
