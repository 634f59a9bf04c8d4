"""Failed boots end attempts, not the run, until N in a row: the controller launches on AWS (moto's
server), each instance boots the real per-run user-data on a bare root (tests/support/harness_bareroot.py) with
IMDSv2 role credentials, and the image has no NVIDIA driver, so the driver phase fails on every host."""

from __future__ import annotations

import base64
import json
import threading
import time

import boto3
import pytest

from tests.support import harness_bareroot
from tests.support.fake_host import AwsMetadataServer
from tests.support.server_seaweed import TEST_KEYS

pytestmark = pytest.mark.slow

AMI = "ami-12c6146b"


class BareRootHosts:
    """Boots every running instance's user-data on its own bare root, once."""

    def __init__(self, ec2, workdir, ca_file, metadata_url):
        self.ec2, self.workdir, self.ca_file, self.metadata_url = ec2, workdir, ca_file, metadata_url
        self.boots: dict[str, harness_bareroot.Boot | None] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _loop(self):
        while not self._stop.is_set():
            try:
                for res in self.ec2.describe_instances(
                        Filters=[{"Name": "instance-state-name", "Values": ["running"]}])["Reservations"]:
                    for inst in res["Instances"]:
                        iid = inst["InstanceId"]
                        if iid in self.boots:
                            continue
                        self.boots[iid] = None
                        ud = self.ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"]
                        text = base64.b64decode(ud).decode()
                        threading.Thread(target=self._boot, args=(iid, text), daemon=True).start()
            except Exception as exc:  # noqa: BLE001 - the fake may be mid-request
                print("bare-root hosts:", exc)
            time.sleep(0.3)

    def _boot(self, iid, text):
        self.boots[iid] = harness_bareroot.boot(self.workdir / iid, text, self.ca_file, self.metadata_url, timeout=120)

    def stop(self):
        self._stop.set()
        self._thread.join(5)
        for b in self.boots.values():
            if b:
                b.kill()


def test_failed_boots_end_attempts_then_the_run(moto_server, seaweed, monkeypatch, tmp_path, capsys):
    key = next(iter(TEST_KEYS))
    env = {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": TEST_KEYS[key], "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": moto_server, "SDCLOUD_STORE_ENDPOINT": seaweed.endpoint,
           "AWS_CA_BUNDLE": str(seaweed.ca_file)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    boto3.client("s3", endpoint_url=seaweed.endpoint).create_bucket(Bucket="boot-failures")
    ec2 = boto3.client("ec2")
    imds = AwsMetadataServer().start()
    imds.attach_role("host-role", key, TEST_KEYS[key])
    hosts = BareRootHosts(ec2, tmp_path / "hosts", seaweed.ca_file, imds.base_url).start()

    from sdcloud.cli import main
    from sdcloud.providers import get_provider
    from sdcloud.runs.driving.controller import Controller, Timing, new_run_id
    from sdcloud.runs.records.state import StateStore

    poll = 0.5
    try:
        state = StateStore()
        run_id = new_run_id()
        spec = {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1", "model": "tiny", "steps": 10,
                "store": "s3://boot-failures/sdcloud", "market": "spot", "max_failed_boots": 2}
        state.create_run(run_id, "sd15-lora", spec, 10)
        provider = get_provider("aws", image_id=AMI, region="us-east-1", regions=["us-east-1"])
        ctl = Controller(state, run_id, provider=provider,
                         timing=Timing(poll_seconds=poll, boot_timeout=240, heartbeat_timeout=120))
        result = ctl.run()
        assert result["state"] == "failed"
        reason = state.get_run(run_id)["reason"]
        assert reason == (f"2 failed boots in a row (last: phase driver); see: sdcloud logs {run_id}; "
                          f"resume with: sdcloud resume {run_id}")
        attempts = state.attempts(run_id)
        assert [a.end_reason for a in attempts] == ["boot-failed:driver", "boot-failed:driver"]
        for a in attempts:
            report = json.loads(ctl.store.get(f"runs/{run_id}/boot/attempt-{a.n}.json"))
            assert report["failed"] == "driver"
            # The failure was reported at report["time"]; the controller ended the attempt within two polls.
            assert a.end - report["time"] < 2 * poll + 1.0, (a.end, report["time"])
        live = [i for r in ec2.describe_instances(
                    Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])["Reservations"]
                for i in r["Instances"]]
        assert live == []
        capsys.readouterr()
        assert main(["status", run_id]) in (0, None)
        assert "boot-failed:driver" in capsys.readouterr().out
        assert main(["logs", run_id]) in (0, None)
        out = capsys.readouterr().out
        assert "no NVIDIA driver on this image" in out and "phase driver failed" in out
    finally:
        hosts.stop()
        imds.stop()
