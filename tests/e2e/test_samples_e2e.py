"""What a run makes, seen from the user's side: `up --sample-prompt` on the local provider with the builtin
trainer and the tiny model, reclaimed once, then `samples`, `pull --list`, `pull --step N`, the metrics
stream and the TensorBoard files of the pulled run (docs/training.md, "Samples and curves")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sdcloud_agent.store import open_store

pytestmark = pytest.mark.slow

PROMPTS = ("a red cube", "a blue ball")
HF_SECRET = "hf_" + "Q" * 30 + "samples"
WANDB_SECRET = "wandb0" + "7" * 34


def sdcloud(home: Path, *args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "SDCLOUD_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_TOKEN": HF_SECRET, **(env or {})}
    return subprocess.run([sys.executable, "-m", "sdcloud.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One reclaimed run, 30 steps, a checkpoint every 10, two sample prompts; with the user's HF token
    and W&B key in config.toml, which must never show up in what the run keeps."""
    home = tmp_path_factory.mktemp("samples-home")
    (home / "config.toml").write_text(f'[huggingface]\ntoken = "{HF_SECRET}"\n\n[wandb]\nkey = "{WANDB_SECRET}"\n')
    proc = sdcloud(home, "up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "30",
                   "--checkpoint-every", "10", "--sample-prompt", PROMPTS[0], "--sample-prompt", PROMPTS[1],
                   "--simulate-preemption", "3", "--yes", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["state"] == "succeeded" and out["step"] == 30
    store = open_store({"url": (home / "bucket").as_uri()})
    return {"home": home, "id": out["run"], "store": store, "summary": out}


def test_the_run_was_reclaimed_and_resumed(run):
    status = json.loads(sdcloud(run["home"], "status", run["id"], "--json").stdout)
    assert [a["end_reason"] for a in status["attempts"]] == ["preempted", "succeeded"]


def test_samples_json_lists_two_prompts_at_three_checkpoints_each_a_png_in_the_store(run):
    proc = sdcloud(run["home"], "samples", run["id"], "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)["samples"]
    assert sorted((s["step"], s["index"]) for s in got) == [(st, i) for st in (10, 20, 30) for i in (0, 1)]
    for s in got:
        assert run["store"].get(s["key"])[:8] == b"\x89PNG\r\n\x1a\n"
        assert s["prompt"] == PROMPTS[s["index"]] and s["sampler"] == "euler"
        assert s["width"] == s["height"] == 32


def test_one_prompt_keeps_its_seed_across_checkpoints_and_the_images_change(run):
    got = json.loads(sdcloud(run["home"], "samples", run["id"], "--json").stdout)["samples"]
    seeds = {(s["index"], s["seed"]) for s in got}
    assert seeds == {(0, 0), (1, 1)}  # prompt i renders with seed + i at every step
    first = [s for s in got if s["index"] == 0]
    assert len({run["store"].get(s["key"]) for s in first}) == 3  # the LoRA changed what it draws


def test_samples_of_one_step_and_their_download(run, tmp_path):
    proc = sdcloud(run["home"], "samples", run["id"], "--step", "20", "-o", str(tmp_path / "s"), "--json")
    assert proc.returncode == 0, proc.stderr
    files = json.loads(proc.stdout)["files"]
    assert sorted(Path(f).relative_to(tmp_path / "s").as_posix() for f in files) == \
        ["000000020/00.png", "000000020/01.png"]
    meta = json.loads((tmp_path / "s" / "000000020" / "01.json").read_text())
    assert meta["prompt"] == PROMPTS[1] and meta["seed"] == 1 and meta["step"] == 20


def test_a_sample_costs_its_gpu_seconds(run):
    from sdcloud.runs.records.samples import list_samples, sampling_seconds

    got = list_samples(run["store"], run["id"])
    assert all(s.gpu_s > 0 for s in got)
    assert sampling_seconds(run["store"], run["id"]) == pytest.approx(sum(s.gpu_s for s in got), abs=1e-3)


def test_the_cost_report_counts_the_samples_as_sampling_not_training(run):
    proc = sdcloud(run["home"], "cost", "report", run["id"], "--format", "json")
    assert proc.returncode == 0, proc.stderr
    (r,) = json.loads(proc.stdout)["runs"]
    assert r["losses"]["minutes"]["sampling"] > 0 and r["losses"]["usd"]["sampling"] >= 0


def test_the_metrics_hold_thirty_loss_points_over_both_attempts(run):
    from sdcloud.runs.records.metrics import read_metrics

    points = read_metrics(run["store"], run["id"])
    assert [p.step for p in points] == list(range(1, 31))
    assert all(p.loss is not None and p.loss_smoothed is not None and p.lr for p in points)
    assert {p.attempt for p in points} == {1, 2}
    assert all(p.steps_per_s and p.steps_per_s > 0 for p in points)
    assert [p.time for p in points] == sorted(p.time for p in points)


def test_the_metrics_stream_is_appended_in_objects(run):
    keys = [i.key for i in run["store"].list(f"runs/{run['id']}/metrics/")]
    assert len(keys) >= 3 and any("/0001-" in k for k in keys) and any("/0002-" in k for k in keys)


def test_the_run_events_mark_the_reclaim_and_the_checkpoints_with_the_cost_so_far(run):
    from sdcloud.runs.records.metrics import CHECKPOINT, read_run_events
    from sdcloud.runs.records.state import StateStore

    events = read_run_events(StateStore(run["home"] / "state.db"), run["store"], run["id"])
    kinds = [e.kind for e in events]
    assert "reclaimed" in kinds or "reclaim-notice" in kinds
    assert [e.step for e in events if e.kind == CHECKPOINT][-3:] == [10, 20, 30]
    costs = [e.cost_usd for e in events]
    assert costs == sorted(costs)


def test_pull_list_shows_the_kept_checkpoints_with_their_samples(run):
    proc = sdcloud(run["home"], "pull", run["id"], "--list", "--json")
    assert proc.returncode == 0, proc.stderr
    kept = {c["step"]: c for c in json.loads(proc.stdout)["checkpoints"]}
    assert {10, 20, 30} <= set(kept)
    assert len(kept[20]["samples"]) == 2 and kept[20]["model_files"]
    table = sdcloud(run["home"], "pull", run["id"], "--list").stdout
    assert f"sdcloud samples {run['id']} --step 20" in table


def test_pull_step_20_gives_a_lora_that_differs_from_the_final_and_loads_in_diffusers(run, tmp_path):
    import torch
    from safetensors.torch import load_file

    from sdcloud_agent.trainers import models, tiny

    final, mid = tmp_path / "final", tmp_path / "mid"
    assert sdcloud(run["home"], "pull", run["id"], str(final)).returncode == 0
    proc = sdcloud(run["home"], "pull", run["id"], str(mid), "--step", "20")
    assert proc.returncode == 0, proc.stderr
    name = "pytorch_lora_weights.safetensors"
    assert {name, "lora_kohya.safetensors", "README.md"} <= {p.name for p in mid.iterdir()}
    a, b = load_file(str(mid / name)), load_file(str(final / name))
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)
    assert "20 steps" in (mid / "README.md").read_text()

    pipe = models.pipeline(tiny.build_components(family="sd15"))
    pipe.set_progress_bar_config(disable=True)

    def render():
        return pipe("a red cube", num_inference_steps=2, height=32, width=32, output_type="np",
                    generator=torch.Generator().manual_seed(0)).images[0]

    before = render()
    pipe.load_lora_weights(str(mid))
    assert abs(render() - before).max() > 0


def test_pull_of_a_step_without_a_checkpoint_is_one_line(run, tmp_path):
    proc = sdcloud(run["home"], "pull", run["id"], str(tmp_path / "x"), "--step", "15")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no checkpoint at step 15" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_tensorboard_reads_a_loss_scalar_of_thirty_steps_from_the_pulled_run(run, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    dest = tmp_path / "pulled"
    assert sdcloud(run["home"], "pull", run["id"], str(dest)).returncode == 0
    acc = EventAccumulator(str(dest / "tensorboard" / "sdcloud"))
    acc.Reload()
    assert "loss" in acc.Tags()["scalars"]
    assert sorted({e.step for e in acc.Scalars("loss")}) == list(range(1, 31))


def test_no_secret_in_any_metrics_sample_or_tensorboard_object(run):
    prefix = f"runs/{run['id']}/"
    kept = [i.key for i in run["store"].list(prefix)
            if i.key[len(prefix):].split("/")[0] in ("metrics", "samples", "tensorboard")]
    assert len(kept) > 12
    for key in kept:
        data = run["store"].get(key)
        assert HF_SECRET.encode() not in data and WANDB_SECRET.encode() not in data, key
    logs = b"".join(p.read_bytes() for p in (run["home"] / "local").rglob("*.log"))
    assert HF_SECRET.encode() not in logs and WANDB_SECRET.encode() not in logs


def test_the_same_through_up_with_kohya_on_the_fake_sd_scripts(tmp_path):
    """`up --trainer kohya` with the fake network trainer (its launcher in place of accelerate's), reclaimed:
    kohya's images are the run's samples, its per-step LoRA the model `pull --step` gives."""
    from PIL import Image

    from sdcloud.runs.records.metrics import read_metrics
    from tests.support import SUPPORT
    from tests.support.fake_kohya import load_tensors

    home, photos = tmp_path / "home", tmp_path / "photos"
    photos.mkdir()
    for i in range(10):  # batch 1: an epoch is the checkpoint interval
        Image.new("RGB", (40, 32), (20 * i, 30, 200)).save(photos / f"{i}.png")
    proc = sdcloud(home, "up", "--provider", "local", "--tier", "sd15-lora", "--trainer", "kohya",
                   "--dataset", str(photos), "--trainer-arg", f"launcher={sys.executable} {SUPPORT / 'fake_kohya.py'}",
                   "--trainer-arg", "script=train_network.py", "--trainer-arg", "network_module=networks.lora",
                   "--trainer-arg", "train_batch_size=1", "--steps", "30", "--checkpoint-every", "10",
                   "--sample-prompt", PROMPTS[0], "--sample-prompt", PROMPTS[1], "--simulate-preemption", "2",
                   "--yes", "--json", env={"FAKE_STEP_SECONDS": "0.2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = json.loads(proc.stdout)["run"]
    got = json.loads(sdcloud(home, "samples", run_id, "--json").stdout)["samples"]
    assert sorted((s["step"], s["index"]) for s in got) == [(st, i) for st in (10, 20, 30) for i in (0, 1)]
    assert {s["trainer"] for s in got} == {"kohya"}
    store = open_store({"url": (home / "bucket").as_uri()})
    assert [p.step for p in read_metrics(store, run_id)] == list(range(1, 31))
    assert sdcloud(home, "pull", run_id, str(tmp_path / "mid"), "--step", "20").returncode == 0
    assert sdcloud(home, "pull", run_id, str(tmp_path / "final")).returncode == 0
    mid = load_tensors(tmp_path / "mid" / "sdcloud-step00000020.safetensors")
    final = load_tensors(tmp_path / "final" / "sdcloud.safetensors")
    assert mid.keys() == final.keys() and mid != final


def test_the_same_through_up_with_the_diffusers_scripts_one_validation_prompt(tmp_path):
    """`up --trainer diffusers` with the fake example script, reclaimed: its validation images (one prompt, as
    the scripts take) are the run's samples, filed under the checkpoints they follow."""
    from PIL import Image

    from sdcloud.runs.records.metrics import read_metrics
    from tests.support import SUPPORT

    home, photos = tmp_path / "home", tmp_path / "photos"
    photos.mkdir()
    for i in range(10):
        Image.new("RGB", (40, 32), (20 * i, 30, 200)).save(photos / f"{i}.png")
    proc = sdcloud(home, "up", "--provider", "local", "--tier", "sd15-lora", "--trainer", "diffusers",
                   "--dataset", str(photos), "--trainer-arg", f"launcher={sys.executable} {SUPPORT / 'fake_host.py'}",
                   "--trainer-arg", "script=diffusers", "--trainer-arg", "instance_prompt=a photo of sks toy",
                   "--trainer-arg", "train_batch_size=1", "--steps", "30", "--checkpoint-every", "10",
                   "--sample-prompt", PROMPTS[0], "--sample-seed", "3", "--simulate-preemption", "2", "--yes", "--json",
                   env={"FAKE_STEP_SECONDS": "0.1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = json.loads(proc.stdout)["run"]
    got = json.loads(sdcloud(home, "samples", run_id, "--json").stdout)["samples"]
    kept = {c["step"] for c in json.loads(sdcloud(home, "pull", run_id, "--list", "--json").stdout)["checkpoints"]}
    steps = [s["step"] for s in got]
    # Each filed under the checkpoint step it follows; a reclaim's urgent upload may skip that checkpoint
    # for a newer one (the image is kept all the same) or take the last epoch's image with its host.
    assert 10 in steps and set(steps) <= {10, 20, 30} and len(steps) == len(set(steps)) >= 2
    assert {(s["index"], s["prompt"], s["seed"], s["trainer"]) for s in got} == {(0, PROMPTS[0], 3, "diffusers")}
    store = open_store({"url": (home / "bucket").as_uri()})
    assert [p.step for p in read_metrics(store, run_id)] == list(range(1, 31))
    assert sdcloud(home, "pull", run_id, str(tmp_path / "mid"), "--step", str(min(kept))).returncode == 0
    assert (tmp_path / "mid" / "pytorch_lora_weights.safetensors").is_file()
