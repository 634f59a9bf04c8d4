"""What sdcloud bids for a Vast.ai interruptible machine, and what a machine's bytes cost where no live
offer says (docs/providers-vast.md, "Bids").

On Vast.ai the interruptible price is a bid: the machine runs while the bid is the highest one on it,
and is paused (not ended) when outbid. The bid sdcloud places is the machine's current minimum bid
plus a margin (`[vast] bid_margin`, default 15 %), never above the user's --max-price: a bid at the
minimum is outbid by the next renter's, and one near on-demand buys little over renting on demand.

A bundled snapshot has no bids: the public catalog lists on-demand prices only (every SpotPrice is
0.00, shared/data/prices/README.md). There the minimum bid is an estimate: on-demand x
SNAPSHOT_MIN_BID_SHARE. Basis: the figures issue 55 quotes from the marketplace, an RTX 4090 at
about $0.24/h on demand with interruptible bids from about $0.12/h (a share of 0.5); a live
`catalog refresh --provider vast` reads each machine's own `min_bid` instead.
"""

from __future__ import annotations

from ... import config
from ...money import usd
from .session import NAME

DEFAULT_BID_MARGIN = 0.15
SNAPSHOT_MIN_BID_SHARE = 0.5
MIN_BID_SOURCE = (f"estimate: on-demand x {SNAPSHOT_MIN_BID_SHARE:g}, the interruptible share the marketplace quoted "
                  "(RTX 4090 about $0.24/h on demand, bids from about $0.12/h; issue 55); the snapshot lists no bids")
# Per-GB bandwidth and per-GB-month disk prices are set by each host; the snapshot has none. These
# estimates stand in until a live refresh reads the machine's own inet_up_cost, inet_down_cost and
# storage_cost.
SNAPSHOT_UPLOAD_USD_PER_GB = 0.005
SNAPSHOT_DOWNLOAD_USD_PER_GB = 0.005
SNAPSHOT_STORAGE_USD_PER_GB_MONTH = 0.15
BANDWIDTH_SOURCE = (f"estimate: upload and download ${SNAPSHOT_UPLOAD_USD_PER_GB:g}/GB, disk "
                    f"${SNAPSHOT_STORAGE_USD_PER_GB_MONTH:g}/GB-month (hosts set their own; none in the snapshot)")


def bid_margin() -> float:
    value = (config.settings().get(NAME) or {}).get("bid_margin", DEFAULT_BID_MARGIN)
    try:
        margin = float(value)
    except (TypeError, ValueError):
        margin = -1.0
    if not 0 <= margin <= 1:
        from ...errors import UserError

        raise UserError(f"[{NAME}] bid_margin must be a number from 0 to 1, got {value!r}")
    return margin


def bid_for(min_bid: float, max_price: float | None = None, margin: float | None = None) -> float:
    """The bid sdcloud places on a machine whose minimum bid is `min_bid` ($/h), capped by --max-price."""
    margin = bid_margin() if margin is None else margin
    bid = round(min_bid * (1 + margin), 4)
    if max_price is not None:
        bid = min(bid, usd(max_price, "--max-price", per_hour=True))
    return bid


def raised_bid(current: float, min_bid: float, max_price: float | None, margin: float | None = None) -> float | None:
    """The bid that wins a paused machine back (over its new minimum), or None when that passes --max-price."""
    want = bid_for(max(min_bid, current), None, margin)
    if max_price is not None and want > max_price + 1e-9:
        return None
    return want
