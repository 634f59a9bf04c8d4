"""Batch jobs on the control plane: submit (validate, split, write items), run K workers, status, cancel, pull, verify.

A job is a row in the runs table (kind "batch" in its spec; the job id owns its workers' attempts)
and a prefix `batch/<job>/` in the bucket that holds everything the workers need (sdcloud_agent.batch).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import config
from ..errors import UserError
from .prompts import build_items, parse_prompts

# A local pool gives up when this many workers per slot have died without finishing the job.
MAX_WORKER_STARTS_PER_SLOT = 5
BATCH_TIERS = {"batch-sd15": "sd15", "batch-sdxl": "sdxl"}
PROVIDERS = ("local", "ssh", "aws", "tencent")


@dataclass
class SubmitOptions:
    tier: str
    model: str
    prompts: str
    lora: str | None = None
    images_per_prompt: int = 1
    workers: int | None = None     # None: 1, or as many as the deadline needs
    market: str = "spot"
    max_price: float | None = None
    deadline_hours: float | None = None
    budget: float | None = None
    provider: str = "local"
    name: str | None = None
    store: str | None = None
    generator: str = "diffusers"   # "fake": no model (tests and protocol demos)
    fake_delay: float = 0.0        # seconds per fake batch, so a test can catch a worker mid-item
    max_failed_boots: int | None = None  # failed host boots in a row that end the job (None: 3)
    # --width/--height/--steps: over the model's defaults (prompts.defaults_for), under a JSONL line's own.
    width: int | None = None
    height: int | None = None
    steps: int | None = None


def _state():
    from ..runs.state import StateStore

    return StateStore()


def new_job_id() -> str:
    return "b-" + secrets.token_hex(4)


def store_conf(provider: str, store: str | None, region: str | None = None) -> dict:
    """The job's store, chosen as a training run's is (sdcloud.runs.store.store_config): --store, this
    machine's bucket folder for local and SSH, else the bucket of `sdcloud infra up` (Tencent: COS with
    its endpoint, virtual addressing and the hosts' CVM role)."""
    from ..runs.store import store_config

    infra = _state().infra(provider, region or "") if provider in ("aws", "tencent") and not store else None
    return store_config(provider, store, region, infra)


def validate(opts: SubmitOptions) -> list[dict[str, Any]]:
    """Every check that can fail, before anything is written or launched. Returns the work items."""
    if opts.tier not in BATCH_TIERS:
        raise UserError(f"tier {opts.tier!r} is not a batch tier: use {' or '.join(BATCH_TIERS)}")
    if opts.workers is not None and opts.workers < 1:
        raise UserError(f"--workers must be at least 1, got {opts.workers}")
    if opts.images_per_prompt < 1:
        raise UserError(f"--images-per-prompt must be at least 1, got {opts.images_per_prompt}")
    if opts.provider not in PROVIDERS:
        raise UserError(f"unknown provider {opts.provider!r}: use {', '.join(PROVIDERS)}")
    if opts.max_price is not None and opts.max_price <= 0:
        raise UserError("--max-price must be positive")
    if opts.budget is not None and opts.budget <= 0:
        raise UserError("--budget must be positive")
    if opts.max_failed_boots is not None and opts.max_failed_boots < 1:
        raise UserError(f"--max-failed-boots must be at least 1, got {opts.max_failed_boots}")
    if opts.deadline_hours is not None and opts.deadline_hours <= 0:
        raise UserError("--deadline must be in the future")
    if not opts.model.strip():
        raise UserError("--model must name a model")
    if opts.provider == "local" and opts.model.startswith(("/", ".", "~")) and not Path(opts.model).expanduser().is_dir():
        raise UserError(f"--model {opts.model}: no such folder (a diffusers model folder, a hub id, or tiny)")
    # --lora: a run id (r-...), else a file, else a run's name (what `sdcloud status` shows).
    is_file = bool(opts.lora) and not opts.lora.startswith("r-") and Path(opts.lora).expanduser().is_file()
    lora_run = resolve_lora_run(opts.lora) if opts.lora and not is_file else None
    prompts = parse_prompts(opts.prompts, BATCH_TIERS[opts.tier], opts.images_per_prompt, model=opts.model,
                            settings={"width": opts.width, "height": opts.height, "steps": opts.steps})
    opts.prompt_list = prompts  # the submit line states their settings (commands/batch.py)
    items = build_items(prompts, opts.model, lora_run.identity if lora_run else lora_identity(opts.lora))
    opts.lora_run = lora_run
    if opts.workers is None:
        opts.workers = workers_for_deadline(opts, sum(len(it["seeds"]) for it in items), len(items))
    return items


# Plan for the deadline with this share of it, leaving room for a reclaim or two.
DEADLINE_SAFETY = 0.8


def workers_for_deadline(opts: SubmitOptions, images: int, items: int) -> int:
    """K from the estimated throughput of the cheapest fitting offer: enough hosts to finish within
    the deadline (1 without a deadline, or where no catalog knows the hosts: local and SSH)."""
    if opts.deadline_hours is None or opts.provider not in ("aws", "tencent"):
        return 1
    from ..offers.catalog import load_catalog
    from ..offers.optimizer import SETUP_HOURS, rank
    from ..offers.tiers import get_tier

    market = None if opts.market == "spot" else "on-demand"
    ranked = rank(get_tier(opts.tier), load_catalog([opts.provider]), market=market, max_price=opts.max_price,
                  provider=opts.provider, job_size=images)
    if not ranked:
        raise UserError(f"no {opts.provider} offer fits tier {opts.tier}")
    work = max(0.0, ranked[0].est_hours - SETUP_HOURS)  # one host, the whole job
    room = opts.deadline_hours * DEADLINE_SAFETY - SETUP_HOURS
    if room <= 0:
        raise UserError(f"--deadline {opts.deadline_hours:g}h leaves no time after host start-up ({SETUP_HOURS:g}h)")
    import math

    return max(1, min(items, math.ceil(work / room)))


# The LoRA a training run leaves in its artifacts (the builtin trainer's diffusers-format file).
RUN_LORA = "pytorch_lora_weights.safetensors"


@dataclass
class LoraRun:
    run_id: str
    store: Any          # the training run's store
    key: str            # runs/<id>/artifacts/pytorch_lora_weights.safetensors
    identity: str       # what the image keys record: r-...@sha256:<16 hex of the file>


def resolve_lora_run(run_id: str) -> LoraRun:
    """`--lora r-...` or `--lora NAME`: that training run, succeeded, and its LoRA artifact in the run's bucket.

    Resolved here, at submit, not on the hosts: only this machine knows the run's state and its
    bucket (a host gets the job's store and nothing else), and a run that cannot serve is refused
    before anything is written or launched. Submit then copies the file into the job's own prefix.
    """
    from ..runs import artifacts
    from ..runs.store import StoreError

    run = _state().get_run(run_id)  # an id or a name
    if run is None or run["spec"].get("kind") == "batch":
        what = "no training run with that id" if run_id.startswith("r-") else "neither a LoRA file nor a training run's name"
        raise UserError(f"--lora {run_id}: {what}; see: sdcloud status")
    if run["state"] != "succeeded":
        raise UserError(f"--lora {run_id}: the run is {run['state']}, not succeeded; its LoRA is not final")
    store, _url = artifacts._store_and_url(run)
    key = f"runs/{run['id']}/artifacts/{RUN_LORA}"
    try:
        data = store.get(key)
    except StoreError:
        data = None
    if not data:
        raise UserError(f"--lora {run_id}: the run has no LoRA artifact ({RUN_LORA}); see: sdcloud pull {run['id']}")
    import hashlib

    return LoraRun(run["id"], store, key, f"{run['id']}@sha256:{hashlib.sha256(data).hexdigest()[:16]}")


def lora_identity(lora: str | None) -> str | None:
    """What the image keys record of a LoRA: a file by its content (a renamed copy makes the same
    images), a run by its id."""
    if not lora or lora.startswith("r-"):
        return lora
    from sdcloud_agent.store import sha256_file

    path = Path(lora).expanduser().resolve()
    return f"{path.name}@sha256:{sha256_file(path)[:16]}"


def job_prefix(job_id: str) -> str:
    return f"batch/{job_id}"


def submit(opts: SubmitOptions, job_id: str | None = None) -> dict[str, Any]:
    """Validate, then write the job's items to the bucket and its row to the state store.

    With a given job_id (a schedule's fire) a second submit of the same id returns the first one.
    """
    items = validate(opts)
    conf = store_conf(opts.provider, opts.store)
    from ..runs.store import open_run_store
    from sdcloud_agent.batch.worker import write_job

    if job_id is not None and _state().get_run(job_id) is not None:
        return {"job": job_id, "existing": True}
    job_id = job_id or new_job_id()
    store = open_run_store(conf)
    images = sum(len(it["seeds"]) for it in items)
    lora = str(Path(opts.lora).expanduser().resolve()) if opts.lora and not opts.lora.startswith("r-") else opts.lora
    lora_key = None
    run_lora: LoraRun | None = getattr(opts, "lora_run", None)
    if run_lora is not None:
        # The run's LoRA goes into the job's own prefix: the hosts read only the job's store, and the
        # job keeps the exact file its image keys name even if the run's artifacts are removed later.
        lora, lora_key = run_lora.identity, f"{job_prefix(job_id)}/lora/{RUN_LORA}"
        store.put_if_absent(lora_key, run_lora.store.get(run_lora.key))
    spec = {"kind": "batch", "tier": opts.tier, "model": opts.model, "lora": lora, "lora_key": lora_key,
            "workers": opts.workers,
            "market": opts.market, "max_price": opts.max_price, "deadline_hours": opts.deadline_hours,
            "budget": opts.budget, "provider": opts.provider, "store": conf, "prefix": job_prefix(job_id),
            "generator": opts.generator, "fake_delay": opts.fake_delay, "max_failed_boots": opts.max_failed_boots,
            "images": images, "items": len(items), "submitted": time.time()}
    write_job(store, job_prefix(job_id), {k: spec[k] for k in ("tier", "model", "lora", "lora_key", "images", "submitted")},
              items)
    state = _state()
    state.create_run(job_id, opts.tier, spec, images, name=opts.name)
    state.event(job_id, "batch-submitted", {"items": len(items), "images": images, "workers": opts.workers})
    return {"job": job_id, "items": len(items), "images": images, "workers": opts.workers, "store": conf["url"]}


def find_job(job_id: str) -> dict[str, Any]:
    run = _state().get_run(job_id)
    if run is None or run["spec"].get("kind") != "batch":
        raise UserError(f"no batch job {job_id!r}; see: sdcloud batch list")
    return run


def _store(job: dict):
    from ..runs.store import open_run_store

    return open_run_store(job["spec"]["store"])


def list_jobs() -> list[dict[str, Any]]:
    return [{"job": r["id"], "name": r.get("name"), "tier": r["tier"], "state": r["state"],
             "images": r["total_steps"], "workers": r["spec"].get("workers")}
            for r in _state().list_runs() if r["spec"].get("kind") == "batch"]


def progress(job_id: str) -> dict[str, Any]:
    job = find_job(job_id)
    store = _store(job)
    prefix = job["spec"]["prefix"]
    done = [json.loads(store.get(o.key)) for o in store.list(f"{prefix}/done/")]
    images = sum(len(m["images"]) for m in done)
    elapsed = max(1e-6, (job["updated"] if job["state"] in ("succeeded", "stopped", "failed", "cancelled") else time.time())
                  - job["spec"]["submitted"])
    rate = images / elapsed
    left = job["total_steps"] - images
    attempts = sum(int(m.get("attempt", 1)) for m in done)
    state = _state()
    attempts_ = state.attempts(job["id"])  # the job's hosts: fleet attempts, or the local pool's worker processes
    # Priced by the cost ledger, as a training run's attempts are (every item; open ones up to now).
    from ..costs.ledger import run_cost

    cost = run_cost(state, job)["total_usd"] if attempts_ else 0.0
    return {"job": job_id, "state": job["state"], "name": job.get("name"), "tier": job["tier"],
            "items": job["spec"]["items"], "items_done": len(done), "images": job["total_steps"],
            "images_done": images, "images_per_s": round(rate, 3),
            "eta_s": round(left / rate) if rate > 0 and left > 0 else (0 if left <= 0 else None),
            "item_attempts": attempts, "redone_items": sum(1 for m in done if int(m.get("attempt", 1)) > 1),
            "hosts": len(attempts_), "cost_usd": round(cost, 6),
            # Redone work is inside the cost already: hosts are paid for the time they ran.
            "cost_per_image_usd": round(cost / images, 8) if images else None}


def cancel(job_id: str, reason: str = "cancelled by sdcloud batch cancel") -> dict[str, Any]:
    """End a job for good: the state first (so that no driver starts another worker), then the bucket's
    cancel marker (workers stop claiming), then this machine's worker processes.

    `job_id` may be the job's name; every write uses the id found (a write by name matched no row and
    left the job `running` while its pool kept relaunching workers).
    """
    from ..runs.state import ACTIVE_RUN_STATES
    from ..runs.store import StoreError

    job = find_job(job_id)
    jid = job["id"]
    state = _state()
    if job["state"] in ACTIVE_RUN_STATES:  # an ended job keeps its end (a cancel changes nothing there)
        state.update_run(jid, state="cancelled", reason=reason)
        state.event(jid, "batch-cancelled", {"reason": reason})
    try:
        _store(job).put(f"{job['spec']['prefix']}/cancel", b"cancelled\n")
    except (StoreError, OSError) as exc:
        # The state already says cancelled, which every driver obeys; workers then stop at their lease's end.
        state.event(jid, "batch-cancel-marker-failed", {"error": str(exc)[:200]})
    for pid in job["spec"].get("worker_pids", []):
        try:
            os.kill(int(pid), 15)
        except (ProcessLookupError, PermissionError):
            pass
    return {"job": jid, "state": state.get_run(jid)["state"]}


# How long a cancel waits for a live driver to end its own hosts before it stops the driver and ends
# them itself (a driver sees the cancel within one poll: 0.5 s locally, the provider's poll on a cloud).
DRIVER_STOP_SECONDS = 30.0


def end_hosts(job_id: str, wait_s: float | None = None) -> int:
    """After a cancel: give a live driver `wait_s` to stop, then SIGTERM it; end whatever hosts are
    still open here (local worker processes, cloud instances through the fleet). Returns how many."""
    import signal

    from ..runs.controller import controller_alive

    state = _state()
    row = state.get_run(job_id)
    if controller_alive(row):
        until = time.time() + (DRIVER_STOP_SECONDS if wait_s is None else wait_s)
        while time.time() < until and controller_alive(state.get_run(job_id)):
            time.sleep(0.2)
        row = state.get_run(job_id)
        if controller_alive(row):
            try:
                os.kill(int(row["controller_pid"]), signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            until = time.time() + 10
            while time.time() < until and controller_alive(state.get_run(job_id)):
                time.sleep(0.2)
    open_ = [a for a in state.attempts(job_id) if a.state != "ended"]
    if not open_:
        return 0
    if row["spec"].get("provider", "local") == "local":
        for a in open_:
            pid = a.instance_id.removeprefix("pid-") if a.instance_id else ""
            if pid.isdigit():
                try:
                    os.kill(int(pid), signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
        _worker_attempts_ended(state, job_id, "stopped")
    else:
        from .controller import BatchController

        ctl = BatchController(state, job_id)
        for cur in ctl.fleet.open_attempts():
            ctl.fleet.end(cur, "stopped")
    return len(open_)


def job_over(job_id: str) -> bool:
    """Whether the job's row says it ended (cancelled, failed, succeeded, stopped): drivers stop at once."""
    from ..runs.state import FINAL_RUN_STATES

    row = _state().get_run(job_id)
    return row is None or row["state"] in FINAL_RUN_STATES


def verify_job(job_id: str) -> dict[str, Any]:
    from sdcloud_agent.batch.verify import verify

    job = find_job(job_id)
    return {"job": job_id, **verify(_store(job), job["spec"]["prefix"]).as_dict()}


def pull(job_id: str, dest: str | None, force: bool = False) -> dict[str, Any]:
    """Download the images, one merged index.jsonl (from the done markers) and the gallery.

    Into a new or empty folder, or an earlier pull of the same job (then only missing images are
    fetched); any other folder only with `force`, so that two jobs' images never mix unasked.
    """
    from ..runs import pulls
    from sdcloud_agent.batch import layout
    from sdcloud_agent.batch.verify import done_markers

    from .gallery import write_gallery

    job = find_job(job_id)
    store = _store(job)
    prefix = job["spec"]["prefix"]
    out = Path(dest or job["id"]).expanduser()
    pulls.check_destination(_state(), job["id"], out, force, f"batch job {job['id']}")
    (out / "images").mkdir(parents=True, exist_ok=True)
    lines = sorted((ln for m in done_markers(store, prefix).values() for ln in m["images"]),
                   key=lambda ln: (ln["item"], ln["seed"]))
    _add_model_and_lora(store, prefix, lines)
    fetched = 0
    for ln in lines:
        target = out / "images" / f"{ln['key']}.png"
        if not target.exists():
            store.get_file(layout.image_path(prefix, ln["key"]), target)
            fetched += 1
    (out / "index.jsonl").write_text("".join(json.dumps(ln, sort_keys=True) + "\n" for ln in lines))
    write_gallery(out, lines, title=f"sdcloud batch {job_id}")
    pulls.record(_state(), job["id"], out)
    return {"job": job_id, "dir": str(out), "images": len(lines), "fetched": fetched,
            "gallery": str(out / "index.html")}


def _add_model_and_lora(store, prefix: str, lines: list[dict[str, Any]]) -> None:
    """Give each index line the model and LoRA its item was made with. Workers record both; lines
    from workers of an older sdcloud do not, and take them from their item."""
    from sdcloud_agent.batch.worker import read_items

    older = [ln for ln in lines if "model" not in ln or "lora" not in ln]
    if not older:
        return
    settings = {it["id"]: it["settings"] for it in read_items(store, prefix)}  # one read: items.jsonl
    for ln in older:
        ln.setdefault("model", settings[ln["item"]].get("model"))
        ln.setdefault("lora", settings[ln["item"]].get("lora"))


# -- running the workers ------------------------------------------------------------------------

def _worker_cmd(job: dict, n: int, ttl: float) -> list[str]:
    spec = job["spec"]
    return [sys.executable, "-m", "sdcloud_agent.batch", "--store", json.dumps(spec["store"]),
            "--job", spec["prefix"], "--worker-id", f"{job['id']}-w{n}", "--generator", spec.get("generator", "diffusers"),
            "--ttl", str(ttl), "--fake-delay", str(spec.get("fake_delay", 0.0))]


def _worker_attempt_started(state, job: dict, pid: int) -> None:
    """A local worker process is the pool's host: an attempt of the job at the [local] price_per_hour,
    as a local training run's host is one, so that `batch status` and the cost report count and price it."""
    n = max((a.n for a in state.attempts(job["id"])), default=0) + 1
    state.add_attempt(job["id"], n, "local", f"{job['id']}-w{n}", region="local", zone="local",
                      instance_type="this-machine", market=job["spec"].get("market") or "on-demand",
                      price=config.local().get("price_per_hour", 0.0), currency="USD", instance_id=f"pid-{pid}")
    state.update_attempt(job["id"], n, state="running", start=time.time())


def _worker_attempts_ended(state, job_id: str, reason: str, pid: int | None = None) -> None:
    """Close the attempt of worker `pid`, or every open one (the pool is over)."""
    for a in state.attempts(job_id):
        if a.end is None and a.provider == "local" and (pid is None or a.instance_id == f"pid-{pid}"):
            state.update_attempt(job_id, a.n, state="ended", end=time.time(), end_reason=reason)


def run_local(job_id: str, ttl: float = 20.0, poll: float = 0.5, on_progress=None) -> dict[str, Any]:
    """Keep K worker processes on this machine until every item is done (the local provider).

    A worker that dies is replaced while items are left; workers exit by themselves when nothing
    is left to claim, which is how the pool scales down at the end of a job.
    """
    job = find_job(job_id)
    if job["spec"]["provider"] != "local":
        raise UserError(f"job {job_id} runs on {job['spec']['provider']}: its hosts are started by the fleet")
    state = _state()
    k = int(job["spec"]["workers"])
    logs = config.home() / "batch" / job_id
    logs.mkdir(parents=True, exist_ok=True)
    procs: dict[int, subprocess.Popen] = {}
    started = 0

    def start(slot: int) -> None:
        nonlocal started
        if job_over(job_id):  # a cancel between this pass's check and now: start nothing
            return
        started += 1
        log = open(logs / f"worker-{started}.log", "ab")
        procs[slot] = subprocess.Popen(_worker_cmd(job, started, ttl), stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        state.event(job_id, "worker-started", {"slot": slot, "n": started, "pid": procs[slot].pid})
        _worker_attempt_started(state, job, procs[slot].pid)

    if job_over(job_id):
        return {**progress(job_id), "workers_started": 0}
    state.update_run(job_id, state="running", controller_pid=os.getpid())
    for slot in range(k):
        start(slot)
    try:
        while True:
            spec = dict(job["spec"], worker_pids=[p.pid for p in procs.values()])
            state.update_run(job_id, spec=json.dumps(spec))
            p = progress(job_id)
            state.update_run(job_id, step=p["images_done"])
            if on_progress:
                on_progress(p)
            if p["items_done"] >= p["items"]:
                break
            # A cancel (or `down`) is final: checked before any worker is started again.
            if job_over(job_id) or _cancel_marked(job):
                break
            for slot, proc in list(procs.items()):
                if proc.poll() is not None:
                    state.event(job_id, "worker-exited", {"slot": slot, "pid": proc.pid, "rc": proc.returncode})
                    _worker_attempts_ended(state, job_id, "succeeded" if proc.returncode == 0 else "failed", proc.pid)
                    del procs[slot]
                    if p["items_done"] < p["items"] and proc.returncode != 0:
                        if started >= MAX_WORKER_STARTS_PER_SLOT * k:
                            # Workers that keep dying (a model that does not load) are a failure, not a reclaim.
                            state.update_run(job_id, state="failed", reason=f"workers keep exiting (rc {proc.returncode}); "
                                             f"see {logs}")
                            return {**progress(job_id), "workers_started": started}
                        start(slot)  # died (killed, reclaimed): keep K alive
            if not procs:
                start(0)  # all exited cleanly while items remain (leases still live): look again
            time.sleep(poll)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        _worker_attempts_ended(state, job_id, "stopped")
    final = progress(job_id)
    state.update_run(job_id, step=final["images_done"], controller_pid=None)
    if _cancel_marked(job) and not job_over(job_id):
        state.update_run(job_id, state="cancelled", reason="cancelled (the bucket's cancel marker)")
    if not job_over(job_id):
        v = verify_job(job_id)
        state.update_run(job_id, state="succeeded" if v["ok"] else "failed",
                         reason=None if v["ok"] else "verify failed")
    return {**progress(job_id), "workers_started": started, "final_images": final["images_done"]}


def _cancel_marked(job: dict) -> bool:
    from ..runs.store import StoreError

    try:
        return _store(job).head(f"{job['spec']['prefix']}/cancel") is not None
    except (StoreError, OSError):
        return False  # unknown now; the state row is the other signal and is checked each pass


def run_job(job_id: str, on_progress=None) -> dict[str, Any]:
    """Run a job to its end: K worker processes here (local), or K hosts through the fleet (clouds, SSH)."""
    job = find_job(job_id)
    with _sigterm_exits():
        if job["spec"]["provider"] == "local":
            return run_local(job["id"], on_progress=on_progress)
        from .controller import BatchController

        res = BatchController(_state(), job["id"]).run()
        return {**progress(job["id"]), **res}


@contextlib.contextmanager
def _sigterm_exits():
    """A driver that is told to stop (down, batch cancel) unwinds, so that its pool's `finally` ends its
    workers; Python's default SIGTERM would end it without running any."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def detach(job_id: str) -> int:
    """Run the job's controller in a background process that outlives this command; its pid."""
    logs = config.home() / "batch" / job_id
    logs.mkdir(parents=True, exist_ok=True)
    log = open(logs / "controller.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "sdcloud.batch.jobs", "run", job_id], stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    # Recorded now, not when the driver gets going: in between, `status` would call the job unattended
    # and `down` would not know whom to stop.
    _state().update_run(job_id, controller_pid=proc.pid)
    return proc.pid


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "run":
        print(json.dumps(run_job(args[1])), flush=True)
        return 0
    print("usage: python -m sdcloud.batch.jobs run JOB", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
