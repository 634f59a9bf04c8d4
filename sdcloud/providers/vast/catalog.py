"""`sdcloud catalog refresh --provider vast`: the live marketplace, one row per machine offered now.

Each row is one machine (its region the continent, its zone the country of `geolocation`): on-demand
$/h (`dph_total`), its minimum bid and the bid sdcloud places (bids.py), its upload, download and
disk prices, its DLPerf score and reliability. Needs VAST_API_KEY (the search is an account's call).
"""

from __future__ import annotations

from pathlib import Path

from ...errors import UserError
from ...offers.catalog import CatalogRow, write_refreshed
from ...offers.gpus import gpu_table
from ... import clock
from . import bids
from .compute import GPU_NAMES
from .session import NAME, Client, VastApiError

CONTINENTS = {"US": "NA", "CA": "NA", "MX": "NA", "BR": "SA", "JP": "AS", "KR": "AS", "TW": "AS", "SG": "AS", "IN": "AS",
              "CN": "AS", "HK": "AS", "AU": "OC", "NZ": "OC"}


def row_of(offer: dict, fetched: str) -> CatalogRow | None:
    gpu = GPU_NAMES.get(str(offer.get("gpu_name")))
    table = gpu_table()
    if gpu is None or gpu not in table or offer.get("dph_total") is None:
        return None
    country = str(offer.get("geolocation") or "").rsplit(",", 1)[-1].strip()
    region = CONTINENTS.get(country, "EU" if country else "XX")
    count = int(offer.get("num_gpus") or 1)
    min_bid = float(offer.get("min_bid") or offer["dph_total"])
    src = f"Vast.ai bundles search, machine {offer.get('machine_id')}, offer {offer['id']} ({fetched})"
    return CatalogRow(
        provider=NAME, region=region, zone=country, instance_type=f"{count}x-{gpu}-m{offer.get('machine_id')}", gpu=gpu,
        gpu_count=count, vram_gb=table[gpu].vram_gb, vcpus=int(offer.get("cpu_cores_effective") or 0),
        memory_gb=round(float(offer.get("cpu_ram") or 0) / 1024, 1), nvme_gb=float(offer.get("disk_space") or 0),
        ondemand_price=float(offer["dph_total"]), spot_price=bids.bid_for(min_bid), currency="USD",
        interruption_band=None, snapshot_date=fetched[:10], ondemand_estimate=False, spot_estimate=False, source=src,
        vram_mib=min(int(offer.get("gpu_ram") or 0) or table[gpu].usable_mib, table[gpu].usable_mib),
        ondemand_basis="quoted", spot_basis="derived", ondemand_date=fetched[:10], spot_date=fetched[:10],
        ondemand_source=src, spot_source=f"derived: the machine's min_bid {min_bid:g} x (1 + [vast] bid_margin); {src}",
        min_bid=min_bid, upload_usd_per_gb=float(offer.get("inet_up_cost") or 0),
        download_usd_per_gb=float(offer.get("inet_down_cost") or 0),
        storage_usd_per_gb_month=float(offer.get("storage_cost") or 0), dlperf=float(offer.get("dlperf") or 0),
        reliability=float(offer.get("reliability2") or 0))


def refresh_catalog(regions: list[str] | None = None, client: Client | None = None) -> tuple[Path, list[CatalogRow], list[str]]:
    client = client or Client()
    fetched = clock.utc_now().isoformat()
    query = {"verified": {"eq": True}, "rentable": {"eq": True}, "rented": {"eq": False}, "type": "bid",
             "order": [["dph_total", "asc"]], "limit": 1000}
    try:
        offers = client.search_offers(query)
    except VastApiError as exc:
        raise UserError(f"Vast.ai catalog refresh failed ({exc}); the previous catalog is kept") from None
    rows = [r for r in (row_of(o, fetched) for o in offers) if r is not None and (not regions or r.region in regions)]
    if not rows:
        raise UserError("Vast.ai catalog refresh read no offers of a known GPU; the previous catalog is kept")
    return write_refreshed(NAME, rows), rows, []
