"""The SSH provider against a real sshd on 127.0.0.1 (started here as the current user).

The "remote" host is this machine, so the host's python is this venv's interpreter and the
bucket a file:// folder both sides see. The agent is the real one, uploaded as the agent wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sdcloud.errors import UserError
from sdcloud.offers.optimizer import Offer
from sdcloud.providers.base import RUNNING, TAG_TOKEN, TERMINATED, CapacityError, LaunchSpec
from sdcloud.providers.ssh.provider import SshProvider, load_hosts
from sdcloud.offers.tiers import get_tier
from tests.support.server_sshd import free_port, write_hosts


@pytest.fixture
def workdir(tmp_path) -> Path:
    return tmp_path / "host-workdir"


@pytest.fixture
def provider(sshd, sdcloud_home, workdir):
    write_hosts(sdcloud_home / "ssh-hosts.toml", [sshd.host_entry("box", workdir, python=sys.executable)])
    prov = SshProvider()
    yield prov
    # Never leave an agent behind, whatever the test did.
    try:
        live = prov.find_tagged()
        if live:
            prov.terminate([i.id for i in live])
    finally:
        prov.close()


def spec_for(tmp_path: Path, run_id: str = "r-ssh", attempt: int = 1, **overrides) -> LaunchSpec:
    cfg = {"run_id": run_id, "attempt": attempt, "trainer": "command", "steps": 10, "checkpoint_every": 5,
           "trainer_args": [sys.executable, "-c", "import time; time.sleep(600)"],
           "store": {"url": (tmp_path / "bucket").as_uri()}, "nvme": False, "require_gpu": False,
           "heartbeat_seconds": 1, "poll_seconds": 1, "min_vram_gb": 12}
    cfg.update(overrides)
    return LaunchSpec(run_id=run_id, attempt=attempt, agent_config=cfg)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def wait_for(cond, timeout: float = 30.0, what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_launch_adopt_find_tail_terminate(provider, tmp_path, workdir):
    events: list[tuple[str, dict]] = []
    offer = provider.offers(get_tier("sd15-lora"), "on-demand")[0]
    spec = spec_for(tmp_path)
    inst = provider.launch(offer, spec, "on-demand", events=lambda k, d: events.append((k, d)))
    name, pid = inst.id.split(":")
    assert name == "box" and inst.state == RUNNING and not inst.adopted
    assert inst.tags == spec.tags and inst.zone == "box"
    # The real agent runs from the uploaded zip, in its own session, with its config private.
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"sdcloud_agent" in cmdline and b"run" in cmdline
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    token_dir = workdir / spec.token
    assert f"PYTHONPATH={token_dir / __import__('sdcloud_agent.wheel').wheel.current().filename}".encode() in environ
    assert os.getsid(int(pid)) == int(pid)
    assert (os.stat(token_dir / "cfg.json").st_mode & 0o777) == 0o600
    assert json.loads((token_dir / "cfg.json").read_text())["workdir"] == str(token_dir / "work")
    status = tmp_path / "bucket" / "runs" / "r-ssh" / "status.json"
    wait_for(status.exists, what="the agent's first heartbeat")
    kinds = [k for k, _ in events]
    assert "ssh-host-key-trusted" in kinds and "launched" in kinds

    # Same token again: the live agent is adopted, nothing new is started.
    again = provider.launch(offer, spec, "on-demand")
    assert again.adopted and again.id == inst.id

    # A new provider (a restarted controller) adopts it too, and finds it by run.
    fresh = SshProvider()
    try:
        assert fresh.launch(offer, spec, "on-demand").id == inst.id
        found = fresh.find_tagged("r-ssh")
        assert [i.id for i in found] == [inst.id] and found[0].tags[TAG_TOKEN] == spec.token
        assert fresh.find_tagged("r-other") == []
        assert [i.state for i in fresh.describe([inst.id])] == [RUNNING]
    finally:
        fresh.close()

    # One run per host: another attempt's token finds the host busy.
    with pytest.raises(CapacityError, match="busy"):
        provider.launch(offer, spec_for(tmp_path, attempt=2), "on-demand")

    text, offset = provider.tail_log(inst.id, 0)
    assert offset > 0 and "starting trainer" in text
    more, offset2 = provider.tail_log(inst.id, offset)
    assert offset2 >= offset

    trainer_pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != int(pid)
                    and _ppid(int(p)) == int(pid)]
    started = time.time()
    provider.terminate([inst.id])
    assert time.time() - started < 60
    assert not pid_alive(int(pid))
    assert not any(pid_alive(p) for p in trainer_pids), "the trainer outlived its agent"
    assert [i.state for i in provider.describe([inst.id])] == [TERMINATED]
    assert provider.find_tagged("r-ssh") == []


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_sigkill_after_grace_and_trainer_cleanup(provider, tmp_path, monkeypatch):
    """An agent that ignores SIGTERM is killed after the grace period, its trainer with it."""
    import sdcloud.providers.ssh.provider as ssh_mod

    monkeypatch.setattr(ssh_mod, "TERMINATE_GRACE_SECONDS", 2.0)
    stub = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True); "
            "time.sleep(600)")
    prov = SshProvider(agent_argv=["-c", stub, "sdcloud_agent"])
    try:
        inst = prov.launch(prov.offers()[0], spec_for(tmp_path), "on-demand")
        pid = int(inst.id.split(":")[1])
        child = wait_for(lambda: next((int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == pid), None),
                         what="the stub's child")
        prov.terminate([inst.id])
        assert not pid_alive(pid) and not pid_alive(child)
    finally:
        prov.close()


def test_agent_that_exits_at_once_is_a_user_error(provider, tmp_path, monkeypatch):
    import sdcloud.providers.ssh.provider as ssh_mod

    monkeypatch.setattr(ssh_mod, "START_CHECK_SECONDS", 5.0)  # room for a slow interpreter start on CI
    spec = spec_for(tmp_path, trainer="nonsense")
    with pytest.raises(UserError, match="agent exited at once"):
        provider.launch(provider.offers()[0], spec, "on-demand")
    assert provider.find_tagged() == []


def test_unreachable_host_falls_back_then_capacity_error(sshd, sdcloud_home, workdir, tmp_path):
    down = sshd.host_entry("down", workdir, python=sys.executable, port=free_port())
    up = sshd.host_entry("up", workdir, python=sys.executable, price_per_hour=0.5)
    write_hosts(sdcloud_home / "ssh-hosts.toml", [down, up])
    prov = SshProvider()
    events = []
    try:
        offer = next(o for o in prov.offers() if o.row.zone == "down")
        inst = prov.launch(offer, spec_for(tmp_path), "on-demand", events=lambda k, d: events.append(k))
        assert inst.zone == "up" and inst.price_per_hour == 0.5
        assert "host-unreachable" in events
        prov.terminate([inst.id])
    finally:
        prov.close()
    write_hosts(sdcloud_home / "ssh-hosts.toml", [down])
    prov = SshProvider()
    with pytest.raises(CapacityError, match=r"down unreachable \(NoValidConnectionsError: .*Unable to connect"):
        prov.launch(prov.offers()[0], spec_for(tmp_path), "on-demand")


def test_a_channel_that_breaks_is_tried_once_more_on_a_new_connection(provider, tmp_path, monkeypatch):
    """A connection that dies between operations (NAT timeout, sshd restarted) must not make a
    live host look down: the operation runs again on a fresh connection, and says so."""
    import paramiko

    real = paramiko.SSHClient.exec_command
    broke: list[int] = []

    def flaky(self, *a, **kw):
        if len(broke) < fail_times:
            broke.append(id(self))
            raise paramiko.SSHException("SSH session not active")  # what paramiko raises on a dead transport
        return real(self, *a, **kw)

    monkeypatch.setattr(paramiko.SSHClient, "exec_command", flaky)
    events: list[tuple[str, dict]] = []
    provider.events = lambda k, d: events.append((k, d))
    fail_times = 1
    assert provider.find_tagged() == []
    retries = [d for k, d in events if k == "ssh-retry"]
    assert len(retries) == 1 and retries[0]["op"] == "scan" and "SSH session not active" in retries[0]["error"]
    assert len(broke) == 1 and id(provider._clients["box"]) != broke[0]  # the broken client was dropped
    # A host whose channel breaks again on the fresh connection is reported with the cause.
    broke.clear()
    fail_times = 2
    with pytest.raises(CapacityError, match=r"box unreachable \(scan failed: SSHException: SSH session not active\)"):
        provider.launch(provider.offers()[0], spec_for(tmp_path), "on-demand")
    assert len(broke) == 2


def test_trust_on_first_use_and_changed_host_key(provider, sshd, sdcloud_home, tmp_path):
    known = sdcloud_home / "ssh_known_hosts"
    assert not known.exists()
    assert provider.find_tagged() == []  # connects
    entry = known.read_text()
    assert f"[127.0.0.1]:{sshd.port} ssh-ed25519 " in entry
    assert (known.stat().st_mode & 0o777) == 0o600
    # The OpenSSH client accepts the recorded key through the argv `sdcloud ssh` uses.
    argv = provider.ssh_argv("box:1")
    assert argv[:5] == ["ssh", "-i", str(sshd.user_key), "-p", str(sshd.port)]
    out = subprocess.run(argv[:-1] + ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", argv[-1], "echo ok"],
                         capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "ok", out.stderr
    # Another key recorded for this address: refuse, and say how to fix it.
    other = Path(f"{sshd.user_key}.pub").read_text().split()[:2]
    known.write_text(f"[127.0.0.1]:{sshd.port} {other[0]} {other[1]}\n")
    with pytest.raises(UserError, match="host key changed"):
        SshProvider().find_tagged()


def test_offers_filter_by_tier_vram(sdcloud_home):
    write_hosts(sdcloud_home / "ssh-hosts.toml", [
        {"name": "small", "host": "10.0.0.1", "user": "me", "key": "id_small", "gpu": "RTX 3070", "vram_gb": 8},
        {"name": "big", "host": "10.0.0.2", "user": "me", "key": "/keys/id_big", "gpu": "RTX 4090", "vram_gb": 24,
         "price_per_hour": 0.3, "gpu_count": 2},
    ])
    offers = SshProvider().offers(get_tier("sd15-lora"), "on-demand")
    assert [o.row.zone for o in offers] == ["big"]
    row = offers[0].row
    assert (row.provider, row.region, row.instance_type, row.gpu, row.gpu_count, row.vram_gb) == \
        ("ssh", "ssh", "big", "RTX 4090", 2, 24.0)
    assert isinstance(offers[0], Offer) and offers[0].price_per_hour == 0.3
    write_hosts(sdcloud_home / "ssh-hosts.toml", [
        {"name": "small", "host": "10.0.0.1", "user": "me", "key": "id_small", "gpu": "RTX 3070", "vram_gb": 8}])
    with pytest.raises(UserError, match=r"12 GB.*small 8 GB"):
        SshProvider().offers(get_tier("sd15-lora"))
    # Relative key paths are relative to the hosts file.
    assert load_hosts(sdcloud_home / "ssh-hosts.toml")[0].key == str(sdcloud_home / "id_small")


@pytest.mark.parametrize("text, match", [
    (None, "no ssh hosts file at"),
    ("[[hosts]\n", "not valid TOML"),
    ("x = 1\n", "no \\[\\[hosts\\]\\]"),
    ('[[hosts]]\nname = "a"\nhost = "h"\nuser = "u"\nkey = "k"\ngpu = "T4"\n', "host #1 \\(a\\) is missing 'vram_gb'"),
    ('[[hosts]]\nname = "a"\nhost = "h"\nuser = "u"\nkey = "k"\ngpu = "T4"\nvram_gb = 16\nport = 0\n', "'port' must be"),
    ('[[hosts]]\nname = "a b"\nhost = "h"\nuser = "u"\nkey = "k"\ngpu = "T4"\nvram_gb = 16\n', "'name' may hold"),
    ('[[hosts]]\nname = "a"\nhost = "h"\nuser = "u"\nkey = "k"\ngpu = "T4"\nvram_gb = 16\nram = 3\n', "unknown field"),
    ('[[hosts]]\nname = "a"\nhost = "h"\nuser = "u"\nkey = "k"\ngpu = "T4"\nvram_gb = 16\n' * 2, "used twice"),
])
def test_bad_hosts_file(sdcloud_home, text, match):
    path = sdcloud_home / "ssh-hosts.toml"
    if text is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    with pytest.raises(UserError, match=match) as err:
        SshProvider().offers()
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_check_credentials_and_env_override(sdcloud_home, tmp_path, monkeypatch):
    key = tmp_path / "id_test"
    hosts = write_hosts(tmp_path / "elsewhere.toml", [
        {"name": "a", "host": "10.0.0.1", "user": "me", "key": str(key), "gpu": "T4", "vram_gb": 16}])
    monkeypatch.setenv("SDCLOUD_SSH_HOSTS", str(hosts))
    prov = SshProvider()
    assert prov.hosts_file == hosts
    with pytest.raises(UserError, match="key file .*id_test does not exist"):
        prov.check_credentials()
    key.write_text("not really a key")
    prov.check_credentials()
    assert SshProvider(hosts_file=tmp_path / "nope.toml").hosts_file == tmp_path / "nope.toml"


def test_module_import_stays_light():
    out = subprocess.run([sys.executable, "-c", "import sys, sdcloud.providers.ssh; print('paramiko' in sys.modules)"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
