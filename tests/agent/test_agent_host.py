"""Host-side pieces of the agent: NVMe planning, GPU check, watchers, config, trainer adapters, user-data."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest


from sdcloud_agent import config, gpu, nvme, watchers
from sdcloud_agent.clouds import aws as aws_cloud, tencent as tencent_cloud
from sdcloud_agent.trainers.base import Context, parse_tqdm
from sdcloud_agent.trainers.builtin_adapter import BuiltinTrainer
from sdcloud_agent.trainers.command import CommandTrainer
from sdcloud_agent.trainers.diffusers import DiffusersTrainer
from sdcloud_agent.trainers.kohya import KohyaTrainer
from sdcloud_agent.userdata import render_user_data

from tests.support import DATA
from tests.support.fake_host import AwsMetadataServer, TencentMetadataServer

LSBLK = DATA / "lsblk"


def _plan(name: str) -> nvme.Plan:
    return nvme.plan((LSBLK / name).read_text())


# -- NVMe ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, action, devices, tb", [
    ("g4dn.xlarge.json", "single", ["/dev/nvme1n1"], 0.125),
    ("g5.12xlarge.json", "single", ["/dev/nvme1n1"], 3.8),
    ("g5.48xlarge.json", "raid0", ["/dev/nvme1n1", "/dev/nvme2n1"], 7.6),
    ("p4d.24xlarge.json", "raid0", [f"/dev/nvme{i}n1" for i in range(1, 9)], 8.0),
    ("p3.2xlarge.json", "root", [], 0),
    ("tencent-cvm-local-nvme.json", "single", ["/dev/nvme0n1"], 3.84),
])
def test_nvme_plan_on_recorded_lsblk(name, action, devices, tb):
    p = _plan(name)
    assert p.action == action
    assert p.devices == devices
    assert p.size_bytes / 1e12 == pytest.approx(tb, rel=0.01)
    if action == "root":
        assert "root disk" in p.warning


def test_nvme_never_touches_ebs_or_the_root_disk():
    for f in LSBLK.glob("*.json"):
        doc = json.loads(f.read_text())
        p = nvme.plan(doc)
        for dev in doc["blockdevices"]:
            if "Elastic Block Store" in (dev.get("model") or "") or dev.get("children"):
                assert f"/dev/{dev['name']}" not in p.devices, f.name


def test_nvme_commands_raid0_then_format_then_mount():
    cmds = nvme.commands(_plan("g5.48xlarge.json"))
    assert cmds[0][:2] == ["mdadm", "--create"] and "--level=0" in cmds[0] and "--raid-devices=2" in cmds[0]
    assert cmds[1][0] == "mkfs.ext4" and cmds[1][-1] == nvme.RAID_DEVICE
    assert cmds[-1] == ["mount", "-o", "noatime,nodiratime", nvme.RAID_DEVICE, "/mnt/nvme"]
    single = nvme.commands(_plan("g4dn.xlarge.json"))
    assert not any(c[0] == "mdadm" for c in single) and single[-1][-2] == "/dev/nvme1n1"


def test_nvme_setup_is_idempotent_once_mounted():
    doc = json.loads((LSBLK / "g4dn.xlarge.json").read_text())
    doc["blockdevices"][1]["fstype"] = "ext4"
    doc["blockdevices"][1]["mountpoint"] = "/mnt/nvme"
    assert nvme.plan(doc).action == "mounted"


def test_nvme_setup_runs_the_plan_and_falls_back_on_failure():
    ran = []

    class R:
        def __init__(self, out=""):
            self.stdout = out

    def runner(cmd, **kw):
        ran.append(cmd)
        if cmd[0] == "lsblk":
            return R((LSBLK / "g5.48xlarge.json").read_text())
        if cmd[0] == "mkfs.ext4" and fail:
            import subprocess
            raise subprocess.CalledProcessError(1, cmd, stderr="mkfs: device busy")
        return R()

    fail = False
    path, p = nvme.setup("/mnt/x", run=runner)
    assert path == Path("/mnt/x") and [c[0] for c in ran] == ["lsblk", "mdadm", "mkfs.ext4", "mkdir", "mount"]
    fail = True
    path, p = nvme.setup("/mnt/x", run=runner)
    assert path is None and "device busy" in p.warning


# -- GPU ----------------------------------------------------------------------------------------

SMI = """name, memory.total [MiB], driver_version
NVIDIA A10G, 23028 MiB, 535.104.05
NVIDIA A10G, 23028 MiB, 535.104.05
"""


def test_gpu_parse_and_vram_check():
    gpus = gpu.parse(SMI)
    assert len(gpus) == 2 and gpus[0].name == "NVIDIA A10G" and gpus[0].vram_mib == 23028
    ok = gpu.check(gpus, min_vram_gb=16, rec_vram_gb=24)  # 23,028 MiB is what a "24 GB" A10G shows
    assert ok.ok and not ok.warnings
    warn = gpu.check(gpus, min_vram_gb=16, rec_vram_gb=40)
    assert warn.ok and "recommended 40" in warn.warnings[0]
    bad = gpu.check(gpus, min_vram_gb=40)
    assert not bad.ok and "40 GB GPU" in bad.reason and "23028 MiB" in bad.reason
    assert not gpu.check([], 8).ok
    assert gpu.check([], 8, require_gpu=False).ok


# -- watchers -----------------------------------------------------------------------------------

def test_aws_watcher_imdsv2_tokens_notice_and_rebalance():
    srv = AwsMetadataServer().start()
    try:
        w = aws_cloud.NoticeWatcher(srv.base_url)
        assert w.check() == []
        srv.recommend_rebalance()
        assert [n.kind for n in w.check()] == ["rebalance"]
        srv.expire_tokens()  # 401: the watcher fetches a new token by itself
        srv.announce(90)
        kinds = {n.kind: n for n in w.check()}
        assert set(kinds) == {"terminate", "rebalance"}
        assert kinds["terminate"].deadline - time.time() == pytest.approx(90, abs=3)
        assert sum(1 for m, p in srv.requests if p == "/latest/api/token") == 2
        assert all(m == "PUT" for m, p in srv.requests if p == "/latest/api/token")
    finally:
        srv.stop()


def test_tencent_watcher_reads_utc8_time():
    srv = TencentMetadataServer().start()
    try:
        w = tencent_cloud.NoticeWatcher(srv.base_url)
        assert w.check() == []
        srv.announce(100)
        (n,) = w.check()
        assert n.kind == "terminate" and n.deadline - time.time() == pytest.approx(100, abs=3)
    finally:
        srv.stop()
    assert tencent_cloud.parse_notice_time("2018-08-18 20:05:33") == pytest.approx(1534593933)


def test_watch_thread_fires_once_per_notice_and_survives_an_absent_endpoint():
    srv = AwsMetadataServer().start()
    got = []
    t = watchers.WatchThread(aws_cloud.NoticeWatcher(srv.base_url), got.append, poll_seconds=0.05).start()
    dead = watchers.WatchThread(aws_cloud.NoticeWatcher("http://127.0.0.1:9"), got.append, poll_seconds=0.05).start()
    try:
        time.sleep(0.2)
        srv.announce()
        deadline = time.time() + 5
        while not got and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
        assert [n.kind for n in got] == ["terminate"]
    finally:
        t.stop()
        dead.stop()
        srv.stop()


# -- config -------------------------------------------------------------------------------------

def test_config_rejects_secrets_unknown_keys_and_bad_trainers(tmp_path):
    base = {"run_id": "r", "store": {"url": "file:///tmp/x"}}
    assert config.from_dict(base).trainer == "builtin"
    with pytest.raises(config.ConfigError, match="secret"):
        config.from_dict({**base, "store": {"url": "s3://b", "aws_secret_access_key": "x"}})
    assert not hasattr(config.from_dict({**base, "colour": 1}), "colour")  # ignored with a warning
    with pytest.raises(config.ConfigError, match="store"):
        config.from_dict({"run_id": "r"})
    with pytest.raises(config.ConfigError, match="trainer"):
        config.from_dict({**base, "trainer": "magic"})
    p = tmp_path / "c.json"
    p.write_text(json.dumps({**base, "store": "s3://b/p", "nvme": "/mnt/fast"}))
    cfg = config.load(p)
    assert cfg.store == {"url": "s3://b/p"} and cfg.mount_point == "/mnt/fast" and cfg.run_prefix == "runs/r"


# -- trainer adapters ---------------------------------------------------------------------------

def _ctx(tmp_path, **kw) -> Context:
    return Context(steps=1000, checkpoint_every=100, model="stabilityai/sdxl", workdir=tmp_path,
                   checkpoint_dir=tmp_path / "ck", output_dir=tmp_path / "out", **kw)


def test_diffusers_args_keep_two_checkpoints_and_resume_latest(tmp_path):
    t = DiffusersTrainer()
    ctx = _ctx(tmp_path, trainer_args={"script": "train_dreambooth_lora_sdxl.py", "checkpoints_total_limit": 1,
                                       "max_train_steps": 5, "learning_rate": 1e-4})
    cmd = t.command(ctx)
    # No sources staged (no trainer_root): the script stays as named, accelerate is run by the env's python.
    assert cmd[:4] == [sys.executable, "-m", "accelerate.commands.launch", "train_dreambooth_lora_sdxl.py"]
    flags = dict(zip(cmd[4::2], cmd[5::2]))
    assert flags["--checkpoints_total_limit"] == "2" and flags["--max_train_steps"] == "1000"
    assert flags["--checkpointing_steps"] == "100" and "--resume_from_checkpoint" not in cmd
    ctx.resume, ctx.resume_step = t.restore_dir(ctx, "checkpoint-300"), 300
    assert ctx.resume == tmp_path / "ck" / "checkpoint-300"
    assert cmd_flag(t.command(ctx), "--resume_from_checkpoint") == "latest"


def cmd_flag(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_diffusers_checkpoint_is_finished_when_accelerate_wrote_rng_and_a_newer_exists(tmp_path):
    t = DiffusersTrainer()
    ctx = _ctx(tmp_path)
    for n in (100, 200):
        d = ctx.checkpoint_dir / f"checkpoint-{n}"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"x")
    (ctx.checkpoint_dir / "checkpoint-100" / "random_states_0.pkl").write_bytes(b"r")
    assert [c.step for c in t.finished(ctx)] == [100]  # 200 is still being written
    (ctx.checkpoint_dir / "checkpoint-200" / "random_states_0.pkl").write_bytes(b"r")
    assert [c.step for c in t.finished(ctx)] == [100]  # ... or might be: wait until it settles
    old = time.time() - 10
    for p in (ctx.checkpoint_dir / "checkpoint-200").iterdir():
        os.utime(p, (old, old))
    os.utime(ctx.checkpoint_dir / "checkpoint-200", (old, old))
    assert [c.step for c in t.finished(ctx)] == [100, 200]


def test_kohya_network_script_resumes_with_skip_and_db_script_gets_remaining_steps(tmp_path):
    t = KohyaTrainer()
    ctx = _ctx(tmp_path, trainer_args={"script": "sdxl_train_network.py", "network_module": "networks.lora"})
    cmd = t.command(ctx)
    assert "--save_state" in cmd and cmd_flag(cmd, "--save_every_n_steps") == "100" and "--resume" not in cmd
    ctx.resume, ctx.resume_step = tmp_path / "restore" / "sdcloud-step00000300-state", 300
    cmd = t.command(ctx)
    assert cmd_flag(cmd, "--resume") == str(ctx.resume) and "--skip_until_initial_step" in cmd
    assert cmd_flag(cmd, "--max_train_steps") == "1000" and t.step_offset == 0

    db = KohyaTrainer()
    ctx.trainer_args = {"script": "sdxl_train.py"}
    cmd = db.command(ctx)
    assert cmd_flag(cmd, "--max_train_steps") == "700" and "--skip_until_initial_step" not in cmd
    assert db.step_offset == 300
    # Its own step 100 is the run's step 400, in folder names and in progress bars.
    d = ctx.checkpoint_dir / "sdcloud-step00000100-state"
    d.mkdir(parents=True)
    (d / "random_states_0.pkl").write_bytes(b"r")
    (ctx.checkpoint_dir / "sdcloud-step00000200-state").mkdir()
    assert [c.step for c in db.finished(ctx)] == [400]
    assert db.parse_line("steps:  14%|█▍  | 100/700 [01:40<10:00, 1.00it/s, avr_loss=0.0812]")["step"] == 400


def test_parse_tqdm_bars():
    p = parse_tqdm("Steps:  5%|▌         | 50/1000 [00:10<03:10, 4.90it/s, loss=0.123, lr=0.0001]")
    assert p == {"step": 50, "it_per_s": 4.9, "loss": 0.123}
    assert parse_tqdm("Steps:  5%| | 50/1000 [00:10<03:10, 2.00s/it]")["it_per_s"] == 0.5
    assert parse_tqdm("loading weights") is None


def test_builtin_and_command_adapters(tmp_path):
    b = BuiltinTrainer()
    ctx = _ctx(tmp_path, trainer_args={"rank": 8, "synthetic": 4}, dataset=tmp_path / "data")
    cmd = b.command(ctx)
    assert cmd[1:3] == ["-m", "sdcloud_agent.trainers.builtin"] and cmd_flag(cmd, "--rank") == "8"
    assert cmd_flag(cmd, "--data-dir") == str(tmp_path / "data") and "--resume-from" not in cmd
    assert cmd_flag(cmd, "--keep-checkpoints") == "2"
    ctx.trainer_args = ["--keep-checkpoints=5", "--data-dir", "/elsewhere"]
    cmd = b.command(ctx)
    assert cmd.count("--data-dir") == 1 and "--keep-checkpoints" not in cmd and "--keep-checkpoints=5" in cmd
    ctx.trainer_args = {"lr_warmup_steps": 10}
    assert cmd_flag(b.command(ctx), "--lr-warmup-steps") == "10"
    ctx.trainer_args = {"rank": 8, "synthetic": 4}
    assert b.parse_line('SDCLOUD_STEP {"step": 7, "loss": 0.5, "it_per_s": 2.0}') == {"step": 7, "loss": 0.5, "it_per_s": 2.0}
    (ctx.checkpoint_dir / ".tmp-step-000000009").mkdir(parents=True)
    (ctx.checkpoint_dir / "step-000000008").mkdir()
    assert [c.step for c in b.finished(ctx)] == [8]

    c = CommandTrainer()
    ctx = _ctx(tmp_path, trainer_args="python train.py --fast")
    assert c.command(ctx) == ["/bin/sh", "-c", "python train.py --fast"]
    ctx.resume, ctx.resume_step = tmp_path / "restore" / "step-5", 5
    env = c.environment(ctx)
    assert env["SDCLOUD_CHECKPOINT_DIR"] == str(tmp_path / "ck") and env["SDCLOUD_RESUME_FROM"].endswith("step-5")


# -- user-data ----------------------------------------------------------------------------------

def test_user_data_carries_the_config_and_no_secrets():
    cfg = {"run_id": "r-1", "attempt": 2, "store": {"url": "s3://b/p"}}
    wheel = "agent/sdcloud_agent-0.1.0+abc-py3-none-any.whl"
    text = render_user_data(cfg, wheel)
    assert text.startswith("#!/bin/bash") and '"run_id":"r-1"' in text and wheel in text
    assert "systemctl enable --now sdcloud-agent.service" in text and "@@" not in text
    assert "pip install" not in text  # nothing installed by name here
    assert len(text.encode()) < 16 * 1024
    with pytest.raises(ValueError, match="secret"):
        render_user_data({**cfg, "store": {"url": "s3://b", "secret_key": "x"}}, wheel)
    with pytest.raises(ValueError, match="credential"):
        render_user_data({**cfg, "trainer_args": {"note": "AKIAIOSFODNN7EXAMPLE"}}, wheel)
    with pytest.raises(ValueError, match="16384-byte"):
        render_user_data({**cfg, "trainer_args": {"prompt": "x" * 4000}}, wheel)
    generic = render_user_data(None)
    assert "pip" not in generic and "systemctl" not in generic  # the template installs nothing


def test_command_trainer_partial_folder_of_a_killed_trainer_is_not_a_checkpoint(tmp_path):
    c = CommandTrainer()
    ctx = _ctx(tmp_path, trainer_args=["true"])
    (ctx.checkpoint_dir / "step-000000010").mkdir(parents=True)
    (ctx.checkpoint_dir / "step-000000020").mkdir()
    (ctx.checkpoint_dir / ".tmp-step-30").mkdir()  # a temp folder never counts
    assert [x.step for x in c.finished(ctx)] == [10]  # 20 may still be written
    assert [x.step for x in c.finished(ctx, trainer_exited=True, killed=True)] == [10]
    assert [x.step for x in c.finished(ctx, trainer_exited=True)] == [10, 20]  # it exited on its own
    c.parse_line('SDCLOUD_CHECKPOINT {"step": 20, "path": "x"}')
    assert [x.step for x in c.finished(ctx, trainer_exited=True, killed=True)] == [10, 20]  # announced
