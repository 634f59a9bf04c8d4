"""A run across clouds end to end: it starts on AWS spot (moto's server), its host is reclaimed, and
then every AWS zone refuses spot; the controller carries the newest complete checkpoint and the
staged dataset to the Tencent store (a copy order of presigned GETs, which the first Tencent host
carries out into its own bucket before its restore, manifest last) and launches on Tencent spot
(the CVM fake); the real agent there resumes from that checkpoint, byte for byte the one the AWS
host wrote, and the run finishes. Its cost report has both clouds' attempts and the move's
egress line. Both stores are buckets on the SeaweedFS fixture; the hosts are real agents
(tests/support/harness_host_emulator.py)."""

from __future__ import annotations

import threading

import boto3
import pytest

from tests.support.harness_host_emulator import HostEmulator
from tests.support.server_seaweed import wait_until

pytestmark = pytest.mark.slow

AMI = "ami-12c6146b"  # one of moto's stock images
STEPS = 20
# The tiny model at 32 px, paced so that the reclaim lands mid-run however fast this machine trains.
PACE = ["--resolution", "32", "--min-step-seconds", "0.3"]


def _photos(folder) -> None:
    from PIL import Image

    folder.mkdir()
    for i in range(3):
        Image.new("RGB", (64, 64), (60 * i, 255 - 60 * i, 128)).save(folder / f"img{i}.png")
        (folder / f"img{i}.txt").write_text(f"a photo of sks, variant {i}")


def test_a_run_reclaimed_on_aws_with_spot_gone_there_finishes_on_tencent(moto_server, s3_env, monkeypatch, tmp_path):
    from tests.support import fake_tencent_api
    from tests.support.fake_tencent_api import SECRET_ID, SECRET_KEY, FakeServer

    from sdcloud.providers import get_provider
    from sdcloud.providers.base import CapacityError
    from sdcloud.runs.driving.controller import Controller, Timing, new_run_id
    from sdcloud.runs.driving.placement import Clouds
    from sdcloud.runs.records.state import StateStore

    for k, v in {"AWS_ENDPOINT_URL": moto_server, "SDCLOUD_STORE_ENDPOINT": s3_env["endpoint_url"],
                 "TENCENTCLOUD_SECRET_ID": SECRET_ID, "TENCENTCLOUD_SECRET_KEY": SECRET_KEY,
                 "SDCLOUD_TENCENT_IMAGE_ID": "img-e2e"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(fake_tencent_api, "PENDING_S", 0.2)
    monkeypatch.setattr(fake_tencent_api, "TERMINATING_S", 0.3)
    monkeypatch.setattr("sdcloud.providers.tencent.session.METADATA_URL", "http://127.0.0.1:9/")
    monkeypatch.setattr("sdcloud.spot.policy.SPOT_REFUSALS", 2)  # spot "gone" after two refusals, not twelve
    s3 = boto3.client("s3", endpoint_url=s3_env["endpoint_url"])
    for bucket in ("across-home", "across-tencent"):
        s3.create_bucket(Bucket=bucket)
    away = {"url": "s3://across-tencent/sdcloud", "endpoint_url": s3_env["endpoint_url"]}
    real_conf = Clouds.store_conf
    # The Tencent stack's bucket, as plain S3 on the fixture (the COS dialect is tested on its own).
    monkeypatch.setattr(Clouds, "store_conf", lambda self, name: away if name == "tencent" else real_conf(self, name))
    ec2 = boto3.client("ec2", endpoint_url=moto_server)
    photos = tmp_path / "photos"
    _photos(photos)
    with FakeServer() as srv:
        monkeypatch.setenv("SDCLOUD_TENCENT_ENDPOINT", srv.endpoint)
        cvm = srv.cvm if hasattr(srv, "cvm") else srv.fake

        def listing():
            for res in ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": ["sdcloud:run"]}])["Reservations"]:
                for inst in res["Instances"]:
                    running = inst["State"]["Name"] == "running"
                    ud = ec2.describe_instance_attribute(InstanceId=inst["InstanceId"], Attribute="userData")[
                        "UserData"].get("Value", "") if running else ""
                    yield inst["InstanceId"], running, ud
            for inst in list(cvm.instances.values()):
                yield inst.id, inst.state == "RUNNING", inst.user_data

        agent_env = {k: s3_env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                                            "AWS_CA_BUNDLE", "AWS_ENDPOINT_URL_S3")}
        hosts = HostEmulator(listing, tmp_path / "hosts", agent_env).start()
        aws = get_provider("aws", image_id=AMI, region="us-east-1", regions=["us-east-1"])
        tencent = get_provider("tencent", poll_interval=0.2, launch_timeout=30)
        try:
            state = StateStore()
            run_id = new_run_id()
            spec = {"tier": "sd15-lora", "provider": "aws", "providers": ["aws", "tencent"], "region": "us-east-1",
                    "model": "tiny", "steps": STEPS, "dataset": str(photos), "checkpoint_every": 4,
                    "store": "s3://across-home/sdcloud", "market": "spot", "trainer_args": PACE}
            state.create_run(run_id, "sd15-lora", spec, STEPS)
            events: list[tuple[str, dict]] = []
            ctl = Controller(state, run_id, provider=aws, emit=lambda k, d: events.append((k, d)),
                             timing=Timing(poll_seconds=0.5, boot_timeout=240, heartbeat_timeout=120),
                             clouds={"tencent": tencent})
            result: dict = {}
            thread = threading.Thread(target=lambda: result.update(ctl.run()), daemon=True)
            thread.start()
            from sdcloud_agent import manifest
            from sdcloud_agent.store import open_store

            home = open_store({"url": "s3://across-home/sdcloud", "endpoint_url": s3_env["endpoint_url"]})
            # A durable checkpoint in the home store, not a status that may lag: then the reclaim.
            wait_until(lambda: manifest.complete_steps(home, f"runs/{run_id}"), timeout=120)

            def refuse(*_a, **_k):
                raise CapacityError("InsufficientInstanceCapacity: no spot capacity in this zone")

            monkeypatch.setattr(aws, "launch", refuse)  # from now on every AWS zone refuses
            first = state.attempts(run_id)[0]
            ec2.terminate_instances(InstanceIds=[first.instance_id])  # the reclaim
            thread.join(300)
            assert not thread.is_alive()
        finally:
            hosts.stop()
    assert result["state"] == "succeeded", result
    attempts = state.attempts(run_id)
    assert attempts[0].provider == "aws" and attempts[0].end_reason == "preempted"
    assert [a.end_reason for a in attempts[1:-1]] == ["launch-failed"] * 2
    assert attempts[-1].provider == "tencent" and attempts[-1].end_reason == "succeeded"
    moved = next(d for k, d in events if k == "cloud-moved")
    assert moved["from"] == "aws" and moved["to"] == "tencent" and moved["egress_usd"] > 0
    # The Tencent host resumed from the checkpoint carried over: at that step its weights, optimizer and
    # random state are byte for byte those of the AWS host, which ran uninterrupted up to it.
    there = open_store(away)
    prefix = f"runs/{run_id}"
    # The first Tencent host carried the order out (it is gone) before its restore, which checks every
    # file's sha256 against the manifest copied byte for byte from the AWS store.
    assert there.head(f"{prefix}/moves/order.json") is None
    assert manifest.newest_complete(there, prefix).step == STEPS
    resumed = next(d for k, d in events if k == "resumed")
    assert resumed["from_step"] == moved["step"] and moved["step"] >= 4
    assert hosts.configs and {c["store"]["url"] for c in hosts.configs.values()} == {
        "s3://across-home/sdcloud", "s3://across-tencent/sdcloud"}
    # The run's journal and lease stayed in the home store.
    assert home.list(f"{prefix}/journal/") and not there.list(f"{prefix}/journal/")
    # The cost report: both clouds' attempts, and the move's egress as its own line.
    from sdcloud.costs.ledger import run_cost

    cost = run_cost(state, state.get_run(run_id))
    assert {a["provider"] for a in cost["attempts"]} == {"aws", "tencent"}
    egress = cost["run_items"]["move egress aws"]
    assert egress["detail"]["bytes"] == moved["bytes"] > 0 and egress["detail"]["per_gb"] == 0.09
    assert "move transfer" in cost["run_items"]
    assert hosts.alive() == []
