"""`sdcloud up --nodes 2` on the local provider, end to end: two agent processes as two hosts meet
through the run's bucket and train the builtin trainer data-parallel (gloo); a reclaim of node 1
(the group's second host) stops both at one step with one checkpoint; the group resumes on two
fresh hosts and finishes with the weights a single host trains with the same global batch."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from sdcloud.cli import main
from tests.support.server_seaweed import agent_processes

pytestmark = pytest.mark.slow

STEPS = 16


def sdcloud(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sdcloud.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _stopped_at(log: str) -> set[int]:
    return {int(s) for s in re.findall(r"stopped by signal 15 at global step (\d+)", log)}


def test_two_hosts_meet_stop_together_resume_and_equal_one_host(sdcloud_home, tmp_path, capsys):
    from safetensors.torch import load_file

    # One host with the whole global batch (2 samples a step), the flags the group's rank 0 gets
    # otherwise (checked below), trained beside the group.
    ref_flags = {"--model": "tiny", "--steps": str(STEPS), "--checkpoint-every": "100",
                 "--checkpoint-dir": str(tmp_path / "ck"), "--output": str(tmp_path / "out"),
                 "--keep-checkpoints": "2", "--family": "sd15,sd2", "--mode": "lora", "--batch-size": "2"}
    ref = subprocess.Popen([sys.executable, "-m", "sdcloud_agent.trainers.builtin",
                            *[x for kv in ref_flags.items() for x in kv]], cwd=tmp_path, stdout=subprocess.DEVNULL,
                           stderr=open(tmp_path / "ref.err", "wb"), env={**os.environ, "HF_HUB_OFFLINE": "1"},
                           preexec_fn=lambda: os.nice(10))  # it takes the CPU the group's hosts leave
    up = sdcloud("up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", str(STEPS),
                 "--checkpoint-every", "100", "--nodes", "2", "--simulate-preemption", "1",
                 "--trainer-arg", "batch_size=1", "--trainer-arg", "min_step_seconds=0.3", "--yes", "--json")
    assert up.returncode == 0, up.stderr[-3000:]
    out = json.loads(up.stdout)
    run = out["run"]
    assert out["state"] == "succeeded" and out["step"] == STEPS
    assert [a["end_reason"] for a in out["attempts"]] == ["preempted", "succeeded"]
    assert out["attempts"][0]["instance_id"] != out["attempts"][1]["instance_id"]  # fresh hosts
    assert out["nodes_per_attempt"] == 2 and len(out["node_hours"]) == 4
    # No host outlives the run (the reference trainer beside it is no host: it may still be training).
    assert not [pid for pid in agent_processes(f"SDCLOUD_HOME={sdcloud_home}") if pid != ref.pid]

    prefix = sdcloud_home / "bucket" / "runs" / run
    for attempt in (1, 2):  # rank 0 published where each attempt's group met
        rv = json.loads((prefix / "rendezvous" / f"{attempt}.json").read_text())
        assert rv["addr"] == "127.0.0.1" and rv["nodes"] == 2 and rv["attempt"] == attempt
    rank0 = (prefix / "logs" / "attempt-1.log").read_text()
    node1 = (prefix / "nodes" / "1" / "logs" / "attempt-1.log").read_text()
    # Node 1 alone was reclaimed; rank 0 stopped with the group.
    assert "reclaim notice" in node1 and "another host of the group was reclaimed" in rank0
    assert "another host of the group was reclaimed" not in node1
    # Both hosts stopped at one step; rank 0 saved that step's checkpoint and no other.
    (step,) = _stopped_at(rank0)
    assert _stopped_at(node1) == {step} and 0 < step < STEPS
    assert re.findall(r'SDCLOUD_CHECKPOINT \{"step": (\d+)', rank0) == [str(step)]
    assert sorted(p.name for p in (prefix / "checkpoints").iterdir()) == [f"{step:09d}", f"{STEPS:09d}"]
    # The fresh group resumed from it: rank 0 restored it, node 1 joined the new rendezvous.
    assert f"restored checkpoint {step} " in (prefix / "logs" / "attempt-2.log").read_text()
    assert "joining rank 0 at 127.0.0.1" in (prefix / "nodes" / "1" / "logs" / "attempt-2.log").read_text()

    assert main(["status", run, "--json"]) == 0  # in this process: a CLI start costs seconds here
    st = json.loads(capsys.readouterr().out)
    assert [(n["node"], n["phase"], n["step"]) for n in st["nodes"]] == [(0, "succeeded", STEPS), (1, "succeeded", STEPS)]
    assert main(["logs", run, "--node", "1"]) == 0
    one = capsys.readouterr().out
    assert "node-1/attempt-2" in one and "controller" not in one

    cmd = shlex.split(re.search(r"starting trainer: (.*)", rank0).group(1))
    group = dict(zip(cmd[3::2], cmd[4::2]))  # after `python -m sdcloud_agent.trainers.builtin`
    assert {k: v for k, v in group.items() if k not in ("--checkpoint-dir", "--output", "--min-step-seconds")} == \
        {**{k: v for k, v in ref_flags.items() if k not in ("--checkpoint-dir", "--output")}, "--batch-size": "1"}
    assert ref.wait(timeout=300) == 0, (tmp_path / "ref.err").read_text()[-3000:]
    two = load_file(str(prefix / "artifacts" / "pytorch_lora_weights.safetensors"))
    single = load_file(str(tmp_path / "out" / "pytorch_lora_weights.safetensors"))
    assert two.keys() == single.keys()
    worst = max(float((two[k] - single[k]).abs().max()) for k in two)
    assert worst <= 1e-6, worst
