"""Spot availability traces as `sdcloud simulate` replays them: one zone's ticks, read from a file.

A trace file is a JSON object: `metadata.gap_seconds` (the tick), `data` (one number per tick), and
optionally `prices` (spot USD per hour, per tick) and `refused` (> 0
where a spot launch was refused for capacity). The simulator (simulate.py) replays zones side by
side on one clock (`stack`).

What a value of `data` means depends on the format (../shared/data/README.md, "spot-traces"):
- the spot-traces format (`skypilot-org/spot-traces`, no `price_info`): > 0 where spot could be had
  (a multi-node file holds the nodes that were up);
- the SkyNomad format (the multi-region sets, with `metadata.price_info`): 1 = preempted or
  unavailable, 0 = available (its simulator's `spot_available()` is `not trace[tick]`).
A file may say which in `metadata.data_means`: "available" or "preempted" (1 = that). A file with
`price_info` whose `data` is not all 0 and 1 fits neither and is refused until it says so.

The published multi-region trace sets also say what their prices are in `metadata.price_info`:
`currency`, `price_unit` (per hour), `machine_type` (the whole traced machine, e.g. an 8-GPU
a3-highgpu-8g) and `on_demand_price`. Such a zone is priced by its own on-demand figure; a set that
mixes machines, currencies or units, or traces with their own prices and traces priced by the
`--ondemand-price` flag, is refused (`ondemand_for`): its savings would compare prices of
different things.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import UserError


@dataclass(frozen=True)
class Trace:
    """One zone's spot availability: avail[k] is True when spot could be had in tick k."""

    key: str
    gap_seconds: int
    avail: np.ndarray  # bool, one value per tick
    prices: np.ndarray | None = None  # spot USD per hour, one value per tick, where the trace carries them
    refused: np.ndarray | None = None  # bool, one value per tick: a spot launch is refused then
    ondemand_price: float | None = None  # metadata.price_info.on_demand_price, where the trace says it
    price_basis: PriceBasis | None = None  # what the trace's prices are for, where it says so

    @property
    def hours(self) -> float:
        return len(self.avail) * self.gap_seconds / 3600


@dataclass(frozen=True)
class PriceBasis:
    """What one trace's prices are in: its currency, its time unit and the machine they pay for."""

    currency: str
    unit: str
    machine: str | None

    def words(self) -> str:
        return f"{self.currency} per {self.unit}" + (f" for machine {self.machine}" if self.machine else "")


def load_trace(path: str | Path) -> Trace:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"trace file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"trace file {path} is not readable JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list) or not isinstance(doc.get("metadata"), dict):
        raise UserError(f"trace file {path} must be a JSON object with 'metadata' and a 'data' list")
    gap = doc["metadata"].get("gap_seconds")
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or gap <= 0 or gap != int(gap):
        raise UserError(f"trace file {path}: metadata.gap_seconds must be a positive whole number, got {gap!r}")
    data = doc["data"]
    if not data or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in data):
        raise UserError(f"trace file {path}: 'data' must be a non-empty list of numbers")
    prices = doc.get("prices")
    if prices is not None:
        if (not isinstance(prices, list) or len(prices) != len(data)
                or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 for v in prices)):
            raise UserError(f"trace file {path}: 'prices' must be a list of {len(data)} non-negative numbers, one per tick")
        prices = np.asarray(prices, dtype=float)
    refused = doc.get("refused")
    if refused is not None:
        if not isinstance(refused, list) or len(refused) != len(data) or any(not isinstance(v, (int, float)) for v in refused):
            raise UserError(f"trace file {path}: 'refused' must be a list of {len(data)} numbers (or booleans), one per tick")
        refused = np.asarray(refused, dtype=float) > 0
    basis, ondemand = _price_info(path, doc["metadata"].get("price_info"))
    values = np.asarray(data, dtype=float)
    if _ones_mean_preempted(path, doc["metadata"], values):
        avail = values == 0
    else:
        avail = values > 0
    return Trace(path.stem, int(gap), avail, prices, refused, ondemand, basis)


# metadata.data_means: what a 1 in `data` says, where a file states it.
DATA_MEANS = ("available", "preempted")


def _ones_mean_preempted(path: Path, meta: dict, values: np.ndarray) -> bool:
    """Whether the file's `data` marks preempted ticks (SkyNomad) rather than available ones (spot-traces)."""
    said = meta.get("data_means")
    if said is not None:
        if said not in DATA_MEANS:
            raise UserError(f"trace file {path}: metadata.data_means must be 'available' or 'preempted' "
                            f"(what a 1 in 'data' says), got {said!r}")
        if said == "preempted" and not np.isin(values, (0, 1)).all():
            raise UserError(f"trace file {path}: metadata.data_means 'preempted' needs 'data' of 0 and 1 only")
        return said == "preempted"
    if "price_info" not in meta:
        return False  # the spot-traces format: > 0 = available
    if not np.isin(values, (0, 1)).all():
        raise UserError(f"trace file {path} has metadata.price_info (the SkyNomad format, 1 = preempted) but 'data' is "
                        "not all 0 and 1: say what it means with metadata.data_means \"available\" or \"preempted\"")
    return True


# Time units a published trace may name for "per hour"; any other unit is refused, not converted.
_HOUR_UNITS = {"h", "hr", "hour", "hours"}


def _price_info(path: Path, info: object) -> tuple[PriceBasis | None, float | None]:
    if info is None:
        return None, None
    if not isinstance(info, dict):
        raise UserError(f"trace file {path}: metadata.price_info must be an object")
    currency = info.get("currency", "USD")
    unit = str(info.get("price_unit", "h")).lower()
    od_unit = str(info.get("on_demand_price_unit", unit)).lower()
    if not isinstance(currency, str) or not currency:
        raise UserError(f"trace file {path}: metadata.price_info.currency must be a currency code, got {currency!r}")
    for name, value in (("price_unit", unit), ("on_demand_price_unit", od_unit)):
        if value not in _HOUR_UNITS:
            raise UserError(f"trace file {path}: metadata.price_info.{name} must be per hour ('h'), got {value!r}")
    od = info.get("on_demand_price")
    if od is not None and (isinstance(od, bool) or not isinstance(od, (int, float)) or not od > 0):
        raise UserError(f"trace file {path}: metadata.price_info.on_demand_price must be a positive number, got {od!r}")
    machine = info.get("machine_type")
    return PriceBasis(currency.upper(), "hour", str(machine) if machine else None), None if od is None else float(od)


def with_prices(trace: Trace, series: Sequence[float]) -> Trace:
    """A price series from elsewhere (e.g. ../shared/data/spot-prices), one value per trace tick.

    A series longer than the trace is cut; a shorter one holds its last price to the end."""
    arr = np.asarray(series, dtype=float)
    if arr.ndim != 1 or not len(arr) or not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise UserError(f"the price series for {trace.key} must be non-negative numbers")
    n = len(trace.avail)
    arr = arr[:n] if len(arr) >= n else np.concatenate([arr, np.full(n - len(arr), arr[-1])])
    return Trace(trace.key, trace.gap_seconds, trace.avail, arr, trace.refused, trace.ondemand_price, trace.price_basis)


def stretch_series(series: Sequence[float], n: int) -> np.ndarray:
    """A price series without timestamps spread evenly over n ticks (value i*len/n at tick i)."""
    arr = np.asarray(series, dtype=float)
    if arr.ndim != 1 or not len(arr) or n <= 0:
        raise UserError("a price series must be a non-empty list of numbers")
    return arr[(np.arange(n) * len(arr)) // n]


def region_of(key: str) -> str:
    """us-west-2a_v100_1 -> us-west-2: the zone is the part before the first '_', less its letter."""
    zone = key.split("_", 1)[0]
    return zone[:-1] if zone[-1:].isalpha() and zone[-2:-1].isdigit() else zone


def coarsen(trace: Trace, tick_seconds: int) -> Trace:
    """A coarser tick: available only when every fine tick inside it is (spot held through it)."""
    if tick_seconds % trace.gap_seconds:
        raise UserError(f"--tick {tick_seconds} must be a multiple of the trace's tick ({trace.gap_seconds} s) for {trace.key}")
    f = tick_seconds // trace.gap_seconds
    n = len(trace.avail) // f
    if n == 0:
        raise UserError(f"trace {trace.key} is shorter than one {tick_seconds} s tick")
    # A coarse tick is paid at the mean of its fine ticks' prices.
    prices = None if trace.prices is None else trace.prices[: n * f].reshape(n, f).mean(axis=1)
    # A coarse tick refuses a launch when any fine tick inside it did.
    refused = None if trace.refused is None else trace.refused[: n * f].reshape(n, f).any(axis=1)
    return Trace(trace.key, tick_seconds, trace.avail[: n * f].reshape(n, f).all(axis=1), prices, refused,
                 trace.ondemand_price, trace.price_basis)


def stack(traces: Sequence[Trace]) -> tuple[np.ndarray, int, list[str]]:
    """Zones side by side on one clock: same tick required; the common length is the shortest."""
    if not traces:
        raise UserError("give at least one --trace file")
    gaps = {t.gap_seconds for t in traces}
    if len(gaps) > 1:
        raise UserError(f"traces must share one tick to be replayed together, got {sorted(gaps)} seconds")
    keys = [t.key for t in traces]
    if len(set(keys)) != len(keys):
        raise UserError(f"two traces have the same zone name: {keys}")
    n = min(len(t.avail) for t in traces)
    return np.stack([t.avail[:n] for t in traces]), gaps.pop(), keys


def stack_prices(traces: Sequence[Trace], default: float) -> np.ndarray | None:
    """The zones' spot prices on the clock of `stack` (Z, n); `default` where a trace has none.
    None when no trace carries prices (every zone at the flat price)."""
    if all(t.prices is None for t in traces):
        return None
    n = min(len(t.avail) for t in traces)
    return np.stack([t.prices[:n] if t.prices is not None else np.full(n, default) for t in traces])


def stack_refused(traces: Sequence[Trace]) -> np.ndarray | None:
    """The zones' refused launches on the clock of `stack` (Z, n); None when no trace carries them."""
    if all(t.refused is None for t in traces):
        return None
    n = min(len(t.avail) for t in traces)
    return np.stack([t.refused[:n] if t.refused is not None else np.zeros(n, bool) for t in traces])


def ondemand_by_zone(keys: Sequence[str], default: float, by_region: dict[str, float] | None = None) -> np.ndarray:
    """Each zone's on-demand price: its region's from `by_region`, else `default`."""
    by_region = by_region or {}
    return np.array([by_region.get(region_of(k), default) for k in keys], dtype=float)


def ondemand_for(traces: Sequence[Trace], fallback: float, fallback_given: bool = False) -> np.ndarray | None:
    """Each zone's on-demand price from its own trace (metadata.price_info), or None when no trace
    says one (every zone then at the `--ondemand-price` fallback).

    Refused, with the zones named: traces whose prices are for different machines, currencies or
    units; and a set where some zones carry their own on-demand price and others would take the
    fallback, or a zone whose prices say which machine they are for but not its on-demand price
    (unless the fallback was given on purpose): the savings would set one machine's spot price
    against another's on-demand price."""
    bases = {t.price_basis for t in traces if t.price_basis is not None}
    currencies = {b.currency for b in bases}
    if len(currencies) > 1:
        raise UserError(f"the traces' prices are in different currencies ({', '.join(sorted(currencies))}); "
                        "replay one currency at a time")
    machines = {b.machine for b in bases if b.machine}
    if len(machines) > 1:
        raise UserError(f"the traces price different machines ({', '.join(sorted(machines))}); "
                        "replay one machine type at a time")
    own = [t for t in traces if t.ondemand_price is not None]
    if not own:
        unpriced = [t for t in traces if t.price_basis is not None and t.price_basis.machine]
        if unpriced and not fallback_given:
            machine = unpriced[0].price_basis.machine  # type: ignore[union-attr]
            raise UserError(f"trace {unpriced[0].key} prices machine {machine} but gives no on-demand "
                            "price (metadata.price_info.on_demand_price); give --ondemand-price for that machine")
        return None
    missing = [t.key for t in traces if t.ondemand_price is None]
    if missing:
        basis = own[0].price_basis
        raise UserError(f"{own[0].key} carries its own prices ({basis.words() if basis else 'per hour'}) but "
                        f"{', '.join(missing)} has none: their prices cannot be set against each other")
    spotless = [t.key for t in traces if t.prices is None]
    if spotless:
        raise UserError(f"{', '.join(spotless)} gives an on-demand price but no spot prices ('prices'): "
                        "its spot would be priced by --spot-price, for another machine")
    return np.array([t.ondemand_price for t in traces], dtype=float)
