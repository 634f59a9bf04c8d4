"""kohya's and the diffusers scripts on a multi-node group: each rank's `accelerate launch` command, read
back by accelerate's own parser (the one `accelerate launch` uses), names the whole world, its own rank
and rank 0's address; the script and its flags are the same on every rank."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from sdcloud_agent.trainers.base import Context
from sdcloud_agent.trainers.diffusers import DiffusersTrainer
from sdcloud_agent.trainers.kohya import KohyaTrainer

launch = pytest.importorskip("accelerate.commands.launch")

ADDR, PORT = "10.0.3.17", 29500


def _ctx(tmp_path: Path, rank: int, nodes: int = 2, gpus: int = 4, args: dict | None = None) -> Context:
    rv = SimpleNamespace(addr=ADDR, port=PORT, nodes=nodes, attempt=3) if nodes > 1 else None
    return Context(steps=100, checkpoint_every=10, model="stabilityai/stable-diffusion-xl-base-1.0",
                   workdir=tmp_path, checkpoint_dir=tmp_path / "ckpt", output_dir=tmp_path / "out",
                   trainer_args=dict(args or {}), gpus=gpus, rendezvous=rv, node_rank=rank)


def _parsed(cmd: list[str]):
    assert cmd[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    return launch.launch_command_parser().parse_args(cmd[3:])


CASES = [(KohyaTrainer, {"script": "/opt/sd-scripts/sdxl_train_network.py", "network_module": "networks.lora",
                         "dataset_config": "/work/ds.toml"}),
         (DiffusersTrainer, {"script": "/opt/diffusers/examples/train_dreambooth_lora_sdxl.py",
                             "instance_data_dir": "/work/data", "instance_prompt": "a photo of sks"})]


@pytest.mark.parametrize("adapter,args", CASES, ids=["kohya", "diffusers"])
def test_each_rank_launches_into_one_world_at_rank_0s_address(adapter, args, tmp_path):
    cmds = [adapter().command(_ctx(tmp_path, rank, args=args)) for rank in (0, 1)]
    for rank, cmd in enumerate(cmds):
        a = _parsed(cmd)
        assert (a.num_machines, a.machine_rank, a.main_process_ip, a.main_process_port) == (2, rank, ADDR, PORT)
        assert a.num_processes == 8 and a.multi_gpu  # the world: 2 hosts x 4 GPUs
        assert a.training_script == args["script"]
    # The script and its flags are the same on every rank; only the rank differs.
    tails = [c[c.index(args["script"]):] for c in cmds]
    assert tails[0] == tails[1]
    assert [x for x in cmds[0] if x not in cmds[1]] == ["0"]


@pytest.mark.parametrize("adapter,args", CASES, ids=["kohya", "diffusers"])
def test_one_host_keeps_its_own_launcher_options(adapter, args, tmp_path):
    cmd = adapter().command(_ctx(tmp_path, 0, nodes=1, gpus=1,
                                 args={**args, "launcher": "accelerate launch --num_processes 1 --mixed_precision bf16"}))
    a = _parsed(cmd)
    assert a.num_processes == 1 and a.num_machines is None and a.main_process_ip is None and a.mixed_precision == "bf16"
    assert "--machine_rank" not in cmd and "--multi_gpu" not in cmd


def test_the_groups_options_replace_the_users_own_and_keep_the_rest(tmp_path):
    args = {**CASES[0][1], "launcher": "accelerate launch --num_processes=1 --num_machines 1 --mixed_precision fp16"}
    cmd = KohyaTrainer().command(_ctx(tmp_path, 1, nodes=3, gpus=1, args=args))
    a = _parsed(cmd)
    assert (a.num_processes, a.num_machines, a.machine_rank, a.mixed_precision) == (3, 3, 1, "fp16")
    assert cmd.count("--num_machines") == 1 and not any(o.startswith("--num_processes=") for o in cmd)
