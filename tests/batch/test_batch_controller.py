"""The batch controller on the fleet: K hosts, a reclaimed one replaced in another zone, fewer hosts as
items run out, none when all are done; and a batch host (the agent's batch mode) that honours a notice."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


from sdcloud.batch import jobs
from sdcloud.batch.controller import BatchController
from sdcloud.fleet.lifecycle import Timing
from sdcloud.runs.records.state import StateStore
from sdcloud_agent.batch import layout
from sdcloud_agent.batch.verify import verify
from sdcloud_agent.store import LocalStore

from tests.fleet.test_fleet import CloudDouble


def _submit(tmp_path: Path, prompts: int, workers: int) -> tuple[str, LocalStore]:
    p = tmp_path / "p.txt"
    p.write_text("".join(f"prompt {n}\n" for n in range(prompts)))
    bucket = tmp_path / "bucket"
    res = jobs.submit(jobs.SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(p), workers=workers,
                                         provider="aws", store=bucket.as_uri(), generator="fake"))
    return res["job"], LocalStore(bucket)


def _finish(store: LocalStore, job: str, n: int) -> None:
    prefix = jobs.job_prefix(job)
    for it in [json.loads(x) for x in store.get(f"{prefix}/items.jsonl").decode().splitlines()][:n]:
        store.put_if_absent(layout.done_key(prefix, it["id"]), json.dumps({"item": it["id"], "images": []}).encode())


def test_k_hosts_replaced_in_another_zone_scaled_down_then_all_stopped(tmp_path):
    job, store = _submit(tmp_path, 10, 3)
    cloud = CloudDouble()
    ctl = BatchController(StateStore(), job, provider=cloud, timing=Timing(0.01, 60, 60))
    assert ctl.step() is False
    assert len(cloud.live()) == 3
    victim = cloud.live()[0]
    cloud.reclaim(victim.id)
    ctl.step()
    live = cloud.live()
    assert len(live) == 3
    replacement = max(live, key=lambda i: i.id)
    assert replacement.zone != victim.zone, "a reclaimed host is replaced in another zone"
    _finish(store, job, 8)
    ctl.step()
    assert len(cloud.live()) == 2, "one host per open item once fewer than K are left"
    _finish(store, job, 10)
    assert ctl.step() is True
    assert cloud.live() == [], "every host stops when all items are done"
    ends = [a.end_reason for a in ctl.fleet.attempts()]
    assert ends.count("preempted") == 1 and "scaled-down" in ends and "done" in ends


def test_cancel_stops_every_host(tmp_path):
    job, store = _submit(tmp_path, 6, 2)
    cloud = CloudDouble()
    ctl = BatchController(StateStore(), job, provider=cloud, timing=Timing(0.01, 60, 60))
    ctl.step()
    assert len(cloud.live()) == 2
    jobs.cancel(job)
    assert ctl.step() is True and cloud.live() == []


def test_batch_host_mode_of_the_agent_runs_the_items(tmp_path):
    job, store = _submit(tmp_path, 5, 1)
    cfg = tmp_path / "agent.json"
    cfg.write_text(json.dumps({"run_id": job, "attempt": 1, "store": {"url": store.url}, "metadata": {"kind": "none"},
                               "batch": {"job": jobs.job_prefix(job), "generator": "fake", "ttl": 10}}))
    out = subprocess.run([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(cfg)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["items_done"] == 5
    assert verify(store, jobs.job_prefix(job)).ok


def test_batch_host_stops_on_sigterm_within_the_notice(tmp_path):
    job, store = _submit(tmp_path, 3, 1)
    cfg = tmp_path / "agent.json"
    cfg.write_text(json.dumps({"run_id": job, "attempt": 1, "store": {"url": store.url}, "metadata": {"kind": "none"},
                               "batch": {"job": jobs.job_prefix(job), "generator": "fake", "fake_delay": 30, "ttl": 60}}))
    proc = subprocess.Popen([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    leases = Path(store.root, jobs.job_prefix(job), "leases")
    end = time.time() + 60
    while not (leases.exists() and any(leases.iterdir())) and time.time() < end:
        time.sleep(0.1)
    t0 = time.time()
    proc.terminate()
    assert proc.wait(10) == 0 and time.time() - t0 < 5
    lease = json.loads(next(leases.iterdir()).read_text())
    assert lease["released"], "the lease is handed back on the notice"


def test_deadline_chooses_k_from_the_estimated_throughput(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"shot {n}", "count": 100}) + "\n" for n in range(100)))

    def k_for(hours):
        o = jobs.SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(p), provider="aws", deadline_hours=hours,
                               store=(tmp_path / "b").as_uri(), generator="fake")
        jobs.validate(o)
        return o.workers
    loose, tight = k_for(48.0), k_for(0.5)
    assert loose >= 1 and tight > loose, (loose, tight)
    o = jobs.SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(p), provider="aws", workers=3,
                           deadline_hours=0.5, store=(tmp_path / "b").as_uri())
    jobs.validate(o)
    assert o.workers == 3, "an explicit --workers wins"


def test_budget_spent_stops_the_job(tmp_path):
    job, store = _submit(tmp_path, 6, 2)
    state = StateStore()
    spec = state.get_run(job)["spec"]
    state.update_run(job, spec=json.dumps({**spec, "budget": 0.000001}))
    cloud = CloudDouble()
    ctl = BatchController(StateStore(), job, provider=cloud, timing=Timing(0.01, 60, 60))
    ctl.step()
    assert len(cloud.live()) == 2
    time.sleep(0.05)  # some host time passes: the cost exceeds the tiny budget
    assert ctl.step() is True and cloud.live() == []
    assert store.head(f"{jobs.job_prefix(job)}/cancel") is not None
