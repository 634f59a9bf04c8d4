"""Tencent Cloud's GPU offers: the catalog refresh (`sdcloud catalog refresh --provider tencent`) and its prices.

DescribeZoneInstanceConfigInfos answers, per zone, the instance types on sale with their price and
stock, in the account's own currency (CNY on the China site, USD on the international one: see
site.py). Tencent publishes no spot price history: the current quote is the one sample, and the
controller samples it while a host runs (costs/ledger.py).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from ... import clock
from ...errors import UserError
from ...offers.catalog import CatalogRow, bundled_rows, load_provider, write_refreshed
from ..base import ProviderError
from . import site
from .session import NAME, Session, _code, _num

SPOT, ONDEMAND = "SPOTPAID", "POSTPAID_BY_HOUR"

# Instance families with whole GPUs whose model is in sdcloud/data/gpus.csv. Tencent's API
# reports the GPU count, not the model, so the family decides it.
GPU_FAMILIES = {
    "GN7": "T4", "GN7vi": "T4", "GN7vw": "T4",
    "GN10X": "V100-32GB", "GN10Xp": "V100-32GB",
    "GT4": "A100",
    "GNV4": "A10", "PNV4": "A10",
}

def default_regions() -> list[str]:
    """The regions of the Tencent catalog in use (refreshed, else bundled)."""
    try:
        rows, _ = load_provider(NAME)
    except (OSError, ValueError, KeyError):
        rows = bundled_rows(NAME)
    return sorted({r.region for r in rows}) or sorted({r.region for r in bundled_rows(NAME)})


class TencentCatalog(Session):
    """What a Tencent account sells, at what price, in its own currency (the adapter builds on it)."""

    def __init__(self, **session: object):
        super().__init__(**session)  # type: ignore[arg-type]
        self._currency: str | None = None

    def account_currency(self, region: str) -> str:
        """CNY or USD: the account's site decides (set by the user, else read from its prices once)."""
        configured = site.configured_currency()
        if configured:
            return configured
        if self._currency is None:
            resp = self.call(region, "DescribeZoneInstanceConfigInfos", {"Filters": [
                {"Name": "instance-family", "Values": sorted(GPU_FAMILIES)},
                {"Name": "instance-charge-type", "Values": [ONDEMAND]}]})
            quoted: dict[str, float] = {}
            for item in resp.get("InstanceTypeQuotaSet") or []:
                price = _num((item.get("Price") or {}).get("UnitPrice"))
                if price:
                    quoted.setdefault(str(item.get("InstanceType")), price)
            self._currency = site.detect_currency(region, quoted, site.bundled_reference(bundled_rows(NAME), region))
        return self._currency

    # -- catalog ---------------------------------------------------------------------------------
    def fetch_region(self, region: str) -> list[CatalogRow]:
        """Catalog rows of one region: one per zone and GPU type, on-demand and spot prices, stock."""
        from ...offers.gpus import gpu_table

        gpus = gpu_table()
        today = clock.utc_now().date().isoformat()  # the UTC day, as every price age is counted
        currency = self.account_currency(region)
        merged: dict[tuple[str, str], dict] = {}
        for charge in (ONDEMAND, SPOT):
            resp = self.call(region, "DescribeZoneInstanceConfigInfos", {"Filters": [
                {"Name": "instance-family", "Values": sorted(GPU_FAMILIES)},
                {"Name": "instance-charge-type", "Values": [charge]}]})
            for item in resp.get("InstanceTypeQuotaSet") or []:
                if item.get("InstanceChargeType", charge) != charge:
                    continue
                gpu = GPU_FAMILIES.get(str(item.get("InstanceFamily") or str(item.get("InstanceType", "")).split(".")[0]))
                count = _num(item.get("GpuCount")) or _num(item.get("Gpu")) or 0
                if gpu is None or gpu not in gpus or count < 1 or count != int(count):
                    continue  # unknown model, or a slice of a GPU (vGPU)
                key = (str(item["Zone"]), str(item["InstanceType"]))
                entry = merged.setdefault(key, {"item": item, "count": int(count), "gpu": gpu})
                price = item.get("Price") or {}
                value = _num(price.get("UnitPriceDiscount")) or _num(price.get("UnitPrice"))
                in_stock = item.get("Status", "SELL") == "SELL" and item.get("StatusCategory") != "WithoutStock"
                entry[charge] = value if in_stock and value and value > 0 else None
        rows = []
        for (zone, itype), entry in sorted(merged.items()):
            if entry.get(ONDEMAND) is None and entry.get(SPOT) is None:
                continue
            item = entry["item"]
            rows.append(CatalogRow(
                provider=NAME, region=region, zone=zone, instance_type=itype, gpu=entry["gpu"],
                gpu_count=entry["count"], vram_gb=gpus[entry["gpu"]].vram_gb, vcpus=int(_num(item.get("Cpu")) or 0),
                memory_gb=_num(item.get("Memory")) or 0.0, nvme_gb=self._nvme_gb(item),
                ondemand_price=entry.get(ONDEMAND), spot_price=entry.get(SPOT), currency=currency,
                interruption_band=None, snapshot_date=today, ondemand_estimate=False, spot_estimate=False,
                source=f"Tencent Cloud DescribeZoneInstanceConfigInfos ({ONDEMAND}, {SPOT}), {region}, {today}"))
        return rows

    @staticmethod
    def _nvme_gb(item: dict) -> float:
        total = 0.0
        blocks = int(_num(item.get("StorageBlockAmount")) or 1)
        for disk in item.get("LocalDiskTypeList") or []:
            if str(disk.get("Type", "")).upper() in ("LOCAL_NVME", "LOCAL_PRO", "LOCAL_SSD"):
                total += (_num(disk.get("MaxSize")) or 0) * max(blocks, 1)
        return total

    def price_history(self, instance_type: str, zone: str, start: datetime, end: datetime) -> list[tuple[datetime, float]]:
        """Tencent publishes no spot price history: the current quote is the one sample."""
        region = zone.rsplit("-", 1)[0]
        resp = self.call(region, "DescribeZoneInstanceConfigInfos", {"Filters": [
            {"Name": "zone", "Values": [zone]}, {"Name": "instance-type", "Values": [instance_type]},
            {"Name": "instance-charge-type", "Values": [SPOT]}]})
        for item in resp.get("InstanceTypeQuotaSet") or []:
            price = item.get("Price") or {}
            value = _num(price.get("UnitPriceDiscount")) or _num(price.get("UnitPrice"))
            if value:
                return [(datetime.now(timezone.utc), value)]
        return []


def refresh_catalog(regions: list[str] | None = None) -> tuple[Path, list[CatalogRow], list[str]]:
    """Read GPU offers and prices of `regions` (default: the catalog's) and write the refreshed catalog.

    A region that fails is reported in `errors` and skipped; when nothing at all was read the
    previous catalog is kept and a UserError says why.
    """
    from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException

    provider = TencentCatalog()
    regions = list(regions or default_regions())
    rows: list[CatalogRow] = []
    errors: list[str] = []
    for region in regions:
        try:
            rows.extend(provider.fetch_region(region))
        except (ProviderError, TencentCloudSDKException) as exc:
            errors.append(f"{region}: {_code(exc) + ': ' if _code(exc) else ''}{getattr(exc, 'message', None) or exc}")
    if not rows:
        why = "; ".join(errors) if errors else "no GPU instance types on sale"
        raise UserError(f"Tencent Cloud catalog refresh read no offers ({why}); the previous catalog is kept")
    path = write_refreshed(NAME, rows, errors)
    return path, rows, errors
