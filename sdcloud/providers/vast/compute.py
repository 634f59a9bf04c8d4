"""Vast.ai instances: one machine per offer, rented on demand or by an interruptible bid.

First-contact rules (vast-cli's vast.py, SkyPilot's sky/provision/vast/, and the marketplace's own):
- a create without `price` rents on demand, and the answer does not say so (vast-cli PR #403): a spot
  launch always sends the bid as `price`, then re-reads the instance and ends it unless it is an
  interruptible (`is_bid`) one at that bid;
- offers go stale in seconds: the machine of a catalog row is searched live at launch, and an offer
  gone or refused (`cancel_unavail`) moves on to the next machine, at most MAX_MACHINES of them;
- there are no tags: the `label` is `sdcloud-<run>.a<attempt>`, from which run, attempt and the
  launch token are read back (gc ends what carries `sdcloud-` and no live run owns);
- an outbid interruptible instance is paused, not ended: state PAUSED (live: its disk still bills).
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

from ...events import Kind
from ...offers.catalog import load_provider
from ...offers.optimizer import Offer, fits
from ..base import (PAUSED, PENDING, RUNNING, STOPPING, TERMINATED, CapacityError, EventSink, Instance, LaunchSpec,
                    ProviderError, launch_token, no_events, TAG_ATTEMPT, TAG_RUN, TAG_TOKEN)
from . import bids
from .credentials import host_env
from .session import NAME, Client, VastApiError, require_key

# A CUDA/PyTorch image: the agent's user-data installs the rest (runs/driving/hostboot.py).
IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
MAX_MACHINES = 5  # live offers tried for one launch before it counts as out of capacity
IMAGE_CUDA = 12.4  # the image's CUDA: a machine whose driver runs less (`cuda_max_good`) cannot run it
# A checkpoint must reach the store before the next one is due and before an outbid pauses the host with
# no notice: an SDXL LoRA's few hundred MB take seconds at this rate, a full SDXL UNet (~5 GB) under 7 minutes.
MIN_UPLOAD_MBPS = 100.0
LABEL_PREFIX = "sdcloud-"
_LABEL = re.compile(r"^sdcloud-(?P<run>.+)\.a(?P<attempt>\d+)$")
# The marketplace's GPU names as gpus.csv names them.
GPU_NAMES = {"RTX 3090": "RTX3090", "RTX 4090": "RTX4090", "RTX 5090": "RTX5090", "RTX A6000": "RTXA6000",
             "L40S": "L40S", "A100 SXM4": "A100", "A100 PCIE": "A100", "H100 SXM": "H100", "RTX 4060 Ti": "RTX4060Ti"}
VAST_NAMES = {ours: theirs for theirs, ours in GPU_NAMES.items()}


def label_for(run_id: str, attempt: int) -> str:
    return f"{LABEL_PREFIX}{run_id}.a{attempt}"


def tags_of(label: str | None) -> dict[str, str]:
    found = _LABEL.match(label or "")
    if found is None:
        return {}
    run, attempt = found["run"], int(found["attempt"])
    return {TAG_RUN: run, TAG_ATTEMPT: str(attempt), TAG_TOKEN: launch_token(run, attempt)}


def state_of(raw: dict) -> str:
    """The normalised state of an instance as GET /instances/ shows it."""
    actual, intended = raw.get("actual_status"), raw.get("intended_status")
    if actual in ("running",):
        return RUNNING
    if actual in (None, "created", "loading", "scheduling"):
        return PENDING
    if intended == "running" and actual in ("exited", "stopped", "offline"):
        return PAUSED  # outbid (or its host went away): kept with its disk, resumes on the same machine
    if intended == "stopped":
        return STOPPING
    return PENDING


def search_query(row, tier=None, disk_gb: float = 0, market: str = "spot", reliability: float | None = None) -> dict:
    """The bundles filter for machines like `row` (vast.py's JSON filter syntax: {field: {op: value}})."""
    from ... import config

    floor = reliability if reliability is not None else float(
        (config.settings().get(NAME) or {}).get("reliability_floor", 0.98))
    q: dict = {"verified": {"eq": True}, "rentable": {"eq": True}, "rented": {"eq": False},
               "reliability2": {"gte": floor}, "num_gpus": {"eq": row.gpu_count},
               "gpu_ram": {"gte": row.usable_vram_mib}, "cuda_max_good": {"gte": IMAGE_CUDA},
               "inet_up": {"gte": MIN_UPLOAD_MBPS}, "type": "bid" if market == "spot" else "on-demand",
               "order": [["dph_total", "asc"]], "limit": 64}
    if row.gpu in VAST_NAMES:
        q["gpu_name"] = {"eq": VAST_NAMES[row.gpu]}
    if tier is not None:
        q["cpu_ram"] = {"gte": tier.memory_gb * 1024}
    if disk_gb:
        q["disk_space"] = {"gte": disk_gb}
    return q  # the row's country is a preference, not a filter (machines(): a stale offer has neighbours)


def machines(found: list[dict], row, market: str) -> list[dict]:
    """The search's machines in the order to try them: the row's country first, then the cheapest."""
    price = "min_bid" if market == "spot" else "dph_total"

    def key(a: dict) -> tuple:
        country = str(a.get("geolocation") or "").rsplit(",", 1)[-1].strip()
        return (bool(row.zone) and country != row.zone, float(a.get(price) or a.get("dph_total") or 0))

    return sorted(found, key=key)


class VastProvider:
    name = NAME

    def __init__(self, client: Client | None = None, poll_interval: float = 2.0, confirm_timeout: float = 60.0,
                 backoff: float | None = None, **_: object):
        self._client = client
        self._backoff = backoff
        self.poll_interval = poll_interval
        self.confirm_timeout = confirm_timeout

    @property
    def client(self) -> Client:
        if self._client is None:  # lazily: offers from the catalog need no key
            self._client = Client() if self._backoff is None else Client(backoff=self._backoff, backoff_max=self._backoff)
        return self._client

    # capabilities.ChecksCredentials
    def check_credentials(self) -> None:
        """One line, exit 2, before anything is recorded: no key, or a key the API refuses."""
        from ..base import CredentialsError

        require_key()
        try:
            self.client.call("GET", "/users/current/")
        except VastApiError as exc:
            if exc.status in (401, 403):
                raise CredentialsError(f"Vast.ai refused the API key (VAST_API_KEY): {exc.message}") from None
            raise

    def offers(self, tier, market: str | None = None, regions: list[str] | None = None) -> list[Offer]:
        rows, _ = load_provider(NAME)
        markets = (market,) if market else ("spot", "on-demand")
        return [Offer(row, m) for row in rows if (not regions or row.region in regions) and fits(tier, row)
                for m in markets if (row.spot_price if m == "spot" else row.ondemand_price) is not None]

    def price_history(self, instance_type: str, zone: str, start: datetime, end: datetime) -> list[tuple[datetime, float]]:
        return []  # no published history: the controller samples the bid while the host runs (spot_prices "samples")

    # --- launch --------------------------------------------------------------------------------------
    def launch(self, offer: Offer, spec: LaunchSpec, market: str, max_price: float | None = None,
               events: EventSink = no_events) -> Instance:
        found = self._by_label(label_for(spec.run_id, spec.attempt))
        if found is not None:
            found.adopted = True
            events(Kind.ADOPTED, {"instance": found.id, "token": spec.token})
            return found
        found = machines(self.client.search_offers(search_query(offer.row, disk_gb=spec.root_volume_gb, market=market)),
                         offer.row, market)
        if not found:
            raise CapacityError(f"no Vast.ai machine like {offer.row.instance_type} in {offer.row.region} is offered now")
        last: Exception | None = None
        # Once: the store's keys (scoped to the run, expiring) are minted for this launch only.
        base = self._create_body(spec, host_env(spec.agent_config.get("store") or {}, spec.run_id))
        for ask in found[:MAX_MACHINES]:
            body = dict(base)
            if market == "spot":
                bid = bids.bid_for(float(ask.get("min_bid") or ask.get("dph_total") or 0), max_price)
                if bid < float(ask.get("min_bid") or 0) - 1e-9:
                    last = CapacityError(f"machine {ask.get('machine_id')}: its minimum bid ${ask.get('min_bid')}/h "
                                         f"is above --max-price")
                    continue
                body["price"] = bid  # never omitted: without it Vast.ai rents on demand
            elif max_price is not None and float(ask.get("dph_total") or 0) > max_price:
                last = CapacityError(f"machine {ask.get('machine_id')} costs more than --max-price")
                continue
            try:
                new_id = self.client.create_instance(ask["id"], body)
            except VastApiError as exc:
                if exc.status in (400, 404, 410):  # taken or gone since the search (a stale offer): the next one
                    events(Kind.LAUNCH_FAILED, {"offer": str(ask["id"]), "error": exc.message})
                    last = CapacityError(str(exc))
                    continue
                raise
            inst = self._confirm(new_id, market, body.get("price"))
            return inst
        raise last or CapacityError("no Vast.ai machine could be rented")

    def _create_body(self, spec: LaunchSpec, store_env: dict[str, str]) -> dict:
        return {"client_id": "me", "image": IMAGE, "disk": spec.root_volume_gb, "label": label_for(spec.run_id, spec.attempt),
                "onstart": spec.user_data, "runtype": "args", "cancel_unavail": True,
                "env": {**spec.env, **store_env}}  # vast.py parse_env's form: {"NAME": "value"}

    def _confirm(self, new_id: int, market: str, bid: float | None) -> Instance:
        """Re-read the new instance: a spot launch must be interruptible at our bid, or it is ended."""
        raw = self.client.instance(new_id)
        if raw is None:
            raise CapacityError(f"Vast.ai instance {new_id} vanished right after its create")
        if market == "spot":
            is_bid = bool(raw.get("is_bid"))
            price = raw.get("bid_price") if raw.get("bid_price") is not None else raw.get("dph_base")
            if not is_bid or price is None or abs(float(price) - float(bid or 0)) > 1e-6:
                self.client.destroy(new_id)
                raise ProviderError(f"Vast.ai rented instance {new_id} on demand, not at the bid ${bid}/h: "
                                    "it was ended; nothing runs at the on-demand price")
        return self._instance(raw)

    # --- read and end ---------------------------------------------------------------------------------
    def _instance(self, raw: dict) -> Instance:
        tags = tags_of(raw.get("label"))
        started = raw.get("start_date")
        price = raw.get("bid_price") if raw.get("is_bid") else raw.get("dph_total")
        return Instance(provider=NAME, id=str(raw["id"]), region=str(raw.get("geolocation") or ""), zone="",
                        instance_type=f"{raw.get('num_gpus', 1)}x-{str(raw.get('gpu_name', '')).replace(' ', '_')}",
                        market="spot" if raw.get("is_bid") else "on-demand", state=state_of(raw),
                        price_per_hour=None if price is None else float(price), public_ip=raw.get("public_ipaddr"),
                        launched_at=datetime.fromtimestamp(float(started), timezone.utc) if started else None, tags=tags)

    def _by_label(self, label: str) -> Instance | None:
        for raw in self.client.instances():
            if raw.get("label") == label:
                inst = self._instance(raw)
                if inst.live:
                    return inst
        return None

    def describe(self, ids: list[str], region: str | None = None) -> list[Instance]:
        out = []
        for i in ids:
            raw = self.client.instance(i)
            out.append(self._instance(raw) if raw else Instance(NAME, str(i), region or "", "", "", "spot", TERMINATED))
        return out

    def terminate(self, ids: list[str], region: str | None = None) -> None:
        for i in ids:
            self.client.destroy(i)

    def find_tagged(self, run_id: str | None = None, regions: list[str] | None = None) -> list[Instance]:
        """Live instances labelled by sdcloud (paused ones included: their disk bills), of `run_id` when given."""
        found = [self._instance(raw) for raw in self.client.instances() if str(raw.get("label") or "").startswith(LABEL_PREFIX)]
        return [i for i in found if i.live and i.run_id and (run_id is None or i.run_id == run_id)]

    # --- the bid of a paused host (spot/pause.py decides; the controller asks) --------------------------
    def change_bid(self, instance_id: str, price: float) -> None:
        self.client.change_bid(instance_id, price)

    def min_bid(self, instance_id: str) -> float | None:
        raw = self.client.instance(instance_id)
        return None if raw is None or raw.get("min_bid") is None else float(raw["min_bid"])

    def wait_state(self, instance_id: str, states: tuple[str, ...], timeout: float) -> Instance | None:
        """Poll until the instance is in one of `states` (bounded by `timeout`); the last seen, or None."""
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            seen = next(iter(self.describe([instance_id])), None)
            if seen is not None and seen.state in states:
                return seen
            time.sleep(self.poll_interval)
        return seen


PROVIDER_CLASS = VastProvider
