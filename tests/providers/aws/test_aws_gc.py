"""A controller that dies between the launch and the state write leaks nothing: `sdcloud gc` reaps it.

Everything goes over HTTP to a moto ThreadedMotoServer through the standard AWS_ENDPOINT_URL
setting, from this process and from a child process that launches and is killed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import urllib.request

import boto3
import pytest
from click.testing import CliRunner

from sdcloud.offers.catalog import bundled_rows
from sdcloud.cli import main, root
from sdcloud.offers.optimizer import Offer
from sdcloud.providers import get_provider
from sdcloud.providers.base import TAG_RUN, LaunchSpec
from sdcloud.runs.records.state import StateStore

REGION = "us-east-1"
AMI = "ami-12c6146b"  # one of moto's stock images

pytestmark = pytest.mark.slow



@pytest.fixture
def endpoint(moto_server, monkeypatch):
    urllib.request.urlopen(urllib.request.Request(f"{moto_server}/moto-api/reset", method="POST"), timeout=10).read()
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
                 "AWS_ENDPOINT_URL": moto_server}.items():
        monkeypatch.setenv(k, v)
    return moto_server


def offer(market: str = "spot") -> Offer:
    return Offer(next(r for r in bundled_rows("aws") if r.region == REGION and r.instance_type == "g5.xlarge"), market)


def running_sdcloud_instances() -> dict[str, str]:
    """instance id -> sdcloud:run of every pending/running instance, straight from the server."""
    ec2 = boto3.client("ec2", region_name=REGION)  # AWS_ENDPOINT_URL points it at the moto server
    res = ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": [TAG_RUN]},
                                          {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return {i["InstanceId"]: {t["Key"]: t["Value"] for t in i["Tags"]}[TAG_RUN]
            for r in res["Reservations"] for i in r["Instances"]}


CRASHING_CONTROLLER = textwrap.dedent(f"""
    import os, signal
    from sdcloud.offers.catalog import bundled_rows
    from sdcloud.offers.optimizer import Offer
    from sdcloud.providers import get_provider
    from sdcloud.providers.base import LaunchSpec
    row = next(r for r in bundled_rows("aws") if r.region == "{REGION}" and r.instance_type == "g5.xlarge")
    inst = get_provider("aws", image_id="{AMI}").launch(Offer(row, "spot"), LaunchSpec("run-crashed", 1), "spot", 0.9)
    print(inst.id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # dies before it writes the run to the state store
""")


def test_crash_between_launch_and_state_write_is_reaped_by_gc(endpoint, capsys):
    store = StateStore()
    store.create_run("run-active", "sdxl-lora", {}, 100)
    store.update_run("run-active", state="running")
    store.create_run("run-done", "sdxl-lora", {}, 100)
    store.update_run("run-done", state="succeeded")
    prov = get_provider("aws", image_id=AMI)
    active = prov.launch(offer(), LaunchSpec("run-active", 1), "spot")
    done = prov.launch(offer("on-demand"), LaunchSpec("run-done", 2), "on-demand")

    child = subprocess.run([sys.executable, "-c", CRASHING_CONTROLLER], capture_output=True, text=True, timeout=120)
    assert child.returncode == -9, child.stderr
    crashed = child.stdout.split()[0]
    assert running_sdcloud_instances() == {active.id: "run-active", done.id: "run-done", crashed: "run-crashed"}

    code = main(["gc", "--provider", "aws", "--region", REGION, "--yes", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["found"] == 3 and report["errors"] == []
    assert sorted(report["terminated"]) == sorted([crashed, done.id])
    assert {s["run_id"] for s in report["strays"]} == {"run-crashed", "run-done"}
    assert [k["id"] for k in report["kept"]] == [active.id]
    # Zero leaked: only the instance of the run that is still active is running.
    assert running_sdcloud_instances() == {active.id: "run-active"}
    assert [e["kind"] for e in store.events("run-done")] == ["gc-terminated"]

    # A second pass finds nothing more to do.
    assert main(["gc", "--provider", "aws", "--region", REGION, "--yes", "--json"]) == 0
    assert json.loads(capsys.readouterr()[0])["terminated"] == []


def test_gc_asks_first_and_terminates_nothing_when_told_no(endpoint):
    prov = get_provider("aws", image_id=AMI)
    stray = prov.launch(offer(), LaunchSpec("run-unknown", 1), "spot")
    result = CliRunner().invoke(root, ["gc", "--provider", "aws", "--region", REGION], input="n\n")
    assert result.exit_code == 0, result.output
    assert stray.id in result.output and "terminate 1 stray host(s)?" in result.output
    assert running_sdcloud_instances() == {stray.id: "run-unknown"}
    result = CliRunner().invoke(root, ["gc", "--provider", "aws", "--region", REGION], input="y\n")
    assert result.exit_code == 0, result.output
    assert running_sdcloud_instances() == {}
    # Nothing stray left: one line says so, no empty table.
    result = CliRunner().invoke(root, ["gc", "--provider", "aws", "--region", REGION])
    assert result.exit_code == 0 and result.output.strip() == "aws: no stray hosts", result.output


def test_gc_without_credentials_is_one_line(capsys, monkeypatch):
    assert main(["gc", "--provider", "aws", "--yes"]) == 2
    err = capsys.readouterr()[1]
    assert err.startswith("error: no AWS credentials found") and err.count("\n") == 1
