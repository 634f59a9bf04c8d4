"""End to end: the agent against SeaweedFS and a local metadata server, preempted at random points
and resumed by a fresh agent in a fresh working directory, until the run finishes.

A run on S3 records each agent's calls (tests/support/authz/authz_run.py) and judges them against the AWS host
role's policy for the run's bucket and prefix (tests/support/authz/authz_judge.py): SeaweedFS's own keys grant
everything, the policy is what AWS would hold the host to."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
import pytest


from sdcloud_agent import manifest as mf
from sdcloud_agent.store import open_store

from tests.support import SUPPORT
from tests.support.fake_host import AwsMetadataServer, SlowProxy, TencentMetadataServer
from tests.support.authz.authz_judge import host_policy, refusals
from tests.support.authz.authz_record import read_log

FAKE = str(SUPPORT / "fake_host.py")
# Run as `python -m`, so the module it runs gets the path `python -m` gives it (the working folder first).
AUTHZ_RUN = ["-m", "tests.support.authz.authz_run"]
STEP_RE = re.compile(r"SDCLOUD_STEP (\{.*\})")


def _bucket(s3_env) -> str:
    name = f"agent-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_env["endpoint_url"]).create_bucket(Bucket=name)
    return name


def _config(tmp: Path, attempt: int, store: dict, meta_url: str, *, kind="aws", trainer="command",
            trainer_args=None, steps=40, every=10, **extra) -> Path:
    cfg = {"run_id": "e2e", "attempt": attempt, "trainer": trainer,
           "trainer_args": trainer_args if trainer_args is not None else [sys.executable, FAKE],
           "steps": steps, "checkpoint_every": every, "keep_checkpoints": 2, "store": store,
           "metadata": {"kind": kind, "base_url": meta_url}, "workdir": str(tmp / f"work-{attempt}"),
           "nvme": False, "require_gpu": False, "heartbeat_seconds": 0.5, "poll_seconds": 0.2, **extra}
    path = tmp / f"agent-{attempt}.json"
    path.write_text(json.dumps(cfg))
    return path


def _start_agent(cfg: Path, env: dict, authz: Path | None = None) -> subprocess.Popen:
    """The agent as a host starts it; with `authz`, every AWS call it makes recorded there as the host's."""
    run = [*AUTHZ_RUN, str(authz), "host", "sdcloud_agent"] if authz else ["-m", "sdcloud_agent"]
    return subprocess.Popen([sys.executable, *run, "run", "--config", str(cfg)],
                            env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _judge_host_calls(authz: Path, store_url: str) -> None:
    """Every call the run's agents made, authorized as AWS would for the host role on that bucket."""
    bucket, _, prefix = store_url.removeprefix("s3://").partition("/")
    calls = read_log(authz)
    assert {"PutObject", "GetObject", "ListObjectsV2"} <= {c.operation for c in calls}, "the agents' calls were recorded"
    found = refusals(calls, host_policy(bucket, prefix.strip("/")))
    assert not found, "\n".join(found[:20])


def _steps_in(text: str) -> list[int]:
    return [json.loads(m.group(1))["step"] for m in STEP_RE.finditer(text)]


def _wait_step(log: Path, target: int, proc: subprocess.Popen, timeout: float = 120) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and any(s >= target for s in _steps_in(log.read_text(errors="replace"))):
            return True
        time.sleep(0.02)
    return False


TRAINER_PID = re.compile(r"trainer pid (\d+)")
# The tests' default seed: the preemption points are the same on every run unless asked otherwise.
DEFAULT_SEED = 20261201


def _rng() -> random.Random:
    return random.Random(int(os.environ.get("SDCLOUD_TEST_SEED", DEFAULT_SEED)))


def _frozen_notice(log: Path, proc: subprocess.Popen, meta, timeout: float = 60) -> None:
    """Announce the reclaim with the trainer frozen (SIGSTOP) until the agent has seen the notice.

    So the notice lands at the step (or upload) the test chose, however fast or loaded this machine
    is: the trainer cannot run on while the agent's metadata poll catches up. The agent's save
    request is queued while the trainer is stopped and delivered when it continues.
    """
    found = TRAINER_PID.search(log.read_text(errors="replace")) if log.exists() else None
    pid = int(found.group(1)) if found else None
    if pid:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            pid = None
    try:
        meta.announce(120)
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None:
            if "reclaim notice (" in log.read_text(errors="replace"):
                return
            time.sleep(0.02)
        raise AssertionError("the agent never saw the reclaim notice")
    finally:
        if pid:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def chain_steps(points: list[tuple[str, int]], every: int, tail: int = 20) -> int:
    """A job long enough that it cannot finish before its last point fires: each "after" point uses
    at most its steps plus the one the trainer is inside when frozen, each "upload" point at most a
    checkpoint interval plus that step; `tail` more remain for the final attempt."""
    return sum((n if mode == "after" else every) + 2 for mode, n in points) + tail


def _run_chain(tmp: Path, store_cfg: dict, env: dict, points: list[tuple[str, int]], proxy: SlowProxy | None,
               meta, kind="aws", steps=40, every=10, trainer="command", trainer_args=None, extra_env=None):
    """Run attempts until one succeeds; attempt i is preempted at points[i]: ("after", n) steps after
    its start, or ("upload", _) while it uploads its first checkpoint. A point that cannot fire (the
    attempt finished first) fails the test with its index."""
    store = open_store(store_cfg)
    history = []
    attempt = 0
    while True:
        attempt += 1
        assert attempt <= len(points) + 3, "the run never finished"
        meta.reset()
        if proxy:
            proxy.upload_seen.clear()
        before = mf.newest_complete(store, "runs/e2e")
        cfg = _config(tmp, attempt, store_cfg, meta.base_url, kind=kind, steps=steps, every=every,
                      trainer=trainer, trainer_args=trainer_args)
        on_s3 = store_cfg["url"].startswith("s3://")
        proc = _start_agent(cfg, {**env, **(extra_env or {})}, tmp / "authz" if on_s3 else None)
        log = tmp / f"work-{attempt}" / f"attempt-{attempt}.log"
        point = points[attempt - 1] if attempt <= len(points) else None
        if point is not None:
            mode, target = point
            if mode == "after":  # n steps after where this attempt resumed
                fired = _wait_step(log, (before.step if before else 0) + target, proc)
            else:
                fired = proxy.upload_seen.wait(60) and proc.poll() is None
            if not fired:
                proc.kill()
                proc.communicate(timeout=60)
                raise AssertionError(f"preemption point {attempt - 1} {point} did not fire (attempt {attempt} "
                                     f"resumed at {before.step if before else 0} of {steps} steps)")
            _frozen_notice(log, proc, meta)
        _, err = proc.communicate(timeout=180)
        text = log.read_text(errors="replace")
        status = json.loads(store.get("runs/e2e/status.json"))
        shipped = store.get(f"runs/e2e/logs/attempt-{attempt}.log").decode(errors="replace")
        after = mf.newest_complete(store, "runs/e2e")
        history.append({"attempt": attempt, "rc": proc.returncode, "status": status, "log": text,
                        "shipped": shipped, "before": before.step if before else 0,
                        "after": after.step if after else 0, "stderr": err.decode(errors="replace")})
        assert proc.returncode in (0, 3), f"attempt {attempt} rc {proc.returncode}: {status}\n{err.decode()[-3000:]}"
        if proc.returncode == 0:
            assert status["phase"] == "succeeded"
            assert point is None, f"preemption point {attempt - 1} {point} fired but the attempt succeeded"
            if on_s3:
                _judge_host_calls(tmp / "authz", store_cfg["url"])
            return history
        assert status["phase"] == "preempted", status


def _check_history(history: list[dict], steps: int) -> None:
    trained: list[int] = []
    for h in history:
        assert "CORRUPT RESUME" not in h["log"]
        s = _steps_in(h["log"])
        # A fresh agent starts exactly after the newest complete checkpoint it found ...
        if s:
            assert s[0] == h["before"] + 1, (h["attempt"], s[:3], h["before"])
            assert s == list(range(s[0], s[0] + len(s))), "steps must be consecutive"
        if h["rc"] == 3:
            # ... and the trainer saved on the notice, so nothing it trained is lost.
            assert h["after"] == (s[-1] if s else h["before"]), (h["attempt"], h["after"], s[-1:])
            assert "notice_to_durable_s=" in h["log"]
        if s and h["before"] > 0:  # a resumed attempt says how long it took to train again
            assert "launch_to_resumed_s=" in h["log"], h["attempt"]
        trained += s
        assert _steps_in(h["shipped"])[: len(s) // 2] == s[: len(s) // 2]  # the log reached the bucket
    assert sorted(trained) == list(range(1, steps + 1)), "each step trained exactly once"


@pytest.mark.slow
def test_protocol_trainer_random_preemptions_with_big_checkpoints_mid_upload(tmp_path, s3_env, seaweed):
    """A fake trainer with the builtin protocol and 4 MB checkpoints behind a 20 MB/s link, so that
    many notices land while an upload runs (the builtin test below has tiny checkpoints)."""
    rng = _rng()
    bucket = _bucket(s3_env)
    # A throttled path to the bucket, so that some notices land in the middle of an upload.
    proxy = SlowProxy(seaweed.port, bytes_per_s=20e6)
    meta = AwsMetadataServer().start()
    every = 10
    points = [("upload", 0) if i % 3 == 2 else ("after", rng.randint(1, 5)) for i in range(12)]
    steps = chain_steps(points, every)
    env = {"FAKE_STEP_SECONDS": "0.08", "FAKE_CKPT_BYTES": str(3_000_000)}
    try:
        history = _run_chain(tmp_path, {"url": f"s3://{bucket}/p", "endpoint_url": proxy.endpoint},
                             s3_env, points, proxy, meta, steps=steps, every=every, extra_env=env)
    finally:
        meta.stop()
        proxy.stop()
    preempted = [h for h in history if h["rc"] == 3]
    assert len(preempted) >= len(points)
    assert sum("abandoning upload" in h["log"] for h in preempted) >= 1, "no notice landed mid-upload"
    _check_history(history, steps)
    store = open_store({"url": f"s3://{bucket}/p", "endpoint_url": s3_env["endpoint_url"]})
    assert store.head("runs/e2e/artifacts/model.bin") is not None
    assert len(mf.complete_steps(store, "runs/e2e")) <= 2  # keep_checkpoints


def test_preempt_and_resume_on_a_file_store_with_tencent_notice(tmp_path):
    meta = TencentMetadataServer().start()
    try:
        history = _run_chain(tmp_path, {"url": f"file://{tmp_path}/bucket"}, {}, [("after", 7), ("after", 9)], None,
                             meta, kind="tencent", steps=25, every=10, extra_env={"FAKE_STEP_SECONDS": "0.1"})
    finally:
        meta.stop()
    assert [h["rc"] for h in history] == [3, 3, 0]
    _check_history(history, 25)


def test_trainer_crash_is_failed_with_the_log_tail(tmp_path):
    cfg = _config(tmp_path, 1, {"url": f"file://{tmp_path}/bucket"}, "http://127.0.0.1:9", kind="none", steps=30)
    proc = _start_agent(cfg, {"FAKE_FAIL_AT": "14"})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err.decode()[-2000:]
    status = json.loads((tmp_path / "bucket/runs/e2e/status.json").read_text())
    assert status["phase"] == "failed"
    assert "exited with code 1" in status["reason"] and "CUDA out of memory" in status["reason"]
    # The checkpoint finished before the crash is in the bucket for the next attempt.
    assert mf.complete_steps(open_store(f"file://{tmp_path}/bucket"), "runs/e2e") == [10]


def test_vram_below_minimum_refuses_to_start(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'name, memory.total [MiB], driver_version'\necho 'Tesla T4, 15360 MiB, 535.104.05'\n")
    smi.chmod(0o755)
    cfg = _config(tmp_path, 1, {"url": f"file://{tmp_path}/bucket"}, "", kind="none", require_gpu=True,
                  min_vram_gb=24, rec_vram_gb=40)
    proc = _start_agent(cfg, {"PATH": f"{bindir}:{os.environ['PATH']}"})
    proc.communicate(timeout=60)
    assert proc.returncode == 1
    status = json.loads((tmp_path / "bucket/runs/e2e/status.json").read_text())
    assert status["phase"] == "failed" and "floor of a 24 GB GPU" in status["reason"]
    assert status["boot_phase"] == "gpu"  # this host's problem: the controller tries another offer


@pytest.mark.slow
@pytest.mark.timeout(1800)  # about 3 minutes on an idle 2-core machine; far more on a loaded one
def test_builtin_trainer_twenty_random_preemptions_resume_from_the_bucket(tmp_path, s3_env, seaweed):
    """The acceptance test: the real builtin trainer (tiny model, CPU, synthetic images) preempted
    at 20 random points (every fourth while a checkpoint uploads); each time a fresh agent in a
    fresh working directory resumes from the bucket; in the end every step was trained exactly
    once and no resume was corrupt or partial. About 6 s per attempt on an idle 2-core machine
    (mostly torch imports); SDCLOUD_E2E_BUILTIN_POINTS=N runs fewer while developing."""
    rng = _rng()
    bucket = _bucket(s3_env)
    proxy = SlowProxy(seaweed.port, bytes_per_s=1e6)
    meta = AwsMetadataServer().start()
    n = int(os.environ.get("SDCLOUD_E2E_BUILTIN_POINTS", "20"))
    points = [("upload", 0) if i % 4 == 3 else ("after", rng.randint(1, 4)) for i in range(n)]
    steps = chain_steps(points, 5)
    try:
        history = _run_chain(tmp_path, {"url": f"s3://{bucket}/p", "endpoint_url": proxy.endpoint}, s3_env,
                             points, proxy, meta, steps=steps, every=5,
                             trainer="builtin", trainer_args={"synthetic": 4, "device": "cpu"})
    finally:
        meta.stop()
        proxy.stop()
    assert [h["rc"] for h in history][-1] == 0 and sum(h["rc"] == 3 for h in history) >= n
    _check_history(history, steps)
    for h in history[1:]:
        assert '"resumed_from"' in h["log"] and h["before"] > 0
    store = open_store({"url": f"s3://{bucket}/p", "endpoint_url": s3_env["endpoint_url"]})
    assert any(o.key.startswith("runs/e2e/artifacts/") for o in store.list("runs/e2e/artifacts/"))


def test_agent_sigterm_is_a_reclaim_and_rebalance_asks_for_a_checkpoint(tmp_path):
    """systemd stopping the agent at shutdown = a notice; a rebalance recommendation = SIGUSR1."""
    meta = AwsMetadataServer().start()
    try:
        cfg = _config(tmp_path, 1, {"url": f"file://{tmp_path}/bucket"}, meta.base_url, steps=400, every=100,
                      trainer_args={"command": [sys.executable, FAKE], "save_signal": "SIGUSR1"})
        proc = _start_agent(cfg, {"FAKE_STEP_SECONDS": "0.05"})
        log = tmp_path / "work-1" / "attempt-1.log"
        assert _wait_step(log, 5, proc, timeout=60)
        meta.recommend_rebalance()
        deadline = time.time() + 20
        store = open_store(f"file://{tmp_path}/bucket")
        while not mf.complete_steps(store, "runs/e2e") and time.time() < deadline:
            time.sleep(0.05)
        extra = mf.complete_steps(store, "runs/e2e")
        assert extra and extra[0] < 100, "the rebalance recommendation did not produce a checkpoint"
        proc.send_signal(15)
        _, err = proc.communicate(timeout=60)
    finally:
        meta.stop()
    assert proc.returncode == 3, err.decode()[-2000:]
    status = json.loads((tmp_path / "bucket/runs/e2e/status.json").read_text())
    assert status["phase"] == "preempted"
    last = _steps_in(log.read_text())[-1]
    assert mf.newest_complete(store, "runs/e2e").step == last == status["step"]


FAKESTEP = re.compile(r"FAKESTEP (\d+)")


@pytest.mark.parametrize("trainer, script", [("diffusers", "diffusers"), ("kohya", "sdxl_train.py")])
def test_external_trainer_preempted_resumes_at_the_global_step(tmp_path, trainer, script):
    """Trainers that cannot save on a signal (and, for kohya's DreamBooth scripts, restart their
    step count): the agent waits for their next checkpoint if it fits, resumes them from the
    bucket, and keeps the global step."""
    meta = AwsMetadataServer().start()
    store_cfg = {"url": f"file://{tmp_path}/bucket"}
    store = open_store(store_cfg)
    steps, every = 30, 5
    args = {"launcher": [sys.executable, FAKE], "script": script, "checkpoints_total_limit": 1}
    seen: list[list[int]] = []
    try:
        for attempt in range(1, 6):
            meta.reset()
            before = mf.newest_complete(store, "runs/e2e")
            start = before.step if before else 0
            cfg = _config(tmp_path, attempt, store_cfg, meta.base_url, trainer=trainer, trainer_args=args,
                          steps=steps, every=every)
            proc = _start_agent(cfg, {"FAKE_STEP_SECONDS": "0.1"})
            log = tmp_path / f"work-{attempt}" / f"attempt-{attempt}.log"
            target = start + 3
            while proc.poll() is None and attempt < 3:
                text = log.read_text(errors="replace") if log.exists() else ""
                if any(int(n) >= target for n in FAKESTEP.findall(text)):
                    meta.announce(120)
                    break
                time.sleep(0.02)
            _, err = proc.communicate(timeout=120)
            text = log.read_text(errors="replace")
            assert "CORRUPT RESUME" not in text
            got = [int(n) for n in FAKESTEP.findall(text)]
            assert got[0] == start + 1, (attempt, got[:3], start)  # the global step carries on
            seen.append(got)
            status = json.loads(store.get("runs/e2e/status.json"))
            if proc.returncode == 0:
                break
            assert proc.returncode == 3 and status["phase"] == "preempted", err.decode()[-2000:]
            # It waited for the periodic checkpoint after the notice instead of losing the steps: the
            # newest checkpoint is a periodic one past the notice (how far past depends on when the
            # watcher's poll saw it).
            ck = mf.newest_complete(store, "runs/e2e").step
            assert ck % every == 0 and ck >= (target // every + 1) * every
    finally:
        meta.stop()
    assert proc.returncode == 0 and len(seen) == 3
    assert sorted(set(sum(seen, []))) == list(range(1, steps + 1))
    assert store.head("runs/e2e/artifacts/final_weights.safetensors") is not None
    assert status["phase"] == "succeeded" and status["step"] == steps


def test_a_killed_agent_takes_its_trainer_with_it(tmp_path):
    # A trainer that prints nothing more (a long GPU step): a broken stdout pipe would not stop it.
    cfg = _config(tmp_path, 1, {"url": f"file://{tmp_path}/bucket"}, "", kind="none",
                  trainer_args=["/bin/sh", "-c", "echo started; exec sleep 60"])
    proc = _start_agent(cfg, {})
    log = tmp_path / "work-1" / "attempt-1.log"
    deadline = time.time() + 30
    while not (log.exists() and "trainer: started" in log.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    pid = int(re.search(r"trainer pid (\d+)", log.read_text()).group(1))
    os.kill(pid, 0)  # alive, in its own session
    proc.kill()
    proc.wait(10)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return  # a zombie: dead, waiting for init to reap it
        time.sleep(0.05)
    os.kill(pid, 9)
    pytest.fail("the trainer outlived its agent")


def test_the_checkpoint_restores_while_the_model_and_dataset_stage(tmp_path, monkeypatch):
    """A resumed attempt downloads its checkpoint beside the staging, not after it: with a model
    stage and a restore of about a second each, the two overlap and the trainer starts after the
    longer of them. The status then says how long the agent took to train again."""
    from sdcloud_agent import agent as agent_mod
    from sdcloud_agent import config as agent_config

    bucket = tmp_path / "bucket"
    store = open_store(f"file://{bucket}")
    # Attempt 1 saves a checkpoint at step 10 and then dies: attempt 2 has something to restore.
    first = _start_agent(_config(tmp_path, 1, {"url": f"file://{bucket}"}, "http://127.0.0.1:9", kind="none", steps=20),
                         {"FAKE_FAIL_AT": "14"})
    first.communicate(timeout=60)
    assert mf.complete_steps(store, "runs/e2e") == [10]
    spans: dict[str, tuple[float, float]] = {}
    real_restore = mf.restore_newest

    def slow_restore(*a, **kw):
        t0 = time.monotonic()
        time.sleep(1.0)
        try:
            return real_restore(*a, **kw)
        finally:
            spans["restore"] = (t0, time.monotonic())

    def slow_model(self):
        t0 = time.monotonic()
        time.sleep(1.0)
        spans["model"] = (t0, time.monotonic())
        return self.cfg.model

    monkeypatch.setattr(agent_mod.mf, "restore_newest", slow_restore)
    monkeypatch.setattr(agent_mod.Agent, "_stage_model", slow_model)
    cfg_path = _config(tmp_path, 2, {"url": f"file://{bucket}"}, "http://127.0.0.1:9", kind="none", steps=20)
    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.01")
    rc = agent_mod.Agent(agent_config.load(cfg_path)).run()
    assert rc == 0
    (r0, r1), (m0, m1) = spans["restore"], spans["model"]
    assert r0 < m1 and m0 < r1, f"the restore ({r0:.2f}-{r1:.2f}) and the model stage ({m0:.2f}-{m1:.2f}) did not overlap"
    text = (tmp_path / "work-2" / "attempt-2.log").read_text()
    steps = _steps_in(text)
    assert steps[0] == 11, steps[:3]
    assert "launch_to_resumed_s=" in text
    status = json.loads(store.get("runs/e2e/status.json"))
    assert status["resumed_from"] == 10 and 0 < status["resumed_after_s"] < 60
