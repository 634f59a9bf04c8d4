"""`sdcloud catalog refresh --provider aws --public`: what AWS publishes, read without credentials.

  on-demand  the AWS bulk price list, one JSON offer file per region
             (https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/<region>/index.json):
             Linux, shared tenancy, no pre-installed software, capacity status "Used", hourly.
  bands      the Spot Instance Advisor data (https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json):
             the interruption band of each region and type.

Per-zone spot prices are not published: they stay as they were (bundled median of zone quotes, or
a refresh with credentials), with their own source and date. The rows of the catalog in use are
updated in place and written as the refreshed catalog; types the catalog does not have are left out
(their local NVMe and GPU model are not in the price list). Only urllib: no SDK, no credentials.
SDCLOUD_AWS_PRICE_LIST_URL (with {region}) and SDCLOUD_SPOT_ADVISOR_URL point elsewhere, e.g. a mirror.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import UserError
from .catalog import CatalogRow, load_provider, write_refreshed

PRICE_LIST_URL = "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/{region}/index.json"
ADVISOR_URL = "https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json"
TIMEOUT_S = 120


def _fetch_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:  # noqa: S310 (https or a configured mirror)
            return json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise RuntimeError(f"{url}: {getattr(exc, 'reason', exc)}") from exc


def parse_bulk_price_list(doc: dict, types: set[str] | None = None) -> tuple[dict[str, float], str]:
    """A bulk offer file -> ({instance type: USD per hour}, publication date YYYY-MM-DD)."""
    products = doc.get("products") or {}
    ondemand = (doc.get("terms") or {}).get("OnDemand") or {}
    prices: dict[str, float] = {}
    for sku, product in products.items():
        attrs = product.get("attributes") or {}
        itype = attrs.get("instanceType")
        if not itype or (types is not None and itype not in types):
            continue
        if (attrs.get("operatingSystem") != "Linux" or attrs.get("tenancy") != "Shared"
                or attrs.get("preInstalledSw", "NA") != "NA" or attrs.get("capacitystatus", "Used") != "Used"
                or attrs.get("licenseModel", "No License required") != "No License required"):
            continue
        for term in (ondemand.get(sku) or {}).values():
            for dim in (term.get("priceDimensions") or {}).values():
                if dim.get("unit") != "Hrs":
                    continue
                usd = float((dim.get("pricePerUnit") or {}).get("USD") or 0)
                if usd > 0:
                    prices[itype] = min(usd, prices.get(itype, usd))
    published = str(doc.get("publicationDate") or "")[:10]
    return prices, published


def parse_advisor(doc: dict) -> dict[tuple[str, str], int]:
    """Spot Instance Advisor data -> {(region, type): band index 0..4} for Linux."""
    out: dict[tuple[str, str], int] = {}
    for region, by_os in (doc.get("spot_advisor") or {}).items():
        for itype, entry in ((by_os or {}).get("Linux") or {}).items():
            if isinstance(entry, dict) and "r" in entry:
                out[(region, itype)] = int(entry["r"])
    return out


def refresh_public(regions: list[str] | None = None, *, price_list_url: str | None = None,
                   advisor_url: str | None = None, now: datetime | None = None) -> tuple[Path, list[CatalogRow], list[str]]:
    """Update the AWS catalog in use from the public price list and advisor data; returns (path, rows, errors)."""
    price_list_url = price_list_url or os.environ.get("SDCLOUD_AWS_PRICE_LIST_URL") or PRICE_LIST_URL
    advisor_url = advisor_url or os.environ.get("SDCLOUD_SPOT_ADVISOR_URL") or ADVISOR_URL
    now = now or datetime.now(timezone.utc)
    today = now.date().isoformat()
    rows, _ = load_provider("aws")
    known = sorted({r.region for r in rows})
    if regions:
        unknown = sorted(set(regions) - set(known))
        if unknown:
            raise UserError(f"no catalog rows for region {unknown[0]!r}; the AWS catalog covers {', '.join(known)}")
    targets = sorted(set(regions or known))
    errors: list[str] = []
    bands: dict[tuple[str, str], int] | None
    try:
        bands = parse_advisor(_fetch_json(advisor_url))
    except RuntimeError as exc:
        bands = None
        errors.append(f"spot advisor data: {exc}; interruption bands kept")
    ondemand: dict[str, tuple[dict[str, float], str, str]] = {}
    for region in targets:
        url = price_list_url.replace("{region}", region)
        types = {r.instance_type for r in rows if r.region == region}
        try:
            prices, published = parse_bulk_price_list(_fetch_json(url), types)
            ondemand[region] = (prices, published or today, url)
        except RuntimeError as exc:
            errors.append(f"{region}: price list: {exc}; on-demand prices kept")
    if not ondemand and bands is None:
        raise UserError("AWS public price refresh failed: " + "; ".join(errors))
    out: list[CatalogRow] = []
    for r in rows:
        if r.region not in targets:
            out.append(r)  # a region not asked for stays exactly as it was
            continue
        if r.region in ondemand and not r.zone:
            prices, published, url = ondemand[r.region]
            if r.instance_type in prices:
                src = f"AWS bulk price list ({url}), published {published}, fetched {today}"
                r = replace(r, ondemand_price=prices[r.instance_type], ondemand_basis="listed", ondemand_estimate=False,
                            ondemand_date=published, ondemand_source=src)
            else:
                errors.append(f"{r.region}: {r.instance_type} is not in the price list; its on-demand price was kept")
        band_src = "band: as before"
        if bands is not None:
            band = bands.get((r.region, r.instance_type))
            if band is not None:
                r = replace(r, interruption_band=band)
                band_src = f"band: Spot Instance Advisor data ({advisor_url}), fetched {today}"
        dates = [d for d in (r.ondemand_date, r.spot_date) if d]
        r = replace(r, snapshot_date=min(dates) if dates else r.snapshot_date,
                    source=f"on-demand: {r.market_source('on-demand')}; spot: {r.market_source('spot')}; {band_src}")
        out.append(r)
    path = write_refreshed("aws", out, errors, fetched_at=now)
    return path, out, errors
