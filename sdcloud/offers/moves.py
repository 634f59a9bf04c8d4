"""What moving a run from one cloud to another costs: its checkpoint's bytes at the source cloud's
internet egress price, plus the hours the copy takes before the first step in the other cloud.

The copy leaves the source cloud's store over the internet (presigned GET there, presigned PUT in the
destination), so the source bills it as internet egress; both clouds take ingress free. The egress
price is the source provider's list price (`egress_gb` in its folder's storage_prices.toml, the file
its traits name in `billing.storage_prices`), in that file's currency, turned into USD with the
user's rate (config.usd_per). The public figures it holds, as read in 2026:
- AWS S3 data transfer out to the internet, first 10 TB/month: $0.09 per GB (aws.amazon.com/s3/pricing);
- Tencent COS internet downstream traffic, mainland: 0.50 CNY per GB (cloud.tencent.com/document/product/436/6239).

Offers sit below providers in the house and cannot ask their traits, so this module reads the
file from the provider's folder directly, as offers/catalog.py reads each folder's catalog.csv. A
provider with no such file (this machine, the user's own boxes) charges no egress.

The transfer time is the bytes over a sustained cross-cloud rate: one stream between two public
endpoints on different continents keeps a few tens of MB/s; MOVE_MB_S is the planning figure and
`transfer_mb_s` (or SDCLOUD_MOVE_MB_S) overrides it where a user has measured their own.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from importlib import resources

from .. import config
from ..errors import UserError

# Sustained MB/s (10^6 bytes) of one copy between two clouds' stores through the controller.
MOVE_MB_S = 40.0
MOVE_MB_S_ENV = "SDCLOUD_MOVE_MB_S"
PRICES_FILE = "storage_prices.toml"


@dataclass(frozen=True)
class MoveCost:
    """The price of carrying `bytes` from one cloud's store to another's, with how it was reached."""
    egress_usd: float
    transfer_hours: float
    bytes: int
    reason: str


def egress_price(provider: str) -> tuple[float, str]:
    """(egress price per GB, its currency) from the provider's storage_prices.toml; (0, USD) without one."""
    path = resources.files("sdcloud").joinpath("providers", provider, PRICES_FILE)
    if not path.is_file():
        return 0.0, "USD"
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return float(data.get("egress_gb", 0.0)), str(data.get("currency", "USD"))


def move_rate_mb_s(transfer_mb_s: float | None = None) -> float:
    """The planning rate of a cross-cloud copy: the argument, else SDCLOUD_MOVE_MB_S, else MOVE_MB_S."""
    if transfer_mb_s is not None:
        return float(transfer_mb_s)
    raw = os.environ.get(MOVE_MB_S_ENV)
    if raw is None:
        return MOVE_MB_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise UserError(f"{MOVE_MB_S_ENV} must be a positive number of MB/s, got {raw!r}")
    return value


def move_cost(src_provider: str, dst_provider: str, checkpoint_bytes: int, *,
              egress_usd_per_gb: float | None = None, transfer_mb_s: float | None = None) -> MoveCost:
    """What moving `checkpoint_bytes` from `src_provider`'s store to `dst_provider`'s costs.

    Within one provider nothing moves between clouds (a zone or region change reads the same home
    store), so the cost is zero. `egress_usd_per_gb` replaces the list price (a negotiated rate, a
    test); GB here is 2^30 bytes, as the clouds bill it.
    """
    nbytes = max(0, int(checkpoint_bytes))
    if src_provider == dst_provider:
        return MoveCost(0.0, 0.0, nbytes, f"same cloud ({src_provider}): the checkpoint stays in its store")
    gb = nbytes / 2**30
    if egress_usd_per_gb is not None:
        per_gb_usd, basis = float(egress_usd_per_gb), f"{float(egress_usd_per_gb):g} USD/GB given"
    else:
        price, currency = egress_price(src_provider)
        per_gb_usd = price * config.usd_per(currency)
        basis = f"{src_provider} list egress {price:g} {currency}/GB"
    rate = move_rate_mb_s(transfer_mb_s)
    hours = nbytes / (rate * 1e6) / 3600.0
    reason = (f"{gb:.2f} GB from {src_provider} to {dst_provider}: {basis} = {gb * per_gb_usd:.4f} USD egress, "
              f"{hours * 60:.1f} min at {rate:g} MB/s")
    return MoveCost(gb * per_gb_usd, hours, nbytes, reason)


__all__ = ["MoveCost", "move_cost", "egress_price", "move_rate_mb_s", "MOVE_MB_S"]
