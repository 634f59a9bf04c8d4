"""What moving a run from one cloud to another costs: every byte it carries (the newest checkpoint,
the staged dataset, the cached base model) at the source's internet egress price, plus the hours
the copy takes before the first step in the other cloud.

The copy leaves the source cloud's store over the internet (presigned GETs the source signs, read
by the destination's host), so the source bills it as internet egress; both clouds take ingress free.
The egress price is the source provider's list price in the source's region and in the currency the
user's account is billed in: a provider trait, read by providers/loader.egress_price from its
storage_prices.toml and handed in here (offers sit below providers and never open their folders).
The public figures, as read in 2026:
- AWS S3 data transfer out to the internet, first 10 TB/month, by region: $0.09 per GB in us-east-1,
  $0.12 in ap-southeast-1, $0.15 in sa-east-1 (aws.amazon.com/s3/pricing);
- Tencent COS internet downstream traffic: 0.50 CNY per GB on the China site
  (cloud.tencent.com/document/product/436/6239); an international-site account pays its USD list.

The transfer time is the bytes over the planning rate: the destination host's network figure (the
host copies, not this machine), else MOVE_MB_S where no host figure is known; `transfer_mb_s` (or
SDCLOUD_MOVE_MB_S) overrides both where a user has measured their own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .. import config
from ..errors import UserError

# Sustained MB/s (10^6 bytes) of one cross-cloud copy where no host's network figure is known.
MOVE_MB_S = 40.0
MOVE_MB_S_ENV = "SDCLOUD_MOVE_MB_S"


@dataclass(frozen=True)
class Egress:
    """A source's internet egress list price: per GB (2^30 bytes), its currency, and where it comes from."""
    per_gb: float
    currency: str
    basis: str


NO_EGRESS = Egress(0.0, "USD", "no egress charge")


@dataclass(frozen=True)
class MoveCost:
    """The price of carrying `bytes` from one cloud's store to another's, with how it was reached."""
    egress_usd: float
    transfer_hours: float
    bytes: int
    reason: str


def move_rate_mb_s(transfer_mb_s: float | None = None, host_gbps: float | None = None,
                   host_basis: str = "") -> tuple[float, str]:
    """The planning rate of a cross-cloud copy and its basis: the argument, else SDCLOUD_MOVE_MB_S,
    else the copying host's network figure (Gbps), else MOVE_MB_S."""
    if transfer_mb_s is not None:
        return float(transfer_mb_s), "given"
    raw = os.environ.get(MOVE_MB_S_ENV)
    if raw is not None:
        try:
            value = float(raw)
        except ValueError:
            value = 0.0
        if not value > 0:
            raise UserError(f"{MOVE_MB_S_ENV} must be a positive number of MB/s, got {raw!r}")
        return value, MOVE_MB_S_ENV
    if host_gbps is not None and host_gbps > 0:
        return host_gbps * 125.0, f"the host's {host_gbps:g} Gbps" + (f", {host_basis}" if host_basis else "")
    return MOVE_MB_S, "no host figure: planning rate"


def move_cost(src_provider: str, dst_provider: str, nbytes: int, *, egress: Egress | None = None,
              egress_usd_per_gb: float | None = None, transfer_mb_s: float | None = None,
              host_gbps: float | None = None, host_basis: str = "") -> MoveCost:
    """What moving `nbytes` (everything the move carries) from `src_provider`'s store to
    `dst_provider`'s costs. `egress`: the source's price (providers.loader.egress_price(src, region));
    `egress_usd_per_gb` replaces it (a negotiated rate); one of them is needed between two clouds.

    Within one provider nothing moves between clouds (a zone or region change reads the same home
    store), so the cost is zero.
    """
    nbytes = max(0, int(nbytes))
    if src_provider == dst_provider:
        return MoveCost(0.0, 0.0, nbytes, f"same cloud ({src_provider}): the checkpoint stays in its store")
    gb = nbytes / 2**30
    if egress_usd_per_gb is not None:
        per_gb_usd, basis = float(egress_usd_per_gb), f"{float(egress_usd_per_gb):g} USD/GB given"
    elif egress is not None:
        per_gb_usd, basis = egress.per_gb * config.usd_per(egress.currency), egress.basis
    else:
        raise ValueError(f"a move out of {src_provider} needs its egress price (providers.loader.egress_price)")
    rate, rate_basis = move_rate_mb_s(transfer_mb_s, host_gbps, host_basis)
    hours = nbytes / (rate * 1e6) / 3600.0
    reason = (f"{gb:.2f} GB ({nbytes:,} bytes) from {src_provider} to {dst_provider}: {basis} = "
              f"{gb * per_gb_usd:.4f} USD egress, {hours * 60:.1f} min at {rate:g} MB/s ({rate_basis})")
    return MoveCost(gb * per_gb_usd, hours, nbytes, reason)


__all__ = ["Egress", "NO_EGRESS", "MoveCost", "move_cost", "move_rate_mb_s", "MOVE_MB_S"]
