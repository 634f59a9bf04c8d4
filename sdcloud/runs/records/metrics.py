"""A run's curves and events on one time axis (the run page, the dashboard, `sdcloud samples`).

The metrics stream is the agent's (bootstrap/sdcloud_agent/metrics.py owns its layout), relative to the
store's root:

    runs/<run_id>/metrics/<attempt:04d>-<seq:06d>.jsonl     one object per logging interval, a record a line
    runs/<run_id>/tensorboard/sdcloud/events.out.tfevents.*  the same figures as TensorBoard scalars
    runs/<run_id>/tensorboard/trainer/...                    the trainer's own TensorBoard logs

`read_metrics` gives one point per step: where a resumed attempt trained a step again, the newest
attempt's record wins (the run's weights came from it). `read_run_events` gives what the controller
recorded (launches, reclaims, moves, health actions, the end) and the checkpoints that are in the store,
each with the run's cost so far at its time (the attempts' price times their hours up to that moment).
`store` is the run's store as runs/records opens it; `state` the StateStore.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from sdcloud_agent import metrics as layout

from ...events import Kind, words
from .store import ObjectStore, StoreError


@dataclass(frozen=True)
class MetricPoint:
    time: float
    step: int
    loss: float | None = None
    loss_smoothed: float | None = None
    lr: float | None = None
    steps_per_s: float | None = None
    data_wait_s: float | None = None
    gpu_util: float | None = None
    mem_used_mib: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    throttling: bool | None = None
    attempt: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RunEvent:
    time: float
    kind: str  # the event kind's word (Kind's value), or "checkpoint"
    words: str  # the event told in plain words
    cost_usd: float  # the run's compute cost so far at `time`
    step: int | None = None
    data: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


CHECKPOINT = "checkpoint"  # a checkpoint landing in the store: not a controller event, so not a Kind
# What the page marks on its charts: the run's turns, not its routine.
MARKED = frozenset({Kind.LAUNCHED, Kind.RECLAIM_NOTICE, Kind.RECLAIMED, Kind.HOST_LOST, Kind.RESUMED,
                    Kind.HEALTH_ACTION, Kind.THROTTLE_MOVE, Kind.OOM_RETRY, Kind.OUT_OF_MEMORY, Kind.CLOUD_MOVED,
                    Kind.BUDGET_WARNING, Kind.BUDGET_REACHED, Kind.RUN_SUCCEEDED, Kind.RUN_FAILED, Kind.RUN_STOPPED,
                    Kind.HOST_FAILED, Kind.BOOT_FAILED})


class MetricsCursor:
    """`read_metrics`, incrementally, for a page that polls: each `poll()` GETs only the objects that
    appeared since the last one and says which steps they brought."""

    def __init__(self, store: ObjectStore, run_id: str):
        self.store, self.run_id = store, run_id
        self._seen: set[str] = set()
        self._by_step: dict[int, tuple[tuple[int, int], dict]] = {}  # step -> ((attempt, seq), record)

    def poll(self) -> list[MetricPoint]:
        """The points new or replaced since the last poll, by step."""
        fresh = []
        for info in self.store.list(layout.metrics_prefix(f"runs/{self.run_id}")):
            parsed = layout.parse_key(info.key)
            if parsed is not None and info.key not in self._seen:
                fresh.append((parsed, info.key))
        changed: set[int] = set()
        for order, key in sorted(fresh):  # attempt, then sequence: a later record of a step wins
            try:
                recs = layout.decode(self.store.get(key))
            except StoreError:
                continue  # read again at the next poll
            self._seen.add(key)
            for rec in recs:
                held = self._by_step.get(rec["step"])
                if held is None or held[0] <= order:
                    self._by_step[rec["step"]] = (order, rec)
                    changed.add(rec["step"])
        return [_point(self._by_step[s][1]) for s in sorted(changed)]

    def points(self) -> list[MetricPoint]:
        """Every step's point as of the last poll."""
        return [_point(rec) for _, (_, rec) in sorted(self._by_step.items())]


def _point(rec: dict) -> MetricPoint:
    names = MetricPoint.__dataclass_fields__
    return MetricPoint(**{k: v for k, v in rec.items() if k in names})


def read_metrics(store: ObjectStore, run_id: str) -> list[MetricPoint]:
    """Every step's record, by step (the newest attempt's where steps were trained twice)."""
    cursor = MetricsCursor(store, run_id)
    cursor.poll()
    return cursor.points()


def cost_at(attempts, t: float) -> float:
    """The compute cost of the run's attempts up to time t (price x hours, each attempt cut at t)."""
    total = 0.0
    for a in attempts:
        if a.start is None or a.start >= t:
            continue
        end = min(a.end if a.end is not None else t, t)
        total += (a.price or 0.0) * max(0.0, end - a.start) / 3600.0
    return round(total, 6)


def checkpoint_times(store: ObjectStore, run_id: str) -> list[tuple[int, float]]:
    """(step, time its manifest was written) of each complete checkpoint in the store."""
    from sdcloud_agent import manifest

    prefix = f"runs/{run_id}"
    out = []
    for step in manifest.complete_steps(store, prefix):
        m = manifest.read(store, prefix, step)
        if m is not None:
            out.append((step, float(m.created)))
    return out


def read_run_events(state, store: ObjectStore | None, run_id: str) -> list[RunEvent]:
    """The controller's marked events and the store's checkpoints, by time, each with the cost so far."""
    attempts = state.attempts(run_id)
    out = []
    for ev in state.events(run_id):
        kind = ev["kind"]
        if kind not in MARKED:
            continue
        data = ev["data"] if isinstance(ev["data"], dict) else {}
        step = data.get("step") if isinstance(data.get("step"), int) else None
        out.append(RunEvent(time=float(ev["time"]), kind=str(kind.value), words=words(kind, data) or str(kind.value),
                            cost_usd=cost_at(attempts, float(ev["time"])), step=step, data=data))
    if store is not None:
        try:
            for step, t in checkpoint_times(store, run_id):
                out.append(RunEvent(time=t, kind=CHECKPOINT, words=f"checkpoint {step} saved",
                                    cost_usd=cost_at(attempts, t), step=step))
        except StoreError:
            pass
    return sorted(out, key=lambda e: e.time)
