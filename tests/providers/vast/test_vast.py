"""The Vast.ai provider against the fake API (tests/support/clouds/fake_vast.py) on the real wire format, over HTTPS:
bids sent as `price` and checked back, stale offers, labels, pauses and bids, 429s, the key on every call,
the live catalog and the charges."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from sdcloud.offers.optimizer import Offer
from sdcloud.providers.base import (PAUSED, PENDING, RUNNING, TERMINATED, CapacityError, CredentialsError, LaunchSpec,
                                    ProviderError)
from sdcloud.providers.vast import bids
from sdcloud.providers.vast.compute import label_for, search_query, state_of, tags_of
from sdcloud.providers.vast.session import Client, VastApiError

from tests.support.clouds.fake_vast import KEY, ask


def _offer(provider, market="spot", gpu="RTX4090", zone="DK"):
    from sdcloud.offers.tiers import get_tier

    rows = [o.row for o in provider.offers(get_tier("sdxl-lora"), market) if o.row.gpu == gpu and o.row.gpu_count == 1]
    return Offer(replace(rows[0], zone=zone), market)


def _spec(run="r-vast", attempt=1) -> LaunchSpec:
    return LaunchSpec(run, attempt, user_data="#!/bin/bash\necho boot", root_volume_gb=60)


def _creates(fake) -> list[dict]:
    return fake.creates()


# --- launch: the bid as `price`, confirmed ------------------------------------------------------------

def test_a_spot_launch_sends_the_bid_as_price_and_never_a_create_without_it(provider, fake):
    inst = provider.launch(_offer(provider), _spec(), "spot", max_price=1.0)
    bodies = _creates(fake)
    assert bodies and all(b.get("price") is not None for b in bodies)
    body = bodies[-1]
    assert body["price"] == pytest.approx(bids.bid_for(0.14, margin=0.15))  # the machine's min_bid plus the margin
    assert body["label"] == "sdcloud-r-vast.a1" and body["cancel_unavail"] is True
    assert body["onstart"] == "#!/bin/bash\necho boot" and body["image"].startswith("pytorch/pytorch:")
    assert inst.market == "spot" and inst.run_id == "r-vast" and inst.price_per_hour == pytest.approx(body["price"])


def test_an_on_demand_launch_sends_no_price(provider, fake):
    inst = provider.launch(_offer(provider, "on-demand"), _spec(), "on-demand")
    assert "price" not in _creates(fake)[-1] and inst.market == "on-demand"


def test_a_create_rented_on_demand_for_a_spot_launch_is_ended_and_said(provider, fake, monkeypatch):
    real = fake._create

    def ignores_price(ask_id, body, now):  # the marketplace's silent on-demand rental (vast-cli PR #403)
        return real(ask_id, {k: v for k, v in body.items() if k != "price"}, now)

    monkeypatch.setattr(fake, "_create", ignores_price)
    with pytest.raises(ProviderError, match="on demand"):
        provider.launch(_offer(provider), _spec(), "spot")
    assert fake.instances == {} and provider.find_tagged() == []


def test_a_stale_offer_moves_on_to_the_next_machine(provider, fake, monkeypatch):
    real = fake._create
    taken = []

    def first_gone(ask_id, body, now):
        if not taken:
            taken.append(ask_id)
            return 404, {"success": False, "error": "no_such_ask", "msg": "not available"}
        return real(ask_id, body, now)

    monkeypatch.setattr(fake, "_create", first_gone)
    events = []
    inst = provider.launch(_offer(provider, zone=""), _spec(), "spot", events=lambda k, d: events.append((k, d)))
    asks = [int(p.split("/")[2]) for m, p, _, _ in fake.log if m == "PUT" and p.startswith("/asks/")]
    assert len(asks) == 2 and asks[0] == taken[0] and asks[1] != asks[0]
    assert inst.live and [k for k, _ in events] == ["launch-failed"]


def test_no_machine_at_all_is_a_capacity_error_and_leaves_nothing(provider, fake):
    for a in fake.asks.values():
        a["rented"] = True
    with pytest.raises(CapacityError):
        provider.launch(_offer(provider), _spec(), "spot")
    assert _creates(fake) == []


def test_a_max_price_under_every_minimum_bid_sends_no_create(provider, fake):
    with pytest.raises(CapacityError, match="max-price"):
        provider.launch(_offer(provider), _spec(), "spot", max_price=0.05)
    assert _creates(fake) == []


def test_the_search_uses_the_filter_syntax_and_the_reliability_floor(provider, fake):
    q = search_query(_offer(provider).row, disk_gb=60, market="spot")
    assert q["reliability2"] == {"gte": 0.98} and q["verified"] == {"eq": True} and q["rentable"] == {"eq": True}
    assert q["gpu_name"] == {"eq": "RTX 4090"} and q["num_gpus"] == {"eq": 1} and q["type"] == "bid"
    found = provider.client.search_offers({**q, "gpu_name": {"in": ["RTX 4090", "RTX 3090"]}, "geolocation": {"neq": "x"}})
    assert found and all(o["reliability2"] >= 0.98 for o in found)  # the 0.90 RTX 3090 host is not offered
    assert [o["min_bid"] for o in found] == sorted(o["min_bid"] for o in found)


def test_a_machine_too_old_for_the_image_or_too_slow_to_upload_is_never_rented(provider, fake):
    for a in fake.asks.values():
        a.update(cuda_max_good=11.8) if a["id"] == 101 else a.update(inet_up=20.0)
    with pytest.raises(CapacityError):
        provider.launch(_offer(provider, zone=""), _spec(), "spot")
    assert _creates(fake) == []
    fake.asks[102]["inet_up"] = 400.0
    assert provider.launch(_offer(provider, zone=""), _spec(), "spot").live
    assert [int(p.split("/")[2]) for m, p, _, _ in fake.log if m == "PUT"] == [102]


def test_an_unreliable_host_is_never_rented(provider, fake):
    with pytest.raises(CapacityError):
        provider.launch(_offer(provider, gpu="RTX3090", zone=""), _spec(), "spot")


def test_a_launch_is_idempotent_on_its_label(provider, fake):
    first = provider.launch(_offer(provider, zone=""), _spec(), "spot")
    again = provider.launch(_offer(provider, zone=""), _spec(), "spot")
    assert again.adopted and again.id == first.id and len(_creates(fake)) == 1


# --- states: pending, running, paused by an outbid, resumed, ended -----------------------------------

def test_an_outbid_host_is_paused_live_and_found_for_gc(provider, fake):
    inst = provider.launch(_offer(provider), _spec(), "spot")
    assert provider.describe([inst.id])[0].state in (PENDING, RUNNING)
    fake.outbid(inst.id, min_bid=0.5)
    paused = provider.describe([inst.id])[0]
    assert paused.state == PAUSED and paused.live
    assert [i.id for i in provider.find_tagged("r-vast")] == [inst.id]  # its disk still bills: gc must see it


def test_a_raised_bid_resumes_the_paused_host_on_the_same_machine(provider, fake):
    inst = provider.launch(_offer(provider), _spec(), "spot")
    fake.outbid(inst.id, min_bid=0.3)
    assert provider.min_bid(inst.id) == 0.3
    provider.change_bid(inst.id, 0.35)
    back = provider.describe([inst.id])[0]
    assert back.state == RUNNING and fake.instances[int(inst.id)].ask["id"] == 101
    assert ("PUT", f"/instances/bid_price/{inst.id}/", {}, {"client_id": "me", "price": 0.35}) in fake.log


def test_terminate_ends_a_paused_host_and_describe_says_terminated(provider, fake):
    inst = provider.launch(_offer(provider), _spec(), "spot")
    fake.outbid(inst.id, 1.0)
    provider.terminate([inst.id])
    assert provider.describe([inst.id])[0].state == TERMINATED and provider.find_tagged() == []
    provider.terminate([inst.id])  # twice is harmless: gone is what was asked


def test_instances_without_sdclouds_label_are_not_ours(provider, fake):
    code, body = fake.handle("PUT", "/asks/102/", {}, {"image": "x", "label": "my-notebook"}, f"Bearer {KEY}")
    assert code == 200
    assert provider.find_tagged() == []


@pytest.mark.parametrize("raw,state", [
    ({"actual_status": "loading", "intended_status": "running"}, PENDING),
    ({"actual_status": "running", "intended_status": "running"}, RUNNING),
    ({"actual_status": "exited", "intended_status": "running"}, PAUSED),
    ({"actual_status": "offline", "intended_status": "running"}, PAUSED),
    ({"actual_status": "exited", "intended_status": "stopped"}, "stopping"),
])
def test_state_mapping(raw, state):
    assert state_of(raw) == state


def test_labels_carry_run_attempt_and_token():
    from sdcloud.providers.base import launch_token

    tags = tags_of(label_for("r-2026-x", 3))
    assert tags["sdcloud:run"] == "r-2026-x" and tags["sdcloud:attempt"] == "3"
    assert tags["sdcloud:token"] == launch_token("r-2026-x", 3)
    assert tags_of("my-notebook") == {} and tags_of(None) == {}


# --- the key, rate limits ---------------------------------------------------------------------------

def test_every_call_carries_the_key_as_a_bearer_header_never_in_the_url(provider, fake):
    provider.launch(_offer(provider), _spec(), "spot")
    provider.find_tagged()
    assert fake.log and all("api_key" not in q for _, _, q, _ in fake.log)
    assert all(KEY not in p for _, p, _, _ in fake.log)


def test_a_wrong_key_is_refused_by_the_api_and_said_in_one_line(vast_server, monkeypatch):
    from sdcloud.providers import get_provider

    monkeypatch.setenv("VAST_API_KEY", "not-the-key")
    with pytest.raises(CredentialsError) as err:
        get_provider("vast").check_credentials()
    assert "\n" not in str(err.value) and "not-the-key" not in str(err.value)


def test_no_key_names_the_variable_and_calls_nothing(vast_server, monkeypatch):
    from sdcloud.providers import get_provider

    monkeypatch.delenv("VAST_API_KEY")
    with pytest.raises(CredentialsError, match="VAST_API_KEY"):
        get_provider("vast").check_credentials()
    assert vast_server.fake.log == []


def test_the_key_can_come_from_config_toml(vast_server, monkeypatch, sdcloud_home):
    from sdcloud.providers import get_provider

    monkeypatch.delenv("VAST_API_KEY")
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text(f'[vast]\napi_key = "{KEY}"\n')
    get_provider("vast").check_credentials()


def test_429s_are_retried_a_bounded_number_of_times(vast_server):
    fake = vast_server.fake
    client = Client(backoff=0.0, backoff_max=0.0)
    fake.throttle(2)
    assert client.instances() == []
    assert len(fake.log) == 3
    fake.throttle(100)
    with pytest.raises(VastApiError) as err:
        client.instances()
    assert err.value.status == 429 and len(fake.log) == 3 + client.max_attempts


def test_an_error_that_is_not_transient_is_not_retried(vast_server):
    client = Client(backoff=0.0)
    with pytest.raises(VastApiError) as err:
        client.change_bid(123, 0.2)
    assert err.value.status == 404 and len(vast_server.fake.log) == 1


def test_the_endpoint_must_be_https(monkeypatch):
    monkeypatch.setenv("SDCLOUD_VAST_ENDPOINT", "http://127.0.0.1:1/api/v0")
    with pytest.raises(ProviderError, match="https"):
        Client()


# --- bids --------------------------------------------------------------------------------------------

def test_the_bid_is_the_minimum_plus_the_margin_capped_by_max_price():
    assert bids.bid_for(0.20, margin=0.15) == pytest.approx(0.23)
    assert bids.bid_for(0.20, 0.21, margin=0.15) == pytest.approx(0.21)
    assert bids.raised_bid(0.23, 0.30, None, margin=0.1) == pytest.approx(0.33)
    assert bids.raised_bid(0.23, 0.30, 0.31, margin=0.1) is None


def test_a_bad_bid_margin_is_refused_in_one_line(sdcloud_home):
    from sdcloud.errors import UserError

    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text("[vast]\nbid_margin = 3\n")
    with pytest.raises(UserError, match="bid_margin"):
        bids.bid_margin()


# --- the live catalog and the charges ----------------------------------------------------------------

def test_catalog_refresh_reads_each_machine_with_its_bid_and_bandwidth(vast_server, sdcloud_home):
    from sdcloud.offers.catalog import load_provider
    from sdcloud.providers.vast.catalog import refresh_catalog

    path, rows, errors = refresh_catalog()
    assert path.exists() and not errors
    by_gpu = {r.gpu: r for r in rows}
    assert {"RTX4090", "L40S", "RTX4060Ti"} <= set(by_gpu)
    r4090 = min((r for r in rows if r.gpu == "RTX4090"), key=lambda r: r.min_bid)
    assert r4090.min_bid == 0.14 and r4090.spot_price == pytest.approx(bids.bid_for(0.14))
    assert r4090.upload_usd_per_gb == 0.004 and r4090.storage_usd_per_gb_month == 0.12 and r4090.dlperf == 60.0
    loaded, source = load_provider("vast")
    assert source.origin == "refreshed" and {r.instance_type for r in loaded} == {r.instance_type for r in rows}
    assert all(r.spot_price == pytest.approx(bids.bid_for(r.min_bid)) for r in loaded)  # no discount applied over them


def test_the_charges_are_read_per_instance_and_kind(provider, fake):
    from sdcloud.providers.vast.billing import billed, charges

    inst = provider.launch(_offer(provider), _spec(), "spot")
    provider.describe([inst.id])
    provider.describe([inst.id])  # running now
    fake.add_bytes(inst.id, up=2_000_000_000, down=1_000_000_000)
    provider.terminate([inst.id])
    lines = charges(provider.client, 0, 2e9)[inst.id]
    assert set(lines) == {"gpu", "storage", "bandwidth"}
    assert lines["bandwidth"] == pytest.approx(2 * 0.004 + 1 * 0.003)
    attempt = SimpleNamespace(instance_id=inst.id, start=1.0, end=None, n=1)
    state = SimpleNamespace(attempts=lambda run_id: [attempt])
    bill = billed(state, [{"id": "r-vast"}], 2e9, client=provider.client)["r-vast"]
    assert bill.currency == "USD" and bill.amount == pytest.approx(sum(lines.values()))
    assert billed(SimpleNamespace(attempts=lambda run_id: []), [{"id": "r-none"}], 2e9, client=provider.client) == {}


def test_the_fake_refuses_a_bid_under_the_minimum_as_the_api_does(fake):
    code, body = fake.handle("PUT", "/asks/101/", {}, {"price": 0.01, "image": "x"}, f"Bearer {KEY}")
    assert code == 400 and body["success"] is False
    code, body = fake.handle("GET", "/bundles/", {"q": json.dumps({"gpu_name": {"eq": "L40S"}})}, None, None)
    assert code == 401 and body["error"] == "not_authorized"


def test_fake_search_filters_like_the_api():
    from tests.support.clouds.fake_vast import FakeVast

    f = FakeVast(asks=[ask(1, "RTX 4090", gpu_ram=24564), ask(2, "L40S", gpu_ram=46068), ask(3, "RTX 4090", verified=False)])
    q = {"gpu_ram": {"gte": 40000}, "verified": {"eq": True}}
    code, body = f.handle("GET", "/bundles/", {"q": json.dumps(q)}, None, f"Bearer {KEY}")
    assert code == 200 and [o["id"] for o in body["offers"]] == [2]
