"""`sdcloud up`'s controller end to end on AWS (moto's ThreadedMotoServer over HTTP, through
AWS_ENDPOINT_URL) and on Tencent Cloud (the fake CVM API): the real agent runs behind each
instance (tests/support/harness_host_emulator.py); the test reclaims the first instance; the controller relaunches
in another zone, the agent resumes from the bucket, the run finishes, nothing is left running."""

from __future__ import annotations

import threading

import boto3
import pytest

from tests.support.harness_host_emulator import HostEmulator
from tests.support.server_seaweed import wait_until

pytestmark = pytest.mark.slow

AMI = "ami-12c6146b"  # one of moto's stock images
# Paced so that the reclaim lands mid-run however fast this machine trains the tiny model.
STEPS = 80
PACE = ["--min-step-seconds", "0.3"]


def _drive(run_spec: dict, provider, steps: int):
    from sdcloud.runs.driving.controller import Controller, Timing, new_run_id
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    run_id = new_run_id()
    state.create_run(run_id, run_spec["tier"], run_spec, steps)
    events: list[tuple[str, dict]] = []
    ctl = Controller(state, run_id, provider=provider, emit=lambda k, d: events.append((k, d)),
                     timing=Timing(poll_seconds=0.5, boot_timeout=240, heartbeat_timeout=120))
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(ctl.run()), daemon=True)
    thread.start()
    return ctl, thread, result, events, state




def _write_images(folder, n: int) -> None:
    """A few small real PNG images with captions, as a user's dataset folder would hold."""
    from PIL import Image

    for i in range(n):
        Image.new("RGB", (64, 64), (40 * i, 255 - 40 * i, 128)).save(folder / f"img{i}.png")
        (folder / f"img{i}.txt").write_text(f"a photo of sks, variant {i}")


def _status_step(ctl, attempt: int) -> int:
    st = ctl.host.read_status()
    return st.get("step") or 0 if st and st.get("attempt") == attempt else 0



def test_aws_reclaim_relaunches_in_another_zone_and_finishes(moto_server, monkeypatch, tmp_path):
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": moto_server}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="sdcloud-e2e")
    ec2 = boto3.client("ec2")
    from sdcloud.providers import get_provider

    provider = get_provider("aws", image_id=AMI, region="us-east-1", regions=["us-east-1"])

    def listing():
        for res in ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": ["sdcloud:run"]}])["Reservations"]:
            for inst in res["Instances"]:
                running = inst["State"]["Name"] == "running"
                ud = (ec2.describe_instance_attribute(InstanceId=inst["InstanceId"], Attribute="userData")["UserData"]
                      .get("Value", "") if running else "")
                yield inst["InstanceId"], running, ud

    hosts = HostEmulator(listing, tmp_path / "hosts", env).start()
    photos = tmp_path / "photos"
    photos.mkdir()
    _write_images(photos, 4)
    try:
        spec = {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1", "model": "tiny", "steps": STEPS,
                "dataset": str(photos),
                "checkpoint_every": 5, "store": "s3://sdcloud-e2e/runs-prefix", "market": "spot", "trainer_args": PACE}
        ctl, thread, result, events, state = _drive(spec, provider, STEPS)
        wait_until(lambda: _status_step(ctl, 1) >= 8)
        first = state.attempts(ctl.run_id)[0]
        ec2.terminate_instances(InstanceIds=[first.instance_id])  # the reclaim
        thread.join(600)
        assert not thread.is_alive()
        assert result["state"] == "succeeded", result
        assert result["step"] == STEPS
        attempts = result["attempts"]
        assert len(attempts) == 2 and attempts[0]["end_reason"] == "preempted" and attempts[1]["end_reason"] == "succeeded"
        assert attempts[1]["zone"] != attempts[0]["zone"]
        # The second host resumed from a checkpoint instead of starting over.
        log = (tmp_path / "hosts" / attempts[1]["instance_id"] / "agent.log").read_text()
        assert "resum" in log.lower()
        live = [i for r in ec2.describe_instances(
                    Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])["Reservations"]
                for i in r["Instances"]]
        assert live == []
        assert any(k == "reclaimed" for k, _ in events)
        # The local dataset went to the bucket once; both hosts staged it from there.
        keys = [o["Key"] for o in
                s3.list_objects_v2(Bucket="sdcloud-e2e", Prefix=f"runs-prefix/runs/{ctl.run_id}/dataset/")["Contents"]]
        assert len(keys) == 8
        assert {c["dataset"] for c in hosts.configs.values()} == {f"s3://sdcloud-e2e/runs-prefix/runs/{ctl.run_id}/dataset"}
        assert [k for k, _ in events].count("dataset-uploaded") == 1
        # The ledger priced both attempts; the reclaimed spot one from its zone's own price history.
        from sdcloud.costs.ledger import run_cost

        cost = run_cost(state, state.get_run(ctl.run_id))
        assert [sorted(a["items"]) for a in cost["attempts"]] == [["bucket", "compute", "disk", "requests"]] * 2
        assert cost["attempts"][0]["items"]["compute"]["source"] in ("rule", "price-history")
        assert cost["reclaims"] == 1 and cost["attempts"][1]["overhead"]["after_attempt"] == 1
        assert state.attempt_costs(ctl.run_id)[2]["bucket_bytes"] > 0
    finally:
        hosts.stop()
    assert hosts.alive() == []


def test_tencent_reclaim_relaunches_in_another_zone_and_finishes(monkeypatch, tmp_path, s3_env):
    from tests.support import fake_tencent_api
    from tests.support.fake_tencent_api import SECRET_ID, SECRET_KEY, FakeServer

    from sdcloud.providers import get_provider

    monkeypatch.setattr(fake_tencent_api, "PENDING_S", 0.2)
    monkeypatch.setattr(fake_tencent_api, "TERMINATING_S", 0.3)
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", SECRET_ID)
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", SECRET_KEY)
    monkeypatch.setenv("SDCLOUD_TENCENT_IMAGE_ID", "img-e2e")
    monkeypatch.setattr("sdcloud.providers.tencent.session.METADATA_URL", "http://127.0.0.1:9/")
    boto3.client("s3", endpoint_url=s3_env["endpoint_url"]).create_bucket(Bucket="e2e-ckpt-1250000000")
    with FakeServer() as srv:
        monkeypatch.setenv("SDCLOUD_TENCENT_ENDPOINT", srv.endpoint)
        cvm = srv.cvm if hasattr(srv, "cvm") else srv.fake

        def listing():
            for inst in list(cvm.instances.values()):
                yield inst.id, inst.state == "RUNNING", inst.user_data

        agent_env = {k: s3_env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_CA_BUNDLE")}
        monkeypatch.setenv("SDCLOUD_STORE_ENDPOINT", s3_env["endpoint_url"])
        hosts = HostEmulator(listing, tmp_path / "hosts", agent_env).start()
        try:
            provider = get_provider("tencent", poll_interval=0.2, launch_timeout=30)
            spec = {"tier": "sd15-lora", "provider": "tencent", "region": "ap-guangzhou", "model": "tiny", "steps": STEPS,
                    "checkpoint_every": 5, "store": "s3://e2e-ckpt-1250000000/sdcloud", "market": "spot", "trainer_args": PACE}
            ctl, thread, result, events, state = _drive(spec, provider, STEPS)
            wait_until(lambda: _status_step(ctl, 1) >= 8)
            first = state.attempts(ctl.run_id)[0]
            cvm.reclaim(first.instance_id)
            thread.join(600)
            assert result["state"] == "succeeded", result
            assert result["step"] == STEPS
            attempts = result["attempts"]
            assert [a["end_reason"] for a in attempts] == ["preempted", "succeeded"]
            assert attempts[1]["zone"] != attempts[0]["zone"]
            assert [i for i in cvm.instances.values() if i.state in ("PENDING", "RUNNING")] == []
            # Tencent spot is priced from the samples taken at launch (Tencent keeps no price history).
            from sdcloud.costs.ledger import run_cost

            cost = run_cost(state, state.get_run(ctl.run_id))
            assert cost["attempts"][0]["items"]["compute"]["source"] == "samples"
            assert cost["attempts"][0]["currency"] == "CNY" and cost["currencies"] == ["CNY"]
        finally:
            hosts.stop()
        assert hosts.alive() == []
