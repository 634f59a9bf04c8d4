"""Traces of more than one cloud replayed as one job's candidates (`sdcloud simulate --trace CLOUD:FILE`).

A trace named `aws:us-west-2a_v100_1.json` is a zone of the cloud `aws`; the cloud is a label the
user gives, nothing here knows what it names. Zones of one cloud share a checkpoint store; a launch
in another cloud than the one holding the newest checkpoint is a move, priced by `--move-hours` and
`--move-usd` (simulate.Setting). Each cloud's zones are priced on their own:

- `--cloud-prices CLOUD:SPOT:ONDEMAND[:CURRENCY]` gives a cloud's flat spot and on-demand prices per
  hour in its own currency, turned into USD with the rate of sdcloud.config.usd_per (CNY: 7.1 per USD
  unless SDCLOUD_CNY_PER_USD or config.toml [currency] cny_per_usd says otherwise), the same rate
  `offers` ranks Tencent's yuan prices with. It wins over `--prices` for that cloud's zones.
- A trace's own prices (its `prices` series, `metadata.price_info`) still win over both, converted
  from the currency its price_info names. Machines and currencies are checked within a cloud
  (traces.ondemand_for), never across: two clouds rent different machines for the same work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from .. import config
from ..errors import UserError
from .traces import Trace, ondemand_for

_LABEL = re.compile(r"^([A-Za-z][A-Za-z0-9_-]*):(.+)$")


def split_trace(text: str) -> tuple[str, str]:
    """`CLOUD:FILE` -> (cloud, file); a plain FILE (or a path that exists as written) -> ("", FILE)."""
    m = _LABEL.match(text)
    if m is None or Path(text).exists():
        return "", text
    return m.group(1), m.group(2)


@dataclass(frozen=True)
class CloudPrices:
    """One cloud's flat prices, in USD per hour, with what they were given in."""

    cloud: str
    spot_usd: float
    ondemand_usd: float
    words: str  # as given, with the rate used: "7.612/19.03 CNY/h at 0.1408 USD per CNY"


def parse_cloud_prices(text: str) -> CloudPrices:
    """`CLOUD:SPOT:ONDEMAND[:CURRENCY]` -> CloudPrices in USD; one line naming what is wrong otherwise."""
    parts = text.split(":")
    if len(parts) not in (3, 4) or not parts[0]:
        raise UserError(f"--cloud-prices {text!r}: write CLOUD:SPOT:ONDEMAND[:CURRENCY], e.g. tencent:7.6:19.03:CNY")
    try:
        spot, od = float(parts[1]), float(parts[2])
    except ValueError:
        raise UserError(f"--cloud-prices {text!r}: spot and on-demand must be numbers per hour") from None
    if not (spot >= 0 and od > 0 and np.isfinite(spot) and np.isfinite(od)):
        raise UserError(f"--cloud-prices {text!r}: spot must be 0 or more and on-demand more than 0")
    currency = parts[3].upper() if len(parts) == 4 else "USD"
    rate = config.usd_per(currency)
    words = f"{spot:g}/{od:g} {currency}/h" + ("" if currency == "USD" else f" at {rate:.4g} USD per {currency}")
    return CloudPrices(parts[0], spot * rate, od * rate, words)


def label(traces: Sequence[Trace], clouds: Sequence[str]) -> list[Trace]:
    """Each trace keyed `cloud:zone` where clouds are named, so that two clouds' files of one name stay two zones."""
    if len(set(clouds)) > 1 and "" in clouds:
        raise UserError("name the cloud of every --trace (CLOUD:FILE) or of none")
    return [replace(t, key=f"{c}:{t.key}") if c else t for t, c in zip(traces, clouds)]


def check_priced(clouds: Sequence[str], priced: dict[str, CloudPrices]) -> None:
    unknown = sorted(set(priced) - set(clouds))
    if unknown:
        raise UserError(f"--cloud-prices names {', '.join(unknown)}, which no --trace CLOUD:FILE names")


def zone_prices(traces: Sequence[Trace], clouds: Sequence[str], priced: dict[str, CloudPrices], spot_flat: float,
                ondemand_flat: float, ondemand_given: bool) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Spot (zones x ticks) and on-demand (one per zone) USD per hour, each cloud's zones priced on
    their own (module docstring). (None, None) where nothing is priced per zone (the flat prices)."""
    n = min(len(t.avail) for t in traces)
    od = np.empty(len(traces))
    own_any = False
    for cloud in dict.fromkeys(clouds):
        idx = [i for i, c in enumerate(clouds) if c == cloud]
        group = [traces[i] for i in idx]
        flat = priced[cloud].ondemand_usd if cloud in priced else ondemand_flat
        own = ondemand_for(group, flat, fallback_given=ondemand_given or cloud in priced)
        own_any = own_any or own is not None or cloud in priced
        for j, i in enumerate(idx):
            od[i] = flat if own is None else own[j] * _rate(traces[i])
    spot = []
    for t, c in zip(traces, clouds):
        if t.prices is not None:
            spot.append(t.prices[:n] * _rate(t))
        else:
            spot.append(np.full(n, priced[c].spot_usd if c in priced else spot_flat))
    has_series = any(t.prices is not None for t in traces) or bool(priced)
    return (np.stack(spot) if has_series else None), (od if own_any else None)


def _rate(trace: Trace) -> float:
    """USD per unit of the currency a trace's own prices are in (USD where it says none)."""
    return config.usd_per(trace.price_basis.currency) if trace.price_basis is not None else 1.0
