"""The credential a Vast.ai host gets for the run's store: STS session keys scoped to `runs/<id>/` (and the
shared cache), expiring, handed over in the create request's env only. moto's server answers STS, and
judges S3 by the session's policy (tests/support/authz/authz_moto_iam.py) when the host's store tries another prefix."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import boto3
import pytest

from sdcloud.providers.base import LaunchSpec
from sdcloud.providers.ssh.credentials import scoped_policy
from sdcloud.providers.vast.credentials import credentials_hours, host_env
from tests.support.authz.authz_moto_iam import fresh_boto3_default_session  # noqa: F401  (an autouse fixture)

BUCKET = "vast-runs"


@pytest.fixture
def sts(moto_server, monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "user-long-lived-key", "AWS_SECRET_ACCESS_KEY": "user-long-lived-secret",
                 "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": moto_server}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SDCLOUD_SSH_STORE_ROLE_ARN", raising=False)
    return moto_server


def test_the_host_gets_session_keys_that_expire(sts):
    env = host_env({"url": f"s3://{BUCKET}/team"}, "r-cred", hours=2)
    assert env["AWS_SESSION_TOKEN"] and env["AWS_ACCESS_KEY_ID"] != "user-long-lived-key"
    assert "user-long-lived-secret" not in json.dumps(env)
    expires = datetime.fromisoformat(env["SDCLOUD_STORE_KEYS_EXPIRE"])
    now = datetime.now(timezone.utc)
    assert now < expires <= now + timedelta(hours=2, minutes=5)


def test_a_store_that_needs_no_keys_gets_none(sts):
    assert host_env({"url": "file:///tmp/bucket"}, "r-cred") == {}
    assert host_env({"url": f"s3://{BUCKET}/p", "credentials": "tencent-cvm-role"}, "r-cred") == {}


def test_credentials_hours_is_bounded_by_what_sts_grants(sdcloud_home):
    from sdcloud.errors import UserError

    assert credentials_hours() == 12.0
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text("[vast]\ncredentials_hours = 48\n")
    with pytest.raises(UserError, match="credentials_hours"):
        credentials_hours()


def test_the_keys_go_in_the_create_requests_env_never_the_onstart_script(sts, tmp_path, monkeypatch):
    from sdcloud.offers.optimizer import Offer
    from sdcloud.offers.tiers import get_tier
    from sdcloud.providers import get_provider
    from tests.support.clouds.fake_vast import KEY, FakeVastServer

    with FakeVastServer(tmp_path / "tls") as srv:
        for k, v in {"SDCLOUD_VAST_ENDPOINT": srv.url, "VAST_API_KEY": KEY, "SSL_CERT_FILE": str(srv.ca_file)}.items():
            monkeypatch.setenv(k, v)
        prov = get_provider("vast", backoff=0.0)
        row = next(o.row for o in prov.offers(get_tier("sdxl-lora"), "spot") if o.row.gpu == "RTX4090")
        spec = LaunchSpec("r-cred", 1, user_data="#!/bin/bash\npython -m sdcloud_agent run",
                          agent_config={"store": {"url": f"s3://{BUCKET}/team"}})
        prov.launch(Offer(row, "spot"), spec, "spot")
        body = srv.fake.creates()[-1]
    assert body["env"]["AWS_SESSION_TOKEN"] and "AWS_SESSION_TOKEN" not in body["onstart"]
    assert body["env"]["AWS_SECRET_ACCESS_KEY"] not in body["onstart"]
    sent = json.dumps(srv.fake.log)
    assert "user-long-lived-secret" not in sent and "user-long-lived-key" not in sent  # no long-lived key of the user's


def test_the_hosts_keys_reach_only_the_runs_prefix(moto_server, monkeypatch):
    """The session's policy as S3 judges it: the run's prefix and the cache are open, another run's is refused."""
    from sdcloud_agent.store import open_store
    from tests.support.authz import authz_moto_iam

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with authz_moto_iam.enforced(moto_server, BUCKET) as keys_for:
        owner = keys_for(authz_moto_iam.owner_policy(BUCKET))
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", owner[0])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", owner[1])
        open_store({"url": f"s3://{BUCKET}/team", "endpoint_url": moto_server}).put("runs/r-other/data.bin", b"theirs")
        key, secret = keys_for(json.dumps(scoped_policy(BUCKET, "/team/", "r-mine")))
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        boto3.DEFAULT_SESSION = None  # the host is another process: it never saw the owner's keys
        store = open_store({"url": f"s3://{BUCKET}/team", "endpoint_url": moto_server})
        store.put("runs/r-mine/checkpoints/step-1/x.bin", b"ok")
        store.put("cache/models/a.bin", b"ok")
        assert [o.key for o in store.list("runs/r-mine/")] == ["runs/r-mine/checkpoints/step-1/x.bin"]
        with pytest.raises(Exception) as refused:
            store.put("runs/r-other/checkpoints/step-1/x.bin", b"stolen")
        assert "AccessDenied" in repr(refused.value) or "403" in repr(refused.value)
        with pytest.raises(Exception) as read:
            store.get("runs/r-other/data.bin")  # another run's object: not readable either
        assert "AccessDenied" in repr(read.value) or "403" in repr(read.value)
        assert store.get("runs/r-mine/checkpoints/step-1/x.bin") == b"ok"
