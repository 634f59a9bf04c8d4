"""The agent's cloud seam (sdcloud_agent/clouds/): every cloud gives the metadata base, the notice
watcher, role credentials and how the machine ends itself, and the boot's S3 client, which travels
alone in the user-data, carries its run's cloud's role-key fetch and nothing else."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import pytest


from sdcloud_agent import clouds, s3lite, selfend, userdata

from tests.support.fake_host import AwsMetadataServer, TencentMetadataServer
from tests.support.server_http import LoopbackServer

# What each cloud module must give (clouds/__init__.py says what each one means).
FOUR_THINGS = {
    "metadata": ("KIND", "METADATA_BASE"),
    "notice watcher": ("watcher",),
    "role credentials": ("ROLE_CREDENTIALS", "boot_role_keys", "role_session"),
    "self-end": ("ENDS_MACHINE", "END_ACTION", "end_machine"),
}


def test_every_cloud_gives_the_four_things():
    assert clouds.kinds() == ["aws", "tencent", "vast", "none"]
    for kind in clouds.kinds():
        cloud = clouds.for_kind(kind)
        assert cloud.KIND == kind
        for thing, names in FOUR_THINGS.items():
            missing = [n for n in names if not hasattr(cloud, n)]
            assert not missing, f"clouds/{kind}.py lacks {thing}: {missing}"
        assert callable(cloud.watcher) and callable(cloud.role_session) and callable(cloud.end_machine)
        assert isinstance(cloud.END_ACTION, str) and isinstance(cloud.ENDS_MACHINE, bool)
        # A cloud with a metadata service fetches role keys from it at boot; one without has none to
        # fetch, unless its keys come in the machine's environment (a Vast.ai container's).
        assert cloud.METADATA_BASE is None or cloud.boot_role_keys is not None
        assert (cloud.boot_role_keys is None) == (cloud.METADATA_BASE is None and kind != "vast")


def test_the_registry_maps_the_config_words():
    assert clouds.for_kind("") is clouds.for_kind(None) is clouds.for_kind("none")
    with pytest.raises(ValueError, match="unknown metadata kind 'gcp': aws, tencent, vast or none"):
        clouds.for_kind("gcp")
    # self_end.provider: only a cloud of its own ends the machine.
    assert [clouds.for_provider(p).END_ACTION for p in ("aws", "tencent", "vast", "ssh", "local", "none", None)] == \
        ["os-shutdown", "terminate-instances", "agent-exit", "agent-exit", "agent-exit", "agent-exit", "agent-exit"]
    assert [selfend.SelfEnd(provider=p).ends_machine for p in ("aws", "tencent", "ssh", "local")] == \
        [True, True, False, False]
    # The store's "credentials" wire value names Tencent's CVM role; anything else names no cloud.
    assert clouds.for_credentials("tencent-cvm-role").KIND == "tencent"
    assert clouds.for_credentials("file:/etc/keys.json") is None and clouds.for_credentials(None) is None
    # The boot signs with the named role, else the metadata kind's, else IMDS (as it always has).
    boot = clouds.boot_cloud
    assert boot({"kind": "tencent"}, {}).KIND == "tencent"
    assert boot({"kind": "aws"}, {"credentials": "tencent-cvm-role"}).KIND == "tencent"
    assert [boot(md, {}).KIND for md in ({"kind": "aws"}, {"kind": "none"}, {}, None)] == ["aws"] * 4


def test_each_clouds_watcher_reads_its_own_metadata_service():
    assert clouds.make_watcher(None) is None and clouds.make_watcher({"kind": "none"}) is None
    for server, kind in ((AwsMetadataServer, "aws"), (TencentMetadataServer, "tencent")):
        srv = server().start()
        try:
            w = clouds.make_watcher({"kind": kind, "base_url": srv.base_url})
            assert w.check() == []
            srv.announce(100)
            assert [n.kind for n in w.check()] == ["terminate"]
        finally:
            srv.stop()
    assert clouds.for_kind("aws").watcher().http.base == clouds.for_kind("aws").METADATA_BASE


class _CamRole(LoopbackServer):
    """The CVM metadata service's role endpoint (the keys Tencent serves to a CAM role)."""

    def __init__(self):
        doc = {"TmpSecretId": "AKIDcvm", "TmpSecretKey": "cvmsecret", "Token": "cvmtoken",
               "ExpiredTime": 4102444800, "Code": "Success"}
        pages = {"/latest/meta-data/cam/security-credentials/": "sdcloud-host",
                 "/latest/meta-data/cam/security-credentials/sdcloud-host": json.dumps(doc)}

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                body = pages.get(self.path)
                self.send_response(200 if body else 404)
                self.end_headers()
                self.wfile.write((body or "").encode())

        self.bind(Handler)
        self.start()
        self.base_url = self.address()


def _shipped_client(config: dict) -> dict:
    """The boot's S3 client as the user-data carries it, loaded alone (no package around it)."""
    source = userdata._compact(userdata.boot_client(config))
    namespace: dict = {"__name__": "s3lite_alone"}
    exec(compile(source, "s3lite.py", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("kind", ["aws", "tencent"])
def test_the_boot_client_alone_signs_with_its_clouds_role(kind, monkeypatch):
    monkeypatch.delenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", raising=False)
    monkeypatch.delenv("SDCLOUD_TENCENT_METADATA_URL", raising=False)
    if kind == "aws":
        srv = AwsMetadataServer().start()
        srv.attach_role("sdcloud-host", "AKIAboot", "bootsecret", "boottoken")
        want = {"key": "AKIAboot", "secret": "bootsecret", "token": "boottoken"}
        store = {"url": "s3://b/p"}
    else:
        srv = _CamRole()
        want = {"key": "AKIDcvm", "secret": "cvmsecret", "token": "cvmtoken"}
        store = {"url": "s3://b-1250000000/p", "credentials": "tencent-cvm-role"}
    try:
        metadata = {"kind": kind, "base_url": srv.base_url}
        config = {"run_id": "r", "store": store, "metadata": metadata}
        alone = _shipped_client(config)
        other = "tencent" if kind == "aws" else "aws"
        # Only its own cloud's fetch travels: no other cloud's metadata address is in the script.
        assert clouds.for_kind(kind).METADATA_BASE in userdata.boot_client(config)
        assert clouds.for_kind(other).METADATA_BASE not in userdata.boot_client(config)
        assert alone["role_credentials"](metadata, store) == want
        # The package's s3lite asks the registry and gets the same keys.
        assert s3lite.role_credentials(metadata, store) == want
    finally:
        srv.stop()


def test_tencents_role_session_refreshes_from_the_cvm_role(monkeypatch):
    srv = _CamRole()
    try:
        monkeypatch.setenv("SDCLOUD_TENCENT_METADATA_URL", srv.base_url)
        creds = clouds.for_credentials("tencent-cvm-role").role_session().get_credentials()
        assert (creds.access_key, creds.secret_key, creds.token) == ("AKIDcvm", "cvmsecret", "cvmtoken")
    finally:
        srv.stop()
    assert clouds.for_kind("aws").role_session() is None and clouds.for_kind("none").role_session() is None


def test_a_vast_containers_boot_client_signs_with_the_keys_in_its_environment(monkeypatch):
    """No role on a stranger's machine: the boot's S3 client, alone as the user-data carries it, reads the
    run-scoped session keys the create request put in the container's environment; none there is said."""
    config = {"run_id": "r", "store": {"url": "s3://b/p"}, "metadata": {"kind": "vast"}}
    source = userdata.boot_client(config)
    assert clouds.for_kind("aws").METADATA_BASE not in source and clouds.for_kind("tencent").METADATA_BASE not in source
    alone = _shipped_client(config)
    keys = {"AWS_ACCESS_KEY_ID": "ASIAvast", "AWS_SECRET_ACCESS_KEY": "vastsecret", "AWS_SESSION_TOKEN": "vasttoken"}
    for k, v in keys.items():
        monkeypatch.setenv(k, v)
    want = {"key": "ASIAvast", "secret": "vastsecret", "token": "vasttoken"}
    assert alone["role_credentials"]({"kind": "vast"}, config["store"]) == want
    assert s3lite.role_credentials({"kind": "vast"}, config["store"]) == want
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    with pytest.raises(RuntimeError, match="AWS_ACCESS_KEY_ID"):
        alone["role_credentials"]({"kind": "vast"}, config["store"])
    assert clouds.make_watcher({"kind": "vast"}) is None  # no notice ever comes
