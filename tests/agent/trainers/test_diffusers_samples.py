"""The diffusers scripts' validation images, curves and per-checkpoint LoRA through the agent, on the fake
script that validates as they do (one --validation_prompt after every --validation_epochs-th epoch, logged
to its TensorBoard tracker after that epoch's checkpoint), reclaimed once."""

from __future__ import annotations

import re
import sys
import time

import pytest

from sdcloud_agent.samples import SampleSettings
from sdcloud_agent.store import open_store
from sdcloud_agent.trainers.base import Context
from sdcloud_agent.trainers.diffusers import DiffusersTrainer

from tests.agent.trainers.test_kohya_adapter import _images
from tests.e2e.test_agent_e2e import FAKE, AwsMetadataServer, _config, _start_agent

pytestmark = pytest.mark.slow  # each module's run takes a few seconds

FAKESTEP = re.compile(r"FAKESTEP (\d+)")
PROMPT = "a photo of sks toy"


@pytest.fixture(scope="module")
def diffusers_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("diffusers-samples")
    data = _images(tmp / "photos", 10)  # batch 1: an epoch is 10 steps
    store_cfg = {"url": f"file://{tmp}/bucket"}
    store = open_store(store_cfg)
    args = {"launcher": [sys.executable, FAKE], "script": "diffusers", "instance_prompt": "a photo of sks toy"}
    samples = {"prompts": [PROMPT], "every": 0, "seed": 5, "sampler": "euler", "steps": 20}
    meta = AwsMetadataServer().start()
    codes = []
    try:
        for attempt in (1, 2):
            meta.reset()
            cfg = _config(tmp, attempt, store_cfg, meta.base_url, trainer="diffusers", trainer_args=args, steps=30,
                          every=10, dataset=str(data), keep_checkpoints=5, samples=samples, metrics_seconds=0.5)
            proc = _start_agent(cfg, {"FAKE_STEP_SECONDS": "0.1"})
            log = tmp / f"work-{attempt}" / f"attempt-{attempt}.log"
            while attempt == 1 and proc.poll() is None:
                text = log.read_text(errors="replace") if log.exists() else ""
                if any(int(n) >= 13 for n in FAKESTEP.findall(text)):
                    meta.announce(120)
                    break
                time.sleep(0.02)
            _, err = proc.communicate(timeout=180)
            codes.append((proc.returncode, err.decode()[-3000:]))
    finally:
        meta.stop()
    return {"tmp": tmp, "store": store, "codes": codes}


def test_the_diffusers_run_was_reclaimed_then_finished(diffusers_run):
    assert [c for c, _ in diffusers_run["codes"]] == [3, 0], diffusers_run["codes"]


def test_its_validation_images_are_samples_of_the_checkpoints(diffusers_run):
    from sdcloud.runs.records.artifacts import kept_checkpoints
    from sdcloud.runs.records.samples import list_samples

    store = diffusers_run["store"]
    got = list_samples(store, "e2e")
    steps = [s.step for s in got]
    # An epoch's validation runs after its checkpoint: the first one's went up with the next checkpoint
    # (or at the end); the one of the checkpoint the reclaim stopped at may be lost with its host, and a
    # reclaim's urgent upload may skip a checkpoint for a newer one (its image is kept all the same).
    assert 10 in steps and len(steps) >= 2 and len(steps) == len(set(steps))
    kept = {c["step"] for c in kept_checkpoints(store, "e2e")}
    assert set(steps) <= {10, 20, 30} and 10 in kept
    for s in got:
        assert s.read_bytes()[:4] == b"\x89PNG"
        assert (s.index, s.prompt, s.seed, s.trainer) == (0, PROMPT, 5, "diffusers")


def test_its_curves_and_its_trackers_logs_are_kept(diffusers_run):
    from sdcloud.runs.records.metrics import read_metrics

    store = diffusers_run["store"]
    points = read_metrics(store, "e2e")
    assert [p.step for p in points] == list(range(1, 31))
    assert points[-1].loss == pytest.approx(1 / 30, abs=1e-4)
    theirs = [i.key for i in store.list("runs/e2e/tensorboard/trainer/")]
    assert theirs and all("/dreambooth-lora-sd-xl/events.out.tfevents." in k for k in theirs)
    assert not [i.key for i in store.list("runs/e2e/artifacts/") if "tfevents" in i.key]


def test_pull_step_gets_the_lora_the_script_saved_in_that_checkpoint(diffusers_run):
    from sdcloud.runs.records.artifacts import kept_checkpoints

    kept = {c["step"]: c for c in kept_checkpoints(diffusers_run["store"], "e2e")}
    assert kept[20]["model_files"] == ["pytorch_lora_weights.safetensors"]
    a, b = (diffusers_run["store"].get(f"runs/e2e/checkpoints/{s:09d}/pytorch_lora_weights.safetensors")
            for s in (20, 30))
    assert a != b


def test_the_scripts_get_one_validation_prompt_its_seed_and_an_interval_in_epochs(tmp_path):
    data = _images(tmp_path / "photos", 4)  # an epoch: 2 steps at batch 2
    ctx = Context(steps=40, checkpoint_every=10, model="m", workdir=tmp_path, checkpoint_dir=tmp_path / "c",
                  output_dir=tmp_path / "o", dataset=data, trainer_args={"instance_prompt": "sks", "train_batch_size": 2},
                  samples=SampleSettings(prompts=("a red cube",), seed=11))
    cmd = DiffusersTrainer().command(ctx)
    flags = dict(zip(cmd, cmd[1:]))
    assert flags["--validation_prompt"] == "a red cube" and flags["--seed"] == "11"
    assert flags["--validation_epochs"] == "5" and flags["--num_validation_images"] == "1"
    assert flags["--report_to"] == "tensorboard"
    ctx.report_to = "wandb"
    cmd = DiffusersTrainer().command(ctx)
    assert cmd[cmd.index("--report_to") + 1] == "all"


def test_tensorboard_reads_a_loss_scalar_of_thirty_steps_from_the_pulled_curves(diffusers_run, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from sdcloud.runs.records.artifacts import pull_curves

    assert pull_curves(diffusers_run["store"], "e2e", tmp_path)
    acc = EventAccumulator(str(tmp_path / "tensorboard" / "sdcloud"))
    acc.Reload()
    assert sorted({e.step for e in acc.Scalars("loss")}) == list(range(1, 31))
