"""The host's training health (sdcloud_agent/health.py) and its out-of-memory retries, as the
controller records them and `sdcloud status` / `watch` show them.

The agent puts `health` (one verdict with its figures) and `oom_events` in status.json. The
controller records a `health` event when the verdict changes, and at most once a minute while it
holds (HEALTH_EVENT_SECONDS), so that `status` reads the latest from the state store without
touching the bucket; each rung the agent climbed is one `oom-retry` event (runs/driving/oom_move.py).
"""

from __future__ import annotations

import time

from ... import events
from ...events import Kind
from .owner import RunOwner

HEALTH_EVENT_SECONDS = 60.0
KINDS = (Kind.HEALTH, Kind.OOM_RETRY, Kind.OUT_OF_MEMORY, Kind.HEALTH_ACTION, Kind.HEALTH_RECHECK, Kind.THROTTLE_MOVE)
# The figures kept in the event, and the latest of them read back: runs/records/health.py.
from ..records.health import FIELDS, latest  # noqa: F401 - status and watch import them from here


def note(controller: RunOwner, attempt: int, status: dict | None, now: float | None = None) -> None:
    """Record the host's health as an event when it changed (or a minute passed), and its actions."""
    note_actions(controller, attempt, status)
    h = (status or {}).get("health")
    if not isinstance(h, dict) or not (h.get("verdict") or h.get("trainer_exit") is not None):
        return
    key = h.get("verdict") or f"exited {h.get('trainer_exit')}"
    now = time.time() if now is None else now
    last = controller.memo.health_last
    if last is not None and last[0] == attempt and last[1] == key and now - last[2] < HEALTH_EVENT_SECONDS:
        return
    controller.memo.health_last = (attempt, key, now)
    controller.event(Kind.HEALTH, {"attempt": attempt, **{k: h.get(k) for k in FIELDS if h.get(k) is not None}})


def note_actions(controller: RunOwner, attempt: int, status: dict | None) -> None:
    """One `health-action` event per action the host took on a verdict (status.json
    `health_actions`, sdcloud_agent/health_act.py) and one `health-recheck` once it was judged again."""
    for act in (status or {}).get("health_actions") or []:
        n = int(act.get("n") or 0)
        if (attempt, n, "action") not in controller.memo.health_acted:
            controller.memo.health_acted.add((attempt, n, "action"))
            controller.event(Kind.HEALTH_ACTION, {"attempt": attempt, **{k: act.get(k) for k in (
                "n", "cause", "changes", "why_not", "before", "step", "resume_step")}})
        if "after" in act and (attempt, n, "recheck") not in controller.memo.health_acted:
            controller.memo.health_acted.add((attempt, n, "recheck"))
            controller.event(Kind.HEALTH_RECHECK, {"attempt": attempt, **{k: act.get(k) for k in (
                "n", "cause", "still", "after", "after_verdict", "before")}})


def line(h: dict) -> str:
    """`health: io-bound: GPU 23%, data wait 64%, no throttling, 0 OOM retries (why)`; an exited
    trainer's: `health: no verdict: the trainer exited with code 3, 0 OOM retries`, or, when it
    finished its work, `health: the trainer finished (exit 0), 0 OOM retries`."""
    n = h.get("oom_retries") or 0
    retries = f"{n} OOM retr{'y' if n == 1 else 'ies'}"
    if h.get("verdict") is None and h.get("trainer_exit") == 0:
        return f"health: the trainer finished (exit 0), {retries}"
    if h.get("verdict") is None and h.get("trainer_exit") is not None:
        return f"health: no verdict: the trainer exited with code {h['trainer_exit']}, {retries}"
    if h.get("verdict") == "unknown":
        return f"health: unknown: {h.get('why') or 'not enough evidence yet'}; {retries}"
    bits = [f"GPU {h['gpu_util']:.0f}%" if h.get("gpu_util") is not None else "GPU not sampled"]
    bits.append(f"data wait {h['data_wait_pct']:.0f}%" if h.get("data_wait_pct") is not None else "data wait unknown")
    reasons = h.get("throttle_reasons") or []
    if reasons:
        share = f" {h['throttle_pct']:.0f}% of the time" if h.get("throttle_pct") is not None else ""
        bits.append(f"throttled by {', '.join(reasons)}{share}")
    else:
        bits.append("no throttling")
    n = h.get("oom_retries") or 0
    bits.append(f"{n} OOM retr{'y' if n == 1 else 'ies'}")
    verdict = h.get("verdict") or "not sampled"
    why = f" ({h['why']})" if h.get("why") and verdict != "healthy" else ""
    return f"health: {verdict}: {', '.join(bits)}{why}"


def plain(kind: Kind | str, data: dict) -> str | None:
    n = data.get("attempt")
    kind = events.parse(kind)
    if kind is Kind.HEALTH:
        return f"attempt {n}: " + line({**data, "oom_retries": None}).replace(", 0 OOM retries", "")
    if kind is Kind.OOM_RETRY:
        # An older host reports fewer figures: each part is told only when it was reported.
        peak = f"peak {data['peak_gb']} GB" if data.get("peak_gb") is not None else ""
        step = f" from step {data['resume_step']}" if data.get("resume_step") is not None else ""
        rung = " ".join(str(data[k]) for k in ("n", "rung") if data.get(k) is not None)
        detail = ", ".join(str(x) for x in (data.get("change"), peak) if x)
        return (f"attempt {n}: out of GPU memory; restarted on the same host{step}"
                + (f" with rung {rung}" if rung else "") + (f" ({detail})" if detail else ""))
    if kind is Kind.HEALTH_ACTION:
        before = data.get("before") or {}
        if not data.get("changes"):
            return f"attempt {n}: {data.get('cause')}: {data.get('why_not') or 'nothing changed'}{_rate(before)}"
        return (f"attempt {n}: {data.get('cause')} ({_figures(before)}): " + "; ".join(data["changes"])
                + "; the trainer restarts from its newest checkpoint")
    if kind is Kind.HEALTH_RECHECK:
        after = data.get("after") or {}
        if data.get("still"):
            return f"attempt {n}: still {data.get('cause')} after the change ({_figures(after)}){_rate(after)}"
        return (f"attempt {n}: no longer {data.get('cause')}: {data.get('after_verdict') or 'judged again'} ({_figures(after)}; "
                f"before: {_figures(data.get('before') or {})})")
    if kind is Kind.THROTTLE_MOVE:
        head = "moving to a fresh host" if data.get("moved") else "not moving"
        share = f" {data['throttle_pct']}% of the time" if data.get("throttle_pct") is not None else ""
        return (f"attempt {n}: GPU throttled ({', '.join(data.get('reasons') or []) or 'slowdown'}){share}: "
                f"{head}: {data.get('why')}")
    if kind is Kind.OUT_OF_MEMORY:
        nxt = data.get("next") or []
        on = f" on {data['offer']}" if data.get("offer") else ""
        return (f"attempt {n}: out of GPU memory with every rung of the memory ladder{on}; "
                + (f"moving to more VRAM: {', '.join(nxt)}" if nxt else "no offer with more VRAM"))
    return None


def _figures(f: dict) -> str:
    bits = [f"{name} {f[k]:.0f}%" for k, name in (("data_wait_pct", "data wait"), ("gpu_util", "GPU"),
                                                   ("save_pct", "saves")) if f.get(k) is not None]
    if f.get("step_s") is not None:
        bits.append(f"{f['step_s']:.3g} s a step")
    return ", ".join(bits) or "not measured"


def _rate(f: dict) -> str:
    return f"; the dataset reads at {f['read_mb_s']:.1f} MB/s" if f.get("read_mb_s") is not None else \
        "; the read rate was not measured"
