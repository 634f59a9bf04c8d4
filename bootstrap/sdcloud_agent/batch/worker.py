"""One batch worker: claim an item, make its images create-only, mark it done, repeat.

Requests per item on the happy path: one create-only PUT for the lease, one per image, the
create-only done marker; the worker's index is rewritten every few seconds; renewals only for
items that take longer than a third of the lease. The done listing is read when a claim is refused.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from ..store import StoreError
from . import layout
from .lease import Lease, Leases

# Passes in a row that may fail on the store (each already retried with backoff in the store)
# before the worker gives up: the item's lease runs out and another worker takes it.
MAX_STORE_FAILURES = 5


class Generator(Protocol):
    """Makes PNG bytes for one item's settings and a batch of seeds (the pipeline stays loaded)."""

    batch_size: int

    def generate(self, settings: dict[str, Any], seeds: list[int], abort: threading.Event) -> list[bytes] | None: ...


def write_job(store: Any, job: str, spec: dict[str, Any], items: list[dict[str, Any]]) -> None:
    """Submit: the job and its items, create-only, so a resubmitted id never rewrites a running job."""
    body = "".join(json.dumps(it, sort_keys=True) + "\n" for it in items).encode()
    store.put_if_absent(f"{job}/items.jsonl", body)
    if store.put_if_absent(layout.job_key(job), json.dumps({**spec, "items": len(items)}, sort_keys=True).encode()) is None:
        raise FileExistsError(f"batch job {job} already exists in {store.url}")


def read_items(store: Any, job: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in store.get(f"{job}/items.jsonl").decode().splitlines() if line.strip()]


@dataclass
class WorkerStats:
    items_done: int = 0
    images_made: int = 0
    images_reused: int = 0     # found already written by an earlier attempt of the item
    images_refused: int = 0    # made here, but a racing worker's copy landed first (redone work)
    items_lost: int = 0        # the lease was lost mid-item (work abandoned)
    claims_refused: int = 0
    seconds: float = 0.0


@dataclass
class Worker:
    store: Any
    job: str
    generator: Generator
    worker_id: str = field(default_factory=lambda: f"w-{uuid.uuid4().hex[:10]}")
    ttl: float = 60.0
    stop: threading.Event = field(default_factory=threading.Event)   # a reclaim notice or a shutdown
    clock: Callable[[], float] = time.time
    idle_wait: float = 1.0
    log: Callable[[str], None] = lambda msg: None
    index_every: float = 5.0

    def __post_init__(self) -> None:
        self.leases = Leases(self.store, self.job, self.worker_id, self.ttl, self.clock)
        self.stats = WorkerStats()
        self._index: list[str] = []
        self._flushed, self._last_flush = 0, time.monotonic()
        self._rng = random.Random(self.worker_id)

    # -- the loop ---------------------------------------------------------------------------------

    def run(self) -> WorkerStats:
        start = time.monotonic()
        items = {it["id"]: it for it in read_items(self.store, self.job)}
        order = sorted(items)
        pos = {item_id: n for n, item_id in enumerate(order)}
        first = True
        failures = 0
        try:
            while not self.stop.is_set():
                try:
                    if self._pass(items, order, pos, first):
                        break
                    failures = 0
                except StoreError as exc:  # its retries ran out: wait, then look again from the listing
                    failures += 1
                    if failures >= MAX_STORE_FAILURES:
                        raise
                    self.log(f"store error ({exc}); trying again ({failures}/{MAX_STORE_FAILURES - 1})")
                    self.stop.wait(self.idle_wait * failures)
                first = False
        finally:
            self._flush_index(force=True)
        self.stats.seconds = time.monotonic() - start
        return self.stats

    def _pass(self, items: dict, order: list[str], pos: dict[str, int], first: bool) -> bool:
        """One look at the job: claim and work items from one listing. True when the work is over."""
        if self.store.head(layout.cancel_key(self.job)) is not None:
            self.log("job cancelled: stopping")
            return True
        done = {o.key.rsplit("/", 1)[-1].removesuffix(".json") for o in self.store.list(f"{self.job}/done/")}
        todo = [i for i in order if i not in done]
        if not todo:
            return True
        # Where to work: first a random place, so K workers spread over the list; later the
        # middle of the longest stretch nobody has finished, the farthest from whoever works
        # through it. A refused claim means we ran into someone: look again (one LIST).
        at = self._rng.randrange(len(todo)) if first else self._widest_gap(todo, pos)
        progressed = False
        for item_id in todo[at:] + todo[:at]:
            if self.stop.is_set():
                break
            lease = self.leases.claim(item_id)
            if lease is None:
                self.stats.claims_refused += 1
                break
            if lease.attempt > 1 and self.store.head(layout.done_key(self.job, item_id)) is not None:
                # Finished since our listing (its old lease simply ran out): we are in a
                # stretch others have done; list again and jump.
                self.stats.claims_refused += 1
                break
            progressed = True
            self._work(items[item_id], lease)
        if not progressed:
            # Every open item we tried is leased by a live worker: wait for them to finish or expire.
            self.stop.wait(self.idle_wait)
        return False

    def _widest_gap(self, todo: list[str], pos: dict[str, int]) -> int:
        """A random place in the middle half of the longest unfinished stretch (random, so that
        workers that read the same listing at once do not all land on the same item)."""
        best_len, best_start, run_start = 0, 0, 0
        for n in range(1, len(todo) + 1):
            if n == len(todo) or pos[todo[n]] != pos[todo[n - 1]] + 1:
                if n - run_start > best_len:
                    best_len, best_start = n - run_start, run_start
                run_start = n
        return best_start + best_len // 4 + self._rng.randrange(best_len // 2 + 1)

    def _flush_index(self, force: bool = False) -> None:
        """The worker's JSONL index, rewritten every few seconds (done markers are the record)."""
        if not self._index or (len(self._index) == self._flushed) or (
                not force and time.monotonic() - self._last_flush < self.index_every):
            return
        try:
            self.store.put(layout.index_key(self.job, self.worker_id), ("\n".join(self._index) + "\n").encode())
        except Exception as exc:  # noqa: BLE001 - the index is derivable from the done markers
            self.log(f"index write failed: {exc}")
            return
        self._flushed, self._last_flush = len(self._index), time.monotonic()

    # -- one item ---------------------------------------------------------------------------------

    def _work(self, item: dict[str, Any], lease: Lease) -> None:
        lost = threading.Event()
        abort = threading.Event()
        finished = threading.Event()

        def renewer() -> None:
            # Also carries a reclaim notice (self.stop) into the generator's abort flag within a tick.
            tick = min(self.ttl / 3, 0.25)
            next_renew = time.monotonic() + self.ttl / 3
            while not finished.wait(tick):
                if self.stop.is_set():
                    abort.set()
                if time.monotonic() >= next_renew:
                    try:
                        renewed = self.leases.renew(lease)
                    except StoreError as exc:  # retried in the store already; the ttl has room for one more
                        self.log(f"{item['id']}: lease renewal failed ({exc}); trying again")
                        next_renew = time.monotonic() + self.ttl / 6
                        continue
                    if not renewed:
                        lost.set()
                        abort.set()
                        return
                    next_renew = time.monotonic() + self.ttl / 3
        watcher = threading.Thread(target=renewer, daemon=True, name=f"renew-{item['id']}")
        watcher.start()
        try:
            lines = self._make_images(item, lease, abort)
        finally:
            finished.set()
        watcher.join()
        if lines is None or lost.is_set():
            if lost.is_set():
                self.stats.items_lost += 1
                self.log(f"{item['id']}: lease lost, abandoned")
            elif self.stop.is_set():
                self.leases.release(lease)
                self.log(f"{item['id']}: stopping, lease released")
            return
        marker = {"item": item["id"], "worker": self.worker_id, "attempt": lease.attempt, "images": lines}
        if self.store.put_if_absent(layout.done_key(self.job, item["id"]), json.dumps(marker).encode()) is None:
            return  # another attempt finished it first; its marker is the record
        self.stats.items_done += 1
        self._index.extend(json.dumps(line, sort_keys=True) for line in lines)
        self._flush_index()

    def _make_images(self, item: dict[str, Any], lease: Lease, abort: threading.Event) -> list[dict[str, Any]] | None:
        settings = item["settings"]
        seeds = [int(s) for s in item["seeds"]]
        keys = {s: layout.image_key(settings, s) for s in seeds}
        have: set[int] = set()
        if lease.attempt > 1:
            # A redo: the images an earlier attempt wrote stay; make only the rest.
            have = {s for s in seeds if self.store.head(layout.image_path(self.job, keys[s])) is not None}
            self.stats.images_reused += len(have)
        lines = [self._line(item, s, keys[s], 0.0, reused=True) for s in seeds if s in have]
        pending = [s for s in seeds if s not in have]
        bs = max(1, int(self.generator.batch_size))
        for i in range(0, len(pending), bs):
            if abort.is_set() or self.stop.is_set():
                return None
            batch = pending[i:i + bs]
            t0 = time.monotonic()
            pngs = self.generator.generate(settings, batch, abort)
            if pngs is None or abort.is_set():
                return None  # abandoned within the notice; nothing of this batch was written
            per = (time.monotonic() - t0) / len(batch)
            for seed, png in zip(batch, pngs):
                if self.store.put_if_absent(layout.image_path(self.job, keys[seed]), png) is None:
                    self.stats.images_refused += 1
                else:
                    self.stats.images_made += 1
                lines.append(self._line(item, seed, keys[seed], per))
        lines.sort(key=lambda ln: ln["seed"])
        return lines

    def _line(self, item: dict[str, Any], seed: int, key: str, seconds: float, reused: bool = False) -> dict[str, Any]:
        s = item["settings"]
        # The model and LoRA belong to each image's record: a pulled folder must say what made it.
        return {"item": item["id"], "model": s.get("model"), "lora": s.get("lora"),
                "prompt": s.get("prompt"), "negative_prompt": s.get("negative_prompt"), "seed": seed, "key": key,
                "worker": self.worker_id, "seconds": round(seconds, 4),
                "width": s.get("width"), "height": s.get("height"), "steps": s.get("steps"),
                "guidance": s.get("guidance"), "scheduler": s.get("scheduler"), **({"reused": True} if reused else {})}
