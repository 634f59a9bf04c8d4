"""THE bare-root boot test: the user-data the controller sends to a cloud host, run as is on a bare
root (a prefixed tree, system python only, systemctl shimmed), against SeaweedFS over HTTPS with
IMDSv2 role credentials from a metadata fake. The agent wheel comes from the bucket; the first boot
of a new bucket installs the pinned environment (torch and the lock) from a local package mirror in
a network that refuses every outside name, fetches the tiny model from a hub mirror, and caches
both in the bucket; the second boot, a fresh root, restores both. The boots that fail on purpose
(an old image python, a missing driver) run against moto's S3 server enforcing IAM, their hosts
signing with keys that hold nothing but the AWS stack's host role policy."""

from __future__ import annotations

import json
import os

import pytest

# An IAM user's keys left in boto3's default session must not sign the next test's calls.
from tests.support.authz.authz_moto_iam import fresh_boto3_default_session  # noqa: F401  (an autouse fixture)

from tests.support import harness_bareroot
from tests.support.fake_host import AwsMetadataServer
from tests.support.server_seaweed import TEST_KEYS
from tests.support.harness_stacks import stack_module

pytestmark = pytest.mark.slow


def _config(endpoint, imds, bucket, run_id, attempt, root, **extra):
    return {"run_id": run_id, "attempt": attempt, "trainer": "builtin", "model": "tiny", "steps": extra.pop("steps", 6),
            "checkpoint_every": 3, "store": {"url": f"s3://{bucket}/sdcloud", "endpoint_url": endpoint,
                                             "region": "us-east-1"},
            "metadata": {"kind": "aws", "base_url": imds.base_url}, "require_gpu": False, "nvme": False,
            "workdir": str(root / "var/lib/sdcloud/work"), "heartbeat_seconds": 1, "poll_seconds": 0.5, **extra}


# The hosts of the boots below sign with an IAM user's keys that hold exactly the AWS stack's host
# role policy, against moto's S3 server enforcing IAM (tests/support/authz/authz_moto_iam.py); the test itself (the
# controller's side: the agent wheel, reading the reports) signs as the bucket's owner.
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # moto speaks plain http: no certificate is read


@pytest.fixture
def host_policy_bucket(moto_server, monkeypatch):
    """(endpoint, store, host key, host secret) for the bucket `bare-root-policy`."""

    from tests.support.authz import authz_moto_iam
    from sdcloud_agent.store import open_store

    role_policy_document = stack_module("aws", "aws_host_policy").role_policy_document

    bucket = "bare-root-policy"
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    with authz_moto_iam.enforced(moto_server, bucket) as keys_for:
        owner = keys_for(authz_moto_iam.owner_policy(bucket))
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", owner[0])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", owner[1])
        monkeypatch.setenv("AWS_DEFAULT_REGION", authz_moto_iam.REGION)
        store = open_store({"url": f"s3://{bucket}/sdcloud", "endpoint_url": moto_server, "region": authz_moto_iam.REGION,
                            "engine": "s3transfer"})
        yield (moto_server, store, *keys_for(role_policy_document(bucket, "sdcloud")))


def _wait_status(store, run_id, attempt, phases, timeout):
    import time

    deadline = time.time() + timeout
    doc = None
    while time.time() < deadline:
        try:
            doc = json.loads(store.get(f"runs/{run_id}/status.json"))
            if doc.get("attempt") == attempt and doc.get("phase") in phases:
                return doc
        except Exception:  # noqa: BLE001 - not written yet
            pass
        time.sleep(0.5)
    raise AssertionError(f"no status in {phases} after {timeout}s: {doc}")


@pytest.mark.timeout(1500)  # about 4 minutes on an idle 2-core machine; a pip install of torch and the lock
def test_a_mainland_host_boots_from_the_mirrors_and_the_bucket_alone_then_restores(tmp_path, seaweed, s3_env, capsys,
                                                                                   lock_wheels):
    """The first host of a new bucket in a mainland network, then the next run's host.

    The hosts' outbound requests go through a proxy that refuses every name (the hub, GitHub,
    download.pytorch.org, PyPI); the package index is a local mirror holding exactly the lock's
    packages and the pinned torch (tests/support/fake_mainland.py: lock_index), the hub a local mirror of a tiny
    pipeline, the rest is the bucket. Boot 1 finds no environment cache and installs everything,
    torch included, from that one index (a CPU host: the index's own torch wheel), then caches the
    environment and the model in the bucket; boot 2, a fresh root, restores both and is reclaimed."""
    # Real time on purpose: the cold boot's pip install of the pinned environment, then the warm
    # boot's restore, are what is measured (the warm boot reaches its first step sooner).
    import time

    from tests.support import fake_mainland
    from tests.support.fake_hub import FakeHub
    from tests.providers.test_limits import CLOUDS, key_problems

    from sdcloud.runs.driving.hostboot import cloud_user_data
    from sdcloud_agent.store import open_store
    from sdcloud_agent.trainers import tiny

    bucket = "bare-root-boot"
    store = open_store({"url": f"s3://{bucket}/sdcloud", "endpoint_url": seaweed.endpoint, "region": "us-east-1"})
    store.ensure_bucket()
    assert not store.list("cache/"), "a first boot starts with no environment or model cache"
    repo = "sdcloud-tests/tiny-sd15"
    files = fake_mainland.tiny_hub_repo(tiny.save_pipeline(tmp_path / "tiny"))
    imds = AwsMetadataServer().start()
    key = next(iter(TEST_KEYS))
    imds.attach_role("sdcloud-host", key, TEST_KEYS[key])  # Token "": identity-mode weed refuses session tokens
    proxy = fake_mainland.RefusingProxy()
    index = fake_mainland.StaticIndex(fake_mainland.lock_index(tmp_path / "index"))
    boots = []
    try:
        with FakeHub({repo: files}) as hub:
            # No torch_index_url: torch comes from the package index like every other package.
            net = {"pip_index_url": index.url, "hf_endpoint": hub.endpoint, "trainer_sources": "bucket"}
            # The host's pip sees the mirror only: none of this machine's find-links, config or caps.
            env = {**proxy.env(), "HF_HUB_OFFLINE": None, "HF_HUB_DISABLE_XET": "1", "PIP_FIND_LINKS": None,
                   "PIP_CONFIG_FILE": os.devnull}
            args = {"model": repo, "network": net, "resolution_from_model": True,
                    "trainer_args": {"family": "sd15", "mode": "lora", "resolution": 512, "batch-size": 1}}

            # Boot 1: cold. Everything is installed from the mirror and cached in the bucket.
            root1 = tmp_path / "host1"
            ud = cloud_user_data("aws", store, _config(seaweed.endpoint, imds, bucket, "r-cold", 1, root1, **args))
            assert len(ud.encode()) < 16 * 1024 and "pip install sdcloud" not in ud
            assert "trainer_sources" in ud and hub.endpoint in ud
            b1 = harness_bareroot.boot(root1, ud, seaweed.ca_file, imds.base_url, env=env)
            boots.append(b1)
            assert b1.rc == 0, b1.log[-4000:]
            done = _wait_status(store, "r-cold", 1, ("succeeded", "failed"), 300)
            assert done["phase"] == "succeeded", (done, b1.agent_log()[-3000:])
            ph1 = harness_bareroot.phases(store, "r-cold", 1)
            assert [p for p in ph1] == ["driver", "python", "wheel", "env", "agent", "model", "checkpoint", "first-step"]
            assert ph1["checkpoint"]["result"] == "none"  # a fresh run: nothing to restore
            assert ph1["env"]["result"] == "installed" and ph1["model"]["result"] == "fetched"
            assert ph1["wheel"]["result"].startswith("sdcloud_agent-0.1.0+")
            assert ph1["driver"]["result"] == "none" and ph1["python"]["result"].startswith("Python 3.")
            # torch and the lock from the one mirror; the model from the hub mirror.
            asked = {r.split("/")[2] for r in index.requests if r.startswith("/simple/")}
            assert {"torch", "diffusers", "transformers", "accelerate"} <= asked, sorted(asked)
            assert any(r.startswith("/files/torch-2.13.0") for r in index.requests)
            assert hub.bytes_fetched() > 0
            assert any(o.key.startswith("cache/env/") and o.key.endswith(".tar.zst") for o in store.list("cache/env/"))
            assert store.list("cache/models/") and not [o for o in store.list("cache/") if o.key.endswith(".part")]
            assert store.head("runs/r-cold/logs/boot-1.log") is not None
            agent_log = (root1 / "var/lib/sdcloud/work/attempt-1.log").read_text()
            assert "resolution: 32 px from the model's config" in agent_log
            # The host's python is the system's, and the agent ran from the environment the boot built.
            assert (f"{root1}/opt/sdcloud/env/bin/python -m sdcloud_agent run"
                    in (root1 / "etc/systemd/system/sdcloud-agent.service").read_text())

            # Boot 2: a fresh root, the next run. The environment and the model come from the cache.
            root2 = tmp_path / "host2"
            ud2 = cloud_user_data("aws", store, _config(seaweed.endpoint, imds, bucket, "r-warm", 1, root2, steps=400, **args))
            fetched = hub.bytes_fetched()
            b2 = harness_bareroot.boot(root2, ud2, seaweed.ca_file, imds.base_url, env=env)
            boots.append(b2)
            assert b2.rc == 0, b2.log[-4000:]
            _wait_status(store, "r-warm", 1, ("training",), 120)
            ph2 = harness_bareroot.phases(store, "r-warm", 1)
            t_end = time.time() + 60
            while "first-step" not in ph2 and time.time() < t_end:
                time.sleep(0.5)
                ph2 = harness_bareroot.phases(store, "r-warm", 1)
            assert ph2["env"]["result"] == "restored" and ph2["model"]["result"] == "restored", ph2
            assert hub.bytes_fetched() == fetched  # the model from the bucket's cache, not the hub
            # Nothing but the agent itself was installed on the warm boot.
            env_log = b2.log.split("environment: torch build")[1].split("sdcloud bootstrap: agent started")[0]
            assert "-r " not in env_log and "venv" not in env_log and "--no-deps" in env_log
            # The reclaim notice from the metadata fake: the agent saves and reports preempted.
            imds.announce(60)
            end = _wait_status(store, "r-warm", 1, ("preempted", "failed", "succeeded"), 120)
            assert end["phase"] == "preempted", end
            # Nothing on either host asked for a name outside: the proxy saw no request at all.
            assert proxy.hosts == [], proxy.hosts
        # Every key the two runs left fits both clouds' key limits (tests/providers/test_limits.py).
        keys = [f"sdcloud/{o.key}" for o in store.list("")]
        assert len(keys) > 20 and [p for k in keys for c in CLOUDS for p in key_problems(c, k)] == []
        cold, warm = harness_bareroot.time_to_first_step(ph1), harness_bareroot.time_to_first_step(ph2)
        with capsys.disabled():
            print(f"\nbare-root boot (mainland mirrors): time to first step cold={cold:.1f}s "
                  f"(env {ph1['env']['seconds']:.1f}s) warm={warm:.1f}s (env {ph2['env']['seconds']:.1f}s)")
        assert warm < cold

        # The same network refuses each outside name, so a fetch from one would have failed.
        host_env = {**proxy.env(), "PATH": "/usr/bin:/bin"}
        refused = fake_mainland.outside_reachable(host_env, "/usr/bin/python3")
        assert all("403" in v or "Tunnel" in v for v in refused.values()), refused
        assert sorted(set(proxy.hosts)) == sorted(fake_mainland.OUTSIDE), proxy.hosts
    finally:
        for b in boots:
            b.kill()
        proxy.close()
        index.close()
        imds.stop()


def test_an_image_with_python_310_gets_the_distributions_python311(tmp_path, host_policy_bucket):
    """Ubuntu 22.04's python3 is 3.10, too old for the lock: the user-data installs python3.11 with
    the image's apt-get (shimmed) and goes on with it. The wheel is taken out of the bucket so
    that the boot stops at the next phase, with python's result recorded."""
    import re

    from sdcloud.runs.driving.hostboot import cloud_user_data

    endpoint, store, host_key, host_secret = host_policy_bucket
    bucket = "bare-root-policy"
    imds = AwsMetadataServer().start()
    imds.attach_role("sdcloud-host", host_key, host_secret)
    try:
        root = tmp_path / "host"
        ud = cloud_user_data("aws", store, _config(endpoint, imds, bucket, "r-py310", 1, root))
        wheel_key = re.search(r"WHEEL_KEY='([^']+)'", ud).group(1)
        store.delete(wheel_key)
        # Unattended upgrades hold the dpkg lock for the boot's first seconds: apt waits for it.
        holder = harness_bareroot.hold_dpkg_lock(root, 3)
        b = harness_bareroot.boot(root, ud, CA_BUNDLE, imds.base_url, shims=harness_bareroot.old_python_image("/usr/bin/python3"))
        holder.wait(timeout=30)
        assert b.rc != 0, b.log[-3000:]
        apt = (root / "var/log/apt-shim.log").read_text()
        assert "install -y -q python3.11 python3.11-venv" in apt, apt
        assert "Could not get lock" not in b.log, b.log[-3000:]
        calls = [line for line in apt.splitlines() if line.startswith("apt-get -")]
        assert calls and all("-o DPkg::Lock::Timeout=600 " in c for c in calls), apt
        waited = [float(w) for w in re.findall(r"lock after ([0-9.]+)s", apt)]
        assert waited[0] >= 1.5, apt  # the first apt-get waited for the lock, then all went on
        ph = harness_bareroot.phases(store, "r-py310", 1)
        assert ph["python"]["result"].startswith("installed Python 3.1"), ph
        assert ph["wheel"]["result"] == "failed", ph
    finally:
        imds.stop()


def subprocess_version(python) -> str:
    import subprocess

    return subprocess.run([str(python), "--version"], capture_output=True, text=True, timeout=30).stdout


SHUTDOWN_SHIM = r"""#!/bin/bash
# shutdown for the bare-root boot: records how it was called (on EC2 the OS halts and, launched with
# InstanceInitiatedShutdownBehavior=terminate, the instance is terminated).
echo "shutdown $*" >> "$SDCLOUD_ROOT/var/log/shutdown-shim.log"
"""


def image_python310() -> str:
    """Ubuntu 22.04's python3 for an image shim: a Python 3.10 (tests/support/harness_interpreters.py finds it)."""
    import os

    from tests.support.harness_interpreters import find_python

    found = find_python((3, 10))
    if found is None:
        why = "no Python 3.10 here for the image's python3 (docs/testing.md)"
        pytest.fail(why) if os.environ.get("CI") else pytest.skip(why)
    return found


def test_a_failed_boot_ends_its_host_after_the_grace(tmp_path, host_policy_bucket):
    """The user-data's failure path: the driver phase fails (a GPU host image without a driver);
    with nobody coming for the host, the user-data runs the agent's self-end from the wheel in the
    bucket on the image's own python (no boto3: the user-data's S3 client records it), which after
    the grace (1 s here) writes the self-end into status.json and runs `shutdown -h now`. The
    image's python3 is Ubuntu 22.04's 3.10: the boot client and the self-end run under it."""
    import time

    from sdcloud.runs.driving.hostboot import cloud_user_data

    endpoint, store, host_key, host_secret = host_policy_bucket
    bucket = "bare-root-policy"
    imds = AwsMetadataServer().start()
    imds.attach_role("sdcloud-host", host_key, host_secret)
    try:
        root = tmp_path / "host"
        cfg = _config(endpoint, imds, bucket, "r-selfend", 1, root, require_gpu=True,
                      self_end={"provider": "aws", "grace_s": 1, "unattended_after_s": 600})
        ud = cloud_user_data("aws", store, cfg)
        py310 = f'#!/bin/bash\nexec {image_python310()} "$@"\n'
        b = harness_bareroot.boot(root, ud, CA_BUNDLE, imds.base_url, shims={"shutdown": SHUTDOWN_SHIM, "python3": py310})
        assert "Python 3.10." in subprocess_version(root.parent / f"{root.name}-shim" / "python3")
        assert b.rc != 0, b.log[-3000:]
        shim_log = root / "var/log/shutdown-shim.log"
        deadline = time.time() + 60
        while not shim_log.exists() and time.time() < deadline:
            time.sleep(0.5)
        log = (root / "var/log/sdcloud-bootstrap.log").read_text()
        assert shim_log.exists(), log[-3000:]
        assert shim_log.read_text().strip() == "shutdown -h now"
        status = json.loads(store.get("runs/r-selfend/status.json"))
        assert status["phase"] == "failed" and status["boot_phase"] == "driver", status
        se = status["self_end"]
        assert se["reason"] == "failed boot (driver)" and se["action"] == "os-shutdown", se
        assert se["waited_s"] >= 1
    finally:
        imds.stop()
