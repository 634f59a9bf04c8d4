"""`sdcloud catalog refresh --provider aws`: facts from moto's describe_instance_types, spot prices per
zone, and on-demand prices parsed from the real Price List response shape through botocore's Stubber
(moto has no pricing service)."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.stub import Stubber
from moto import mock_aws

from sdcloud.offers.catalog import bundled_rows, load_provider
from sdcloud.cli import main
from sdcloud.providers.aws.session import CLIENT_CONFIG, Retry
from sdcloud.providers.aws.catalog import gpu_model, instance_facts, parse_price_list, refresh, refresh_region

from tests.support import DATA
from tests.support.server_http import LoopbackServer

REGION = "us-east-1"



@pytest.fixture
def moto(aws_env):
    with mock_aws():
        yield


def product(itype: str, usd: str, region: str = REGION, os_: str = "Linux", capacity: str = "Used",
            market: str = "OnDemand") -> str:
    """One PriceList item as get_products returns it: a JSON document in a string. `market` is the
    product's marketoption: OnDemand, or CapacityBlock for Capacity Blocks for ML (reserved ahead,
    priced by supply and demand: never an on-demand price)."""
    sku = f"SKU{abs(hash((itype, region, os_, capacity, market))) % 10**8:08d}"
    return json.dumps({
        "product": {"productFamily": "Compute Instance", "sku": sku, "attributes": {
            "instanceType": itype, "regionCode": region, "location": "US East (N. Virginia)", "operatingSystem": os_,
            "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": capacity, "licenseModel": "No License required",
            "instanceFamily": "GPU instance", "vcpu": "4", "memory": "16 GiB", "gpu": "1", "servicecode": "AmazonEC2",
            "marketoption": market,
            "usagetype": f"USE1-{'CapacityBlock' if market == 'CapacityBlock' else 'BoxUsage'}:{itype}"}},
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {f"{sku}.JRTCKXETXF": {
                "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                    "unit": "Hrs", "endRange": "Inf", "beginRange": "0", "appliesTo": [],
                    "description": f"${usd} per On Demand {os_} {itype} Instance Hour",
                    "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7", "pricePerUnit": {"USD": usd}}},
                "sku": sku, "effectiveDate": "2026-06-01T00:00:00Z", "offerTermCode": "JRTCKXETXF", "termAttributes": {}}},
            "Reserved": {f"{sku}.4NA7Y494T4": {
                "priceDimensions": {f"{sku}.4NA7Y494T4.6YS6EN2CT7": {
                    "unit": "Hrs", "pricePerUnit": {"USD": "0.0100000000"}, "description": "reserved"}},
                "sku": sku, "offerTermCode": "4NA7Y494T4",
                "termAttributes": {"LeaseContractLength": "1yr", "PurchaseOption": "No Upfront"}}}},
        "version": "20260601000000", "publicationDate": "2026-06-01T00:00:00Z"})


def stubbed_pricing(pages: list[list[str]]):
    client = boto3.client("pricing", region_name="us-east-1", config=CLIENT_CONFIG)
    stub = Stubber(client)
    for i, items in enumerate(pages):
        resp = {"FormatVersion": "aws_v1", "PriceList": items}
        if i + 1 < len(pages):
            resp["NextToken"] = f"page-{i + 1}"
        expected = {"ServiceCode": "AmazonEC2", "Filters": [
            {"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in (
                ("regionCode", REGION), ("operatingSystem", "Linux"), ("tenancy", "Shared"), ("preInstalledSw", "NA"),
                ("capacitystatus", "Used"), ("instanceFamily", "GPU instance"), ("marketoption", "OnDemand"))]}
        if i:
            expected["NextToken"] = f"page-{i}"
        stub.add_response("get_products", resp, expected)
    stub.activate()
    return client, stub


def test_gpu_names_map_to_the_ranked_gpus():
    assert gpu_model("T4", 16384) == "T4"
    assert gpu_model("A10G", 22888) == "A10G"
    assert gpu_model("L4", 22888) == "L4"
    assert gpu_model("L40S", 45776) == "L40S"
    assert gpu_model("V100", 16384) == "V100"
    assert gpu_model("V100", 32768) == "V100-32GB"
    assert gpu_model("A100", 40960) == "A100"
    assert gpu_model("A100", 81920) == "A100-80GB"
    assert gpu_model("H100", 81920) == "H100"
    assert gpu_model("Radeon Pro V520", 8192) is None


def test_price_list_parsing_keeps_linux_shared_on_demand_hours():
    items = [product("g5.xlarge", "1.0060000000"), product("g5.xlarge", "2.0", os_="Windows"),
             product("g5.xlarge", "0.9", capacity="UnusedCapacityReservation"),
             product("g4dn.xlarge", "0.5260000000"), product("g6.xlarge", "0.8", region="eu-west-1"),
             product("g5.xlarge", "0.4", market="CapacityBlock"), product("p5.48xlarge", "31.4", market="CapacityBlock")]
    # Capacity Block SKUs never become prices, even when the query's filter lets them through.
    assert parse_price_list(items, REGION) == {"g5.xlarge": 1.006, "g4dn.xlarge": 0.526}
    # botocore may hand the items over decoded (the shape is marked jsonvalue): both work.
    assert parse_price_list([json.loads(items[0])], REGION) == {"g5.xlarge": 1.006}


def test_refresh_finds_gpu_facts_zone_spot_prices_and_stubbed_on_demand_prices(moto):
    ec2 = boto3.client("ec2", region_name=REGION, config=CLIENT_CONFIG)
    pricing, stub = stubbed_pricing([[product("g5.xlarge", "1.0060000000"), product("g4dn.xlarge", "0.5260000000")],
                                     [product("p4d.24xlarge", "32.7726000000")]])
    bundled = {(r.region, r.instance_type): r for r in bundled_rows("aws") if not r.zone}
    rows, errors = refresh_region(REGION, ec2, pricing, Retry(base=0), [], bundled, "2026-07-01")
    stub.assert_no_pending_responses()
    assert errors == []
    region_rows = {r.instance_type: r for r in rows if not r.zone}
    expect = {"g4dn.xlarge": ("T4", 1, 16, 125), "g5.xlarge": ("A10G", 1, 24, 250), "g6.xlarge": ("L4", 1, 24, 250),
              "p4d.24xlarge": ("A100", 8, 40, 8000), "g5.48xlarge": ("A10G", 8, 24, 7600)}
    for itype, (gpu, count, vram, nvme) in expect.items():
        r = region_rows[itype]
        assert (r.gpu, r.gpu_count, r.vram_gb, r.nvme_gb) == (gpu, count, vram, nvme), itype
    assert region_rows["g4dn.xlarge"].vcpus == 4 and region_rows["g4dn.xlarge"].memory_gb == 16
    # On-demand: from the API where it answered, the bundled list price where it did not.
    assert region_rows["g5.xlarge"].ondemand_price == 1.006 and not region_rows["g5.xlarge"].ondemand_estimate
    assert region_rows["p4d.24xlarge"].ondemand_price == 32.7726
    assert region_rows["g6.xlarge"].ondemand_price == bundled[(REGION, "g6.xlarge")].ondemand_price
    assert "bundled" in region_rows["g6.xlarge"].source
    # The bundled interruption band is kept; spot prices come per zone.
    assert region_rows["g5.xlarge"].interruption_band == bundled[(REGION, "g5.xlarge")].interruption_band
    zone_rows = [r for r in rows if r.instance_type == "g5.xlarge" and r.zone]
    assert len(zone_rows) >= 2 and all(r.zone.startswith(REGION) and r.spot_price > 0 for r in zone_rows)
    assert all(r.ondemand_price is None and r.interruption_band == 4 for r in zone_rows)
    assert region_rows["g5.xlarge"].spot_price is None


def test_failing_region_and_pricing_are_named_and_do_not_sink_the_refresh(moto):
    session = boto3.session.Session(region_name=REGION)

    def opt_in_required(params, **kwargs):
        if "eu-west-1" in params.get("url", ""):
            return AWSResponse(params["url"], 401, {}, None), {
                "Error": {"Code": "OptInRequired", "Message": "region not enabled"}, "ResponseMetadata": {}}
        return None

    session.events.register("before-call.ec2.DescribeInstanceTypes", opt_in_required)
    path, rows, errors = refresh([REGION, "eu-west-1"], session=session, retry=Retry(base=0))
    assert any(e.startswith("eu-west-1: ec2 describe_instance_types failed") and "OptInRequired" in e for e in errors)
    # moto has no Price List API: named, and the bundled on-demand prices stay in use.
    assert any(e.startswith(f"{REGION}: pricing get_products failed") and "bundled on-demand" in e for e in errors)
    eu = [r for r in rows if r.region == "eu-west-1"]
    assert eu and set(eu) == {r for r in bundled_rows("aws") if r.region == "eu-west-1"}
    us = {(r.instance_type, r.zone): r for r in rows if r.region == REGION}
    assert us[("g5.xlarge", "")].ondemand_price == 1.006 and any(z for (t, z) in us if t == "g5.xlarge")
    # Regions not asked for stay as they were.
    assert {r.region for r in rows} == {r.region for r in bundled_rows("aws")}
    loaded, source = load_provider("aws")
    assert source.origin == "refreshed" and source.path == str(path) and len(loaded) == len(rows)
    assert json.loads(path.read_text())["errors"] == errors


def test_spot_failure_keeps_the_bundled_spot_price_with_its_basis_and_date(moto):
    ec2 = boto3.client("ec2", region_name=REGION, config=CLIENT_CONFIG)
    ec2.meta.events.register("before-call.ec2.DescribeSpotPriceHistory", lambda params, **kw: (
        AWSResponse(params["url"], 403, {}, None), {"Error": {"Code": "UnauthorizedOperation", "Message": "no"}}))
    bundled = {(r.region, r.instance_type): r for r in bundled_rows("aws") if not r.zone}
    rows, errors = refresh_region(REGION, ec2, None, Retry(base=0), [], bundled, "2026-07-01")
    assert any("describe_spot_price_history failed" in e and "UnauthorizedOperation" in e for e in errors)
    g5 = next(r for r in rows if r.instance_type == "g5.xlarge")
    assert not any(r.zone for r in rows)
    old = bundled[(REGION, "g5.xlarge")]
    assert g5.spot_price == old.spot_price
    # Kept as it was: the bundled median of zone quotes, with the bundled date, not the refresh's.
    assert (g5.spot_basis, g5.spot_date, g5.spot_source) == (old.spot_basis, old.spot_date, old.spot_source) == \
        ("derived", "2025-06-01", old.spot_source)
    assert g5.price_age_days("spot") > g5.price_age_days("on-demand") or g5.ondemand_price is None


def test_cli_refresh_then_show_and_offers_rank_zone_prices(moto, capsys):
    code = main(["catalog", "refresh", "--provider", "aws", "--region", REGION, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert doc["regions"][REGION]["types"] >= 20 and len(doc["regions"][REGION]["zones"]) >= 3
    assert any("pricing get_products failed" in e for e in doc["errors"])
    assert main(["catalog", "show", "--provider", "aws", "--region", REGION, "--json"]) == 0
    shown = json.loads(capsys.readouterr()[0])
    assert shown["sources"][0]["origin"] == "refreshed"
    assert main(["offers", "--tier", "sdxl-lora", "--provider", "aws", "--region", REGION, "--spot", "--json"]) == 0
    ranked = json.loads(capsys.readouterr()[0])
    assert ranked and all(e["zone"].startswith(REGION) for e in ranked)
    # Zone quotes from the API are "quoted", dated by their own timestamp (moto's is a fixed 2006 date), not the refresh's.
    assert all(e["price_basis"] == "quoted" and e["price_date"] and e["price_age_days"] is not None for e in ranked)


def test_cli_refresh_without_credentials_or_with_a_bad_region(capsys):
    assert main(["catalog", "refresh", "--provider", "aws"]) == 2
    assert "no AWS credentials found" in capsys.readouterr()[1]
    assert main(["catalog", "refresh", "--provider", "aws", "--region", "nowhere"]) == 2
    assert "not an AWS region" in capsys.readouterr()[1]


def test_instance_facts_skip_non_nvidia_and_arm():
    items = [
        {"InstanceType": "g4ad.xlarge", "GpuInfo": {"Gpus": [{"Name": "Radeon Pro V520", "Manufacturer": "AMD",
                                                               "Count": 1, "MemoryInfo": {"SizeInMiB": 8192}}]},
         "VCpuInfo": {"DefaultVCpus": 4}, "MemoryInfo": {"SizeInMiB": 16384}},
        {"InstanceType": "g5g.xlarge", "ProcessorInfo": {"SupportedArchitectures": ["arm64"]},
         "GpuInfo": {"Gpus": [{"Name": "T4g", "Manufacturer": "NVIDIA", "Count": 1, "MemoryInfo": {"SizeInMiB": 16384}}]}},
        {"InstanceType": "p3.2xlarge", "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
         "GpuInfo": {"Gpus": [{"Name": "V100", "Manufacturer": "NVIDIA", "Count": 1, "MemoryInfo": {"SizeInMiB": 16384}}]},
         "VCpuInfo": {"DefaultVCpus": 8}, "MemoryInfo": {"SizeInMiB": 62464}},
    ]
    facts = instance_facts(items)
    assert list(facts) == ["p3.2xlarge"]
    assert facts["p3.2xlarge"].nvme_gb == 0 and facts["p3.2xlarge"].memory_gb == 61


# --- `catalog refresh --provider aws --public`: the bulk price list and advisor data, no credentials ---

import http.server

PUBLIC = DATA / "public_prices"


@pytest.fixture
def public_server(tmp_path):
    """The recorded excerpts served over HTTP on loopback, as pricing.us-east-1.amazonaws.com and the advisor bucket would."""
    root = tmp_path / "www"
    (root / "eu-west-1").mkdir(parents=True)
    (root / "eu-west-1" / "index.json").write_text((PUBLIC / "eu-west-1" / "index.json").read_text())
    advisor = json.loads((PUBLIC / "spot-advisor-data.json").read_text())
    advisor["spot_advisor"]["eu-west-1"]["Linux"]["g5.xlarge"]["r"] = 4  # a later file: g5.xlarge moved to >20%
    (root / "spot-advisor-data.json").write_text(json.dumps(advisor))
    hits: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

        def log_message(self, *args):
            hits.append(self.path)

    server = LoopbackServer()
    server.bind(Handler)
    with server:
        yield server.address(), hits


def test_public_refresh_reads_the_price_list_and_advisor_without_credentials(public_server, monkeypatch, capsys):
    base, hits = public_server
    monkeypatch.setenv("SDCLOUD_AWS_PRICE_LIST_URL", base + "/{region}/index.json")
    monkeypatch.setenv("SDCLOUD_SPOT_ADVISOR_URL", base + "/spot-advisor-data.json")
    before = {(r.region, r.instance_type): r for r in bundled_rows("aws")}
    code = main(["catalog", "refresh", "--provider", "aws", "--public", "--region", "eu-west-1", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert doc["regions"]["eu-west-1"]["ondemand_prices"] >= 2
    assert [e for e in doc["errors"] if "not in the price list" in e and "g5.2xlarge" in e]
    assert {"/eu-west-1/index.json", "/spot-advisor-data.json"} <= set(hits)
    rows, source = load_provider("aws")
    assert source.origin == "refreshed"
    after = {(r.region, r.instance_type): r for r in rows}
    g5 = after[("eu-west-1", "g5.xlarge")]
    assert g5.ondemand_price == 1.123 and g5.ondemand_basis == "listed" and g5.ondemand_date == "2026-02-09"
    assert "bulk price list" in g5.ondemand_source and base in g5.ondemand_source
    assert g5.interruption_band == 4 and before[("eu-west-1", "g5.xlarge")].interruption_band == 2
    # Spot stays as it was, with its own (older) date; other regions are untouched.
    assert g5.spot_price == before[("eu-west-1", "g5.xlarge")].spot_price and g5.spot_date == "2025-06-01"
    assert after[("us-east-1", "p5.4xlarge")] == before[("us-east-1", "p5.4xlarge")]
    assert ("eu-west-1", "g6e.xlarge") not in after  # not a row of the catalog: left out
    assert source.oldest is not None and source.oldest.date().isoformat() == "2025-06-01"


def test_public_refresh_failures_are_one_line(public_server, monkeypatch, capsys):
    base, _ = public_server
    monkeypatch.setenv("SDCLOUD_AWS_PRICE_LIST_URL", base + "/missing/{region}.json")
    monkeypatch.setenv("SDCLOUD_SPOT_ADVISOR_URL", base + "/missing.json")
    code = main(["catalog", "refresh", "--provider", "aws", "--public", "--region", "eu-west-1"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and "AWS public price refresh failed" in err
    code = main(["catalog", "refresh", "--provider", "aws", "--public", "--region", "mars-1"])
    out, err = capsys.readouterr()
    assert code == 2 and "mars-1" in err and err.count("\n") == 1
    code = main(["catalog", "refresh", "--provider", "tencent", "--public"])
    out, err = capsys.readouterr()
    assert code == 2 and "--public is for --provider aws" in err
    assert not load_provider("aws")[1].origin == "refreshed"


def test_bulk_price_list_reader_keeps_only_linux_shared_hourly_rows():
    from sdcloud.providers.aws.public_prices import parse_bulk_price_list
    prices, published = parse_bulk_price_list(PUBLIC / "eu-west-1" / "index.json")
    assert published == "2026-02-09"
    # Windows 1.307, dedicated 1.235, SQL Web 1.2 and the 1-year reserved 0.707 are all skipped.
    assert prices == {"g5.xlarge": 1.123, "g4dn.xlarge": 0.587, "g6e.xlarge": 2.047}
    assert parse_bulk_price_list(PUBLIC / "eu-west-1" / "index.json", {"g4dn.xlarge"})[0] == {"g4dn.xlarge": 0.587}
