"""A host agent's whole run with the keys a host has: an IAM user holding exactly the AWS stack's host
role policy (stacks/aws/aws_host_policy.py), handed to the agent by the instance metadata fake as
role credentials, against moto's S3 server with IAM enforced. The run trains, checkpoints (multipart
and tagged), keeps two checkpoints (deleting older ones), ships its logs and status, is reclaimed
and resumed by a fresh agent: every call it makes must pass under that policy alone, as on AWS.
Each agent process records its calls (tests/support/authz/authz_run.py) and the evaluator judges them too, with
the conditions moto passes over (s3:prefix on listings, the tagging a PUT carries, per-key deletes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# An IAM user's keys left in boto3's default session must not sign the next test's calls.
from tests.support.authz.authz_moto_iam import fresh_boto3_default_session  # noqa: F401  (an autouse fixture)

from tests.support.fake_host import AwsMetadataServer
from tests.e2e.test_agent_e2e import AUTHZ_RUN, FAKE, _steps_in
from tests.support.authz.authz_judge import host_policy, refusals
from tests.support.authz.authz_record import read_log


from tests.support.harness_stacks import stack_module

role_policy_document = stack_module("aws", "aws_host_policy").role_policy_document

BUCKET, PREFIX, REGION = "sdcloud-agent-policy", "sdcloud", "us-east-1"


@pytest.fixture
def host_keys(moto_server):
    """moto's server enforcing IAM (tests/support/authz/authz_moto_iam.py); yields keys_for(policy) -> (key, secret)."""
    from tests.support.authz import authz_moto_iam

    with authz_moto_iam.enforced(moto_server, BUCKET) as keys_for:
        yield keys_for


def _host_env(tmp: Path, imds: AwsMetadataServer) -> dict[str, str]:
    """A host's environment: no keys of its own; boto3 finds the role's on the metadata service."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "LANG": "C.UTF-8",
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.base_url, "AWS_DEFAULT_REGION": REGION,
            "AWS_CONFIG_FILE": str(tmp / "no-config"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "no-credentials"),
            **{k: v for k, v in os.environ.items() if k.endswith("_NUM_THREADS") or k == "PYTHONPATH"}}


def _agent(tmp: Path, attempt: int, store: dict, imds: AwsMetadataServer, steps: int) -> tuple[subprocess.Popen, Path]:
    cfg = {"run_id": "policy", "attempt": attempt, "trainer": "command", "trainer_args": [sys.executable, FAKE],
           "steps": steps, "checkpoint_every": 3, "keep_checkpoints": 2, "store": store,
           "metadata": {"kind": "aws", "base_url": imds.base_url}, "workdir": str(tmp / f"work-{attempt}"),
           "nvme": False, "require_gpu": False, "heartbeat_seconds": 0.5, "poll_seconds": 0.2}
    path = tmp / f"agent-{attempt}.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.Popen([sys.executable, *AUTHZ_RUN, str(tmp / "authz"), "host", "sdcloud_agent", "run",
                             "--config", str(path)],
                            env=_host_env(tmp, imds), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return proc, tmp / f"work-{attempt}" / f"attempt-{attempt}.log"


@pytest.mark.slow
def test_a_reclaimed_and_resumed_run_needs_nothing_but_the_host_roles_policy(host_keys, moto_server, tmp_path,
                                                                            monkeypatch):
    from sdcloud_agent import manifest as mf
    from sdcloud_agent.store import open_store

    key, secret = host_keys(role_policy_document(BUCKET, PREFIX))
    imds = AwsMetadataServer().start()
    imds.attach_role("sdcloud-host", key, secret)
    store_cfg = {"url": f"s3://{BUCKET}/{PREFIX}", "endpoint_url": moto_server, "region": REGION,
                 "engine": "s3transfer"}
    steps = 18
    try:
        # Attempt 1: reclaimed after a few checkpoints.
        proc, log = _agent(tmp_path, 1, store_cfg, imds, steps)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and max(_steps_in(
                log.read_text(errors="replace")) if log.exists() else [0], default=0) < 8:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate(timeout=30)[1].decode()[-3000:]
        imds.announce(120)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 3, f"rc {proc.returncode}:\n{err.decode()[-3000:]}"
        # Attempt 2: a fresh agent resumes from the bucket and finishes.
        imds.reset()
        proc, log2 = _agent(tmp_path, 2, store_cfg, imds, steps)
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"rc {proc.returncode}:\n{err.decode()[-3000:]}"
    finally:
        imds.stop()
    text = log.read_text(errors="replace") + log2.read_text(errors="replace")
    assert "AccessDenied" not in text, text[-3000:]
    calls = read_log(tmp_path / "authz")
    ops = {c.operation for c in calls}
    assert {"PutObject", "GetObject", "HeadObject", "ListObjectsV2", "DeleteObjects"} <= ops, ops
    assert any(c.params.get("Tagging") for c in calls), "the tagged checkpoint uploads are among those judged"
    found = refusals(calls, host_policy(BUCKET, PREFIX))
    assert not found, "\n".join(found)
    # What the run left, read back with the same keys (the host's policy lets it read its prefix).
    for k, v in {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE"):
        monkeypatch.delenv(k, raising=False)
    store = open_store(store_cfg)
    status = json.loads(store.get("runs/policy/status.json"))
    assert status["phase"] == "succeeded" and status["attempt"] == 2, status
    trained = _steps_in(log.read_text(errors="replace")) + _steps_in(log2.read_text(errors="replace"))
    assert sorted(trained) == list(range(1, steps + 1)), trained
    assert mf.newest_complete(store, "runs/policy").step == steps
    assert len(mf.complete_steps(store, "runs/policy")) <= 2  # older checkpoints deleted under the policy
    assert store.head("runs/policy/logs/attempt-1.log") is not None


def test_the_same_run_is_refused_without_put_object(host_keys, moto_server, tmp_path):
    """The check can fail: with s3:PutObject taken out of the policy the agent cannot report and
    fails, naming the store's refusal."""
    doc = json.loads(role_policy_document(BUCKET, PREFIX))
    doc["Statement"][0]["Action"] = [a for a in doc["Statement"][0]["Action"] if a != "s3:PutObject"]
    key, secret = host_keys(json.dumps(doc))
    imds = AwsMetadataServer().start()
    imds.attach_role("sdcloud-host", key, secret)
    store_cfg = {"url": f"s3://{BUCKET}/{PREFIX}", "endpoint_url": moto_server, "region": REGION,
                 "engine": "s3transfer"}
    try:
        proc, log = _agent(tmp_path, 1, store_cfg, imds, 6)
        _, err = proc.communicate(timeout=120)
    finally:
        imds.stop()
    said = err.decode(errors="replace") + (log.read_text(errors="replace") if log.exists() else "")
    assert proc.returncode not in (0, 3), said[-3000:]
    assert "AccessDenied" in said or "refused" in said.lower(), said[-3000:]
