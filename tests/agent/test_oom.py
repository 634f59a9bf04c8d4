"""CUDA out-of-memory healed on the host (sdcloud_agent/oom.py): recorded trainer output is
recognised, each trainer's ladder climbs through its own flags, the builtin trainer that runs out
of memory is restarted from its checkpoint with the next rung, and a spent ladder moves the run to
an offer with more VRAM."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from sdcloud.runs.driving.owner import Memo
from sdcloud_agent import oom
from sdcloud_agent.trainers import options

from tests.support import DATA as TEST_DATA, SUPPORT

DATA = TEST_DATA / "oom"


# -- recognising it ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, peak, total", [
    ("kohya-sdxl-rich-traceback.txt", 10.92, 11.76),
    ("kohya-sdxl-train-torch2.txt", 39.55, 39.56),
    ("kohya-network-runtimeerror.txt", 7.21, 8.0),
    ("diffusers-dreambooth-sd3.txt", 39.55, 39.56),
    ("diffusers-flux-lora.txt", 79.08, 79.15),
])
def test_recorded_trainer_oom_output_is_recognised_with_its_memory(name, peak, total):
    seen = oom.scan((DATA / name).read_text())
    assert seen is not None
    assert "out of memory" in seen.line.lower()
    assert seen.peak_gb == pytest.approx(peak, abs=0.01)
    assert seen.total_gb == pytest.approx(total, abs=0.01)


def test_a_traceback_that_is_not_an_oom_is_not_taken_for_one():
    assert oom.scan((DATA / "not-oom.txt").read_text()) is None


def test_the_builtin_trainers_oom_line_carries_torchs_peak():
    d = oom.Detector()
    assert d.feed('SDCLOUD_OOM {"step": 7, "peak_gb": 14.2, "total_gb": 14.58, "error": "CUDA out of memory."}')
    assert (d.seen.peak_gb, d.seen.total_gb) == (14.2, 14.58)


# -- the ladder, per trainer ---------------------------------------------------------------------

def _climb(ladder: oom.Ladder) -> list[tuple[str, object]]:
    r, out = oom.Recipe(), []
    while (nxt := ladder.step(r)) is not None:
        r, rung, _ = nxt
        out.append((rung, ladder.apply(r)))
    return out


def test_kohya_ladder_uses_kohyas_flags_each_accepted_by_the_pinned_script():
    args = {"script": "sdxl_train_network.py", "network_module": "networks.lora", "train_batch_size": 4,
            "network_train_unet_only": True}
    steps = _climb(oom.Ladder("kohya", args, script_options=oom.script_options("kohya", args), has_bitsandbytes=True))
    assert [s[0] for s in steps] == ["gradient-checkpointing", "8bit-optimizer", "cache-latents",
                                     "half-batch", "half-batch"]
    last = steps[-1][1]
    assert last["gradient_checkpointing"] is True and last["optimizer_type"] == "AdamW8bit"
    assert last["cache_latents"] is True and last["cache_text_encoder_outputs"] is True
    assert (last["train_batch_size"], last["gradient_accumulation_steps"]) == (1, 4)  # effective 4 kept
    accepted = options.script_options("kohya", "sdxl_train_network.py")
    flags = [k for _, a in steps for k in a if k not in ("script",)]
    assert not options.problems("kohya", "sdxl_train_network.py", {k: last[k] for k in last if k != "script"})
    assert all(f"--{k}" in accepted for k in flags)


def test_kohya_without_bitsandbytes_takes_adafactor_and_keeps_text_encoders_when_trained():
    args = {"script": "sdxl_train_network.py", "network_module": "networks.lora"}
    steps = _climb(oom.Ladder("kohya", args, script_options=oom.script_options("kohya", args), has_bitsandbytes=False))
    last = steps[-1][1]
    assert last["optimizer_type"] == "Adafactor" and "relative_step=False" in last["optimizer_args"]
    # Text encoders are trained here (no --network_train_unet_only): their outputs are not cached.
    assert last["cache_latents"] is True and "cache_text_encoder_outputs" not in last


def test_diffusers_ladder_passes_over_what_the_example_scripts_lack():
    args = {"script": "train_dreambooth_lora_sdxl.py", "instance_prompt": "sks", "train_batch_size": 2,
            "gradient_accumulation_steps": 3}
    steps = _climb(oom.Ladder("diffusers", args, script_options=oom.script_options("diffusers", args),
                              has_bitsandbytes=True))
    assert [s[0] for s in steps] == ["gradient-checkpointing", "8bit-optimizer", "half-batch"]
    last = steps[-1][1]
    assert last["use_8bit_adam"] is True and last["gradient_checkpointing"] is True
    assert (last["train_batch_size"], last["gradient_accumulation_steps"]) == (1, 6)
    assert not options.problems("diffusers", "train_dreambooth_lora_sdxl.py",
                                {k: v for k, v in last.items() if k != "script"})


def test_builtin_ladder_through_its_argparse_flags():
    from sdcloud_agent.trainers.builtin import build_parser

    steps = _climb(oom.Ladder("builtin", {"batch_size": 6}, has_bitsandbytes=False, cuda=False))
    assert [s[0] for s in steps] == ["gradient-checkpointing", "8bit-optimizer", "half-batch", "half-batch"]
    last = steps[-1][1]
    assert last["optimizer"] == "adafactor"  # no bitsandbytes on this host
    assert (last["batch-size"], last["grad-accum"]) == (1, 6)
    from sdcloud_agent.trainers.builtin_adapter import BuiltinTrainer
    from sdcloud_agent.trainers.base import Context

    ctx = Context(steps=10, checkpoint_every=5, model="tiny", workdir=Path("/w"), checkpoint_dir=Path("/w/c"),
                  output_dir=Path("/w/o"), trainer_args=last)
    argv = BuiltinTrainer().command(ctx)[3:]
    a = build_parser().parse_args(argv)
    assert a.gradient_checkpointing and a.optimizer == "adafactor" and a.optimizer_change
    assert (a.batch_size, a.grad_accum) == (1, 6)


def test_an_argv_list_gets_the_rungs_at_its_end_and_a_rung_already_on_is_passed_over():
    ladder = oom.Ladder("builtin", ["--gradient-checkpointing", "--batch-size", "2"], has_bitsandbytes=True)
    r, rung, change = ladder.step(oom.Recipe())
    assert rung == "8bit-optimizer" and "AdamW8bit" in change
    assert ladder.apply(r) == ["--gradient-checkpointing", "--batch-size", "2", "--optimizer", "adamw8bit",
                               "--optimizer-change"]
    r, rung, _ = ladder.step(r)
    assert rung == "half-batch" and ladder.apply(r)[-4:] == ["--batch-size", "1", "--grad-accum", "2"]
    assert ladder.step(r) is None  # a micro-batch of 1: the ladder is spent


def test_a_plain_command_is_not_restarted_but_one_that_reads_the_recipe_is():
    assert oom.Ladder("command", ["python", "train.py"]).step(oom.Recipe()) is None
    ladder = oom.Ladder("command", {"command": ["t"], "memory_ladder": True, "batch_size": 2})
    r, rung, _ = ladder.step(oom.Recipe())
    assert rung == "gradient-checkpointing"
    assert json.loads(oom.environment(r)["SDCLOUD_MEMORY_RECIPE"])["gradient_checkpointing"] is True


def test_the_recipe_is_kept_in_the_runs_prefix_and_read_by_the_next_attempt(tmp_path):
    from sdcloud_agent.store import open_store

    store = open_store(f"file://{tmp_path}/bucket")
    h = oom.Healer("builtin", {}, store=store, run_prefix="runs/r1", cuda=False)
    assert h.start() == ({}, {})
    ev = h.climb(oom.OomSeen("CUDA out of memory", peak_gb=14.1), step=6)
    assert ev["rung"] == "gradient-checkpointing" and ev["peak_gb"] == 14.1 and ev["resume_step"] == 6
    nxt = oom.Healer("builtin", {}, store=store, run_prefix="runs/r1", cuda=False)
    args, _ = nxt.start()
    assert args == {"gradient-checkpointing": True}
    assert nxt.climb(None, step=6)["rung"] == "8bit-optimizer"  # the next OOM climbs on from there


# -- the acceptance: a builtin run that runs out of memory heals on the host ----------------------

def _agent(tmp: Path, attempt: int, steps: int, every: int, env: dict, trainer_args=None) -> tuple[int, dict, str]:
    cfg = {"run_id": "oomrun", "attempt": attempt, "trainer": "builtin", "model": "tiny",
           "trainer_args": trainer_args or {}, "steps": steps, "checkpoint_every": every, "keep_checkpoints": 3,
           "store": {"url": f"file://{tmp}/bucket"}, "metadata": {"kind": "none"},
           "workdir": str(tmp / f"work-{attempt}"), "nvme": False, "require_gpu": False,
           "heartbeat_seconds": 0.5, "poll_seconds": 0.2}
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"agent-{attempt}.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.run([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(path)],
                          env={**os.environ, **env}, capture_output=True, timeout=900)
    status = json.loads((tmp / "bucket/runs/oomrun/status.json").read_text())
    log = (tmp / f"work-{attempt}" / f"attempt-{attempt}.log").read_text(errors="replace")
    return proc.returncode, status, log


@pytest.mark.slow
def test_builtin_trainer_out_of_memory_restarts_on_the_host_with_the_next_rung(tmp_path):
    from safetensors.torch import load_file

    # OOM from step 5 on unless gradient checkpointing is on: checkpoints at 2 and 4 exist by then.
    rc, status, log = _agent(tmp_path, 1, 8, 2, {"SDCLOUD_TRAINER_OOM_AT": "5:gradient_checkpointing"})
    assert rc == 0, log[-3000:]
    assert status["phase"] == "succeeded" and status["oom_retries"] == 1
    ev = status["oom_events"][0]
    assert ev["rung"] == "gradient-checkpointing" and ev["change"] == "gradient checkpointing on"
    assert ev["resume_step"] == 4 and "out of memory" in ev["error"].lower()
    assert "resumed from" in log and "at global step 4" in log
    assert "--gradient-checkpointing" in log.split("with rung gradient-checkpointing")[1]
    # Exactly from the checkpoint: the same weights as a run with the recipe from the start.
    rc2, _, log2 = _agent(tmp_path / "ref", 1, 8, 2, {}, trainer_args={"gradient_checkpointing": True})
    assert rc2 == 0, log2[-3000:]
    got = load_file(str(tmp_path / "work-1/output/pytorch_lora_weights.safetensors"))
    ref = load_file(str(tmp_path / "ref/work-1/output/pytorch_lora_weights.safetensors"))
    assert got.keys() == ref.keys()
    for k in got:
        assert got[k].allclose(ref[k], atol=1e-6), k
    # The recipe is kept: the run's next attempt starts with it and never runs out of memory.
    assert json.loads((tmp_path / "bucket/runs/oomrun/recipe.json").read_text())["rungs"] == ["gradient-checkpointing"]
    rc3, status3, log3 = _agent(tmp_path, 2, 10, 2, {"SDCLOUD_TRAINER_OOM_AT": "5:gradient_checkpointing"})
    assert rc3 == 0, log3[-3000:]
    assert "memory recipe kept from an earlier attempt: gradient-checkpointing" in log3
    assert not status3.get("oom_events")


@pytest.mark.slow
def test_a_spent_ladder_ends_the_attempt_with_reason_out_of_memory(tmp_path):
    rc, status, log = _agent(tmp_path, 1, 6, 2, {"SDCLOUD_TRAINER_OOM_AT": "3:no_such_flag"})
    assert rc == 1
    assert status["phase"] == "failed" and status["failure_cause"] == "out-of-memory" and status["oom_spent"]
    # CPU: gradient checkpointing, then Adafactor; the micro-batch is already 1.
    assert [e["rung"] for e in status["oom_events"]] == ["gradient-checkpointing", "8bit-optimizer"]
    assert status["reason"].startswith("out-of-memory: the memory ladder is spent")


# -- the controller: a spent ladder moves the run to more VRAM ------------------------------------

def _offer(itype: str, vram_gb: float, zone: str = "us-east-1a"):
    from sdcloud.offers.catalog import CatalogRow
    from sdcloud.offers.optimizer import Offer

    row = CatalogRow(provider="aws", region="us-east-1", zone=zone, instance_type=itype, gpu="x", gpu_count=1,
                     vram_gb=vram_gb, vcpus=8, memory_gb=32, nvme_gb=0, ondemand_price=1.0, spot_price=0.4,
                     currency="USD", interruption_band=1, snapshot_date="2026-01-01", ondemand_estimate=False,
                     spot_estimate=False, source="test")
    return Offer(row, "spot")


def test_candidates_with_more_vram_than_the_offer_that_ran_out():
    from sdcloud.fleet.candidates import vram_of, with_more_vram, zone_key

    offers = [_offer("g4dn.xlarge", 16), _offer("g4dn.xlarge", 16, "us-east-1b"), _offer("g5.xlarge", 24),
              _offer("g6e.xlarge", 48)]
    have = vram_of(offers, zone_key(offers[0]))
    assert have == 16 * 1024
    assert [o.row.instance_type for o in with_more_vram(offers, have)] == ["g5.xlarge", "g6e.xlarge"]


class _Ctrl:
    def __init__(self, offers):
        self.fleet = SimpleNamespace(candidates=offers, cooled=[], cool_down=lambda k, r: self.fleet.cooled.append((k, r)))
        self.events, self.ended, self.run_end, self.run_id = [], [], None, "r"
        self.memo = Memo()
        self.state = SimpleNamespace(update_run=lambda rid, **f: self.events.append(("update_run", f)))

    def set_state(self, state):
        self.state.update_run(self.run_id, state=state)

    def event(self, kind, data):
        self.events.append((kind, data))

    def end_attempt(self, cur, reason):
        self.ended.append(reason)

    def end_run(self, state, reason):
        self.run_end = (state, reason)


def test_spent_ladder_cools_the_offer_and_moves_to_more_vram():
    from sdcloud.runs.driving import oom_move

    offers = [_offer("g4dn.xlarge", 16), _offer("g5.xlarge", 24)]
    ctrl = _Ctrl(offers)
    cur = SimpleNamespace(n=1, provider="aws", region="us-east-1", zone="us-east-1a", instance_type="g4dn.xlarge")
    status = {"phase": "failed", "failure_cause": "out-of-memory",
              "oom_events": [{"n": 1, "rung": "gradient-checkpointing", "change": "gradient checkpointing on",
                              "peak_gb": 14.9, "resume_step": 40}]}
    assert oom_move.is_out_of_memory(status)
    oom_move.on_out_of_memory(ctrl, cur, status)
    assert ctrl.ended == ["out-of-memory"]
    assert ctrl.fleet.cooled == [("aws/us-east-1/us-east-1a/g4dn.xlarge", "out-of-memory")]
    assert [o.row.instance_type for o in ctrl.fleet.candidates] == ["g5.xlarge"]
    assert ctrl.run_end is None
    kinds = [k for k, _ in ctrl.events]
    assert kinds.count("oom-retry") == 1 and "out-of-memory" in kinds
    # On the bigger GPU it spends its ladder again: nothing bigger is left, the run ends in one line.
    cur2 = SimpleNamespace(n=2, provider="aws", region="us-east-1", zone="us-east-1a", instance_type="g5.xlarge")
    oom_move.on_out_of_memory(ctrl, cur2, status)
    assert ctrl.run_end[0] == "failed" and "no candidate offer has more VRAM" in ctrl.run_end[1]


# -- the external trainers' recorded OOM output, through the agent ----------------------------------

OOM_FAKE = str(SUPPORT / "fake_oom_trainer.py")


def _external(tmp: Path, trainer: str, script: str, cure: str, text: str, extra_args: dict | None = None,
              env_extra: dict | None = None) -> tuple[int, dict, str]:
    cfg = {"run_id": "oomx", "attempt": 1, "trainer": trainer,
           "trainer_args": {"launcher": [sys.executable, OOM_FAKE], "script": script, **(extra_args or {})},
           "steps": 12, "checkpoint_every": 5, "keep_checkpoints": 3,
           "store": {"url": f"file://{tmp}/bucket"}, "metadata": {"kind": "none"},
           "workdir": str(tmp / "work"), "nvme": False, "require_gpu": False,
           "heartbeat_seconds": 0.5, "poll_seconds": 0.2}
    (tmp / "agent.json").write_text(json.dumps(cfg))
    env = {**os.environ, "FAKE_STEP_SECONDS": "0.05", "FAKE_OOM_AT": "7", "FAKE_OOM_CURE": cure,
           "FAKE_OOM_TEXT": str(DATA / text), **(env_extra or {})}
    proc = subprocess.run([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(tmp / "agent.json")],
                          env=env, capture_output=True, timeout=300)
    status = json.loads((tmp / "bucket/runs/oomx/status.json").read_text())
    return proc.returncode, status, (tmp / "work/attempt-1.log").read_text(errors="replace")


def test_diffusers_script_oom_restarts_with_gradient_checkpointing_from_its_checkpoint(tmp_path):
    rc, status, log = _external(tmp_path, "diffusers", "diffusers", "--gradient_checkpointing",
                                "diffusers-dreambooth-sd3.txt")
    assert rc == 0, log[-3000:]
    (ev,) = status["oom_events"]
    assert ev["rung"] == "gradient-checkpointing" and ev["resume_step"] == 5 and ev["peak_gb"] == 39.55
    steps = [int(x) for x in re.findall(r"FAKESTEP (\d+)", log)]
    assert steps == [1, 2, 3, 4, 5, 6, 6, 7, 8, 9, 10, 11, 12]  # the second run takes up at checkpoint 5
    assert "--resume_from_checkpoint latest" in log.split("with rung gradient-checkpointing")[1]


def test_kohya_script_oom_climbs_to_cached_latents_with_kohyas_flags(tmp_path):
    rc, status, log = _external(tmp_path, "kohya", "sdxl_train.py", "--cache_latents",
                                "kohya-sdxl-train-torch2.txt")
    assert rc == 0, log[-3000:]
    # sdxl_train.py resumes only with its optimizer state: after a checkpoint the optimizer rung
    # would load AdamW's state into Adafactor; it is passed over, with that reason.
    assert [e["rung"] for e in status["oom_events"]] == ["gradient-checkpointing", "cache-latents"]
    assert all(e["resume_step"] == 5 for e in status["oom_events"])
    (passed,) = status["oom_events"][1]["passed_over"]
    assert passed["rung"] == "8bit-optimizer" and "optimizer's state" in passed["why"]
    last = log.split("with rung cache-latents")[1]
    assert "--gradient_checkpointing" in last and "--cache_latents" in last and "--optimizer_type" not in last
    steps = [int(x) for x in re.findall(r"FAKESTEP (\d+)", log)]
    assert steps[-6:] == [7, 8, 9, 10, 11, 12] and steps.count(6) == 3  # each restart from 5


def test_a_rung_the_builtin_trainers_gpu_recipe_already_has_is_passed_over():
    d = oom.Detector()
    d.feed('SDCLOUD_START {"step": 0, "total_steps": 10, "resumed_from": null, "recipe": '
           '{"gradient_checkpointing": true, "optimizer": "adamw8bit", "batch_size": 1, "grad_accum": 4}}')
    assert d.feed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB.")
    h = oom.Healer("builtin", {"batch_size": 4}, cuda=True)
    # The GPU's recipe already checkpoints, uses AdamW8bit and a micro-batch of 1: nothing is left.
    assert h.climb(d.seen, step=0, effective=d.effective) is None
    h2 = oom.Healer("builtin", {"batch_size": 4}, cuda=True)
    ev = h2.climb(d.seen, step=0, effective={**d.effective, "batch_size": 2, "grad_accum": 2})
    assert ev["rung"] == "half-batch" and h2.args()[0]["batch-size"] == 1 and h2.args()[0]["grad-accum"] == 4


def test_diffusers_oom_after_a_checkpoint_passes_over_the_optimizer_rung_with_its_reason(tmp_path):
    rc, status, log = _external(tmp_path, "diffusers", "diffusers", "--train_batch_size=1",
                                "diffusers-dreambooth-sd3.txt", {"train_batch_size": 2})
    assert rc == 0, log[-3000:]
    # (the fake's script name is not in the options table: cache-latents is tried too)
    assert [e["rung"] for e in status["oom_events"]] == ["gradient-checkpointing", "cache-latents", "half-batch"]
    (passed,) = status["oom_events"][1]["passed_over"]
    assert passed["rung"] == "8bit-optimizer" and "--resume_from_checkpoint" in passed["why"]
    assert "--use_8bit_adam" not in log and "KeyError: " not in log
    assert "rung 8bit-optimizer passed over" in log


def test_the_diffusers_fake_fails_as_bitsandbytes_does_on_adamws_state(tmp_path):
    env = {**os.environ, "FAKE_STEP_SECONDS": "0", "FAKE_OOM_AT": "99", "FAKE_OOM_CURE": "--x",
           "FAKE_OOM_TEXT": str(DATA / "diffusers-flux-lora.txt")}
    out = tmp_path / "out"
    first = [sys.executable, OOM_FAKE, "diffusers", "--output_dir", str(out), "--max_train_steps", "2",
             "--checkpointing_steps", "2"]
    assert subprocess.run(first, env=env, capture_output=True).returncode == 0
    again = [*first[:-4], "--max_train_steps", "4", "--checkpointing_steps", "2", "--resume_from_checkpoint", "latest"]
    eightbit = subprocess.run([*again, "--use_8bit_adam"], env=env, capture_output=True, text=True)
    assert eightbit.returncode == 1 and "KeyError: 'state1'" in eightbit.stderr
    assert subprocess.run(again, env=env, capture_output=True).returncode == 0  # AdamW on AdamW's state


# -- kohya's network scripts: the optimizer rung starts a fresh optimizer at the checkpoint --------

KOHYA_FAKE = str(SUPPORT / "fake_kohya.py")


def _kohya_images(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True)
    for i in range(n):
        (folder / f"{i}.png").write_bytes(b"png")
        (folder / f"{i}.txt").write_text(f"photo {i}")
    return folder


def test_kohya_optimizer_rung_starts_fresh_from_the_checkpoints_weights_and_step(tmp_path):
    from sdcloud_agent.trainers import safetensors_keys as st

    data = _kohya_images(tmp_path / "photos", 6)
    args = {"launcher": [sys.executable, KOHYA_FAKE], "script": "sdxl_train_network.py",
            "network_module": "networks.lora", "resolution": "64,64"}
    cfg = {"run_id": "oomk", "attempt": 1, "trainer": "kohya", "trainer_args": args, "steps": 12,
           "checkpoint_every": 5, "keep_checkpoints": 3, "store": {"url": f"file://{tmp_path}/bucket"},
           "metadata": {"kind": "none"}, "workdir": str(tmp_path / "work"), "dataset": str(data), "nvme": False,
           "require_gpu": False, "heartbeat_seconds": 0.5, "poll_seconds": 0.2}
    (tmp_path / "agent.json").write_text(json.dumps(cfg))
    # OOM from step 7 on unless the optimizer changes; states are "module."-prefixed as under DDP.
    env = {**os.environ, "FAKE_STEP_SECONDS": "0.02", "FAKE_OOM_AT": "7", "FAKE_OOM_CURE": "--optimizer_type",
           "FAKE_OOM_TEXT": str(DATA / "kohya-network-runtimeerror.txt"), "FAKE_DDP": "1"}
    proc = subprocess.run([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(tmp_path / "agent.json")],
                          env=env, capture_output=True, timeout=300)
    log = (tmp_path / "work/attempt-1.log").read_text(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    status = json.loads((tmp_path / "bucket/runs/oomk/status.json").read_text())
    assert [e["rung"] for e in status["oom_events"]] == ["gradient-checkpointing", "8bit-optimizer"]
    ev = status["oom_events"][1]
    assert ev["fresh_optimizer"] and ev["resume_step"] == 5 and "Adafactor" in ev["change"]
    last = log.split("with rung 8bit-optimizer")[1]
    assert "--network_weights" in last and "--initial_step 5" in last and "--resume " not in last
    assert [int(n) for n in re.findall(r"TRUESTEP (\d+)", last)] == list(range(6, 13))
    # The reference: AdamW to the checkpoint, then the final recipe (Adafactor) from its weights and step.
    toml = str(tmp_path / "work/kohya_dataset.toml")
    ref = tmp_path / "ref"
    base = [sys.executable, KOHYA_FAKE, "--network_module", "networks.lora", "--dataset_config", toml,
            "--output_name", "sdcloud", "--output_dir", str(ref)]
    quiet = {k: v for k, v in env.items() if not k.startswith("FAKE_OOM") and k != "FAKE_DDP"}
    assert subprocess.run([*base, "--max_train_steps", "5", "--save_state", "--save_every_n_steps", "5"],
                          env=quiet, capture_output=True).returncode == 0
    (ref / "sdcloud.safetensors").unlink()
    done = subprocess.run([*base, "--max_train_steps", "12", "--optimizer_type", "Adafactor", "--initial_step", "5",
                           "--skip_until_initial_step", "--network_weights",
                           str(ref / "sdcloud-step00000005-state/model.safetensors")],
                          env=quiet, capture_output=True)
    assert done.returncode == 0, done.stderr[-2000:]
    got = st.tensors(tmp_path / "bucket/runs/oomk/artifacts/sdcloud.safetensors")
    want = st.tensors(ref / "sdcloud.safetensors")
    assert got.keys() == want.keys()
    import struct

    for k in got:
        a = struct.unpack(f"<{len(got[k][2]) // 4}f", got[k][2])
        b = struct.unpack(f"<{len(want[k][2]) // 4}f", want[k][2])
        assert all(abs(x - y) <= 1e-6 for x, y in zip(a, b)), (k, a, b)
    # The kept recipe says where the optimizer changed: a later attempt resuming from state 5 starts fresh.
    recipe = json.loads((tmp_path / "bucket/runs/oomk/recipe.json").read_text())
    assert recipe["optimizer"] == "adafactor" and recipe["optimizer_step"] == 5


def test_the_kohya_fake_fails_as_adafactor_does_on_adamws_state(tmp_path):
    data = _kohya_images(tmp_path / "p" / "1_x", 2)
    base = [sys.executable, KOHYA_FAKE, "--network_module", "networks.lora", "--train_data_dir", str(data.parent),
            "--output_name", "o", "--output_dir", str(tmp_path / "o"), "--save_state", "--save_every_n_steps", "2"]
    env = {**os.environ, "FAKE_STEP_SECONDS": "0"}
    assert subprocess.run([*base, "--max_train_steps", "2"], env=env, capture_output=True).returncode == 0
    state = str(tmp_path / "o/o-step00000002-state")
    bad = subprocess.run([*base, "--max_train_steps", "4", "--resume", state, "--optimizer_type", "Adafactor"],
                         env=env, capture_output=True, text=True)
    assert bad.returncode == 1 and "KeyError: 'exp_avg_sq_row'" in bad.stderr


def test_text_encoder_outputs_are_not_cached_when_kohyas_assert_would_fail(tmp_path):
    base = {"script": "sdxl_train_network.py", "network_module": "networks.lora", "network_train_unet_only": True}
    opts = oom.script_options("kohya", base)
    r, _, change = oom.Ladder("kohya", base, script_options=opts).step(
        oom.Recipe(rungs=["gradient-checkpointing", "8bit-optimizer"]))
    assert ("text-encoder outputs cached" in change
            and oom.Ladder("kohya", base, script_options=opts).apply(r).get("cache_text_encoder_outputs") is True)
    for blocker in ({"shuffle_caption": True}, {"caption_dropout_rate": 0.1}, {"token_warmup_step": 10},
                    {"caption_tag_dropout_rate": 0.2}):
        ladder = oom.Ladder("kohya", {**base, **blocker}, script_options=opts)
        r, rung, change = ladder.step(oom.Recipe(rungs=["gradient-checkpointing", "8bit-optimizer"]))
        assert rung == "cache-latents" and "text-encoder" not in change
        assert "cache_text_encoder_outputs" not in ladder.apply(r) and ladder.apply(r)["cache_latents"] is True
        assert ladder.passed[0]["rung"] == "cache-text-encoder-outputs" and next(iter(blocker)) in ladder.passed[0]["why"]
    toml = tmp_path / "ds.toml"
    toml.write_text('[[datasets]]\nresolution = 1024\n[[datasets.subsets]]\nimage_dir = "x"\nshuffle_caption = true\n')
    ladder = oom.Ladder("kohya", {**base, "dataset_config": str(toml)}, script_options=opts)
    r, _, _ = ladder.step(oom.Recipe(rungs=["gradient-checkpointing", "8bit-optimizer"]))
    assert "cache_text_encoder_outputs" not in ladder.apply(r) and "ds.toml" in ladder.passed[0]["why"]
