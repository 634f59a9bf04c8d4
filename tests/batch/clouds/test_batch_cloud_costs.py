"""A cloud batch job is costed as a training run is, and a resumed one pays one host per worker slot.

On moto (EC2 through sdcloud's AWS provider), with the agent's own batch Worker making the images
behind each instance (tests/test_batch_cloud_schedule.Hosts):
- a worker host's on-demand list price is recorded when it starts, from the catalog offer it was
  launched from, so `batch status` and `cost report` price the same worker hours on demand
  (issue 39: they said on-demand `unknown`), and both give the same figures for a RUNNING job at
  one pinned instant (sdcloud/clock.py);
- a host a dead driver left running is adopted into its slot before anything is launched, or
  ended first when its slot was already given up (sdcloud/batch/orphans.py).
"""

from __future__ import annotations

import json
import time

import pytest

from sdcloud.batch.controller import BatchController
from sdcloud.cli import main
from sdcloud.fleet.lifecycle import Timing
from sdcloud.runs.records.state import StateStore

from tests.batch.clouds.test_batch_cloud import _submit
from tests.batch.clouds.test_batch_cloud_schedule import Hosts

TIMING = Timing(0.01, 60, 60)


@pytest.fixture
def cloud(aws_env, sdcloud_home):
    import boto3
    from moto import mock_aws

    from sdcloud.providers import get_provider

    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        ami = ec2.describe_images(ImageIds=["ami-12c6146b"])["Images"][0]["ImageId"]
        yield ec2, get_provider("aws", region="us-east-1", image_id=ami, retry_base=0, retry_cap=0)


def _job(tmp_path, prompts: int, workers: int) -> tuple[str, object, StateStore]:
    job, store = _submit(tmp_path, "aws", prompts=prompts, workers=workers)
    state = StateStore()
    state.update_run(job, spec=json.dumps({**state.get_run(job)["spec"], "region": "us-east-1"}))
    return job, store, state


def _instances(ec2, job: str, live_only: bool = True) -> list[dict]:
    out = []
    for res in ec2.describe_instances(Filters=[{"Name": "tag:sdcloud:run", "Values": [job]}])["Reservations"]:
        out += [i for i in res["Instances"] if not live_only or i["State"]["Name"] in ("pending", "running")]
    return out


def _figures(capsys, job: str) -> tuple[dict, dict]:
    capsys.readouterr()
    assert main(["batch", "status", job, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert main(["cost", "report", job, "--format", "json"]) == 0
    (rep,) = json.loads(capsys.readouterr().out)["runs"]
    return st, rep


def test_a_cloud_worker_records_its_on_demand_price_and_a_running_job_reads_alike_everywhere(
        cloud, tmp_path, capsys, monkeypatch):
    from sdcloud import clock, config

    ec2, aws = cloud
    job, store, state = _job(tmp_path, prompts=4, workers=1)
    ctl = BatchController(state, job, provider=aws, timing=TIMING)
    ctl.step()
    (a,) = state.attempts(job)
    row = next(o.row for o in ctl.fleet.candidates if o.row.instance_type == a.instance_type and o.row.zone == a.zone)
    assert row.ondemand_price is not None
    recorded = state.attempt_costs(job)[1]
    assert recorded["ondemand_price"] == row.ondemand_price and recorded["currency"] == row.currency
    assert recorded["quote_price"] == (row.spot_price if a.market == "spot" else row.ondemand_price)

    hosts = Hosts(ec2, job)  # the agent's worker on the host makes some images; the job stays running
    hosts.sync()
    deadline = time.monotonic() + 30
    while not store.list(f"{state.get_run(job)['spec']['prefix']}/done/") and time.monotonic() < deadline:
        time.sleep(0.05)
    hosts.stop()
    assert state.get_run(job)["state"] in ("pending", "running")

    # One instant for both commands: an hour after launch, the host still open.
    at = a.start + 3600.0
    monkeypatch.setattr(clock, "epoch", lambda: at)
    st, rep = _figures(capsys, job)
    assert st["images_done"] == rep["images_done"] >= 1
    for s_key, r_key in (("cost_usd", "total_usd"), ("cost_per_image_usd", "cost_per_image"),
                         ("cost_per_1k_images_usd", "cost_per_1k_images"), ("ondemand_usd", "ondemand_usd"),
                         ("savings_usd", "savings_usd"), ("savings_pct", "savings_pct")):
        assert st[s_key] == rep[r_key] and st[s_key] is not None, (s_key, st[s_key], rep[r_key])
    # The same worker hour on demand: at least the list price for it (disk, bucket and requests on top).
    od_hour = row.ondemand_price * config.usd_per(row.currency)
    assert od_hour <= rep["ondemand_usd"] <= od_hour + 0.05, (od_hour, rep["ondemand_usd"])
    assert rep["savings_usd"] == pytest.approx(rep["ondemand_usd"] - rep["total_usd"], abs=1e-4)
    if a.market == "spot" and row.spot_price is not None and row.spot_price < row.ondemand_price:
        assert rep["savings_usd"] > 0
    assert rep["cost_per_image"] == pytest.approx(rep["total_usd"] / rep["images_done"], rel=1e-3)

    # Later is later for both: the pinned clock is what they read.
    monkeypatch.setattr(clock, "epoch", lambda: at + 3600.0)
    st2, rep2 = _figures(capsys, job)
    assert st2["cost_usd"] == rep2["total_usd"] > st["cost_usd"]
    capsys.readouterr()
    assert main(["batch", "status", job]) == 0
    assert "unknown" not in capsys.readouterr().out
    ctl.fleet.end(ctl.fleet.open_attempts()[0], "done")


def test_a_resumed_job_adopts_the_host_another_driver_launched_instead_of_a_second(cloud, tmp_path):
    """The other driver (the cloud's, or a laptop that died before its rows reached here) launched
    the job's one worker; this machine's rows never saw it. Resumed here, the job keeps that host."""
    from sdcloud.batch import journal

    ec2, aws = cloud
    job, store, laptop = _job(tmp_path, prompts=3, workers=1)
    journal.save(laptop, store, job)
    other = StateStore(tmp_path / "other" / "state.db")
    journal.restore(other, store, job)
    BatchController(other, job, provider=aws, timing=TIMING).step()
    (theirs,) = _instances(ec2, job)
    assert laptop.attempts(job) == []

    ctl = BatchController(laptop, job, provider=aws, timing=TIMING)  # `resume JOB`: a new driver here
    ctl.step()
    assert [i["InstanceId"] for i in _instances(ec2, job, live_only=False)] == [theirs["InstanceId"]], \
        "a second host was launched beside the one at work"
    (a,) = laptop.attempts(job)
    assert a.instance_id == theirs["InstanceId"] and a.end is None and a.n == 1
    assert laptop.attempt_costs(job)[1]["ondemand_price"] is not None  # costed as a launched host is
    kinds = [(e["kind"], e["data"].get("action")) for e in laptop.events(job)]
    assert ("reconcile", "adopted-orphan") in kinds and "launching" not in [k for k, _ in kinds]
    ctl.step()  # the next pass watches it, launches nothing and sweeps nothing
    assert len(_instances(ec2, job, live_only=False)) == 1 and len(_instances(ec2, job)) == 1
    ctl.fleet.end(ctl.fleet.open_attempts()[0], "done")


def test_a_host_whose_end_failed_is_ended_before_its_slot_is_filled_again(cloud, tmp_path, monkeypatch):
    """The driver ended a host (it was lost) but the terminate call failed, and the driver died.
    Resumed, the job ends that host before it launches the slot's next one, never beside it."""
    from sdcloud.providers.base import ProviderError

    ec2, aws = cloud
    job, store, state = _job(tmp_path, prompts=3, workers=1)
    ctl = BatchController(state, job, provider=aws, timing=TIMING)
    ctl.step()
    (first,) = _instances(ec2, job)
    real = aws.terminate

    def refused(ids, region=None):
        raise ProviderError("RequestLimitExceeded")

    monkeypatch.setattr(aws, "terminate", refused)
    ctl.fleet.end(ctl.fleet.open_attempts()[0], "lost")
    monkeypatch.setattr(aws, "terminate", real)
    assert [i["InstanceId"] for i in _instances(ec2, job)] == [first["InstanceId"]]

    BatchController(state, job, provider=aws, timing=TIMING).step()  # the resumed driver
    live = _instances(ec2, job)
    assert len(live) == 1 and live[0]["InstanceId"] != first["InstanceId"]
    order = [(e["kind"], e["data"].get("action"), e["data"].get("attempt")) for e in state.events(job)]
    ended = order.index(("reconcile", "ended-orphan", 1))
    launched = order.index(("launching", None, 2))
    assert ended < launched, order
    ctl.fleet.end(ctl.fleet.open_attempts()[0], "done")


def test_a_finished_cloud_job_keeps_each_workers_images_per_second(cloud, tmp_path):
    """What the worker measured (each image's seconds in its done markers) is kept as an observed
    images/s of its host's GPU, as a training attempt's steps/s is: `offers` for the batch tier reads it."""
    from sdcloud.speeds import records

    ec2, aws = cloud
    job, store, state = _job(tmp_path, prompts=4, workers=1)
    ctl = BatchController(state, job, provider=aws, timing=TIMING)
    ctl.step()
    prefix = state.get_run(job)["spec"]["prefix"]
    hosts = Hosts(ec2, job)
    hosts.sync()
    deadline = time.monotonic() + 60
    while len(store.list(f"{prefix}/done/")) < int(state.get_run(job)["spec"]["items"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    hosts.stop()
    ctl.finish()
    lines = [ln for o in store.list(f"{prefix}/done/") for ln in json.loads(store.get(o.key))["images"]]
    made = [ln for ln in lines if not ln.get("reused")]
    (a,) = state.attempts(job)
    [row] = [r for r in records.rows(state) if r.run_id == job]
    assert row.origin == records.OBSERVED and row.n == a.n and row.tier == state.get_run(job)["tier"]
    assert row.instance_type == a.instance_type and row.zone == a.zone and row.market == a.market
    assert row.rate == pytest.approx(len(made) / sum(ln["seconds"] for ln in made), rel=1e-3)
    assert row.hours == pytest.approx(a.hours, rel=1e-3) and not row.reclaimed
