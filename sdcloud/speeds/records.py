"""The `speeds` table of the state store: figures recorded by the user and observed by attempts.

Each row is keyed by provider, instance type, GPU (and how many the trainer drove), tier, trainer and
recipe ('' where a key holds for any: a figure recorded for a GPU holds on every provider's host of
it). Observed rows are one per attempt (run id, attempt number), so learning an attempt twice
replaces its row.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

RECORDED, OBSERVED = "recorded", "observed"
COLUMNS = ("id", "origin", "provider", "instance_type", "gpu", "gpu_count", "tier", "trainer", "recipe", "zone",
           "market", "rate", "first_step_s", "phases", "restart_s", "hours", "reclaimed", "run_id", "n", "note", "time")


@dataclass(frozen=True)
class SpeedRow:
    id: int
    origin: str
    provider: str
    instance_type: str
    gpu: str
    gpu_count: int
    tier: str
    trainer: str
    recipe: str
    zone: str
    market: str
    rate: float | None
    first_step_s: float | None
    phases: dict | None
    restart_s: float | None
    hours: float | None
    reclaimed: bool
    run_id: str | None
    n: int | None
    note: str
    time: float

    def as_dict(self) -> dict[str, Any]:
        return {c: getattr(self, c) for c in COLUMNS}


def _number(value: Any) -> float | None:
    """A figure of a row as a finite number, or None: a row another tool or an old version wrote with text
    or nan in a number's column is read as unknown, never a traceback in `speeds` or `offers`."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _row(r) -> SpeedRow:
    d = dict(r)
    for col in ("rate", "first_step_s", "restart_s", "hours"):
        d[col] = _number(d[col])
    try:
        d["phases"] = json.loads(d["phases"]) if d.get("phases") else None
    except (TypeError, ValueError):
        d["phases"] = None
    if not isinstance(d["phases"], dict):
        d["phases"] = None
    d["reclaimed"] = bool(d["reclaimed"])
    return SpeedRow(**{c: d[c] for c in COLUMNS})


def rows(state, origin: str | None = None, tier: str | None = None) -> list[SpeedRow]:
    """Every row (of one origin, of one tier), oldest first."""
    where, args = [], []
    if origin:
        where.append("origin = ?")
        args.append(origin)
    if tier:
        where.append("tier = ?")
        args.append(tier)
    sql = "SELECT * FROM speeds" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY time, id"
    with state.tx() as db:
        return [_row(r) for r in db.execute(sql, args).fetchall()]


def add_recorded(state, gpu: str, tier: str, rate: float, trainer: str = "", note: str = "", provider: str = "",
                 instance_type: str = "", gpu_count: int = 1, at: float | None = None) -> int:
    """A rate measured elsewhere (a bench, another tool). A second figure for the same key replaces the first."""
    key = (provider, instance_type, gpu, gpu_count, tier, trainer)
    with state.tx() as db:
        db.execute("DELETE FROM speeds WHERE origin = ? AND provider = ? AND instance_type = ? AND gpu = ? "
                   "AND gpu_count = ? AND tier = ? AND trainer = ?", (RECORDED, *key))
        cur = db.execute("INSERT INTO speeds (origin, provider, instance_type, gpu, gpu_count, tier, trainer, rate, note, "
                         "time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (RECORDED, *key, float(rate), note, at if at is not None else time.time()))
        return int(cur.lastrowid or 0)


def put_observed(state, run_id: str, n: int, **fields: Any) -> None:
    """What attempt n of a run measured (its row replaced if it was learnt before)."""
    if "phases" in fields and fields["phases"] is not None:
        fields["phases"] = json.dumps(fields["phases"])
    fields = {"origin": OBSERVED, "run_id": run_id, "n": n, "time": fields.pop("time", None) or time.time(), **fields}
    cols = list(fields)
    with state.tx() as db:
        db.execute("DELETE FROM speeds WHERE run_id = ? AND n = ?", (run_id, n))
        db.execute(f"INSERT INTO speeds ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", [fields[c] for c in cols])


def forget(state, gpu: str | None = None, tier: str | None = None, trainer: str | None = None,
           origin: str | None = None, row_id: int | None = None, run_id: str | None = None) -> int:
    """Remove the rows that match every given key; how many were removed."""
    where, args = [], []
    for col, value in (("gpu", gpu), ("tier", tier), ("trainer", trainer), ("origin", origin), ("id", row_id),
                       ("run_id", run_id)):
        if value is not None:
            where.append(f"{col} = ?")
            args.append(value)
    if not where:
        raise ValueError("forget needs at least one key")
    with state.tx() as db:
        return db.execute("DELETE FROM speeds WHERE " + " AND ".join(where), args).rowcount


def reclaims_per_hour(found: list[SpeedRow]) -> dict[str, float]:
    """Per zone (provider/zone), the reclaims per spot hour that the attempts observed there."""
    hours: dict[str, float] = {}
    reclaims: dict[str, int] = {}
    for r in found:
        if r.origin != OBSERVED or r.market != "spot" or not r.hours or not r.zone:
            continue
        key = f"{r.provider}/{r.zone}"
        hours[key] = hours.get(key, 0.0) + r.hours
        reclaims[key] = reclaims.get(key, 0) + int(r.reclaimed)
    return {k: reclaims[k] / h for k, h in hours.items() if h > 0}


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
