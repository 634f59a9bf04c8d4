"""COS from a Tencent host: the agent's store signs with the CVM role's temporary keys, fetched from
the metadata service (a local one here) and refreshed, against a real S3 server (SeaweedFS)."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler

import boto3
import pytest
from botocore.config import Config

from sdcloud.runs.driving.controller import store_url
from sdcloud.runs.inputs.spec import RunSpec
from sdcloud_agent.store import open_store

from tests.support.fronts.front_cos import CosLayer
from tests.support.server_seaweed import SeaweedS3
from tests.support.harness_stacks import stack_module
from tests.support.server_http import LoopbackServer


class RoleMetadata(LoopbackServer):
    def __init__(self, expires_in: float):
        self.hits = 0
        self.expires_in = expires_in
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                return None

            def do_GET(self):
                if self.path == "/latest/meta-data/cam/security-credentials/":
                    body = b"sdcloud-host-role"
                elif self.path == "/latest/meta-data/cam/security-credentials/sdcloud-host-role":
                    outer.hits += 1
                    body = json.dumps({"TmpSecretId": f"AKID-tmp-{outer.hits}", "TmpSecretKey": "tmp-secret",
                                       "Token": "tmp-token", "ExpiredTime": int(time.time() + outer.expires_in),
                                       "Code": "Success"}).encode()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.bind(Handler)
        self.start()
        self.url = self.address()


@pytest.fixture(scope="module")
def anonymous_seaweed():
    """Role credentials carry a session token, which SeaweedFS accepts only with no identities configured."""
    server = SeaweedS3(keys=None).start()
    yield server
    server.stop()


def test_cos_store_uses_the_cvm_role_and_refreshes(anonymous_seaweed, monkeypatch):
    """Over HTTPS at COS's own host name (through the COS-behaviour layer), with the host's config."""

    role_policy_document = stack_module("tencent", "host_policy").role_policy_document

    # The role's temporary keys get only what the Tencent stack grants the CVM role.
    policy = role_policy_document("ap-guangzhou", "1250000000", "role-ckpt-1250000000", "sdcloud")
    with CosLayer(anonymous_seaweed, policies={"AKID-tmp-*": policy}) as cos:
        for k, v in cos.env.items():
            monkeypatch.setenv(k, v)
        boto3.client("s3", endpoint_url=cos.endpoint("ap-guangzhou"), region_name="ap-guangzhou",
                     config=Config(s3={"addressing_style": "virtual"}),
                     aws_access_key_id="x", aws_secret_access_key="y").create_bucket(Bucket="role-ckpt-1250000000")
        meta = RoleMetadata(expires_in=60)  # inside botocore's refresh window: every call refreshes
        monkeypatch.setenv("SDCLOUD_TENCENT_METADATA_URL", meta.url)
        spec = RunSpec(tier="sd15-lora", provider="tencent", region="ap-guangzhou")
        conf = store_url(spec, {"bucket": "role-ckpt-1250000000", "prefix": "sdcloud", "region": "ap-guangzhou"})
        store = open_store(conf)
        store.put("runs/r/status.json", b"{}")
        assert store.get("runs/r/status.json") == b"{}"
        store.delete(["runs/r/status.json"])
        assert store.list("runs/") == []
        creds = store.client._request_signer._credentials
        assert creds.method == "tencent-cvm-role" and creds.get_frozen_credentials().token == "tmp-token"
        assert meta.hits >= 2  # fetched, then refreshed as the expiry is near
        assert not cos.refusals()
        assert any(s.actions for s in cos.seen)  # the role's requests were judged, and allowed
        assert {s.host for s in cos.seen} == {"role-ckpt-1250000000.cos.ap-guangzhou.myqcloud.com"}
        meta.httpd.shutdown()


def test_controller_gives_the_host_a_role_backed_cos_store():
    spec = RunSpec(tier="sd15-lora", provider="tencent", region="ap-guangzhou")
    conf = store_url(spec, {"bucket": "role-ckpt-1250000000", "prefix": "sdcloud", "region": "ap-guangzhou",
                            "endpoint": "https://cos.ap-guangzhou.myqcloud.com"})
    assert conf == {"url": "s3://role-ckpt-1250000000/sdcloud", "endpoint_url": "https://cos.ap-guangzhou.myqcloud.com",
                    "region": "ap-guangzhou", "addressing_style": "virtual", "credentials": "tencent-cvm-role"}
    assert not any("secret" in k.lower() for k in conf)
