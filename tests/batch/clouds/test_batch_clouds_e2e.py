"""`batch submit --provider aws,tencent` on moto and the Tencent CVM fake: workers in both clouds at
once, each on its own cloud's store, every image in the home store exactly once; and the same job
without Tencent's keys refused before anything is recorded."""

from __future__ import annotations

import base64
import json
import threading
import time

import pytest
from sdcloud_agent.batch.verify import verify
from sdcloud_agent.store import LocalStore

from sdcloud.batch import jobs
from sdcloud.batch.clouds import ATTEMPTS_APART
from sdcloud.batch.controller import BatchController
from sdcloud.cli import main
from sdcloud.fleet.lifecycle import Timing
from sdcloud.runs.records.state import StateStore
from tests.batch.clouds.test_batch_cloud import agent_config_of
from tests.batch.clouds.test_batch_cloud_schedule import Hosts
from tests.support import fake_tencent_api
from tests.support.fake_batch import FakeGenerator

TIMING = Timing(0.01, 60, 60)


class CvmHosts:
    """The agent's batch Worker behind each running instance of the CVM fake, as Hosts does on moto."""

    def __init__(self, cvm):
        self.cvm, self.workers = cvm, {}

    def sync(self) -> None:
        from sdcloud_agent.batch.worker import Worker
        from sdcloud_agent.store import open_store

        for inst in list(self.cvm.instances.values()):
            running = inst.state == "RUNNING"
            if running and inst.id not in self.workers:
                cfg = agent_config_of(base64.b64decode(inst.user_data).decode())
                b = cfg["batch"]
                w = Worker(open_store(cfg["store"]), b["job"], FakeGenerator(delay=0.05), worker_id=b["worker_id"],
                           ttl=2.0, idle_wait=0.05)
                t = threading.Thread(target=w.run, daemon=True)
                t.start()
                self.workers[inst.id] = (w, t)
            elif not running and inst.id in self.workers:
                self.workers[inst.id][0].stop.set()

    def stop(self) -> None:
        for w, t in self.workers.values():
            w.stop.set()
            t.join(10)


@pytest.fixture
def clouds(aws_env, sdcloud_home, monkeypatch, tmp_path):
    import boto3
    from moto import mock_aws

    from sdcloud.providers import get_provider

    monkeypatch.setattr("sdcloud.providers.tencent.session.METADATA_URL", "http://127.0.0.1:9/")
    monkeypatch.setenv("SDCLOUD_TENCENT_IMAGE_ID", "img-batch")
    # Each cloud's bucket is a folder here (S3 and COS have their own tests): the other cloud's is
    # what its stack would give.
    monkeypatch.setattr("sdcloud.batch.submit.store_conf",
                        lambda provider, store, region=None: {"url": store or (tmp_path / f"{provider}-bucket").as_uri()})
    with mock_aws(), fake_tencent_api.serving(monkeypatch, tmp_path) as srv:
        ec2 = boto3.client("ec2", region_name="us-east-1")
        ami = ec2.describe_images(ImageIds=["ami-12c6146b"])["Images"][0]["ImageId"]
        aws = get_provider("aws", region="us-east-1", image_id=ami, retry_base=0, retry_cap=0)
        tencent = get_provider("tencent", poll_interval=0.03, launch_timeout=10, backoff=0.01, backoff_max=0.05)
        yield ec2, aws, srv.cvm, tencent, tmp_path


def _prompts(tmp_path, n: int):
    p = tmp_path / "p.txt"
    p.write_text("".join(f"a lighthouse, take {i}\n" for i in range(n)))
    return p


@pytest.mark.slow
def test_workers_in_both_clouds_put_every_image_home_once(clouds):
    ec2, aws, cvm, tencent, tmp_path = clouds
    home = tmp_path / "home-bucket"
    res = jobs.submit(jobs.SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(_prompts(tmp_path, 24)), workers=4,
                                         provider="aws", providers=["aws", "tencent"], store=home.as_uri(),
                                         generator="fake"))
    job = res["job"]
    state = StateStore()
    state.update_run(job, spec=json.dumps({**state.get_run(job)["spec"], "region": "us-east-1"}))
    # The job was copied to the other cloud's bucket at submit, where its workers read it.
    other = LocalStore(tmp_path / "tencent-bucket")
    assert other.head(f"batch/{job}/items.jsonl") is not None
    ctl = BatchController(state, job, provider=aws, timing=TIMING, others={"tencent": tencent})
    aws_hosts, cvm_hosts = Hosts(ec2, job), CvmHosts(cvm)
    try:
        deadline = time.monotonic() + 25
        over = False
        while not over and time.monotonic() < deadline:
            over = ctl.step()
            aws_hosts.sync()
            cvm_hosts.sync()
            time.sleep(0.05)
        out = ctl.finish()
    finally:
        aws_hosts.stop()
        cvm_hosts.stop()
    assert over and out["state"] == "succeeded", out
    store = LocalStore(home)
    v = verify(store, f"batch/{job}")
    assert v.ok and v.items_done == 24 and v.images_present == 24 and not v.stray_images, v.as_dict()
    # Workers of both clouds made images that are home now; each cloud's attempts numbered apart.
    attempts = state.attempts(job)
    assert {a.provider for a in attempts} == {"aws", "tencent"}
    assert all((a.n > ATTEMPTS_APART) == (a.provider == "tencent") for a in attempts)
    winners = {m["worker"] for m in (json.loads(store.get(o.key)) for o in store.list(f"batch/{job}/done/"))}
    assert any(int(w.rsplit("-a", 1)[1]) > ATTEMPTS_APART for w in winners), winners
    assert any(int(w.rsplit("-a", 1)[1]) <= ATTEMPTS_APART for w in winners), winners
    # No host is left in either cloud.
    live = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] in ("pending", "running")]
    assert live == [] and [i for i in cvm.instances.values() if i.state in ("PENDING", "RUNNING")] == []


def test_without_the_other_clouds_keys_nothing_is_recorded(clouds, monkeypatch, capsys):
    *_, tmp_path = clouds
    monkeypatch.delenv("TENCENTCLOUD_SECRET_ID")
    monkeypatch.delenv("TENCENTCLOUD_SECRET_KEY")
    import boto3

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="home-bucket")
    code = main(["batch", "submit", "--tier", "batch-sd15", "--model", "tiny", "--prompts", str(_prompts(tmp_path, 3)),
                 "--provider", "aws,tencent", "--store", "s3://home-bucket/sdcloud", "--generator", "fake", "--detach"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "provider tencent (of aws,tencent)" in err, err
    assert StateStore().list_runs() == []  # nothing recorded, nothing written, nothing launched
    assert boto3.client("s3", region_name="us-east-1").list_objects_v2(Bucket="home-bucket").get("KeyCount") == 0
    assert not (tmp_path / "tencent-bucket").exists()


def test_a_schedule_takes_one_provider(clouds, capsys):
    *_, tmp_path = clouds
    code = main(["batch", "schedule", "add", "--cron", "0 2 * * *", "--tier", "batch-sd15", "--model", "tiny",
                 "--prompts", str(_prompts(tmp_path, 3)), "--provider", "aws,tencent"])
    err = capsys.readouterr().err
    assert code == 2 and "a schedule's jobs run in one cloud" in err and err.count("\n") == 1, err
