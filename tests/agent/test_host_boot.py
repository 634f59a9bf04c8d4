"""The host's boot pieces, each on its own: the agent wheel, the torch build from recorded nvidia-smi
outputs, usable-VRAM floors, the standard-library S3 client with role credentials, the run lease,
a failed boot phase on a bare root, and the controller's answer to failed boots."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.support import ROOT, DATA
from tests.support import harness_bareroot
from tests.support.fake_host import AwsMetadataServer
from tests.support.server_seaweed import TEST_KEYS


SMI = DATA / "nvidia-smi"


# -- the agent wheel ----------------------------------------------------------------------------

def test_agent_wheel_is_named_by_content_and_matches_bootstrap_pyproject(tmp_path):
    from sdcloud_agent import wheel as agent_wheel

    a, b = agent_wheel.build(), agent_wheel.build()
    assert a.data == b.data and a.filename == b.filename  # deterministic: the name follows the content
    assert a.filename.startswith("sdcloud_agent-0.1.0+") and a.filename.endswith("-py3-none-any.whl")
    project = tomllib.loads((ROOT / "bootstrap" / "pyproject.toml").read_text())["project"]
    assert project["name"] == "sdcloud-agent" and project["requires-python"] == agent_wheel.REQUIRES_PYTHON
    assert project["dependencies"] == agent_wheel.DEPENDENCIES
    assert project["optional-dependencies"] == agent_wheel.EXTRAS
    path = tmp_path / a.filename
    path.write_bytes(a.data)
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        meta = zf.read(f"sdcloud_agent-{a.version}.dist-info/METADATA").decode()
    assert "sdcloud_agent/s3lite.py" in names and "sdcloud_agent/data/env-lock.txt" in names
    assert "sdcloud_agent/templates/user-data.sh.tmpl" in names and not any("__pycache__" in n for n in names)
    assert "Requires-Python: >=3.10" in meta and "Requires-Dist: boto3>=1.34" in meta
    # The system python imports the boot steps straight from the wheel (what the user-data does).
    out = subprocess.run(["/usr/bin/python3", "-c", "import sdcloud_agent.boot as b; print(b.__file__)"],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(path)})
    assert out.returncode == 0 and a.filename in out.stdout, out.stderr


def test_agent_wheel_uploaded_once_per_version(tmp_path):
    from sdcloud_agent import wheel as agent_wheel
    from sdcloud_agent.store import LocalStore

    store = LocalStore(tmp_path / "bucket")
    w = agent_wheel.ensure_uploaded(store)
    path = tmp_path / "bucket" / w.key
    assert path.read_bytes() == w.data
    before = path.stat().st_mtime_ns
    time.sleep(0.01)
    agent_wheel.ensure_uploaded(store)
    assert path.stat().st_mtime_ns == before


# -- GPU: torch build and usable VRAM ----------------------------------------------------------

@pytest.mark.parametrize("name,build", [("g4dn-dlami-t4.txt", "cu126"), ("g5-a10g-535.txt", "cu126"),
                                        ("p5-h100-580.txt", "cu130"), ("tencent-gn7-t4-525.txt", "cu126")])
def test_torch_build_from_nvidia_smi(name, build):
    from sdcloud_agent import gpu

    text = (SMI / name).read_text()
    assert gpu.torch_build(gpu.driver_cuda(text)) == build
    ran = lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, text, "")  # noqa: E731
    assert gpu.host_torch_build(run=ran) == build


@pytest.mark.parametrize("cuda,build", [((12, 0), "cu126"), ((12, 2), "cu126"), ((12, 6), "cu126"), ((12, 8), "cu126"),
                                        ((12, 9), "cu126"), ((13, 0), "cu130"), ((13, 2), "cu130")])
def test_torch_build_is_an_index_torch_2_13_publishes(cuda, build):
    """torch 2.13.0's stable CUDA builds are 12.6 and 13.0: a 12.8 driver takes cu126, never cu128."""
    from sdcloud_agent import boot, gpu

    assert boot.TORCH_PIN == "torch==2.13.0"  # the published builds below are this pin's
    assert gpu.torch_build(cuda) == build
    assert {tag for _, tag in gpu.TORCH_CUDA_BUILDS} == {"cu126", "cu130"}


def test_torch_build_refuses_a_driver_older_than_every_build_and_is_cpu_without_gpu():
    from sdcloud_agent import gpu

    with pytest.raises(ValueError, match="CUDA 11.4"):
        gpu.torch_build(gpu.driver_cuda((SMI / "p3-v100-470.txt").read_text()))
    assert gpu.torch_build(gpu.driver_cuda("NVIDIA-SMI has failed because it couldn't communicate with the driver")) == "cpu"


def test_usable_vram_floor_counts_a_t4_as_16_gb():
    from sdcloud_agent import gpu

    t4 = gpu.Gpu("Tesla T4", 15360, "570.133.20")
    assert gpu.check([t4], min_vram_gb=16).ok
    assert gpu.check([gpu.Gpu("NVIDIA A10G", 23028, "535")], min_vram_gb=24).ok
    small = gpu.check([gpu.Gpu("12 GB card", 12288, "535")], min_vram_gb=16)
    assert not small.ok and "12288 MiB" in small.reason


# -- s3lite: the host's first S3 client --------------------------------------------------------

def test_s3lite_with_imdsv2_role_credentials_over_https(tmp_path, seaweed, s3_env, monkeypatch):
    from sdcloud_agent import s3lite
    from sdcloud_agent.store import open_store

    store_conf = {"url": "s3://s3lite-test/pre", "endpoint_url": seaweed.endpoint, "region": "us-east-1"}
    store = open_store(store_conf)
    store.ensure_bucket()
    imds = AwsMetadataServer().start()
    try:
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(k)
        b = s3lite.Bucket(store_conf, {"kind": "aws", "base_url": imds.base_url})
        with pytest.raises(OSError):  # no role attached: nothing to sign with
            b.head("x")
        key = next(iter(TEST_KEYS))
        imds.attach_role("host-role", key, TEST_KEYS[key])
        b = s3lite.Bucket(store_conf, {"kind": "aws", "base_url": imds.base_url})
        src = tmp_path / "f.bin"
        src.write_bytes(b"\x00hello" * 1000)
        b.put_file("dir/f.bin", str(src))
        assert b.head("dir/f.bin") == 6000 and b.head("dir/missing") is None
        b.get("dir/f.bin", str(tmp_path / "back"))
        assert (tmp_path / "back").read_bytes() == src.read_bytes()
        assert store.get("dir/f.bin") == src.read_bytes()  # the same object boto3 sees
        bad = s3lite.Bucket(store_conf, {"kind": "aws", "base_url": imds.base_url})
        bad._creds = {"key": key, "secret": "wrong", "token": ""}
        with pytest.raises(s3lite.S3Error) as err:
            bad.put_bytes("dir/g", b"x")
        assert err.value.status == 403
        assert ("PUT", "/latest/api/token") in imds.requests  # IMDSv2: a token first
    finally:
        imds.stop()


# -- the lease ---------------------------------------------------------------------------------

def test_lease_one_writer(tmp_path):
    from sdcloud_agent.lease import Lease, LeaseHeld
    from sdcloud_agent.store import LocalStore

    store = LocalStore(tmp_path / "b")
    a = Lease(store, "runs/r", attempt=1, ttl=2.0, holder="a")
    a.acquire()
    with pytest.raises(LeaseHeld, match="attempt 1"):
        Lease(store, "runs/r", attempt=1, ttl=2.0, holder="b").acquire()  # same attempt: leave at once
    # A later attempt waits for the old lease to lapse (its holder stopped renewing), then takes it.
    c = Lease(store, "runs/r", attempt=2, ttl=2.0, holder="c")
    t0 = time.time()
    c.acquire()
    assert 0.5 < time.time() - t0 < 5 and c.generation == 2
    assert not a.renew()  # the old holder sees that it lost the run
    c.release()
    d = Lease(store, "runs/r", attempt=3, ttl=60, holder="d")
    t0 = time.time()
    d.acquire()
    assert time.time() - t0 < 1  # released: no wait


def test_lease_race_has_one_winner(tmp_path, seaweed, s3_env):
    from sdcloud_agent.lease import Lease, LeaseHeld
    from sdcloud_agent.store import open_store

    store = open_store({"url": "s3://lease-race/p", "endpoint_url": seaweed.endpoint, "region": "us-east-1"})
    store.ensure_bucket()
    results: list[str] = []

    def take(name):
        try:
            Lease(store, "runs/r", attempt=1, ttl=30, holder=name).acquire(wait=0)
            results.append("won")
        except LeaseHeld:
            results.append("held")

    threads = [threading.Thread(target=take, args=(f"h{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["held", "held", "held", "won"]


def test_second_agent_on_a_live_run_leaves_without_touching_it(tmp_path):
    from tests.support.fake_host import __file__ as fakes

    bucket = tmp_path / "bucket"
    def cfg(n):
        c = {"run_id": "r-live", "attempt": 1, "trainer": "command", "steps": 200, "checkpoint_every": 5,
             "trainer_args": [sys.executable, fakes], "store": {"url": bucket.as_uri()}, "nvme": False,
             "require_gpu": False, "workdir": str(tmp_path / f"w{n}"), "heartbeat_seconds": 0.5}
        p = tmp_path / f"agent{n}.json"
        p.write_text(json.dumps(c))
        return p
    env = {**__import__("os").environ, "FAKE_STEP_SECONDS": "0.05", "FAKE_CKPT_BYTES": "1000"}
    first = subprocess.Popen([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(cfg(1))], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        ckpts = bucket / "runs/r-live/checkpoints"
        end = time.time() + 60
        while time.time() < end and not list(ckpts.glob("*/manifest.json")):
            time.sleep(0.2)
        assert list(ckpts.glob("*/manifest.json"))
        second = subprocess.run([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(cfg(2))], env=env,
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 4
        log = (tmp_path / "w2" / "attempt-1.log").read_text()
        assert "holds this run" in log and "leaving it alone" in log
        assert not (tmp_path / "w2" / "status.json").exists() and not (tmp_path / "w2" / "checkpoints").exists()
        assert first.poll() is None  # the live agent carries on
    finally:
        first.terminate()
        first.wait(60)


# -- a failed boot phase on a bare root ---------------------------------------------------------

def test_failed_boot_phase_reports_failed_with_the_phase_and_the_log(tmp_path, seaweed, s3_env):
    from sdcloud.runs.driving.hostboot import cloud_user_data
    from sdcloud_agent.store import open_store

    store = open_store({"url": "s3://boot-fail/sdcloud", "endpoint_url": seaweed.endpoint, "region": "us-east-1"})
    store.ensure_bucket()
    imds = AwsMetadataServer().start()
    key = next(iter(TEST_KEYS))
    imds.attach_role("host-role", key, TEST_KEYS[key])
    try:
        root = tmp_path / "host"
        cfg = {"run_id": "r-nogpu", "attempt": 1, "store": {"url": "s3://boot-fail/sdcloud", "endpoint_url": seaweed.endpoint,
                                                            "region": "us-east-1"},
               "metadata": {"kind": "aws", "base_url": imds.base_url}}  # require_gpu: this root has no driver
        boot = harness_bareroot.boot(root, cloud_user_data("aws", store, cfg), seaweed.ca_file, imds.base_url, timeout=60)
        assert boot.rc != 0 and boot.agent_pid is None
        status = json.loads(store.get("runs/r-nogpu/status.json"))
        assert status["phase"] == "failed" and status["boot_phase"] == "driver" and status["attempt"] == 1
        assert "no NVIDIA driver on this image" in status["reason"]
        ph = harness_bareroot.phases(store, "r-nogpu", 1)
        assert list(ph) == ["driver"] and ph["driver"]["result"] == "failed"
        assert b"phase driver failed" in store.get("runs/r-nogpu/logs/boot-1.log")
    finally:
        imds.stop()


def test_tencent_user_data_installs_the_driver_first_and_only_when_missing():
    from sdcloud_agent.userdata import render_user_data

    text = render_user_data({"run_id": "r", "store": {"url": "cos://b-1250000000/p", "credentials": "tencent-cvm-role"},
                             "metadata": {"kind": "tencent"}}, "agent/a.whl", driver="535-server")
    assert "DRIVER='535-server'" in text
    body = text[text.index("p_driver() {"):]
    assert body.index("nvidia-smi >/dev/null 2>&1; then echo present") < body.index(
        'apt-get -o DPkg::Lock::Timeout=$APT_LOCK_WAIT install -y -q "linux-headers-$(uname -r)" "nvidia-driver-$DRIVER"')
    assert text.index("phase driver p_driver") < text.index("phase wheel p_wheel")


def test_the_driver_install_brings_kernel_headers_and_keeps_nouveau_off(tmp_path):
    """The driver phase run as on a fresh Tencent image (its commands shimmed): DKMS gets the
    running kernel's headers in the same install, and nouveau is blacklisted and unloaded first."""
    import re

    from sdcloud_agent.userdata import render_user_data

    text = render_user_data({"run_id": "r", "store": {"url": "cos://b-1250000000/p", "credentials": "tencent-cvm-role"},
                             "metadata": {"kind": "tencent"}}, "agent/a.whl", driver="535-server")
    p_driver = re.search(r"^p_driver\(\) \{.*?^\}$", text, re.S | re.M)[0]
    shim, root = tmp_path / "bin", tmp_path / "root"
    shim.mkdir()
    (root / "boot").mkdir(parents=True)
    log = tmp_path / "calls.log"
    shims = {
        "uname": 'echo 5.15.0-105-generic',
        "modprobe": f'echo "modprobe $*" >> {log}',
        "apt-get": f'echo "apt-get $*" >> {log}; case " $* " in *" install "*) '
                   f'printf "#!/bin/bash\\necho driver 535\\n" > {shim}/nvidia-smi; chmod +x {shim}/nvidia-smi;; esac',
    }
    for name, body in shims.items():
        (shim / name).write_text(f"#!/bin/bash\n{body}\n")
        (shim / name).chmod(0o755)
    script = (f"set -Eeuo pipefail\nR={root}\nBOOT={root}/boot\nDRIVER=535-server\nREQUIRE_GPU=1\nAPT_LOCK_WAIT=600\n"
              f"{p_driver}\np_driver\n")
    p = subprocess.run(["/bin/bash", "-c", script], env={"PATH": f"{shim}:/usr/bin:/bin"}, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    calls = log.read_text().splitlines()
    install = next(c for c in calls if " install " in c)
    assert "linux-headers-5.15.0-105-generic nvidia-driver-535-server nvidia-utils-535-server" in install
    assert calls.index("modprobe -r nouveau") < calls.index(install) < calls.index("modprobe nvidia")
    conf = (root / "etc/modprobe.d/sdcloud-blacklist-nouveau.conf").read_text()
    assert conf.splitlines() == ["blacklist nouveau", "options nouveau modeset=0"]
    assert (root / "boot/result").read_text().strip() == "installed"


def test_every_apt_get_at_first_boot_waits_for_the_dpkg_lock():
    """Unattended upgrades hold the dpkg lock in a new instance's first minutes: every apt-get the
    boot runs (driver, python3.11, its venv module) waits for it instead of failing the phase."""
    import re

    from sdcloud_agent.userdata import render_user_data

    text = render_user_data({"run_id": "r", "store": {"url": "cos://b-1250000000/p", "credentials": "tencent-cvm-role"},
                             "metadata": {"kind": "tencent"}}, "agent/a.whl", driver="535-server")
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    calls = re.findall(r"apt-get (?!>)[^;&|\n]*", code.replace("command -v apt-get", ""))
    calls = [c for c in calls if not c.startswith("apt-get to ")]  # the message naming it
    assert len(calls) == 6, calls
    assert all(c.startswith("apt-get -o DPkg::Lock::Timeout=$APT_LOCK_WAIT ") for c in calls), calls
    wait = int(re.search(r"^APT_LOCK_WAIT=(\d+)$", text, re.M)[1])
    assert 300 <= wait <= 900  # minutes, inside the 30-minute boot timeout


def test_aws_never_ranks_p3_the_launch_image_cannot_drive(aws_env):
    from sdcloud.offers.tiers import get_tier
    from sdcloud.providers.aws.compute import image_supports
    from sdcloud.providers import get_provider

    assert not image_supports("p3.2xlarge") and not image_supports("p3dn.24xlarge") and image_supports("g4dn.xlarge")
    offers = get_provider("aws").offers(get_tier("sd15-lora"))
    assert offers and not [o for o in offers if o.row.instance_type.startswith("p3")]


def test_the_stacks_are_package_data_of_the_sdcloud_wheel():
    import fnmatch

    from sdcloud.infra.automation import stacks_dir

    here = Path(__import__("sdcloud.infra.automation").infra.automation.__file__).parent / "stacks"
    assert stacks_dir() == here and (here / "aws" / "sdcloud_aws_stack.py").is_file()
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["sdcloud"]
    shipped = [f for f in (ROOT / "stacks").rglob("*") if f.is_file() and "__pycache__" not in f.parts]
    for f in shipped:  # every file of the stacks matches a package-data pattern, so the wheel carries it
        rel = "infra/stacks/" + f.relative_to(ROOT / "stacks").as_posix()
        assert any(fnmatch.fnmatchcase(rel, p) and rel.count("/") == p.count("/") for p in patterns), rel


def test_failed_boots_in_a_row_counts_only_the_unbroken_tail():
    from types import SimpleNamespace as A

    from sdcloud.runs.driving.hostboot import failed_boots_in_a_row

    seq = lambda *r: [A(end_reason=x) for x in r]  # noqa: E731
    assert failed_boots_in_a_row(seq("boot-failed:env", "preempted", "boot-failed:driver", "boot-timeout", None)) == 2
    assert failed_boots_in_a_row(seq("boot-failed:gpu", "lost")) == 0
    assert failed_boots_in_a_row(seq()) == 0
