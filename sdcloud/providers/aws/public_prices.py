"""`sdcloud catalog refresh --provider aws --public` (the catalog trait's `public`): what AWS publishes, read without credentials.

  on-demand  the AWS bulk price list, one JSON offer file per region
             (https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/<region>/index.json):
             Linux, shared tenancy, no pre-installed software, capacity status "Used", hourly.
  bands      the Spot Instance Advisor data (https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json):
             the interruption band of each region and type.

Per-zone spot prices are not published: they stay as they were (bundled median of zone quotes, or
a refresh with credentials), with their own source and date. The rows of the catalog in use are
updated in place and written as the refreshed catalog; types the catalog does not have are left out
(their local NVMe and GPU model are not in the price list). urllib and ijson only: no SDK, no credentials; the offer
file is downloaded to a temporary file and streamed (a big region's file is hundreds of MB), never held in memory whole.
SDCLOUD_AWS_PRICE_LIST_URL (with {region}) and SDCLOUD_SPOT_ADVISOR_URL point elsewhere, e.g. a mirror.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from ... import clock
from ...errors import UserError
from ...offers.catalog import CatalogRow, load_provider, write_refreshed
from .session import NAME

PRICE_LIST_URL = "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/{region}/index.json"
ADVISOR_URL = "https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json"
TIMEOUT_S = 120


def _fetch_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:  # noqa: S310 (https or a configured mirror)
            return json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise RuntimeError(f"{url}: {getattr(exc, 'reason', exc)}") from exc


def _download(url: str) -> Path:
    """The document at `url` in a temporary file (the caller removes it)."""
    fd, name = tempfile.mkstemp(prefix="sdcloud-price-list-", suffix=".json")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:  # noqa: S310
            shutil.copyfileobj(resp, out, length=1 << 20)
    except (urllib.error.URLError, OSError) as exc:
        os.unlink(name)
        raise RuntimeError(f"{url}: {getattr(exc, 'reason', exc)}") from exc
    return Path(name)


def _wanted(attrs: dict, types: set[str] | None) -> str | None:
    """The instance type of a Linux, shared-tenancy, no-software, in-use product; None for anything else."""
    itype = attrs.get("instanceType")
    if not itype or (types is not None and itype not in types):
        return None
    if (attrs.get("operatingSystem") != "Linux" or attrs.get("tenancy") != "Shared"
            or attrs.get("preInstalledSw", "NA") != "NA" or attrs.get("capacitystatus", "Used") != "Used"
            or attrs.get("licenseModel", "No License required") != "No License required"):
        return None
    return itype


def parse_bulk_price_list(path: Path, types: set[str] | None = None) -> tuple[dict[str, float], str]:
    """A bulk offer file -> ({instance type: USD per hour}, publication date YYYY-MM-DD), streamed in two passes."""
    import ijson  # lazily: only this refresh needs it

    skus: dict[str, str] = {}
    published = ""
    try:
        with open(path, "rb") as f:
            for prefix, event, value in ijson.parse(f):
                if prefix == "publicationDate" and event == "string":
                    published = str(value)[:10]
                    break
        with open(path, "rb") as f:
            for sku, product in ijson.kvitems(f, "products"):
                itype = _wanted((product or {}).get("attributes") or {}, types)
                if itype:
                    skus[sku] = itype
        prices: dict[str, float] = {}
        with open(path, "rb") as f:
            for sku, terms in ijson.kvitems(f, "terms.OnDemand"):
                itype = skus.get(sku)
                if itype is None:
                    continue
                for term in (terms or {}).values():
                    for dim in (term.get("priceDimensions") or {}).values():
                        if dim.get("unit") != "Hrs":
                            continue
                        usd = float((dim.get("pricePerUnit") or {}).get("USD") or 0)
                        if usd > 0:
                            prices[itype] = min(usd, prices.get(itype, usd))
    except ijson.JSONError as exc:
        raise RuntimeError(f"not a price list offer file ({exc})") from exc
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
    now = now or clock.utc_now()
    today = now.date().isoformat()
    rows, _ = load_provider(NAME)
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
            local = _download(url)
            try:
                prices, published = parse_bulk_price_list(local, types)
            finally:
                local.unlink(missing_ok=True)
            ondemand[region] = (prices, published or today, url)
        except RuntimeError as exc:
            errors.append(f"{region}: price list: {exc}; on-demand prices kept")
    if not ondemand and bands is None:
        raise UserError("AWS public price refresh failed: " + "; ".join(errors))
    out: list[CatalogRow] = []
    missing: dict[str, list[str]] = {}
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
                missing.setdefault(r.region, []).append(r.instance_type)
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
    for region, types in sorted(missing.items()):
        errors.append(f"{region}: not in the price list, on-demand kept as it was: {', '.join(sorted(types))}")
    path = write_refreshed(NAME, out, errors, fetched_at=now)
    return path, out, errors
