"""The Tencent Cloud provider against the fake CVM API (tests/support/fake_tencent_api.py) through the real SDK."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest


from sdcloud.offers.catalog import CatalogRow, load_provider
from sdcloud.cli import main
from sdcloud.errors import UserError
from sdcloud.offers.optimizer import Offer
from sdcloud.providers import base, get_provider
from sdcloud.providers.tencent import compute as tencent
from sdcloud.providers.base import LaunchSpec

from tests.support import ROOT, SUPPORT
from tests.support import fake_tencent_api
from tests.support.server_seaweed import free_port
from tests.support.fake_tencent_api import SECRET_ID, SECRET_KEY

REGION = "ap-guangzhou"
INFRA = {"image_id": "img-fake0001", "launch_template_id": "lt-fake0001", "vpc_id": "vpc-fake",
         "subnet_ids": {"ap-guangzhou-3": "subnet-3", "ap-guangzhou-4": "subnet-4", "ap-guangzhou-6": "subnet-6"},
         "security_group_id": "sg-fake", "cam_role_name": "sdcloud-host"}


# What the stack's launch template sets (stacks/tencent: tags_for(cfg, "host"), a CLOUD_BSSD system disk).
STACK_TAGS = {"Name": "sdcloud-dev-host", "sdcloud:managed": "true", "sdcloud:stack": "dev"}
TEMPLATE = {"ImageId": "img-fake0001", "SystemDisk": {"DiskType": "CLOUD_BSSD", "DiskSize": 200},
            "SecurityGroupIds": ["sg-fake"], "CamRoleName": "sdcloud-host",
            "TagSpecification": [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in STACK_TAGS.items()]}],
            "UserData": base64.b64encode(b"#!/bin/sh\necho template\n").decode()}


@pytest.fixture
def fake(monkeypatch, tmp_path):
    # No metadata service, no network.
    monkeypatch.setattr("sdcloud.providers.tencent.session.METADATA_URL", "http://127.0.0.1:9/")
    with fake_tencent_api.serving(monkeypatch, tmp_path) as srv:
        for template_id in ("lt-fake0001", "lt-gz3", "lt-gz4"):
            srv.cvm.add_launch_template(template_id, TEMPLATE)
        yield srv


def provider(**kw) -> tencent.TencentProvider:
    opts = dict(poll_interval=0.03, launch_timeout=10, backoff=0.01, backoff_max=0.05)
    opts.update(kw)
    return tencent.TencentProvider(**opts)


def row(itype="GN7.2XLARGE32", zone="", region=REGION, od=9.55, spot=2.87, currency="CNY") -> CatalogRow:
    return CatalogRow("tencent", region, zone, itype, "T4", 1, 16, 8, 32, 0, od, spot, currency, None,
                      "2026-01-01", False, False, "test")


def spec(run="run-1", attempt=1, **kw) -> LaunchSpec:
    kw.setdefault("user_data", "#!/bin/sh\necho hello\n")
    return LaunchSpec(run_id=run, attempt=attempt, infra=dict(INFRA), **kw)


class Events(list):
    def __call__(self, kind: str, data: dict) -> None:
        self.append((kind, data))

    def kinds(self) -> list[str]:
        return [k for k, _ in self]


def calls(srv, action: str) -> list[dict]:
    return [c for c in srv.cvm.calls if c["action"] == action]


# -- the SDK, credentials, the endpoint ---------------------------------------------------------------

def test_help_and_import_do_not_load_the_sdk():
    code = ("import sys; from sdcloud.cli import main; "
            "import sdcloud.providers.tencent.compute, sdcloud.providers.tencent.storage\n"
            "try: main(['--help'])\nexcept SystemExit: pass\n"
            "bad = [m for m in sys.modules if m.startswith(('tencentcloud', 'boto3'))]\n"
            "assert not bad, bad")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr


def test_wrong_secret_is_refused_by_signature(fake, monkeypatch):
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", "not-the-secret")
    with pytest.raises(base.CredentialsError, match="AuthFailure.SignatureFailure"):
        provider().find_tagged(regions=[REGION])


def test_unknown_secret_id(fake, monkeypatch):
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "AKIDnobody")
    with pytest.raises(base.CredentialsError, match="AuthFailure.SecretIdNotFound"):
        provider().find_tagged(regions=[REGION])


def test_no_credentials_is_one_clear_line(fake, monkeypatch):
    monkeypatch.delenv("TENCENTCLOUD_SECRET_ID")
    monkeypatch.delenv("TENCENTCLOUD_SECRET_KEY")
    with pytest.raises(base.CredentialsError) as err:
        provider().find_tagged(regions=[REGION])
    assert "TENCENTCLOUD_SECRET_ID" in str(err.value) and "\n" not in str(err.value)
    assert main(["gc", "--provider", "tencent", "--region", REGION, "--yes"]) == 2


def test_half_set_credentials(fake, monkeypatch):
    monkeypatch.delenv("TENCENTCLOUD_SECRET_KEY")
    with pytest.raises(base.CredentialsError, match="TENCENTCLOUD_SECRET_KEY is not set"):
        provider().find_tagged(regions=[REGION])


def test_profile_file_credentials(fake, monkeypatch, tmp_path):
    monkeypatch.delenv("TENCENTCLOUD_SECRET_ID")
    monkeypatch.delenv("TENCENTCLOUD_SECRET_KEY")
    creds = tmp_path / "home" / ".tencentcloud" / "credentials"
    creds.parent.mkdir(parents=True)
    creds.write_text(f"[default]\nsecret_id = {SECRET_ID}\nsecret_key = {SECRET_KEY}\n")
    assert provider().find_tagged(regions=[REGION]) == []


def test_cvm_role_credentials(fake, monkeypatch):
    """On a CVM host with a CAM role, temporary keys come from the metadata service."""
    from http.server import BaseHTTPRequestHandler

    from tests.support.server_http import LoopbackServer

    monkeypatch.delenv("TENCENTCLOUD_SECRET_ID")
    monkeypatch.delenv("TENCENTCLOUD_SECRET_KEY")
    fake.cvm.accounts["AKIDtemporary"] = "temporary-key"
    creds = {"Code": "Success", "TmpSecretId": "AKIDtemporary", "TmpSecretKey": "temporary-key",
             "Token": "session-token", "ExpiredTime": int(time.time()) + 3600}

    class Metadata(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = {"/latest/meta-data/cam/security-credentials/": b"sdcloud-host",
                    "/latest/meta-data/cam/security-credentials/sdcloud-host": json.dumps(creds).encode()}.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body or b"")

    metadata = LoopbackServer()
    metadata.bind(Metadata)
    with metadata:
        monkeypatch.setattr("sdcloud.providers.tencent.session.METADATA_URL", f"{metadata.address()}/latest/meta-data/")
        assert provider().find_tagged(regions=[REGION]) == []


@pytest.mark.parametrize("value", ["127.0.0.1:9000", "ftp://host", "http://host/path", "http://"])
def test_bad_endpoint_override(fake, monkeypatch, value):
    monkeypatch.setenv("SDCLOUD_TENCENT_ENDPOINT", value)
    with pytest.raises(UserError, match="SDCLOUD_TENCENT_ENDPOINT"):
        provider().find_tagged(regions=[REGION])


def test_fake_answers_in_the_real_envelope(fake):
    from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException
    req = urllib.request.Request(fake.endpoint + "/", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json", "X-TC-Action": "DescribeZones"})
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"] == "application/json"
        body = json.loads(resp.read())
    assert body["Response"]["Error"]["Code"].startswith("AuthFailure") and body["Response"]["RequestId"]
    # Field names are checked against the SDK's models.
    with pytest.raises(TencentCloudSDKException) as err:
        provider().call(REGION, "RunInstances", {"Placement": {"Zone": "ap-guangzhou-3"}, "MaxPrice": "1"})
    assert err.value.code == "UnknownParameter"


# -- catalog ---------------------------------------------------------------------------------------

def test_refresh_catalog_from_fake(fake):
    fake.cvm.set_sold_out("ap-guangzhou-4", "GN7.2XLARGE32", "SPOTPAID")
    path, rows, errors = tencent.refresh_catalog([REGION, "ap-singapore"])
    assert errors == [] and path.exists()
    by = {(r.zone, r.instance_type): r for r in rows}
    assert {r.gpu for r in rows} == {"T4", "V100-32GB", "A100", "A10"}  # vGPU slice and CPU types left out
    assert not any(t.startswith(("GN7vw", "S5")) for _, t in by)
    t4 = by[("ap-guangzhou-3", "GN7.2XLARGE32")]
    assert (t4.ondemand_price, t4.spot_price, t4.currency, t4.vcpus, t4.memory_gb, t4.vram_gb) == (9.55, 2.87, "CNY", 8, 32, 16)
    assert not t4.spot_estimate and not t4.ondemand_estimate and t4.interruption_band is None
    assert by[("ap-guangzhou-4", "GN7.2XLARGE32")].spot_price is None  # sold out for spot
    assert by[("ap-guangzhou-4", "GN7.2XLARGE32")].ondemand_price == 9.55
    assert by[("ap-guangzhou-3", "GN10Xp.2XLARGE40")].spot_price == 6.45  # arrived as a string
    assert by[("ap-guangzhou-3", "GT4.4XLARGE96")].memory_gb == 96  # arrived as a string
    sg = by[("ap-singapore-1", "GN7.2XLARGE32")]
    # The account's site decides the currency, not the region: a China-site account pays CNY in Singapore too.
    assert sg.currency == "CNY" and sg.ondemand_price == 9.55
    loaded, source = load_provider("tencent")
    assert source.origin == "refreshed" and len(loaded) == len(rows)
    charges = {c["params"]["Filters"][1]["Values"][0] for c in calls(fake, "DescribeZoneInstanceConfigInfos")}
    assert charges == {"POSTPAID_BY_HOUR", "SPOTPAID"}


def test_refreshed_catalog_ranks_in_offers(fake, capsys):
    assert main(["catalog", "refresh", "--provider", "tencent", "--region", REGION, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] > 0
    assert main(["offers", "--tier", "sd15-lora", "--provider", "tencent", "--limit", "0", "--json"]) == 0
    captured = capsys.readouterr()
    ranked = json.loads(captured.out)
    assert "refreshed catalog" in captured.err
    assert ranked and all(e["provider"] == "tencent" and e["zone"].startswith(REGION) for e in ranked)
    costs = [e["est_cost"] for e in ranked]
    assert costs == sorted(costs)
    assert any(e["market"] == "spot" and not e["price_estimate"] for e in ranked)


def test_refresh_reports_a_bad_region_and_keeps_the_rest(fake):
    _, rows, errors = tencent.refresh_catalog([REGION, "ap-nowhere"])
    assert rows and len(errors) == 1 and "InvalidRegion.NotFound" in errors[0]
    with pytest.raises(UserError, match="previous catalog is kept"):
        tencent.refresh_catalog(["ap-nowhere"])


# -- launch ----------------------------------------------------------------------------------------

def test_spot_launch_with_max_price(fake, monkeypatch):
    monkeypatch.setenv("SDCLOUD_CNY_PER_USD", "7.0")
    events = Events()
    inst = provider().launch(Offer(row(zone="ap-guangzhou-4"), "spot"), spec(), "spot", max_price=0.5, events=events)
    assert inst.state == base.RUNNING and inst.market == "spot" and inst.zone == "ap-guangzhou-4"
    assert inst.tags == spec().tags and inst.run_id == "run-1" and not inst.adopted
    assert inst.public_ip and inst.private_ip and inst.price_per_hour == pytest.approx(3.5)
    (call,) = calls(fake, "RunInstances")
    p = call["params"]
    assert p["InstanceChargeType"] == "SPOTPAID"
    assert p["InstanceMarketOptions"] == {"MarketType": "spot",
                                          "SpotOptions": {"MaxPrice": "3.5000", "SpotInstanceType": "one-time"}}
    assert p["ClientToken"].startswith(spec().token) and len(p["ClientToken"]) <= 64
    assert base64.b64decode(p["UserData"]).decode() == spec().user_data
    assert p["LaunchTemplate"] == {"LaunchTemplateId": "lt-fake0001"}
    # The template holds the network, the security group and the role: the request does not repeat them.
    assert not {"VirtualPrivateCloud", "CamRoleName", "SecurityGroupIds", "ImageId"} & set(p)
    (made,) = fake.cvm.live()
    assert made.request["CamRoleName"] == "sdcloud-host" and made.request["SecurityGroupIds"] == ["sg-fake"]
    assert {t["Key"]: t["Value"] for t in p["TagSpecification"][0]["Tags"]} == spec().tags
    assert calls(fake, "InquiryPriceRunInstances") and "quote" in events.kinds() and "launched" in events.kinds()


def test_per_zone_launch_template_from_the_stack(fake):
    infra = {**INFRA, "launch_template_ids": {"ap-guangzhou-3": "lt-gz3", "ap-guangzhou-4": "lt-gz4"}}
    s = LaunchSpec(run_id="run-lt", attempt=1, infra=infra)
    provider().launch(Offer(row(zone="ap-guangzhou-4"), "on-demand"), s, "on-demand")
    assert calls(fake, "RunInstances")[0]["params"]["LaunchTemplate"] == {"LaunchTemplateId": "lt-gz4"}


def test_on_demand_launch(fake):
    inst = provider().launch(Offer(row(zone="ap-guangzhou-3"), "on-demand"), spec(), "on-demand")
    assert inst.market == "on-demand" and inst.state == base.RUNNING and inst.price_per_hour == 9.55
    p = calls(fake, "RunInstances")[0]["params"]
    assert p["InstanceChargeType"] == "POSTPAID_BY_HOUR" and "InstanceMarketOptions" not in p


def test_idempotent_retry_adopts(fake):
    prov = provider()
    offer = Offer(row(), "spot")
    first = prov.launch(offer, spec(), "spot")
    events = Events()
    again = provider().launch(offer, spec(), "spot", events=events)  # a new controller, same run and attempt
    assert again.id == first.id and again.adopted and events.kinds() == ["adopted"]
    assert len(calls(fake, "RunInstances")) == 1
    other = prov.launch(offer, spec(attempt=2), "spot")
    assert other.id != first.id and len(fake.cvm.live()) == 2


def test_crash_between_run_and_wait_is_adopted(fake):
    """RunInstances went through but the controller died before it saw the id: the retry adopts it."""
    prov = provider()
    params = prov._run_params(Offer(row(), "spot"), spec(), "spot", "ap-guangzhou-6", "9.0")
    ids = prov.call(REGION, "RunInstances", params)["InstanceIdSet"]
    # The same ClientToken again gives the same instance, not a second one.
    assert prov.call(REGION, "RunInstances", params)["InstanceIdSet"] == ids
    inst = provider().launch(Offer(row(), "spot"), spec(), "spot")
    assert inst.adopted and inst.id == ids[0] and inst.state == base.RUNNING
    assert len(fake.cvm.live()) == 1


def test_sold_out_fails_over_across_zones(fake):
    fake.cvm.set_sold_out("ap-guangzhou-3", "GN7.2XLARGE32")
    fake.cvm.inject("RunInstances", "ResourcesSoldOut.SpecifiedInstanceType", zone="ap-guangzhou-4")
    events = Events()
    inst = provider().launch(Offer(row(), "spot"), spec(), "spot", events=events)
    assert inst.zone == "ap-guangzhou-6"
    hops = [d for k, d in events if k == "failover"]
    # The zone the catalog says is sold out is tried last, after the in-stock ones.
    assert [h["zone"] for h in hops] == ["ap-guangzhou-4"]
    fake.cvm.set_sold_out("ap-guangzhou-4", "GN7.2XLARGE32")
    fake.cvm.set_sold_out("ap-guangzhou-6", "GN7.2XLARGE32")
    events = Events()
    with pytest.raises(base.CapacityError, match="every zone"):
        provider().launch(Offer(row(), "spot"), spec(attempt=2), "spot", events=events)
    assert [d["code"] for k, d in events if k == "failover"] == ["ResourceInsufficient.SpecifiedInstanceType"] * 3
    assert len(fake.cvm.live()) == 1


def test_offer_with_a_zone_tries_only_that_zone(fake):
    fake.cvm.set_sold_out("ap-guangzhou-3", "GN7.2XLARGE32")
    with pytest.raises(base.CapacityError):
        provider().launch(Offer(row(zone="ap-guangzhou-3"), "spot"), spec(), "spot")
    assert fake.cvm.live() == []


def test_price_too_low(fake):
    events = Events()
    with pytest.raises(base.PriceTooLowError) as err:
        provider().launch(Offer(row(zone="ap-guangzhou-3"), "spot"), spec(), "spot", max_price=0.1, events=events)
    assert err.value.current_price == pytest.approx(2.87)
    assert not calls(fake, "RunInstances")  # the quote already said no
    # The API's own refusal carries the current price in its message.
    fake.cvm.inject("RunInstances", "InvalidParameterValue.InsufficientPrice",
                    "The bid price 1.0 is lower than the current price 3.21.")
    with pytest.raises(base.PriceTooLowError) as err:
        provider().launch(Offer(row(zone="ap-guangzhou-3"), "spot"), spec(), "spot", max_price=1.0)
    assert err.value.current_price == pytest.approx(3.21)
    assert fake.cvm.live() == []


def test_throttling_is_retried_with_backoff(fake):
    fake.cvm.inject("RunInstances", "RequestLimitExceeded", times=2)
    fake.cvm.inject("DescribeInstances", "RequestLimitExceeded.UinLimitExceeded", times=1)
    events = Events()
    inst = provider().launch(Offer(row(), "spot"), spec(), "spot", events=events)
    assert inst.state == base.RUNNING and len(fake.cvm.live()) == 1
    retries = [d for k, d in events if k == "retry"]
    assert [r["action"] for r in retries] == ["DescribeInstances", "RunInstances", "RunInstances"]
    assert all(r["wait_s"] >= 0 for r in retries)


def test_throttling_is_bounded(fake):
    fake.cvm.inject("RunInstances", "RequestLimitExceeded", times=100)
    with pytest.raises(base.ProviderError, match="after 4 tries"):
        provider(max_attempts=4).launch(Offer(row(zone="ap-guangzhou-3"), "spot"), spec(), "spot")
    assert fake.cvm.injections[0].times == 96 and fake.cvm.live() == []


@pytest.mark.parametrize("code", ["LimitExceeded.SpotQuota", "LimitExceeded.UserSpotQuota", "LimitExceeded.InstanceQuota"])
def test_quota_stops_with_a_clear_message(fake, code):
    fake.cvm.inject("RunInstances", code, times=10)
    with pytest.raises(base.QuotaError, match=code) as err:
        provider().launch(Offer(row(), "spot"), spec(), "spot")
    assert isinstance(err.value, UserError) and "\n" not in str(err.value) and "quota" in str(err.value)
    assert fake.cvm.injections[0].times == 9 and fake.cvm.live() == []  # asked once, never again


def test_launch_failed_moves_to_next_zone_and_is_left_alone(fake):
    fake.cvm.fail_launch.add(("ap-guangzhou-3", "GN7.2XLARGE32"))
    events = Events()
    inst = provider().launch(Offer(row(), "spot"), spec(), "spot", events=events)
    assert inst.zone == "ap-guangzhou-4" and "launch-failed" in events.kinds()
    assert [i.id for i in fake.cvm.live()] == [inst.id]
    # A LAUNCH_FAILED instance is not billed and TerminateInstances refuses it: never asked.
    assert calls(fake, "TerminateInstances") == []


def test_terminate_leaves_launch_failed_alone_and_never_mixes_charge_types(fake):
    prov = provider()
    fake.cvm.fail_launch.add(("ap-guangzhou-3", "GN7.2XLARGE32"))
    with pytest.raises(base.CapacityError):
        prov.launch(Offer(row(zone="ap-guangzhou-3"), "spot"), spec("r", 1), "spot")
    (failed,) = [i for i in fake.cvm.instances.values() if i.state == "LAUNCH_FAILED"]
    spot = prov.launch(Offer(row(zone="ap-guangzhou-4"), "spot"), spec("r", 2), "spot")
    ondemand = prov.launch(Offer(row(zone="ap-guangzhou-4"), "on-demand"), spec("r", 3), "on-demand")
    prov.terminate([failed.id, spot.id, ondemand.id], REGION)
    assert fake.cvm.live() == []
    batches = [c["params"]["InstanceIds"] for c in calls(fake, "TerminateInstances")]
    assert failed.id not in sum(batches, [])
    charge = {spot.id: "SPOTPAID", ondemand.id: "POSTPAID_BY_HOUR"}
    assert all(len({charge[i] for i in b}) == 1 for b in batches) and sorted(sum(batches, [])) == sorted(charge)
    prov.terminate([spot.id, ondemand.id])  # again, and without a region: nothing left to do, no error


def test_gc_survives_mixed_leftovers(fake, capsys):
    prov = provider()
    a = prov.launch(Offer(row(zone="ap-guangzhou-3"), "spot"), spec("crashed", 1), "spot")
    b = prov.launch(Offer(row(zone="ap-guangzhou-3"), "on-demand"), spec("crashed", 2), "on-demand")
    c = prov.launch(Offer(row(zone="ap-guangzhou-6"), "spot"), spec("crashed", 3), "spot")
    assert main(["gc", "--provider", "tencent", "--region", REGION, "--yes", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(out["terminated"]) == sorted([a.id, b.id, c.id]) and fake.cvm.live() == []


def test_launch_needs_an_image_or_template(fake):
    with pytest.raises(UserError, match="SDCLOUD_TENCENT_IMAGE_ID"):
        provider().launch(Offer(row(), "spot"), LaunchSpec("run-1", 1), "spot")
    with pytest.raises(UserError, match="user-data"):
        provider().launch(Offer(row(), "spot"), spec(user_data=os.urandom(20000).hex()), "spot")


# -- describe, reclaim, terminate, gc ----------------------------------------------------------------

def test_reclaim_then_describe(fake):
    prov = provider()
    inst = prov.launch(Offer(row(), "spot"), spec(), "spot")
    fake.cvm.reclaim(inst.id)
    assert prov.describe([inst.id], REGION)[0].state == base.TERMINATED
    time.sleep(0.3)  # gone from the API altogether
    (gone,) = prov.describe([inst.id], REGION)
    assert gone.state == base.TERMINATED and not gone.live
    assert prov.find_tagged("run-1", [REGION]) == []


def test_crash_then_gc_leaves_zero_instances(fake, capsys):
    from sdcloud.runs.records.state import StateStore

    prov = provider()
    store = StateStore()
    store.create_run("live-run", "sd15-lora", {}, 100)
    store.update_run("live-run", state="running")
    store.close()
    keep = prov.launch(Offer(row(), "spot"), spec("live-run"), "spot")
    stray = prov.launch(Offer(row(), "spot"), spec("crashed-run"), "spot")
    stray2 = prov.launch(Offer(row(region="ap-shanghai"), "on-demand"), spec("crashed-run", 2), "on-demand")
    del prov  # the controller dies here
    assert {i.id for i in provider().find_tagged(regions=[REGION, "ap-shanghai"])} == {keep.id, stray.id, stray2.id}
    assert main(["gc", "--provider", "tencent", "--region", REGION, "--region", "ap-shanghai", "--yes", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(out["terminated"]) == sorted([stray.id, stray2.id])
    assert [i.id for i in fake.cvm.live()] == [keep.id]
    # The run ends: everything goes, nothing leaks.
    provider().terminate([keep.id])
    assert fake.cvm.live() == []
    assert provider().find_tagged(regions=[REGION, "ap-shanghai"]) == []


def test_terminate_skips_instances_already_gone(fake):
    prov = provider()
    a = prov.launch(Offer(row(), "spot"), spec("r", 1), "spot")
    b = prov.launch(Offer(row(), "spot"), spec("r", 2), "spot")
    fake.cvm.reclaim(a.id)
    time.sleep(0.3)
    prov.terminate([a.id, b.id], REGION)
    assert fake.cvm.live() == []


def test_find_tagged_reports_a_bad_region(fake):
    prov = provider()
    assert prov.find_tagged(regions=["ap-nowhere", REGION]) == []
    assert len(prov.last_errors) == 1 and "ap-nowhere" in prov.last_errors[0]


def test_get_provider_and_price_history(fake):
    prov = get_provider("tencent")
    assert isinstance(prov, tencent.TencentProvider) and isinstance(prov, base.Provider)
    (sample,) = prov.price_history("GN7.2XLARGE32", "ap-guangzhou-3", None, None)
    assert sample[1] == pytest.approx(2.87)


# -- the fake as a subprocess, with its control API ----------------------------------------------------

def test_fake_runs_as_a_subprocess_with_control(monkeypatch, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SUPPORT / "fake_tencent_api.py"), "--port", str(port)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert "fake CVM API" in proc.stdout.readline()
        endpoint = f"http://127.0.0.1:{port}"

        def control(**body) -> dict:
            req = urllib.request.Request(endpoint + "/_control", data=json.dumps(body).encode(), method="POST")
            with urllib.request.urlopen(req) as resp:
                return json.loads(resp.read())

        monkeypatch.setenv("SDCLOUD_TENCENT_ENDPOINT", endpoint)
        monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", SECRET_ID)
        monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", SECRET_KEY)
        control(op="template", template_id="lt-fake0001", fields=TEMPLATE)
        control(op="inject", action="RunInstances", code="ResourceInsufficient.AvailabilityZoneSoldOut", zone="ap-guangzhou-3")
        inst = provider(poll_interval=0.1).launch(Offer(row(), "spot"), spec(), "spot")
        assert inst.zone == "ap-guangzhou-4"
        control(op="reclaim", instance_id=inst.id)
        states = {i["InstanceId"]: i["InstanceState"] for i in control(op="instances")["instances"]}
        assert states == {inst.id: "TERMINATING"}
        assert any(c["action"] == "RunInstances" for c in control(op="calls")["calls"])
    finally:
        proc.terminate()
        proc.wait(5)


# -- the account's currency ----------------------------------------------------------------------------

@pytest.mark.parametrize("site, region, sent", [
    # An international account in a mainland region: its prices (and MaxPrice) are USD.
    ("international", "ap-guangzhou", "0.5000"),
    # A China-site account outside the mainland: CNY, at the documented rate.
    ("china", "ap-singapore", "3.5500"),
])
def test_max_price_is_sent_in_the_accounts_currency(fake, monkeypatch, site, region, sent):
    monkeypatch.setenv("SDCLOUD_CNY_PER_USD", "7.1")
    fake.cvm.site = site
    zone = fake_tencent_api.ZONES[region][0]
    bundled = next(r for r in tencent.bundled_rows("tencent") if r.region == region and r.instance_type == "GN7.2XLARGE32")
    provider().launch(Offer(CatalogRow(**{**bundled.as_dict(), "zone": zone}), "spot"), spec(), "spot", max_price=0.5)
    (call,) = calls(fake, "RunInstances")
    assert call["params"]["InstanceMarketOptions"]["SpotOptions"]["MaxPrice"] == sent


@pytest.mark.parametrize("site, row_currency, od, sent", [
    # A CNY catalog row on an international (USD) account: 9.55 CNY at 7.0 CNY/USD is 1.3643 USD.
    ("international", "CNY", 9.55, "1.3643"),
    # A USD row on a China-site (CNY) account: 1.25 USD is 8.75 CNY.
    ("china", "USD", 1.25, "8.7500"),
    # Same currency both sides: the on-demand price as it is.
    ("china", "CNY", 9.55, "9.5500"),
])
def test_the_default_spot_cap_is_the_rows_on_demand_price_in_the_accounts_currency(
        fake, monkeypatch, site, row_currency, od, sent):
    monkeypatch.setenv("SDCLOUD_CNY_PER_USD", "7.0")
    fake.cvm.site = site
    provider().launch(Offer(row(zone="ap-guangzhou-4", od=od, spot=0.01, currency=row_currency), "spot"), spec(), "spot")
    (call,) = calls(fake, "RunInstances")
    assert call["params"]["InstanceMarketOptions"]["SpotOptions"]["MaxPrice"] == sent


def test_the_site_can_be_set_in_config_and_wins(fake, monkeypatch, sdcloud_home):
    monkeypatch.setenv("SDCLOUD_CNY_PER_USD", "7.1")
    fake.cvm.site = "international"
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text('[tencent]\nsite = "international"\n')
    prov = provider()
    assert prov.account_currency(REGION) == "USD"
    assert not calls(fake, "DescribeZoneInstanceConfigInfos")  # set, not asked
    (sdcloud_home / "config.toml").write_text('[tencent]\nsite = "mars"\n')
    with pytest.raises(UserError, match="china or international"):
        provider().account_currency(REGION)


def test_refreshed_catalog_is_in_the_accounts_currency(fake, monkeypatch):
    monkeypatch.setenv("SDCLOUD_CNY_PER_USD", "7.1")
    fake.cvm.site = "international"
    _, rows, _ = tencent.refresh_catalog([REGION, "ap-singapore"])
    assert {r.currency for r in rows} == {"USD"}
    gz = next(r for r in rows if r.region == REGION and r.instance_type == "GN7.2XLARGE32")
    assert gz.ondemand_price == pytest.approx(9.55 / 7.1, abs=1e-3)
    # Ranking converts with the documented rate: the same host costs the same in USD on both sites.
    from sdcloud.offers.optimizer import Offer as RankedOffer
    fake.cvm.site = "china"
    _, cny_rows, _ = tencent.refresh_catalog([REGION])
    cny = next(r for r in cny_rows if r.instance_type == "GN7.2XLARGE32" and r.zone == gz.zone)
    assert cny.currency == "CNY"
    assert RankedOffer(cny, "on-demand").price_per_hour_usd == pytest.approx(
        RankedOffer(gz, "on-demand").price_per_hour_usd, rel=1e-3)


# -- the launch template -------------------------------------------------------------------------------

def test_the_request_keeps_what_the_template_sets(fake):
    """The per-run request sends what the run needs; the template's disk type and stack tags survive the merge."""
    infra = {**INFRA, "host_tags": STACK_TAGS, "launch_template_ids": {"ap-guangzhou-4": "lt-gz4"},
             "instance_defaults": {"system_disk_gb": 200, "system_disk_type": "CLOUD_BSSD"}}
    s = LaunchSpec(run_id="run-lt", attempt=1, infra=infra, user_data="#!/bin/sh\necho run\n", root_volume_gb=200)
    inst = provider().launch(Offer(row(zone="ap-guangzhou-4"), "spot"), s, "spot")
    (made,) = [i for i in fake.cvm.live() if i.id == inst.id]
    assert made.request["SystemDisk"]["DiskType"] == "CLOUD_BSSD"
    assert made.tags == {**STACK_TAGS, **s.tags}
    assert base64.b64decode(made.user_data).decode() == s.user_data
    sent = calls(fake, "RunInstances")[0]["params"]
    assert "ImageId" not in sent and "SecurityGroupIds" not in sent and "CamRoleName" not in sent


def test_a_bigger_disk_than_the_templates_keeps_its_type(fake):
    infra = {**INFRA, "host_tags": STACK_TAGS, "launch_template_ids": {"ap-guangzhou-4": "lt-gz4"},
             "instance_defaults": {"system_disk_gb": 200, "system_disk_type": "CLOUD_BSSD"}}
    s = LaunchSpec(run_id="run-lt", attempt=1, infra=infra, root_volume_gb=500)
    inst = provider().launch(Offer(row(zone="ap-guangzhou-4"), "on-demand"), s, "on-demand")
    (made,) = [i for i in fake.cvm.live() if i.id == inst.id]
    assert made.request["SystemDisk"] == {"DiskType": "CLOUD_BSSD", "DiskSize": 500}


def test_spotpaid_without_market_options_bids_the_market_price(fake):
    """The real API takes SPOTPAID alone (no cap: it bids the market price); the fake does too."""
    zone = "ap-guangzhou-3"
    resp = fake.cvm.handle("RunInstances", REGION, {"InstanceChargeType": "SPOTPAID", "Placement": {"Zone": zone},
                                                    "InstanceType": "GN7.2XLARGE32", "ImageId": "img-x"})
    (iid,) = resp["InstanceIdSet"]
    assert fake.cvm.instances[iid].charge_type == "SPOTPAID" and fake.cvm.instances[iid].max_price is None
