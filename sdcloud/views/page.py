"""A run's or batch job's page as data: the JSON format of `sdcloud report`, and what html.py renders.

Everything the page shows is here: the header, the samples (images as data: URIs), the metrics
rows, the events on the same time axis, the attempts and their causes, and the cost report's figures
for this run (costs/report.py, so the page and `cost report` say the same amounts).
"""

from __future__ import annotations

from typing import Any

from ..errors import UserError
from ..events import Kind, one_line, parse
from ..offers.kinds import RunKind

# Which events a chart marks, in which group (charts.EVENT_STYLE); the rest are listed, not marked.
EVENT_GROUPS: dict[Kind, str] = {
    Kind.RECLAIMED: "reclaim", Kind.RECLAIM_NOTICE: "reclaim", Kind.HOST_LOST: "reclaim",
    Kind.CLOUD_MOVED: "move", Kind.FAILOVER: "move", Kind.THROTTLE_MOVE: "move",
    Kind.HEALTH_ACTION: "health", Kind.OOM_RETRY: "health", Kind.OUT_OF_MEMORY: "health",
    Kind.HOST_FAILED: "health", Kind.BOOT_FAILED: "health",
    Kind.LAUNCHED: "launch", Kind.RESUMED: "launch",
    Kind.BUDGET_WARNING: "budget", Kind.BUDGET_REACHED: "budget",
    Kind.RUN_SUCCEEDED: "end", Kind.RUN_FAILED: "end", Kind.RUN_STOPPED: "end",
}


def _group(kind: str) -> str:
    from ..runs.records.metrics import CHECKPOINT  # a checkpoint in the store, not a journal kind

    if kind == CHECKPOINT:
        return "checkpoint"
    k = parse(kind)
    return EVENT_GROUPS.get(k, "other") if isinstance(k, Kind) else "other"


def _events(state, run: dict, store) -> list[dict]:
    """The run's marked events and checkpoints, oldest first, each with its group."""
    from .sources import run_events

    return [{**ev, "group": _group(ev["kind"])} for ev in run_events(state, store, run["id"])]


def _cost_so_far(state, run_id: str, metrics: list[dict]) -> None:
    """Each point's compute cost so far (the attempts' price times their hours up to its time)."""
    from ..runs.records.metrics import cost_at

    attempts = state.attempts(run_id)
    for m in metrics:
        if m.get("cost_usd") is None:
            m["cost_usd"] = cost_at(attempts, m["t"])


def _time_left_s(run: dict, metrics: list[dict]) -> float | None:
    """Seconds to the last step at the newest measured rate; 0 once ended; None before any rate."""
    from ..runs.records.state import ACTIVE_RUN_STATES

    if run["state"] not in ACTIVE_RUN_STATES:
        return 0.0 if run["state"] == "succeeded" else None
    rate = next((m["steps_per_s"] for m in reversed(metrics) if m.get("steps_per_s")), None)
    if not rate:
        return None
    return round(max(0, (run["total_steps"] or 0) - (run["step"] or 0)) / rate, 1)


def _attempts(state, run: dict) -> list[dict]:
    from ..costs import ledger

    costs = ledger.attempt_costs_usd(state, run)
    return [{"n": a.n, "provider": a.provider, "zone": a.zone, "instance_type": a.instance_type, "market": a.market,
             "start": a.start, "end": a.end, "hours": round(a.hours, 4), "cost_usd": costs.get(a.n, round(a.cost, 4)),
             "cause": a.end_reason or ("running" if a.end is None else "ended")} for a in state.attempts(run["id"])]


def _cost(state, run: dict, now: float | None) -> dict:
    from ..costs.report import build_report

    images = None
    if RunKind.of(run.get("spec")) is RunKind.BATCH:
        from ..batch.status import images_done

        images = {run["id"]: images_done(run)}
    return build_report(state, [run], now=now, images=images)


def _store(run: dict):
    from ..runs.records.store_of import store_of

    return store_of(run)


def build(state, run_id: str, now: float | None = None, with_images: bool = True, store=None) -> dict:
    """The page of one run or batch job (`store`: its bucket when this machine's state does not say where it
    is, a `dashboard --store` bucket's run). A store that cannot be read leaves samples and metrics empty
    and says why in `notes`: the state store's figures are still shown."""
    from .. import clock

    run = state.get_run(run_id)
    if run is None:
        raise UserError(f"no run {run_id!r}; see: sdcloud status")
    now = now or clock.epoch()
    spec = run["spec"] or {}
    kind = RunKind.of(spec)
    report = _cost(state, run, now)
    cost_run = report["runs"][0]
    notes: list[str] = []
    samples: list[dict] = []
    metrics: list[dict] = []
    events: list[dict] = []
    batch: dict | None = None
    if kind is RunKind.BATCH:
        batch = _batch(run, notes)
    else:
        try:
            store = store or _store(run)
        except Exception as exc:  # noqa: BLE001 - no bucket here: the page shows what the state store holds
            store = None
            notes.append(f"the run's store cannot be read here: {one_line(str(exc))}")
        if store is not None:
            from . import sources

            samples = _read(lambda: sources.samples(store, run_id, with_images), [], "samples", notes)
            metrics = _read(lambda: sources.metrics(store, run_id), [], "metrics", notes)
            _cost_so_far(state, run_id, metrics)
        events = _read(lambda: _events(state, run, store), [], "events", notes)
    t0 = run["created"]
    page = {
        "run": run["id"], "kind": str(kind), "generated": now, "started": t0,
        "header": {"name": run.get("name"), "tier": run["tier"], "model": spec.get("model"), "dataset": spec.get("dataset"),
                   "trainer": spec.get("trainer"), "provider": spec.get("provider") or "local", "state": run["state"],
                   "reason": one_line(run["reason"]) if run.get("reason") else None,
                   "step": run["step"], "total_steps": run["total_steps"], "cost_usd": cost_run["total_usd"],
                   "time_left_s": _time_left_s(run, metrics)},
        "samples": samples, "metrics": metrics, "events": events,
        "attempts": _attempts(state, run), "cost": report, "notes": notes,
    }
    if batch is not None:
        page["batch"] = batch
        page["header"]["cost_per_image_usd"] = cost_run.get("cost_per_image")
    return page


def _read(fn, empty, what: str, notes: list[str]):
    try:
        return fn()
    except ImportError:
        notes.append(f"this sdcloud cannot read {what} yet")
    except Exception as exc:  # noqa: BLE001 - a store fault leaves that part empty, said once
        notes.append(f"{what} cannot be read: {one_line(str(exc))}")
    return empty


def _batch(job: dict, notes: list[str]) -> dict:
    from ..batch.status import progress
    from .sources import batch_images

    out: dict[str, Any] = {"workers": job["spec"].get("workers"), "images": job["total_steps"]}
    try:
        p = progress(job["id"])
        out.update({k: p[k] for k in ("images_done", "images_per_s", "eta_s", "hosts", "cost_per_image_usd",
                                      "cost_per_1k_images_usd")})
        out["gallery"], out["gallery_total"] = batch_images(job)
    except Exception as exc:  # noqa: BLE001 - the job's bucket gone: its row's figures only
        notes.append(f"the job's bucket cannot be read here: {one_line(str(exc))}")
        out.update({"images_done": job.get("step") or 0, "gallery": [], "gallery_total": 0})
    return out


def version(page: dict) -> str:
    """What changes when the page must be drawn again: state, step, and counts of what it lists."""
    h = page["header"]
    extra = f"/{page['batch']['images_done']}" if page.get("batch") else ""
    return (f"{h['state']}/{h['step']}/{len(page['samples'])}/{len(page['metrics'])}/{len(page['events'])}/"
            f"{len(page['attempts'])}{extra}")
