"""kohya's samples, curves and per-step LoRA through the agent, on the fake sd-scripts network trainer that
writes them as upstream does (`<output_dir>/sample/<name>_<step:06d>_<NN>_<date>_<seed>.png`, the
`-step<N:08d>.safetensors` beside each state, TensorBoard logs under --logging_dir), reclaimed once."""

from __future__ import annotations

import json
import re
import sys
import time

import pytest

from sdcloud_agent.samples import SampleSettings, kohya_prompt_file
from sdcloud_agent.store import open_store
from sdcloud_agent.trainers.base import Context
from sdcloud_agent.trainers.kohya import KohyaTrainer

from tests.agent.trainers.test_kohya_adapter import FAKE_KOHYA, _images
from tests.e2e.test_agent_e2e import AwsMetadataServer, _config, _start_agent
from tests.support.fake_kohya import sample_prompts

pytestmark = pytest.mark.slow  # each module's run takes a few seconds

TRUE = re.compile(r"TRUESTEP (\d+)")
PROMPTS = ["a red cube", "a blue ball"]
WANDB_SECRET = "wandbkey" + "5" * 32


@pytest.fixture(scope="module")
def kohya_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kohya-samples")
    data = _images(tmp / "photos", 10)  # batch 1: an epoch is 10 steps, the checkpoint interval
    store_cfg = {"url": f"file://{tmp}/bucket"}
    store = open_store(store_cfg)
    store.put("runs/e2e/secrets/wandb-key", WANDB_SECRET.encode())  # where the controller puts it
    args = {"launcher": [sys.executable, FAKE_KOHYA], "script": "train_network.py",
            "network_module": "networks.lora", "resolution": "512,512"}
    samples = {"prompts": PROMPTS, "every": 0, "seed": 7, "sampler": "euler", "steps": 20}
    meta = AwsMetadataServer().start()
    codes = []
    try:
        for attempt in (1, 2):
            meta.reset()
            cfg = _config(tmp, attempt, store_cfg, meta.base_url, trainer="kohya", trainer_args=args, steps=30,
                          every=10, dataset=str(data), keep_checkpoints=5, samples=samples, metrics_seconds=0.5,
                          report_to="wandb")
            proc = _start_agent(cfg, {"FAKE_STEP_SECONDS": "0.1"})
            log = tmp / f"work-{attempt}" / f"attempt-{attempt}.log"
            while attempt == 1 and proc.poll() is None:
                text = log.read_text(errors="replace") if log.exists() else ""
                if any(int(n) >= 13 for n in TRUE.findall(text)):
                    meta.announce(120)  # kohya cannot save on a signal: the agent waits for step 20's save
                    break
                time.sleep(0.02)
            _, err = proc.communicate(timeout=180)
            codes.append((proc.returncode, err.decode()[-3000:]))
    finally:
        meta.stop()
    return {"tmp": tmp, "store": store, "codes": codes}


def test_the_kohya_run_was_reclaimed_then_finished(kohya_run):
    assert [c for c, _ in kohya_run["codes"]] == [3, 0], kohya_run["codes"]


def test_kohya_samples_are_in_the_store_two_prompts_at_three_checkpoints(kohya_run):
    from sdcloud.runs.records.samples import list_samples

    got = list_samples(kohya_run["store"], "e2e")
    assert [(s.step, s.index) for s in got] == [(st, i) for st in (10, 20, 30) for i in (0, 1)]
    assert all(s.read_bytes()[:4] == b"\x89PNG" for s in got)
    assert {(s.index, s.prompt, s.seed, s.sampler, s.trainer) for s in got} == \
        {(0, PROMPTS[0], 7, "euler", "kohya"), (1, PROMPTS[1], 8, "euler", "kohya")}


def test_kohya_curves_hold_thirty_steps_and_its_own_logs_are_collected(kohya_run):
    from sdcloud.runs.records.metrics import read_metrics

    store = kohya_run["store"]
    points = read_metrics(store, "e2e")
    assert [p.step for p in points] == list(range(1, 31))
    assert all(p.loss == pytest.approx(0.1) and p.steps_per_s for p in points)
    theirs = [i.key for i in store.list("runs/e2e/tensorboard/trainer/")]
    assert theirs and all("/network_train/events.out.tfevents." in k for k in theirs)


def test_pull_step_gets_kohyas_lora_of_that_step(kohya_run, tmp_path):
    from sdcloud.runs.records.artifacts import kept_checkpoints

    kept = {c["step"]: c for c in kept_checkpoints(kohya_run["store"], "e2e")}
    assert kept[20]["model_files"] == ["export/sdcloud-step00000020.safetensors"]
    assert len(kept[20]["samples"]) == 2
    from tests.support.fake_kohya import load_tensors

    for step in (20, 30):
        key = f"runs/e2e/checkpoints/{step:09d}/export/sdcloud-step{step:08d}.safetensors"
        kohya_run["store"].get_file(key, tmp_path / f"{step}.safetensors")
    a, b = (load_tensors(tmp_path / f"{s}.safetensors") for s in (20, 30))
    assert a.keys() == b.keys() and a != b


def test_the_wandb_key_reaches_kohya_only_through_its_environment(kohya_run):
    tmp, store = kohya_run["tmp"], kohya_run["store"]
    cmd = (tmp / "work-2" / "attempt-2.log").read_text()
    assert "--log_with all" in cmd and WANDB_SECRET not in cmd
    kept = [i.key for i in store.list("runs/e2e/") if i.key.split("/")[2] in ("metrics", "samples", "tensorboard",
                                                                               "logs", "status.json")]
    assert kept
    for key in kept:
        assert WANDB_SECRET.encode() not in store.get(key), key


def test_kohyas_prompt_file_says_each_prompts_seed_as_kohya_reads_it(tmp_path):
    s = SampleSettings(prompts=("a red cube", "a photo of sks, --not an option"), seed=40, steps=12)
    path = kohya_prompt_file(s, tmp_path / "p.txt", 512, 768)
    lines = path.read_text().splitlines()
    assert lines[0] == "a red cube --d 40 --s 12 --w 512 --h 768"
    assert [seed for _, seed in sample_prompts(path)] == [40, 41]


def test_kohyas_command_carries_the_samples_and_its_logging(tmp_path):
    t = KohyaTrainer()
    ctx = Context(steps=30, checkpoint_every=10, model="m", workdir=tmp_path, checkpoint_dir=tmp_path / "c",
                  output_dir=tmp_path / "o", trainer_args={"network_module": "networks.lora", "resolution": "512"},
                  samples=SampleSettings(prompts=("x",), every=20))
    cmd = t.command(ctx)
    flags = dict(zip(cmd, cmd[1:]))
    assert flags["--sample_every_n_steps"] == "20" and flags["--sample_sampler"] == "euler"
    assert flags["--log_with"] == "tensorboard" and flags["--logging_dir"] == str(tmp_path / "trainer-logs")
    assert (tmp_path / "kohya_sample_prompts.txt").read_text().startswith("x --d 0")
    ctx.trainer_args = {**ctx.trainer_args, "log_with": "wandb"}  # the user's own logging wins
    ctx.samples = None
    cmd = KohyaTrainer().command(ctx)
    assert "--sample_prompts" not in cmd and cmd[cmd.index("--log_with") + 1] == "wandb"
    assert "--logging_dir" not in cmd
    assert json.dumps(cmd)  # a plain argv


def test_tensorboard_reads_a_loss_scalar_of_thirty_steps_from_the_pulled_curves(kohya_run, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from sdcloud.runs.records.artifacts import pull_curves

    assert pull_curves(kohya_run["store"], "e2e", tmp_path)
    acc = EventAccumulator(str(tmp_path / "tensorboard" / "sdcloud"))
    acc.Reload()
    assert sorted({e.step for e in acc.Scalars("loss")}) == list(range(1, 31))
