"""A provider is its folder: a copy of `providers/aws`, `providers/tencent` or `providers/local`,
registered under a new name with one line and edited in nothing else, works as that provider.

Each copy lies in a temporary folder on `sdcloud.providers.__path__` (the source tree is not touched)
and is registered with `traits.register(name)`. The AWS copy runs against moto, the Tencent copy
against the fake CVM API (tests/support/fake_tencent_api.py): the same fakes the originals' tests use.
"""

from __future__ import annotations

import json
import shutil
import sys
import urllib.request
from pathlib import Path

import boto3
import pytest
from click.testing import CliRunner
from moto import mock_aws

import sdcloud.providers
from sdcloud.cli import main, root
from sdcloud.providers import traits as provider_traits

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
AMI = "ami-12c6146b"  # one of moto's stock images


@pytest.fixture
def copy_of(tmp_path):
    """copy_of("aws", "awscopy"): the folder copied under the new name, importable, and registered."""
    folder = tmp_path / "providers"
    folder.mkdir()
    sdcloud.providers.__path__.append(str(folder))
    made: list[str] = []

    def make(original: str, name: str) -> str:
        shutil.copytree(ROOT / "sdcloud" / "providers" / original, folder / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
        provider_traits.register(name)  # the one line
        made.append(name)
        return name

    yield make
    for name in made:
        provider_traits.unregister(name)
        for mod in [m for m in sys.modules if m == f"sdcloud.providers.{name}" or m.startswith(f"sdcloud.providers.{name}.")]:
            del sys.modules[mod]
    sdcloud.providers.__path__.remove(str(folder))


def test_registering_is_one_line_and_unregistering_leaves_the_shipped_ones(copy_of):
    shipped = provider_traits.names()
    copy_of("aws", "awscopy")
    assert provider_traits.names() == (*shipped, "awscopy")
    t = provider_traits.traits("awscopy")
    assert t.name == "awscopy" and t.catalog is not None and t.function == provider_traits.traits("aws").function
    provider_traits.unregister("awscopy")
    assert provider_traits.names() == shipped
    with pytest.raises(KeyError):
        provider_traits.traits("awscopy")


def test_a_copy_calls_itself_by_its_registered_name(copy_of):
    # The name comes from the registration (the folder), never from a literal a copy would keep.
    copy_of("ssh", "sshcopy")
    assert provider_traits.traits("sshcopy").name == "sshcopy"
    from sdcloud.providers import get_provider

    assert get_provider("sshcopy").name == "sshcopy"


def test_the_copies_are_choices_of_the_cli(copy_of):
    copy_of("aws", "awscopy")
    copy_of("tencent", "tencentcopy")
    copy_of("local", "localcopy")
    runner = CliRunner()
    gc_help = runner.invoke(root, ["gc", "--help"]).output
    assert all(n in gc_help for n in ("awscopy", "tencentcopy", "localcopy")), gc_help
    refresh_help = runner.invoke(root, ["catalog", "refresh", "--help"]).output
    assert "awscopy" in refresh_help and "tencentcopy" in refresh_help and "localcopy" not in refresh_help
    wrong = runner.invoke(root, ["gc", "--provider", "nocopy"])
    assert wrong.exit_code == 2 and "awscopy" in wrong.output


# -- AWS ---------------------------------------------------------------------------------------------

def test_the_aws_copy_lists_offers_from_its_own_bundled_catalog(copy_of, capsys):
    name = copy_of("aws", "awscopy")
    assert main(["offers", "--tier", "sdxl-lora", "--provider", name, "--region", REGION, "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)
    assert ranked and {e["provider"] for e in ranked} == {name}
    assert main(["catalog", "show", "--provider", name, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["sources"][0]["provider"] == name and shown["sources"][0]["origin"] == "bundled"
    # Its refresh hint names it, not the original.
    from sdcloud.offers.catalog import load_catalog, stale_warning

    warning = stale_warning(load_catalog([name]).sources) or ""
    assert f"--provider {name}" in warning and "--provider aws " not in warning


def test_a_copy_brings_its_own_network_facts_to_offers_for_groups(copy_of, tmp_path):
    """The network between hosts is a trait of the folder: a copy registered from outside the tree
    ranks groups on its own interconnect file, not on the assumed 5 Gbps."""
    from sdcloud.offers.groups import DEFAULT_GBPS, link_of
    from sdcloud.providers import loader

    provider_traits.names()  # as the CLI does first (its --provider choices): every provider's traits read
    name = copy_of("aws", "awsnet")
    folder = Path(sdcloud.providers.__path__[-1]) / name
    for itype in ("g5.12xlarge", "p4d.24xlarge"):
        assert link_of(name, itype) == link_of("aws", itype) and link_of(name, itype).gbps != DEFAULT_GBPS
    assert loader.interconnect(name) == loader.interconnect("aws")
    # Its own file, not the original's: a copy that says otherwise is read as it says.
    text = (folder / "interconnect.csv").read_text().replace("g5.12xlarge,40,", "g5.12xlarge,12,")
    (folder / "interconnect.csv").write_text(text)
    provider_traits.unregister(name)
    provider_traits.register(name)
    assert link_of(name, "g5.12xlarge").gbps == 12 and link_of("aws", "g5.12xlarge").gbps == 40
    provider_traits.unregister(name)  # forgotten with its folder: no longer a provider, its network assumed
    assert link_of(name, "g5.12xlarge").gbps == DEFAULT_GBPS
    provider_traits.register(name)


def test_the_aws_copy_refreshes_its_catalog_against_moto(copy_of, aws_env, capsys):
    name = copy_of("aws", "awscopy")
    with mock_aws():
        code = main(["catalog", "refresh", "--provider", name, "--region", REGION, "--json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        doc = json.loads(out)
        assert doc["provider"] == name and doc["regions"][REGION]["types"] >= 20
        assert Path(doc["path"]).name == f"{name}.json"
        assert main(["offers", "--tier", "sdxl-lora", "--provider", name, "--region", REGION, "--spot", "--json"]) == 0
        ranked = json.loads(capsys.readouterr().out)
        assert ranked and all(e["provider"] == name and e["zone"].startswith(REGION) for e in ranked)
    # The original's catalog is untouched by the copy's refresh.
    from sdcloud.offers.catalog import load_provider

    assert load_provider("aws")[1].origin == "bundled"


@pytest.mark.slow
def test_the_aws_copy_gcs_its_strays_against_moto(copy_of, moto_server, monkeypatch, capsys):
    urllib.request.urlopen(urllib.request.Request(f"{moto_server}/moto-api/reset", method="POST"), timeout=10).read()
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
                 "AWS_ENDPOINT_URL": moto_server}.items():
        monkeypatch.setenv(k, v)
    name = copy_of("aws", "awscopy")
    from sdcloud.offers.catalog import bundled_rows
    from sdcloud.offers.optimizer import Offer
    from sdcloud.providers import get_provider
    from sdcloud.providers.base import TAG_RUN, LaunchSpec
    from sdcloud.runs.records.state import StateStore

    store = StateStore()
    store.create_run("run-live", "sdxl-lora", {}, 100)
    store.update_run("run-live", state="running")
    row = next(r for r in bundled_rows(name) if r.region == REGION and r.instance_type == "g5.xlarge")
    prov = get_provider(name, image_id=AMI)
    assert prov.name == name
    live = prov.launch(Offer(row, "spot"), LaunchSpec("run-live", 1), "spot")
    stray = prov.launch(Offer(row, "on-demand"), LaunchSpec("run-gone", 1), "on-demand")
    assert live.provider == name
    code = main(["gc", "--provider", name, "--region", REGION, "--yes", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["provider"] == name and report["terminated"] == [stray.id]
    ec2 = boto3.client("ec2", region_name=REGION)
    running = ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": [TAG_RUN]},
                                              {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    assert [i["InstanceId"] for r in running["Reservations"] for i in r["Instances"]] == [live.id]


# -- Tencent -----------------------------------------------------------------------------------------

@pytest.fixture
def tencent_fake_server(monkeypatch, tmp_path):
    from tests.support.fake_tencent_api import serving

    with serving(monkeypatch, tmp_path) as srv:
        yield srv


def test_the_tencent_copy_lists_offers_refreshes_and_gcs_against_the_fake(copy_of, tencent_fake_server, monkeypatch,
                                                                           capsys):
    name = copy_of("tencent", "tencentcopy")
    # No metadata service, no network (as tests/providers/tencent/test_tencent.py sets for the original).
    monkeypatch.setattr(f"sdcloud.providers.{name}.session.METADATA_URL", "http://127.0.0.1:9/")
    region = "ap-guangzhou"
    assert main(["offers", "--tier", "sd15-lora", "--provider", name, "--limit", "0", "--json"]) == 0
    bundled = json.loads(capsys.readouterr().out)
    assert bundled and {e["provider"] for e in bundled} == {name}

    assert main(["catalog", "refresh", "--provider", name, "--region", region, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["provider"] == name and doc["rows"] > 0
    assert main(["offers", "--tier", "sd15-lora", "--provider", name, "--limit", "0", "--json"]) == 0
    captured = capsys.readouterr()
    ranked = json.loads(captured.out)
    assert "refreshed catalog" in captured.err
    assert ranked and all(e["provider"] == name and e["zone"].startswith(region) for e in ranked)

    from sdcloud.offers.catalog import CatalogRow
    from sdcloud.offers.optimizer import Offer
    from sdcloud.providers import get_provider
    from sdcloud.providers.base import LaunchSpec
    from sdcloud.runs.records.state import StateStore

    store = StateStore()
    store.create_run("live-run", "sd15-lora", {}, 100)
    store.update_run("live-run", state="running")
    store.close()
    infra = {"image_id": "img-fake0001", "vpc_id": "vpc-fake", "security_group_id": "sg-fake",
             "subnet_ids": {"ap-guangzhou-3": "subnet-3", "ap-guangzhou-4": "subnet-4", "ap-guangzhou-6": "subnet-6"},
             "cam_role_name": "sdcloud-host"}
    row = CatalogRow(name, region, "", "GN7.2XLARGE32", "T4", 1, 16, 8, 32, 0, 9.55, 2.87, "CNY", None,
                     "2026-01-01", False, False, "test")
    prov = get_provider(name, poll_interval=0.03, launch_timeout=10, backoff=0.01, backoff_max=0.05)
    assert prov.name == name
    spec = dict(infra=infra, user_data="#!/bin/sh\necho hello\n")
    keep = prov.launch(Offer(row, "spot"), LaunchSpec("live-run", 1, **spec), "spot")
    stray = prov.launch(Offer(row, "spot"), LaunchSpec("crashed-run", 1, **spec), "spot")
    assert keep.provider == name
    assert main(["gc", "--provider", name, "--region", region, "--yes", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["provider"] == name and out["terminated"] == [stray.id]
    assert [i.id for i in tencent_fake_server.cvm.live()] == [keep.id]


# -- local -------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_local_copy_runs_a_job(copy_of, sdcloud_home, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    name = copy_of("local", "localcopy")
    code = main(["up", "--provider", name, "--tier", "sd15-lora", "--model", "tiny", "--steps", "8", "--yes", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    run = json.loads(out)
    assert run["state"] == "succeeded" and run["step"] == 8
    assert main(["status", run["run"], "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert [a["provider"] for a in status["attempts"]] == [name]
    # Its hosts were its own: under its own folder of $SDCLOUD_HOME, none under the original's.
    assert (sdcloud_home / name).is_dir() and not (sdcloud_home / "local").exists()


# -- vast --------------------------------------------------------------------------------------------

def test_the_vast_copy_lists_offers_refreshes_and_gcs_against_the_fake(copy_of, tmp_path, monkeypatch, capsys):
    from tests.support.clouds.fake_vast import KEY, FakeVastServer

    name = copy_of("vast", "vastcopy")
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    assert main(["offers", "--tier", "sdxl-lora", "--provider", name, "--limit", "0", "--json"]) == 0
    bundled = json.loads(capsys.readouterr().out)  # the bundled snapshot: no key needed
    assert bundled and {e["provider"] for e in bundled} == {name} and {"RTX4090", "L40S"} <= {e["gpu"] for e in bundled}

    with FakeVastServer(tmp_path / "tls") as srv:
        for k, v in {"SDCLOUD_VAST_ENDPOINT": srv.url, "VAST_API_KEY": KEY, "SSL_CERT_FILE": str(srv.ca_file)}.items():
            monkeypatch.setenv(k, v)
        assert main(["catalog", "refresh", "--provider", name, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["rows"] > 0
        assert main(["offers", "--tier", "sdxl-lora", "--provider", name, "--limit", "0", "--json"]) == 0
        captured = capsys.readouterr()
        assert "refreshed catalog" in captured.err and {e["provider"] for e in json.loads(captured.out)} == {name}

        from sdcloud.offers.optimizer import Offer
        from sdcloud.offers.tiers import get_tier
        from sdcloud.providers import get_provider
        from sdcloud.providers.base import LaunchSpec
        from sdcloud.runs.records.state import StateStore

        store = StateStore()
        store.create_run("live-run", "sdxl-lora", {}, 100)
        store.update_run("live-run", state="running")
        store.close()
        prov = get_provider(name, backoff=0.0)
        assert prov.name == name
        row = next(o.row for o in prov.offers(get_tier("sdxl-lora"), "spot") if o.row.gpu == "RTX4090")
        keep = prov.launch(Offer(row, "spot"), LaunchSpec("live-run", 1, user_data="echo"), "spot")
        stray = prov.launch(Offer(row, "spot"), LaunchSpec("crashed-run", 1, user_data="echo"), "spot")
        srv.fake.outbid(stray.id, 5.0)  # paused: its disk still bills, so gc ends it too
        assert main(["gc", "--provider", name, "--yes", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["provider"] == name and out["terminated"] == [stray.id]
        assert [str(i) for i in srv.fake.instances] == [keep.id]
