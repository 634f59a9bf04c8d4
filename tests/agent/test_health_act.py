"""Acting on a health verdict on the host (sdcloud_agent/health_act.py): what each trainer's action
changes, the bounds of a save interval, and local builtin runs whose slow reader and slow saves are
cured by a restart from the checkpoint with the same final weights."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sdcloud_agent import health_act, oom

from tests.support import DATA as TEST_DATA, SUPPORT

# -- local runs: acting on a verdict restarts the trainer from its checkpoint with the cure -----------

def _act_run(tmp: Path, env: dict, steps: int = 24, every: int = 4, dataset: Path | None = None,
             extra: dict | None = None) -> tuple[dict, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = {"run_id": "act", "attempt": 1, "trainer": "builtin", "model": "tiny", "trainer_args": {},
           "steps": steps, "checkpoint_every": every, "keep_checkpoints": 2,
           "store": {"url": f"file://{tmp}/bucket"}, "metadata": {"kind": "none"}, "workdir": str(tmp / "work"),
           "nvme": False, "require_gpu": False, "heartbeat_seconds": 0.3, "poll_seconds": 0.2,
           **({"dataset": str(dataset)} if dataset else {}), **(extra or {})}
    (tmp / "agent.json").write_text(json.dumps(cfg))
    env = {**os.environ, "SDCLOUD_HEALTH_SECONDS": "0.1", "SDCLOUD_HEALTH_ACT_AFTER": "1", **env,
           "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(tmp / "agent.json")],
                          env=env, capture_output=True, timeout=600)
    log = (tmp / "work/attempt-1.log").read_text(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    return json.loads((tmp / "bucket/runs/act/status.json").read_text()), log


def _photos(folder: Path, n: int = 4) -> Path:
    from PIL import Image

    folder.mkdir(parents=True)
    for i in range(n):
        Image.new("RGB", (32, 32), (60 * i, 90, 30)).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"a photo of sks {i}")
    return folder


def _weights(tmp: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(tmp / "work/output/pytorch_lora_weights.safetensors"))


@pytest.mark.slow
def test_each_verdict_leads_to_its_action_and_the_run_finishes(tmp_path):
    # The dataset sits on a "network disk" whose reads are slow, and every save is slow too.
    slow = tmp_path / "netdisk"
    data = _photos(slow / "photos")
    status, log = _act_run(tmp_path / "run", {"SDCLOUD_TRAINER_READ_DELAY": "0.3", "SDCLOUD_TRAINER_SLOW_DIR": str(slow),
                                              "SDCLOUD_TRAINER_SAVE_PAUSE": "0.6"},
                           steps=20, every=2, dataset=data, extra={"checkpoint_every_max": 6})
    io, save = status["health_actions"]
    # io-bound first: the dataset moves to the working disk; judged again, it no longer waits for data.
    assert io["cause"] == "io-bound" and io["before"]["data_wait_pct"] >= 30
    assert any("dataset copied" in c for c in io["changes"]) and io["resume_step"] > 0
    assert io["still"] is False and io["after"]["data_wait_pct"] < 30
    assert (tmp_path / "run/work/dataset-local").is_dir()
    # Then save-bound: the interval doubles within the user's bound of 6 steps.
    assert save["cause"] == "save-bound" and save["before"]["save_pct"] >= 15
    assert "save interval 2 -> 4 steps" in " ".join(save["changes"]) and save["resume_step"] >= io["resume_step"]
    assert "--checkpoint-every 4" in log.split("for save-bound")[1]
    assert status["phase"] == "succeeded" and status["step"] == 20
    # (the weights against a run without the trouble: tests/e2e/test_health_e2e.py, on the local provider)


@pytest.mark.slow
def test_a_still_io_bound_run_says_so_with_its_read_rate(tmp_path):
    data = _photos(tmp_path / "run" / "work" / "photos")  # already on the working disk: nothing to move
    status, log = _act_run(tmp_path / "run", {"SDCLOUD_TRAINER_READ_DELAY": "0.3"}, steps=8, every=8, dataset=data)
    (act,) = status["health_actions"]
    assert act["cause"] == "io-bound" and act["still"] is True and not act["changes"]
    assert "nothing left to change" in act["why_not"] and "read rate" in log
    assert status["phase"] == "succeeded"


# -- the plans, per trainer ------------------------------------------------------------------------

def test_io_plan_per_trainer(tmp_path):
    fast, net = tmp_path / "work", tmp_path / "net" / "photos"
    fast.mkdir()
    net.mkdir(parents=True)
    kargs = {"script": "sdxl_train_network.py", "network_module": "networks.lora", "network_train_unet_only": True}
    ladder = oom.Ladder("kohya", kargs, script_options=oom.script_options("kohya", kargs))
    cache = ladder._try("cache-latents", oom.Recipe())[1]
    p = health_act.plan_io("kohya", kargs, dataset=net, fast_dir=fast, vcpus=16,
                           options=oom.script_options("kohya", kargs), cache_change=cache)
    assert p.dataset == fast / "dataset-local" and p.rung == "cache-latents"
    assert p.flags == {"max_data_loader_n_workers": 16, "persistent_data_loader_workers": True}
    assert "data loader workers 8 -> 16" in " ".join(p.changes) and "text-encoder outputs cached" in " ".join(p.changes)
    dargs = {"script": "train_dreambooth_lora_sdxl.py", "instance_prompt": "sks", "dataloader_num_workers": 2}
    p = health_act.plan_io("diffusers", dargs, dataset=fast, fast_dir=fast, vcpus=8,
                           options=oom.script_options("diffusers", dargs), cache_change=None)
    assert p.dataset is None and p.flags == {"dataloader_num_workers": 8} and p.restarts
    p = health_act.plan_io("builtin", {}, dataset=fast, fast_dir=fast, vcpus=8, options=None, cache_change=None)
    assert not p.restarts and "reads it from memory" in p.why_not


def test_save_plan_grows_within_the_users_bound_and_the_reclaim_risk(tmp_path):
    d = tmp_path / "c"
    p = health_act.plan_save(every=100, bound=150, step_s=1.0, save_s=5.0, notice_s=120.0, mean_s=7200.0,
                             checkpoint_dir=d, fast_dir=tmp_path)
    assert p.checkpoint_every == 150 and "user's bound of 150" in p.changes[1]
    # A 143 s save does not fit a 120 s notice: Young/Daly at a mean of 2 h between reclaims is 1435 s
    # (1195 steps): an interval of 1200 cannot grow.
    p = health_act.plan_save(every=1200, bound=None, step_s=1.2, save_s=143.0, notice_s=120.0, mean_s=7200.0,
                             checkpoint_dir=d, fast_dir=tmp_path)
    assert p.checkpoint_every is None and "cannot grow" in p.why_not and "Young/Daly" in p.why_not
    p = health_act.plan_save(every=500, bound=None, step_s=1.2, save_s=143.0, notice_s=120.0, mean_s=7200.0,
                             checkpoint_dir=d, fast_dir=tmp_path)
    assert p.checkpoint_every == 1000 and "reclaim risk" in p.changes[1]
    assert health_act.plan_save(every=4, bound=None, step_s=None, save_s=None, notice_s=None, mean_s=None,
                                checkpoint_dir=d, fast_dir=tmp_path).checkpoint_every == 8


def test_kohya_io_bound_caches_latents_after_its_next_checkpoint_and_loses_no_step(tmp_path):
    """kohya does not report its data wait: an idle GPU while it trains (a recorded report at 0%)
    is io-bound; the action (cached latents through the ladder's rung) waits for the next periodic
    checkpoint, then restarts from it, and the run's weights are those of a run without the stop."""
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(6):
        (photos / f"{i}.png").write_bytes(b"png")
    args = {"launcher": [sys.executable, str(SUPPORT / "fake_kohya.py")], "script": "sdxl_train_network.py",
            "network_module": "networks.lora", "resolution": "64,64", "network_train_unet_only": True}

    def run(where: Path, env: dict) -> str:
        cfg = {"run_id": "k", "attempt": 1, "trainer": "kohya", "steps": 24, "checkpoint_every": 5, "trainer_args": args,
               "store": {"url": f"file://{where}/bucket"}, "metadata": {"kind": "none"}, "dataset": str(photos),
               "workdir": str(where / "work"), "nvme": False, "require_gpu": False,
               "heartbeat_seconds": 0.2, "poll_seconds": 0.2}
        where.mkdir()
        (where / "agent.json").write_text(json.dumps(cfg))
        proc = subprocess.run([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(where / "agent.json")],
                              env={**os.environ, "FAKE_STEP_SECONDS": "0.1", **env}, capture_output=True, timeout=300)
        log = (where / "work/attempt-1.log").read_text(errors="replace")
        assert proc.returncode == 0, log[-3000:]
        return log

    log = run(tmp_path / "run", {"SDCLOUD_HEALTH_SECONDS": "0.05", "SDCLOUD_HEALTH_ACT_AFTER": "0.5",
                                 "SDCLOUD_HEALTH_SMI_FILE": str(TEST_DATA / "nvidia-smi-q/deepracer-58-idle-table.txt")})
    status = json.loads((tmp_path / "run/bucket/runs/k/status.json").read_text())
    (act,) = status["health_actions"]
    assert act["cause"] == "io-bound" and act["before"]["gpu_util"] == 0
    assert any("latents cached and text-encoder outputs cached" in c for c in act["changes"])
    # It waited for the next periodic checkpoint (at or past the step it decided at) before the stop.
    assert act["resume_step"] % 5 == 0 and act["resume_step"] >= act["step"] > 0
    after = log.split("restarting the trainer from step")[1]
    assert "--cache_latents" in after and "--cache_text_encoder_outputs" in after and "--resume" in after
    assert act["still"] is True  # the recorded GPU stays idle: said plainly
    true = [int(n) for n in re.findall(r"TRUESTEP (\d+)", after)]
    assert true[0] == act["resume_step"] + 1 and true[-1] == 24
    from sdcloud_agent.trainers import safetensors_keys as st

    ref_log = run(tmp_path / "ref", {})
    assert "restarting the trainer" not in ref_log
    got = st.tensors(tmp_path / "run/bucket/runs/k/artifacts/sdcloud.safetensors")
    want = st.tensors(tmp_path / "ref/bucket/runs/k/artifacts/sdcloud.safetensors")
    assert got == want
