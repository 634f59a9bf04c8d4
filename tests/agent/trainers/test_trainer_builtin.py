"""The builtin trainer, run for real (tiny random SD model, CPU) as the agent runs it: a child in its
own process group, driven by flags, signals and the checkpoint folder, read through stdout."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sdcloud_agent.trainers import builtin

N = 24  # steps of the reference run: long enough that a signal sent at step 2 lands before the end


class Run:
    """One trainer process; stdout protocol lines parsed as they arrive."""

    def __init__(self, cwd: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.cwd = cwd
        self.stderr_path = cwd / f"stderr-{time.monotonic_ns()}.txt"
        # One intra-op thread: on a busy 2-core machine OpenMP's spinning threads slow a step
        # five-fold, and a fixed thread count keeps CPU results bitwise reproducible.
        full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})}
        for var in ("SDCLOUD_RESUME_FROM", "SDCLOUD_CHECKPOINT_DIR", "SDCLOUD_OUTPUT_DIR"):
            if var not in (env or {}):
                full_env.pop(var, None)
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sdcloud_agent.trainers.builtin", *args], cwd=cwd,
                env=full_env, stdout=subprocess.PIPE, stderr=err, text=True,
                start_new_session=True)
        self.events: list[tuple[str, dict]] = []
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            kind, _, payload = line.strip().partition(" ")
            assert kind.startswith("SDCLOUD_"), f"non-protocol line on stdout: {line!r}"
            self._q.put((kind.removeprefix("SDCLOUD_"), json.loads(payload)))
        self._q.put(None)

    def _pull(self, timeout: float) -> tuple[str, dict] | None:
        ev = self._q.get(timeout=timeout)
        if ev is not None:
            self.events.append(ev)
        return ev

    def wait_for(self, kind: str, pred=lambda p: True, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            ev = self._pull(max(0.01, deadline - time.monotonic()))
            if ev is None:
                raise AssertionError(f"trainer ended before {kind}: {self.stderr()}")
            if ev[0] == kind and pred(ev[1]):
                return ev[1]

    def finish(self, timeout: float = 120) -> int:
        rc = self.proc.wait(timeout=timeout)
        while self._pull(timeout=10) is not None:
            pass
        return rc

    def steps(self) -> list[int]:
        return [p["step"] for k, p in self.events if k == "STEP"]

    def of(self, kind: str) -> list[dict]:
        return [p for k, p in self.events if k == kind]

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-3000:]


def caught(pid: int, sig: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (sig - 1)))
    return False


def lora(output: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(output / "pytorch_lora_weights.safetensors"))


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        # Same ops in the same order on the same CPU: bitwise equal, not merely close.
        assert (a[k] == b[k]).all(), f"{k} differs by {(a[k] - b[k]).abs().max()}"


def assert_complete(ckpt: Path, step: int) -> None:
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["global_step"] == step and ckpt.name == f"step-{step:09d}"
    for name, size in state["files"].items():
        assert (ckpt / name).stat().st_size == size
    assert {"lora.safetensors", "optimizer.pt", "scheduler.pt", "rng.json",
            "rng.safetensors"} <= set(state["files"])


def common(tmp: Path, steps: int = N) -> list[str]:
    return ["--model", "tiny", "--steps", str(steps), "--synthetic", "6", "--batch-size", "2",
            "--resolution", "32", "--seed", "7", "--checkpoint-dir", str(tmp / "ckpt"),
            "--output", str(tmp / "out")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Run, Path]:
    """An uninterrupted N-step run, checkpointing every 5 steps."""
    tmp = tmp_path_factory.mktemp("reference")
    run = Run(tmp, *common(tmp), "--checkpoint-every", "5")
    assert run.finish() == 0, run.stderr()
    return run, tmp


def test_trains_and_writes_loadable_lora(reference):
    run, tmp = reference
    (start,) = run.of("START")
    assert {k: start[k] for k in ("step", "total_steps", "resumed_from")} == {"step": 0, "total_steps": N,
                                                                               "resumed_from": None}
    # The memory settings in force (on CPU: no recipe, the flags' defaults), for the OOM ladder.
    assert start["recipe"] == {"gradient_checkpointing": False, "optimizer": "adamw", "batch_size": 2,
                               "grad_accum": 1}
    assert run.steps() == list(range(1, N + 1))
    assert [c["step"] for c in run.of("CHECKPOINT")] == [5, 10, 15, 20, N]
    for c in run.of("CHECKPOINT"):
        assert_complete(Path(c["path"]), c["step"])
    assert run.of("DONE") == [{"step": N, "output": str((tmp / "out").resolve())}]
    assert all(p["loss"] > 0 and p["it_per_s"] > 0 for p in run.of("STEP"))
    w = lora(tmp / "out")
    # Diffusers' LoRA layout; B ("up") starts at zero, so a non-zero up weight proves training.
    assert w and all(k.startswith("unet.") for k in w)
    ups = [v for k, v in w.items() if "lora.up" in k or "lora_B" in k]
    assert ups and all(v.abs().max() > 0 for v in ups)
    assert not list((tmp / "ckpt").glob(".tmp-*"))


def test_sigterm_saves_checkpoint_and_exits_143_then_resume_matches(tmp_path, reference):
    ref_run, ref_tmp = reference
    first = Run(tmp_path, *common(tmp_path))
    first.wait_for("STEP", lambda p: p["step"] >= 2)
    os.killpg(first.proc.pid, signal.SIGTERM)
    assert first.finish() == 143, first.stderr()
    (ckpt,) = first.of("CHECKPOINT")
    k = ckpt["step"]
    assert k < N, "the signal arrived after training ended: nothing was interrupted"
    assert first.steps() == list(range(1, k + 1))  # the step in flight finished, then the save
    assert_complete(Path(ckpt["path"]), k)
    assert not first.of("DONE") and not (tmp_path / "out").exists()

    # Resume twice from the same checkpoint: both continue at k+1 and end where the reference did.
    for attempt in ("a", "b"):
        out = tmp_path / f"out-{attempt}"
        run = Run(tmp_path, *common(tmp_path), "--output", str(out),
                  env={"SDCLOUD_RESUME_FROM": ckpt["path"]})
        assert run.finish() == 0, run.stderr()
        assert run.of("START")[0]["step"] == k
        assert run.steps() == list(range(k + 1, N + 1))
        # The same losses as the uninterrupted run at the same steps: same data order and noise.
        ref_loss = {p["step"]: p["loss"] for p in ref_run.of("STEP")}
        assert all(ref_loss[p["step"]] == p["loss"] for p in run.of("STEP"))
        assert_same_weights(lora(out), lora(ref_tmp / "out"))


def test_sigusr1_saves_and_continues(tmp_path, reference):
    _, ref_tmp = reference
    run = Run(tmp_path, *common(tmp_path))
    run.wait_for("STEP", lambda p: p["step"] >= 2)
    os.killpg(run.proc.pid, signal.SIGUSR1)
    ckpt = run.wait_for("CHECKPOINT")
    assert ckpt["step"] < N, "the signal arrived after training ended"
    assert_complete(Path(ckpt["path"]), ckpt["step"])
    assert run.finish() == 0, run.stderr()
    assert run.steps() == list(range(1, N + 1))
    assert [c["step"] for c in run.of("CHECKPOINT")] == [ckpt["step"], N]
    assert_same_weights(lora(tmp_path / "out"), lora(ref_tmp / "out"))  # saving changed nothing


def test_kill9_during_save_leaves_only_tmp_which_resume_ignores(tmp_path, reference):
    ref_run, ref_tmp = reference
    import shutil

    # Start from the reference's step-5 checkpoint; the next save (step 6) pauses half-written.
    shutil.copytree(ref_tmp / "ckpt" / "step-000000005", tmp_path / "ckpt" / "step-000000005")
    run = Run(tmp_path, *common(tmp_path), "--checkpoint-every", "3", "--resume-from", "latest",
              env={builtin.SAVE_PAUSE_ENV: "60"})
    run.wait_for("STEP", lambda p: p["step"] == 6)
    deadline = time.monotonic() + 30
    while not list((tmp_path / "ckpt").glob(".tmp-step-000000006-*/lora.safetensors")):
        assert time.monotonic() < deadline, run.stderr()
        time.sleep(0.02)
    os.killpg(run.proc.pid, signal.SIGKILL)
    run.finish()
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names[0].startswith(".tmp-step-000000006-") and names[1:] == ["step-000000005"]
    assert [s for s, _ in builtin.list_checkpoints(tmp_path / "ckpt")] == [5]

    again = Run(tmp_path, *common(tmp_path), "--resume-from", "latest")
    assert again.finish() == 0, again.stderr()
    assert again.of("START")[0]["step"] == 5
    assert again.steps() == list(range(6, N + 1))
    assert not list((tmp_path / "ckpt").glob(".tmp-*"))  # the stale half-save was cleared
    assert_same_weights(lora(tmp_path / "out"), lora(ref_tmp / "out"))


def test_sigterm_at_start_exits_143_without_training(tmp_path):
    run = Run(tmp_path, *common(tmp_path))
    # Signal as soon as the SIGTERM handler is in (before the slow imports), not before: the
    # kernel's caught-signals mask says when.
    deadline = time.monotonic() + 30
    while not caught(run.proc.pid, signal.SIGTERM):
        assert time.monotonic() < deadline and run.proc.poll() is None
        time.sleep(0.005)
    os.killpg(run.proc.pid, signal.SIGTERM)
    assert run.finish() == 143, run.stderr()
    assert run.steps() == [] and not run.of("CHECKPOINT")


def test_help_is_fast_and_imports_no_torch():
    code = ("import sys, sdcloud_agent.trainers.builtin as b; "
            "assert 'torch' not in sys.modules and 'diffusers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "sdcloud_agent.trainers.builtin", "--help"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    assert "--checkpoint-every" in out and time.monotonic() - t0 < 5


def test_batch_order_is_a_pure_function_of_the_step():
    n, bs = 5, 2
    order = [i for s in range(1, 11) for i in builtin.batch_indices(s, bs, n, seed=3)]
    for epoch in range(4):  # every epoch visits each image once
        assert sorted(order[epoch * n:(epoch + 1) * n]) == list(range(n))
    assert order[:n] != order[n:2 * n] or order[n:2 * n] != order[2 * n:3 * n]
    assert builtin.batch_indices(7, bs, n, seed=3) == order[12:14]
    assert builtin.batch_indices(7, bs, n, seed=4) != order[12:14] or \
        builtin.batch_indices(8, bs, n, seed=4) != order[14:16]


def test_list_and_resolve_checkpoints(tmp_path):
    d = tmp_path / "ckpt"
    for name, complete in [("step-000000004", True), ("step-000000010", True),
                           ("step-000000012", False), (".tmp-step-000000020-1", True),
                           ("other", True)]:
        (d / name).mkdir(parents=True)
        if complete:
            (d / name / "trainer_state.json").write_text("{}")
    assert [s for s, _ in builtin.list_checkpoints(d)] == [4, 10]
    assert builtin.resolve_resume("latest", d) == d / "step-000000010"
    assert builtin.resolve_resume(str(d), d) == d / "step-000000010"
    assert builtin.resolve_resume(str(d / "step-000000004"), d) == d / "step-000000004"
    assert builtin.resolve_resume("latest", tmp_path / "none") is None
    assert builtin.resolve_resume(None, d) is None
    with pytest.raises(builtin.UsageError):
        builtin.resolve_resume(str(d / "step-000000012"), d)


@pytest.mark.slow
def test_dreambooth_from_local_folder_with_captions_resumes_exactly(tmp_path):
    """--model PATH (the tiny pipeline saved as a diffusers folder), --data-dir with captions,
    --mode dreambooth: the whole UNet trains, resumes bitwise, and the output is a pipeline."""
    import numpy as np
    from PIL import Image
    from safetensors.torch import load_file

    from sdcloud_agent.trainers import tiny

    model = tiny.save_pipeline(tmp_path / "model")
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):  # odd sizes: resized and centre-cropped to 32x32
        Image.fromarray(rng.integers(0, 255, (40, 48 + i, 3), dtype=np.uint8)).save(data / f"{i}.png")
    (data / "0.txt").write_text("a photo of sks dog\n")

    def args(tag: str, *extra: str) -> list[str]:
        return ["--model", str(model), "--mode", "dreambooth", "--data-dir", str(data),
                "--resolution", "32", "--steps", "4", "--checkpoint-dir", str(tmp_path / "ckpt"),
                "--output", str(tmp_path / tag), *extra]

    full = Run(tmp_path, *args("full", "--checkpoint-every", "2"))
    assert full.finish() == 0, full.stderr()
    ckpt = tmp_path / "ckpt" / "step-000000002"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["mode"] == "dreambooth" and "unet.safetensors" in state["files"]
    resumed = Run(tmp_path, *args("resumed", "--resume-from", str(ckpt)))
    assert resumed.finish() == 0, resumed.stderr()
    assert resumed.steps() == [3, 4]

    def unet(tag: str) -> dict:
        (f,) = (tmp_path / tag / "unet").glob("*.safetensors")
        return load_file(str(f))

    assert_same_weights(unet("resumed"), unet("full"))
    base = load_file(str(next((model / "unet").glob("*.safetensors"))))
    assert any(not (base[k] == v).all() for k, v in unet("full").items())  # it did train
    assert (tmp_path / "full" / "model_index.json").is_file()

    # A LoRA checkpoint cannot resume a DreamBooth run: exit 2, one line, no training.
    bad = Run(tmp_path, *args("bad", "--mode", "lora", "--resume-from", str(ckpt)))
    assert bad.finish() == 2 and bad.steps() == []
    assert "mode" in bad.stderr()
