"""Batch workers on AWS and Tencent boot as training hosts do: the per-run user-data carries the agent
config with its batch section (and the agent wheel is in the job's bucket), the job's store is a
training run's (COS endpoint, virtual addressing and the CVM role on Tencent), and failed boots end
a host, then the job after N in a row."""

from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path

import pytest
from sdcloud_agent.config import check_no_secrets
from sdcloud_agent.store import LocalStore
from sdcloud_agent.userdata import MAX_USER_DATA

from sdcloud.batch import jobs
from sdcloud.batch.controller import BatchController
from sdcloud.errors import UserError
from sdcloud.fleet.lifecycle import Timing
from sdcloud.runs.driving.controller import store_url
from sdcloud.runs.inputs.spec import RunSpec
from sdcloud.runs.records.state import StateStore

from tests.fleet.test_fleet import CloudDouble


class RecordingCloud(CloudDouble):
    """The fleet test's cloud, keeping every LaunchSpec it was given."""

    def __init__(self, name: str = "aws"):
        super().__init__()
        self.name, self.specs = name, []

    def launch(self, offer, spec, market, max_price, events=None):
        self.specs.append(spec)
        return super().launch(offer, spec, market, max_price, events)


def _submit(tmp_path: Path, provider: str, prompts: int = 4, workers: int = 2, **opts) -> tuple[str, LocalStore]:
    p = tmp_path / "p.txt"
    p.write_text("".join(f"prompt {n}\n" for n in range(prompts)))
    bucket = tmp_path / "bucket"
    res = jobs.submit(jobs.SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(p), workers=workers,
                                         provider=provider, store=bucket.as_uri(), generator="fake", **opts))
    return res["job"], LocalStore(bucket)


def agent_config_of(user_data: str) -> dict:
    """The agent config the script writes to /etc/sdcloud/agent.json (its SDCLOUD_CONFIG heredoc)."""
    m = re.search(r"<<'SDCLOUD_CONFIG'\n(.*?)\nSDCLOUD_CONFIG\n", user_data, re.DOTALL)
    assert m, "the user-data writes no agent config"
    return json.loads(m.group(1))


def wheel_key_of(user_data: str) -> str:
    m = re.search(r"^WHEEL_KEY='([^']+)'$", user_data, re.MULTILINE)
    assert m, "the user-data names no agent wheel"
    return m.group(1)


def check_worker_user_data(text: str, job: str, n: int, store: LocalStore) -> dict:
    """The checks of tests/agent/test_agent_host.py's user-data test, for a batch worker's script."""
    assert text.startswith("#!/bin/bash") and "@@" not in text
    assert "pip install" not in text  # nothing installed by a package name
    assert len(text.encode()) < 16 * 1024  # AWS: 16 KB before base64
    assert len(base64.b64encode(text.encode())) <= MAX_USER_DATA  # Tencent: 16 KB after it
    cfg = agent_config_of(text)
    check_no_secrets(cfg)
    assert cfg["run_id"] == job and cfg["attempt"] == n
    assert cfg["batch"]["job"] == jobs.job_prefix(job) and cfg["batch"]["worker_id"] == f"{job}-a{n}"
    assert cfg["batch"]["generator"] == "fake"
    key = wheel_key_of(text)
    assert store.head(key) is not None, f"the agent wheel {key} is not in the job's bucket"
    return cfg


@pytest.mark.parametrize("provider", ["aws", "tencent"])
def test_a_cloud_worker_boots_from_the_per_run_user_data_with_the_batch_config(tmp_path, provider):
    job, store = _submit(tmp_path, provider)
    cloud = RecordingCloud(provider)
    ctl = BatchController(StateStore(), job, provider=cloud, timing=Timing(0.01, 60, 60))
    ctl.step()
    assert [s.attempt for s in cloud.specs] == [1, 2]
    for spec in cloud.specs:
        cfg = check_worker_user_data(spec.user_data, job, spec.attempt, store)
        assert cfg["metadata"] == {"kind": provider} and cfg["store"] == {"url": store.url}
        assert spec.agent_config == cfg
    driver = re.search(r"^DRIVER='([^']*)'$", cloud.specs[0].user_data, re.MULTILINE).group(1)
    assert driver == ("535-server" if provider == "tencent" else "")  # Tencent's images have no driver


def test_local_and_ssh_workers_get_no_user_data(tmp_path):
    job, _store = _submit(tmp_path, "ssh")
    spec = BatchController.launch_spec(_bare(job, "ssh"), 1)
    assert spec.user_data == "" and spec.agent_config["batch"]["job"] == jobs.job_prefix(job)


def _bare(job: str, provider: str) -> BatchController:
    ctl = BatchController.__new__(BatchController)
    state = StateStore()
    ctl.state, ctl.job_id, ctl.spec = state, job, state.get_run(job)["spec"]
    from sdcloud.offers.tiers import get_tier

    ctl.tier, ctl.provider_name, ctl._infra = get_tier(ctl.spec["tier"]), provider, {}
    return ctl


# -- the job's store -------------------------------------------------------------------------

def test_tencent_batch_store_is_cos_with_virtual_addressing_and_the_cvm_role():
    StateStore().save_infra("tencent", "", {"bucket": "sd-1250000000", "region": "ap-singapore"})
    conf = jobs.store_conf("tencent", None)
    assert conf == {"url": "s3://sd-1250000000/sdcloud", "endpoint_url": "https://cos.ap-singapore.myqcloud.com",
                    "region": "ap-singapore", "addressing_style": "virtual", "credentials": "tencent-cvm-role"}
    # The same store a training run on that bucket gets.
    assert conf == store_url(RunSpec(tier="sd15-lora", provider="tencent"), StateStore().infra("tencent", ""))


def test_aws_batch_store_is_the_stack_bucket_and_none_is_one_clear_line():
    with pytest.raises(UserError, match="sdcloud infra up --provider aws"):
        jobs.store_conf("aws", None)
    StateStore().save_infra("aws", "", {"bucket": "sdcloud-runs-1", "region": "us-east-1"})
    assert jobs.store_conf("aws", None) == {"url": "s3://sdcloud-runs-1/sdcloud", "region": "us-east-1"}
    assert jobs.store_conf("aws", "s3://mine/p") == {"url": "s3://mine/p"}  # --store wins


# -- failed boots ----------------------------------------------------------------------------

def _fail_boot(store: LocalStore, job: str, n: int, phase: str = "driver") -> None:
    store.put(f"runs/{job}/boot/attempt-{n}.json",
              json.dumps({"run": job, "attempt": n, "phases": [], "failed": phase}).encode())
    store.put(f"runs/{job}/logs/boot-{n}.log", b"sdcloud bootstrap: phase driver failed (exit 1)\n")


def test_a_failed_boot_ends_that_host_and_three_in_a_row_end_the_job(tmp_path):
    job, store = _submit(tmp_path, "aws", prompts=6, workers=2)
    cloud = RecordingCloud("aws")
    state = StateStore()
    ctl = BatchController(state, job, provider=cloud, timing=Timing(0.01, 60, 60))
    ctl.step()
    store.put(f"runs/{job}/boot/attempt-2.json", json.dumps({"run": job, "attempt": 2, "phases": []}).encode())
    _fail_boot(store, job, 1)
    assert ctl.step() is False
    ends = {a.n: a.end_reason for a in ctl.fleet.attempts()}
    assert ends[1] == "boot-failed:driver" and ends[2] is None and ends[3] is None  # host 1 replaced
    assert state.get_run(job)["state"] == "running"
    boot = [e for e in state.events(job) if e["kind"] == "boot-failed"]
    assert boot[0]["data"]["boot_phase"] == "driver" and "phase driver failed" in boot[0]["data"]["reason"]
    _fail_boot(store, job, 3)
    ctl.step()
    _fail_boot(store, job, 4)
    assert ctl.step() is True, "three failed boots in a row end the job"
    run = state.get_run(job)
    assert run["state"] == "failed" and "3 failed boots in a row" in run["reason"]
    assert cloud.live() == [], "every host stops with the job"


def test_max_failed_boots_sets_the_jobs_limit(tmp_path):
    job, store = _submit(tmp_path, "aws", prompts=4, workers=1, max_failed_boots=1)
    cloud = RecordingCloud("aws")
    state = StateStore()
    ctl = BatchController(state, job, provider=cloud, timing=Timing(0.01, 60, 60))
    ctl.step()
    _fail_boot(store, job, 1)
    assert ctl.step() is True, "with --max-failed-boots 1 the first failed boot ends the job"
    assert "1 failed boots in a row" in state.get_run(job)["reason"]
    with pytest.raises(UserError, match="max-failed-boots"):
        _submit(tmp_path, "aws", max_failed_boots=0)


def test_a_worker_that_never_reports_is_a_boot_timeout(tmp_path):
    job, store = _submit(tmp_path, "aws", prompts=2, workers=1)
    cloud = RecordingCloud("aws")
    ctl = BatchController(StateStore(), job, provider=cloud, timing=Timing(0.01, 0.05, 60))
    ctl.step()
    store.put(f"runs/{job}/boot/attempt-1.json", b"{}")  # host 1 reported; a report is its sign of life
    time.sleep(0.1)
    ctl.step()
    assert [a.end_reason for a in ctl.fleet.attempts()] == [None]
    cloud2 = RecordingCloud("aws")
    (tmp_path / "two").mkdir()
    job2, _ = _submit(tmp_path / "two", "aws", prompts=2, workers=1)
    ctl2 = BatchController(StateStore(), job2, provider=cloud2, timing=Timing(0.01, 0.05, 60))
    ctl2.step()
    time.sleep(0.1)
    ctl2.step()
    assert ctl2.fleet.attempts()[0].end_reason == "boot-timeout"


# -- through the AWS provider, against moto ------------------------------------------------------

def test_a_batch_job_on_the_aws_provider_sends_our_script_with_the_batch_config(tmp_path, aws_env):
    import boto3
    from moto import mock_aws

    from sdcloud.providers import get_provider

    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        ami = ec2.describe_images(ImageIds=["ami-12c6146b"])["Images"][0]["ImageId"]
        aws = get_provider("aws", region="us-east-1", image_id=ami, retry_base=0, retry_cap=0)
        job, store = _submit(tmp_path, "aws", prompts=3, workers=1)
        state = StateStore()
        state.update_run(job, spec=json.dumps({**state.get_run(job)["spec"], "region": "us-east-1"}))
        raw: list[str] = []
        aws.client("ec2", "us-east-1").meta.events.register(
            "before-call.ec2.RunInstances", lambda params, **kw: raw.append(params["body"]["UserData"]))
        ctl = BatchController(state, job, provider=aws, timing=Timing(0.01, 60, 60))
        ctl.step()
        assert len(raw) == 1
        script = base64.b64decode(raw[0]).decode()  # what EC2 is sent, decoded
        check_worker_user_data(script, job, 1, store)
        ctl.fleet.end(ctl.fleet.open_attempts()[0], "done")


def test_submit_on_a_cloud_without_store_takes_the_stack_bucket_as_sdcloud_up_does(monkeypatch):
    from sdcloud.commands.batch import _ensure_bucket

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    StateStore().save_infra("aws", "us-east-1", {"bucket": "sdcloud-runs-2", "region": "us-east-1"})  # the stack's
    _ensure_bucket({"provider": "aws", "store": None})
    assert jobs.store_conf("aws", None)["url"] == "s3://sdcloud-runs-2/sdcloud"
    _ensure_bucket({"provider": "local", "store": None})  # nothing to create for local, SSH or --store
