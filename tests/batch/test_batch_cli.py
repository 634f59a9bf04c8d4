"""`sdcloud batch` on the local provider: bad input refused before anything runs; a job over K workers
with one killed mid-item still verifies; pull brings the images, the index and the gallery."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sdcloud.cli import main


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sdcloud.cli", *args], capture_output=True, text=True, timeout=300)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def prompts(tmp_path) -> Path:
    p = tmp_path / "prompts.txt"
    p.write_text("a red cube\n# a comment\n\na blue sphere\n")
    return p


BASE = ("batch", "submit", "--tier", "batch-sd15", "--model", "tiny", "--generator", "fake")


@pytest.mark.parametrize("content,suffix,needle", [
    ("", ".txt", "has no prompts"),
    ("\n# only a comment\n", ".txt", "has no prompts"),
    ('{"prompt": "ok"}\n{"prompt": "broken"\n', ".jsonl", "line 2: not valid JSON"),
    ('{"prompt": "ok"}\n{"prompt": "x", "steps": 0}\n', ".jsonl", "line 2: steps must be an integer"),
    ('{"prompt": "ok", "width": 500}\n', ".jsonl", "line 1: width must be"),
    ('{"prompt": "ok", "colour": 1}\n', ".jsonl", "line 1: unknown field 'colour'"),
    ('{"prompt": "ok", "scheduler": "magic"}\n', ".jsonl", "line 1: scheduler must be one of"),
    ('{"prompt": ""}\n', ".jsonl", "line 1: \"prompt\" must be a non-empty string"),
    ('{"prompt": "same", "seed": 3}\n{"prompt": "same", "seed": 3}\n', ".jsonl", "line 2: repeats line 1"),
])
def test_bad_prompts_file_is_one_line_and_exit_2(capsys, tmp_path, content, suffix, needle):
    p = tmp_path / f"p{suffix}"
    p.write_text(content)
    rc, out, err = _cli(capsys, *BASE, "--prompts", str(p))
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (Path(os.environ["SDCLOUD_HOME"]) / "bucket").exists(), "nothing may be written before validation passes"


@pytest.mark.parametrize("extra,needle", [
    (("--workers", "0"), "--workers must be at least 1"),
    (("--tier", "sd15-lora"), "is not a batch tier: use batch-sd15, batch-sdxl or batch-sd35"),
    (("--provider", "mars"), "unknown provider"),
    (("--deadline", "soon"), "--deadline must be a duration"),
    (("--lora", "missing.safetensors"), "neither a LoRA file nor a training run's name"),
    (("--model", "/no/such/model"), "no such folder"),
])
def test_bad_options_are_one_line_and_exit_2(capsys, prompts, extra, needle):
    rc, out, err = _cli(capsys, *BASE, "--prompts", str(prompts), *extra)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("cron,tz,needle", [("61 2 * * *", "UTC", "bad cron expression"),
                                            ("0 2 * *", "UTC", "bad cron expression"),
                                            ("0 2 * * *", "Mars/Olympus", "unknown time zone")])
def test_bad_schedule_is_one_line_and_exit_2(capsys, prompts, cron, tz, needle):
    rc, out, err = _cli(capsys, "batch", "schedule", "add", "--cron", cron, "--tz", tz, "--tier", "batch-sd15",
                        "--model", "tiny", "--prompts", str(prompts))
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def _wait(pred, timeout: float, what: str):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _job_state(job: str) -> dict:
    from sdcloud.runs.records.state import StateStore

    return StateStore().get_run(job)


def _kill_one_worker_mid_item(job: str, timeout: float = 300) -> int:
    """SIGKILL the worker process that holds the lease of an unfinished item (mid-item); its pid.

    The lease names its worker (`<job>-w<n>`), and the pool's `worker-started` events map n to a pid,
    so the worker killed is the one inside an item, whichever of the K it is."""
    from sdcloud.batch import jobs
    from sdcloud.runs.records.state import StateStore

    def holding():
        run = jobs.find_job(job)
        store = jobs.job_store(run)
        prefix = run["spec"]["prefix"]
        done = {o.key.rsplit("/", 1)[-1] for o in store.list(f"{prefix}/done/")}
        if not done:
            return None  # let the job get going first
        pids = {e["data"]["n"]: e["data"]["pid"] for e in StateStore().events(run["id"]) if e["kind"] == "worker-started"}
        alive = set(run["spec"].get("worker_pids") or [])
        for lease in store.list(f"{prefix}/leases/"):
            if lease.key.rsplit("/", 1)[-1] in done:
                continue
            try:
                worker = json.loads(store.get(lease.key))["worker"]
            except (ValueError, KeyError, OSError):
                continue
            pid = pids.get(int(worker.rsplit("-w", 1)[-1]))
            if pid in alive:
                return pid
        return None
    pid = _wait(holding, timeout, "a worker mid-item")
    os.kill(pid, signal.SIGKILL)
    return pid


def test_job_on_two_workers_with_one_killed_verifies_and_pulls(tmp_path, prompts):
    p = tmp_path / "many.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"product shot {n}", "count": 6}) + "\n" for n in range(8)))
    env = {**os.environ}
    sub = subprocess.run([sys.executable, "-m", "sdcloud.cli", *BASE, "--prompts", str(p), "--workers", "2",
                          "--fake-delay", "0.3", "--detach", "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert sub.returncode == 0, sub.stderr
    job = json.loads(sub.stdout)["job"]
    assert json.loads(sub.stdout)["images"] == 48
    _kill_one_worker_mid_item(job)
    _wait(lambda: _job_state(job)["state"] in ("succeeded", "failed"), 180, "the job to end")
    assert _job_state(job)["state"] == "succeeded"
    v = _run("batch", "verify", job, "--json")
    assert v.returncode == 0, v.stdout + v.stderr
    verdict = json.loads(v.stdout)
    assert verdict["ok"] and verdict["images_present"] == 48 and not verdict["duplicate_keys"]
    w = _run("batch", "watch", job, "--interval", "0.2")
    assert w.returncode == 0 and f"{job} succeeded: 48/48 images" in w.stdout, w.stdout + w.stderr
    st = json.loads(_run("batch", "status", job, "--json").stdout)
    assert st["images_done"] == 48 and st["items_done"] == st["items"]
    out = tmp_path / "pulled"
    pulled = _run("batch", "pull", job, str(out), "--json")
    assert pulled.returncode == 0, pulled.stderr
    lines = [json.loads(ln) for ln in (out / "index.jsonl").read_text().splitlines()]
    assert len(lines) == 48 == len({ln["key"] for ln in lines}) == len(list((out / "images").glob("*.png")))
    assert (out / "index.html").read_text().count("<figure") == 48
    listed = json.loads(_run("batch", "list", "--json").stdout)
    assert [j["job"] for j in listed] == [job]


@pytest.mark.slow
def test_tiny_sd15_on_seaweed_two_workers_one_killed(tmp_path, s3_env, monkeypatch):
    """The acceptance run: real diffusers generation (a tiny SD1.5-shaped random-weight pipeline on
    CPU) of 40 images on 2 workers against SeaweedFS over HTTPS; one worker SIGKILLed mid-item."""
    import uuid

    import boto3

    bucket = f"bj-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_env["endpoint_url"]).create_bucket(Bucket=bucket)
    monkeypatch.setenv("SDCLOUD_STORE_ENDPOINT", s3_env["endpoint_url"])
    monkeypatch.setenv("SDCLOUD_CPU_THREADS", "1")
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"a small product photo {n}", "count": 4, "width": 64, "height": 64,
                                     "steps": 2, "scheduler": "ddim"}) + "\n" for n in range(10)))
    sub = _run("batch", "submit", "--tier", "batch-sd15", "--model", "tiny", "--prompts", str(p), "--workers", "2",
               "--store", f"s3://{bucket}/sd", "--detach", "--json")
    assert sub.returncode == 0, sub.stderr
    job = json.loads(sub.stdout)["job"]
    _kill_one_worker_mid_item(job)
    _wait(lambda: _job_state(job)["state"] in ("succeeded", "failed"), 900, "the job to end")
    verdict = json.loads(_run("batch", "verify", job, "--json").stdout)
    assert verdict["ok"] and verdict["images_present"] == 40 and not verdict["duplicate_keys"], verdict
    assert verdict["redone_items"] >= 1, "the killed worker's item was taken over"
    out = tmp_path / "pulled"
    assert _run("batch", "pull", job, str(out)).returncode == 0
    from PIL import Image

    pngs = sorted((out / "images").glob("*.png"))
    assert len(pngs) == 40 and all(Image.open(f).size == (64, 64) for f in pngs)


def test_schedule_commands_round_trip(capsys, prompts, monkeypatch, tmp_path):
    rc, out, err = _cli(capsys, "batch", "schedule", "add", "--cron", "0 2 * * *", "--tz", "Europe/Berlin",
                        *BASE[2:], "--prompts", str(prompts), "--workers", "2")
    assert rc == 0, err
    sid = out.strip()
    rc, out, _ = _cli(capsys, "batch", "schedule", "list", "--json")
    rows = json.loads(out)
    assert [r["id"] for r in rows] == [sid] and rows[0]["next"].endswith(("+01:00", "+02:00"))
    assert rows[0]["options"]["workers"] == 2 and rows[0]["options"]["generator"] == "fake"
    rc, out, _ = _cli(capsys, "batch", "schedule", "pause", sid)
    # Each change says which schedule and where (issue 39): this machine's timer.
    assert rc == 0 and out.startswith(f"paused {sid} (0 2 * * * in Europe/Berlin) on this machine's timer"), out
    assert json.loads(_cli(capsys, "batch", "schedule", "list", "--json")[1])[0]["paused"] == 1
    rc, out, _ = _cli(capsys, "batch", "schedule", "pause", sid)
    assert rc == 0 and "already paused; nothing changed" in out, out
    rc, out, _ = _cli(capsys, "batch", "schedule", "resume", sid)
    assert rc == 0 and out.startswith(f"resumed {sid} ") and "next at 20" in out, out
    assert json.loads(_cli(capsys, "batch", "schedule", "list", "--json")[1])[0]["paused"] == 0
    rc, _, err = _cli(capsys, "batch", "schedule", "pause", "s-nosuch")
    assert rc == 2 and err.count("\n") == 1 and "no schedule 's-nosuch'" in err
    rc, out, _ = _cli(capsys, "scheduler", "run", "--once")
    assert rc == 0, "nothing is due yet: one tick submits nothing"
    rc, out, _ = _cli(capsys, "scheduler", "install", "--crontab")
    assert rc == 0 and "scheduler run --once" in out
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _cli(capsys, "scheduler", "install")[0] == 0
    assert (tmp_path / "home/.config/systemd/user/sdcloud-scheduler.timer").exists()
    rc, out, _ = _cli(capsys, "batch", "schedule", "remove", sid)
    assert rc == 0 and out.startswith(f"removed {sid} (0 2 * * * in Europe/Berlin) from this machine's timer"), out
    rc, _, err = _cli(capsys, "batch", "schedule", "remove", sid)
    assert rc == 2 and "no schedule" in err
    assert json.loads(_cli(capsys, "batch", "list", "--json")[1]) == []


def test_foreground_submit_runs_to_the_end_and_prints_the_job(prompts):
    sub = _run(*BASE, "--prompts", str(prompts), "--images-per-prompt", "3", "--workers", "2", "--json")
    assert sub.returncode == 0, sub.stderr
    res = json.loads(sub.stdout)
    assert res["job"].startswith("b-") and res["images"] == 6 and res["images_done"] == 6 and res["state"] == "succeeded"
    text = _run(*BASE, "--prompts", str(prompts))
    assert text.returncode == 0 and text.stdout.strip().startswith("b-")


@pytest.mark.slow
def test_workers_that_keep_dying_fail_the_job_with_a_reason(tmp_path):
    # Real processes on purpose: each worker starts, finds no weights in the model folder and dies
    # (before it imports torch), five per slot before the pool gives up; the limit and the reason
    # are what is proved.
    p = tmp_path / "p.txt"
    p.write_text("one\ntwo\n")
    # A folder with a UNet config and no weights: it passes the check before submit (an empty folder
    # is refused there), and every worker exits non-zero at load.
    (tmp_path / "empty-model" / "unet").mkdir(parents=True)
    (tmp_path / "empty-model" / "unet" / "config.json").write_text("{}")
    sub = _run("batch", "submit", "--tier", "batch-sd15", "--model", str(tmp_path / "empty-model"), "--prompts", str(p),
               "--json")
    assert sub.returncode == 0, sub.stderr
    res = json.loads(sub.stdout)
    assert res["state"] == "failed" and _job_state(res["job"])["reason"].startswith("workers keep exiting")
    # Each worker said why, in its own log, before it imported torch.
    logs = sorted((Path(os.environ["SDCLOUD_HOME"]) / "batch" / res["job"]).glob("worker-*.log"))
    assert len(logs) >= 5 and all("holds no weights file" in f.read_text() for f in logs), logs
