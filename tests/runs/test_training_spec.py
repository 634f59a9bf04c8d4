"""What a run trains, settled before launch: the model and its family against the tier, the
dataset layout, the trainer flags end to end (a mapping stays a mapping), required flags, and
`sdcloud pull`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdcloud.cli import main
from sdcloud.runs.driving.controller import agent_config
from sdcloud.runs.inputs.spec import build_spec


def _photos(folder: Path, n: int = 3, size=(48, 40)) -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.new("RGB", size, (60 * i, 30, 90)).save(folder / f"p{i}.png")
    return folder


def _single_file(path: Path, prefix: str) -> Path:
    import torch
    from safetensors.torch import save_file

    save_file({f"{prefix}.weight": torch.zeros(1), "model.diffusion_model.input_blocks.0.0.weight": torch.zeros(1)},
              str(path))
    return path


def test_a_trainer_args_mapping_and_trainer_arg_flags_reach_the_agent_whole(tmp_path, sdcloud_home):
    from sdcloud_agent.trainers.base import Context
    from sdcloud_agent.trainers.kohya import KohyaTrainer

    rf = tmp_path / "run.yaml"
    rf.write_text("tier: sdxl-lora\ntrainer: kohya\nmodel: stabilityai/stable-diffusion-xl-base-1.0\n"
                  "trainer_args:\n  network_dim: 32\n  learning_rate: 0.0002\n  network_module: networks.lora\n")
    photos = _photos(tmp_path / "photos")
    spec = build_spec(str(rf), {"trainer_arg": ["network_alpha=8", "noise_offset=0.05", "cache_latents=false"],
                                "dataset": str(photos)})
    cfg = agent_config(spec, "r1", 1, 100, {"url": "file:///tmp/x"})
    args = cfg["trainer_args"]
    # Keys AND values (a mapping was once cut down to its keys), the tier's defaults under them.
    assert args["network_dim"] == 32 and args["learning_rate"] == 0.0002 and args["network_alpha"] == "8"
    assert args["noise_offset"] == "0.05" and args["cache_latents"] is False
    assert args["resolution"] == "1024,1024" and args["gradient_checkpointing"] is True
    assert args["script"] == "sdxl_train_network.py" and args["optimizer_type"] == "AdamW8bit"
    json.dumps(cfg)  # it travels as JSON
    ctx = Context(steps=100, checkpoint_every=10, model=cfg["model"], workdir=tmp_path / "w",
                  checkpoint_dir=tmp_path / "w" / "ck", output_dir=tmp_path / "w" / "out", dataset=photos,
                  trainer_args=json.loads(json.dumps(args)))
    cmd = KohyaTrainer().command(ctx)
    flags = dict(zip(cmd, cmd[1:]))
    assert flags["--network_dim"] == "32" and flags["--noise_offset"] == "0.05" and "--cache_latents" not in cmd
    assert flags["--dataset_config"].endswith("kohya_dataset.toml")


def test_builtin_gets_the_tier_family_mode_resolution_and_batch(sdcloud_home):
    spec = build_spec(None, {"tier": "sdxl-dreambooth", "provider": "local", "model": "tiny",
                             "trainer_arg": ["validation-prompt=a dog"]})
    args = agent_config(spec, "r1", 1, 10, {"url": "file:///tmp/x"})["trainer_args"]
    # A mapping from --trainer-arg; tiny keeps its 32 px but takes the tier's family and mode.
    assert args["family"] == "sdxl" and args["mode"] == "dreambooth" and args["batch-size"] == 1
    sd2 = build_spec(None, {"tier": "sd15-lora", "provider": "local", "model": "tiny-sd2"})  # SD 2.x: an sd15 tier
    sd2_args = agent_config(sd2, "r3", 1, 10, {"url": "file:///tmp/x"})["trainer_args"]
    assert sd2_args[sd2_args.index("--family") + 1] == "sd15,sd2"
    assert "resolution" not in args and args["validation-prompt"] == "a dog"
    real = build_spec(None, {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1"})
    assert real.spec.model == "stable-diffusion-v1-5/stable-diffusion-v1-5"
    args = agent_config(real, "r2", 1, 10, {"url": "file:///tmp/x"})["trainer_args"]
    assert "--resolution" in args and args[args.index("--resolution") + 1] == "512"
    assert args[args.index("--batch-size") + 1] == "2"


def test_family_detection_without_the_network(tmp_path):
    from sdcloud_agent.trainers import models, tiny

    assert models.detect_family("stabilityai/stable-diffusion-xl-base-1.0") == "sdxl"
    assert models.detect_family("someone/my-sdxl-anime-v3") == "sdxl"
    assert models.detect_family("someone/unknown-model") is None  # the host's loader decides
    assert models.detect_family("s3://bucket/models/x.safetensors") is None
    assert models.detect_family(str(tiny.save_pipeline(tmp_path / "m", family="sdxl"))) == "sdxl"
    assert models.detect_family(str(_single_file(tmp_path / "xl.safetensors", "conditioner.embedders.1.model"))) == "sdxl"
    assert models.detect_family(str(_single_file(tmp_path / "v2.safetensors", "cond_stage_model.model.x"))) == "sd2"
    assert models.detect_family(str(_single_file(tmp_path / "v1.safetensors", "cond_stage_model.transformer.x"))) == "sd15"


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory):
    from sdcloud_agent.trainers import tiny

    tmp_path = tmp_path_factory.mktemp("bad")
    empty = tmp_path / "empty"
    empty.mkdir()
    broken = _photos(tmp_path / "broken")
    (broken / "p1.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    garbled = _photos(tmp_path / "garbled")
    (garbled / "p1.png").write_bytes(b"not an image at all")
    stray = _photos(tmp_path / "stray")
    (stray / "notes.docx").write_bytes(b"x")
    return {"sd15": str(tiny.save_pipeline(tmp_path / "sd15")), "empty": str(empty), "broken": str(broken),
            "garbled": str(garbled), "stray": str(stray), "photos": str(_photos(tmp_path / "ok")),
            "v1file": str(_single_file(tmp_path / "v1.safetensors", "cond_stage_model.transformer.x"))}


@pytest.mark.parametrize("args, needle", [
    (["--tier", "sdxl-lora", "--model", "{sd15}"], "is an sd15 model but tier sdxl-lora trains sdxl"),
    (["--tier", "sdxl-lora", "--provider", "aws", "--model", "{v1file}", "--yes"], "is an sd15 model"),
    (["--tier", "sd15-lora", "--model", "tiny-sdxl"], "is an sdxl model"),
    (["--tier", "sd15-lora", "--dataset", "{empty}"], "no images"),
    (["--tier", "sd15-lora", "--provider", "ssh", "--model", "./no-such-model"], "no such file or folder"),
    (["--tier", "sd15-lora", "--provider", "aws", "--model", "{empty}/gone.safetensors", "--yes"], "no such file"),
    (["--tier", "sd15-lora", "--provider", "aws", "--model", "{empty}", "--yes"], "an empty folder"),
    (["--tier", "sd15-lora", "--dataset", "{broken}"], "unreadable image(s): p1.png (OSError: Truncated File Read)"),
    # Pillow's why, not a piece of the path it repeats (it was cut to "...files/garb)").
    (["--tier", "sd15-lora", "--dataset", "{garbled}"], "unreadable image(s): p1.png (UnidentifiedImageError: "
                                                         "cannot identify image file)"),
    (["--tier", "sd15-lora", "--dataset", "{stray}"], "notes.docx"),
    (["--tier", "sdxl-lora", "--trainer", "kohya", "--model", "stabilityai/stable-diffusion-xl-base-1.0"],
     "--trainer-arg dataset_config"),
    (["--tier", "sdxl-lora", "--trainer", "kohya", "--dataset", "{photos}", "--trainer-arg", "network_module=",
      "--model", "stabilityai/stable-diffusion-xl-base-1.0"], "--trainer-arg network_module"),
    (["--tier", "sdxl-lora", "--trainer", "diffusers", "--dataset", "{photos}",
      "--model", "stabilityai/stable-diffusion-xl-base-1.0"], "--trainer-arg instance_prompt"),
    (["--tier", "sdxl-lora", "--provider", "aws", "--model", "tiny", "--yes"], "--model tiny-sdxl"),
    (["--tier", "sd15-lora", "--trainer-arg", "=3"], "KEY=VALUE"),
    # Launched, it failed three boots in a row on "needs trainer_args: the command line".
    (["--tier", "sd15-lora", "--trainer", "command"], "trainer command needs the command to run"),
    (["--tier", "sd15-lora", "--trainer", "command", "--trainer-arg", "save_signal=SIGUSR1"], "--trainer-arg command="),
])
def test_bad_training_input_is_one_line_exit_2_nothing_launched(capsys, sdcloud_home, bad_inputs, args, needle):
    capsys.readouterr()
    code = main(["up", *[a.format(**bad_inputs) for a in args]])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert err.count("\n") == 1 and needle in err, err
    assert not (sdcloud_home / "local" / "hosts").exists()


def test_pull_downloads_the_artifacts(tmp_path, sdcloud_home, capsys):
    from sdcloud.runs.records.state import StateStore
    from sdcloud_agent.store import open_store

    spec = build_spec(None, {"tier": "sd15-lora", "provider": "local"})
    StateStore().create_run("run-abc", "sd15-lora", spec.as_dict(), 10)
    assert main(["pull", "run-abc", str(tmp_path / "none")]) == 2  # nothing there yet
    store = open_store((sdcloud_home / "bucket").resolve().as_uri())
    store.put("runs/run-abc/artifacts/pytorch_lora_weights.safetensors", b"lora" * 10)
    store.put("runs/run-abc/artifacts/README.md", b"# readme\n")
    store.put("runs/run-abc/checkpoints/000000010/x", b"not an artifact")
    capsys.readouterr()
    assert main(["pull", "run-abc", str(tmp_path / "got")]) == 0
    assert (tmp_path / "got" / "pytorch_lora_weights.safetensors").read_bytes() == b"lora" * 10
    assert sorted(p.name for p in (tmp_path / "got").iterdir()) == ["README.md", "pytorch_lora_weights.safetensors"]
    assert "2 file(s)" in capsys.readouterr().out


def test_a_one_gpu_trainer_is_not_estimated_as_if_it_used_every_gpu(sdcloud_home):
    from sdcloud.offers.catalog import load_catalog
    from sdcloud.offers.optimizer import rank
    from sdcloud.offers.tiers import get_tier
    from sdcloud.runs.inputs.training import gpus_used

    tier = get_tier("sdxl-lora")
    every = {e.offer.key: e for e in rank(tier, load_catalog(["aws"]), region="us-east-1")}
    one = {e.offer.key: e for e in rank(tier, load_catalog(["aws"]), region="us-east-1", gpus_used=1)}
    multi = [k for k, e in every.items() if e.offer.row.gpu_count >= 4]
    single = [k for k, e in every.items() if e.offer.row.gpu_count == 1]
    assert multi and single, "the bundled catalog has 1- and multi-GPU hosts"
    # One GPU's speed at the whole host's price; 1-GPU hosts are estimated as before.
    assert all(one[k].est_hours > every[k].est_hours for k in multi)
    assert all(one[k].est_hours == every[k].est_hours for k in single)
    builtin = build_spec(None, {"tier": "sdxl-lora", "provider": "aws", "region": "us-east-1"}).spec
    assert gpus_used(builtin) is None  # one process per GPU
    kohya = build_spec(None, {"tier": "sdxl-lora", "provider": "aws", "region": "us-east-1", "trainer": "kohya",
                              "dataset": None, "trainer_arg": ["dataset_config=/d.toml"]}).spec
    assert gpus_used(kohya) == 1
    kohya.trainer_args["launcher"] = ["accelerate", "launch", "--num_processes", "4"]
    assert gpus_used(kohya) == 4


def test_builtin_runs_one_process_per_gpu_through_accelerate(tmp_path):
    from sdcloud_agent.trainers.base import Context
    from sdcloud_agent.trainers.builtin_adapter import BuiltinTrainer

    t = BuiltinTrainer()
    ctx = Context(steps=10, checkpoint_every=5, model="tiny", workdir=tmp_path, checkpoint_dir=tmp_path / "c",
                  output_dir=tmp_path / "o", gpus=4)
    cmd = t.command(ctx)
    assert cmd[1:4] == ["-m", "accelerate.commands.launch", "--multi_gpu"]
    assert cmd[cmd.index("--num_processes") + 1] == "4" and t.signal_group
    ctx.gpus = 1
    cmd = t.command(ctx)
    assert cmd[1:3] == ["-m", "sdcloud_agent.trainers.builtin"] and not t.signal_group
