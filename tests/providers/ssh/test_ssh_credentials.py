"""A box of the user's gets short-lived, prefix-scoped store keys from the controller, over SSH, and
fresh ones before they expire; none is ever written to a log, the state store or the agent's config.

Real parts: sshd on 127.0.0.1, the agent shipped to it, moto's server for STS and S3 (the agent on the
host has no AWS keys of its own: its uploads work only with the keys the controller handed over)."""

from __future__ import annotations

import json
import sqlite3
import sys
import threading


import boto3
import pytest


from sdcloud.providers.ssh.credentials import StoreCredentials, scoped_policy

from tests.support.server_sshd import write_hosts

pytestmark = pytest.mark.slow


def test_scoped_policy_names_only_the_run_and_the_cache():
    policy = scoped_policy("bkt", "/team/", "r-1")
    objects = policy["Statement"][0]["Resource"]
    assert objects == ["arn:aws:s3:::bkt/team/runs/r-1/*", "arn:aws:s3:::bkt/team/cache/*"]
    assert policy["Statement"][1]["Condition"]["StringLike"]["s3:prefix"] == ["team/runs/r-1/*", "team/cache/*"]
    assert StoreCredentials.needed({"url": "s3://b/p"})
    assert not StoreCredentials.needed({"url": "file:///tmp/b"})
    assert not StoreCredentials.needed({"url": "s3://b/p", "credentials": "tencent-cvm-role"})


def test_ssh_host_trains_on_renewed_short_lived_keys(sshd, sdcloud_home, tmp_path, moto_server, monkeypatch):  # noqa: F811
    from sdcloud.providers.ssh.provider import SshProvider
    from sdcloud.runs.driving.controller import Controller, Timing, new_run_id
    from sdcloud.runs.records.state import StateStore

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": moto_server, "SDCLOUD_STORE_ENDPOINT": moto_server,
                 # Renewed often enough that the run sees it (STS keys live 15 minutes at the least).
                 "SDCLOUD_SSH_CREDENTIALS_RENEW_SECONDS": "4"}.items():
        monkeypatch.setenv(k, v)
    boto3.client("s3").create_bucket(Bucket="ssh-keys")
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
                                                     "Action": "sts:AssumeRole"}]}
    role = boto3.client("iam").create_role(RoleName="sdcloud-run-store", AssumeRolePolicyDocument=json.dumps(trust))
    monkeypatch.setenv("SDCLOUD_SSH_STORE_ROLE_ARN", role["Role"]["Arn"])  # the run's role: an STS session on it
    workdir = tmp_path / "host-workdir"
    write_hosts(sdcloud_home / "ssh-hosts.toml", [sshd.host_entry("box", workdir, python=sys.executable)])
    provider = SshProvider()
    handed: list[dict] = []
    real_call = provider._call

    def spy(h, payload, timeout=120.0):  # what crossed SSH, to look for it everywhere else afterwards
        if payload.get("credentials"):
            handed.append(dict(payload["credentials"]))
        return real_call(h, payload, timeout)

    provider._call = spy
    state = StateStore()
    run_id = new_run_id()
    spec = {"tier": "sd15-lora", "provider": "ssh", "model": "tiny", "steps": 24, "checkpoint_every": 6,
            "store": "s3://ssh-keys/team", "market": "on-demand", "trainer_args": ["--min-step-seconds", "0.5"]}
    state.create_run(run_id, "sd15-lora", spec, 24)
    events: list[tuple[str, dict]] = []
    ctl = Controller(state, run_id, provider=provider, emit=lambda k, d: events.append((k, d)),
                     timing=Timing(poll_seconds=0.5, boot_timeout=300, heartbeat_timeout=120))
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(ctl.run()), daemon=True)
    thread.start()
    try:
        thread.join(600)
    finally:
        live = provider.find_tagged()
        if live:
            provider.terminate([i.id for i in live])
        provider.close()
    assert not thread.is_alive()
    assert result["state"] == "succeeded", (result, [e for e in events if e[0] in ("run-failed", "host-lost")])
    # The checkpoints reached the bucket, signed with the handed-over keys (the host has none of its own).
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="ssh-keys", Prefix=f"team/runs/{run_id}/")["Contents"]]
    assert any("/checkpoints/" in k for k in keys) and any("/artifacts/" in k for k in keys)
    # Short-lived keys: a session token each time, and fresh keys before the first ones expired.
    assert handed and all(c["SessionToken"] for c in handed)
    assert len({c["AccessKeyId"] for c in handed}) >= 2, "the keys were never renewed"
    assert any(k == "store-credentials-renewed" for k, _ in events)
    # No secret anywhere it could leak: the agent's config and log on the host, the run's events and
    # the whole state store, the shipped log in the bucket. The keys file is gone with the attempt.
    secrets = {c["SecretAccessKey"] for c in handed} | {c["SessionToken"] for c in handed}
    texts = []
    for token_dir in (p for p in workdir.iterdir() if p.is_dir()):
        cfg = json.loads((token_dir / "cfg.json").read_text())
        assert cfg["store"]["credentials"].startswith("file:")
        texts += [(token_dir / "cfg.json").read_text(), (token_dir / "agent.log").read_text(errors="replace")]
        texts += [p.read_text(errors="replace") for p in token_dir.rglob("*.log")]
        assert not (token_dir / "store-credentials.json").exists()
    db = sqlite3.connect(state.path)
    texts += [json.dumps(row) for table in ("runs", "attempts", "events") for row in db.execute(f"SELECT * FROM {table}")]
    s3 = boto3.client("s3")
    texts += [s3.get_object(Bucket="ssh-keys", Key=k)["Body"].read().decode(errors="replace") for k in keys if k.endswith(".log")]
    texts.append(json.dumps(events, default=str))
    leaked = [s for s in secrets if any(s in t for t in texts)]
    assert not leaked, "a store secret was written where it must never be"
