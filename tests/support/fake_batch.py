"""Fakes for the batch tests: a generator with no model, and a store wrapper that counts and kills."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from typing import Any


class FakeGenerator:
    """Deterministic bytes per (settings, seed), so a test can tell which request made an image."""

    def __init__(self, batch_size: int = 2, delay: float = 0.0):
        self.batch_size, self.delay = batch_size, delay

    @staticmethod
    def image(settings: dict[str, Any], seed: int) -> bytes:
        return b"FAKEPNG" + hashlib.sha256(json.dumps([settings, seed], sort_keys=True).encode()).digest()

    def generate(self, settings, seeds, abort):
        if self.delay and abort.wait(self.delay):
            return None
        return [self.image(settings, s) for s in seeds]


class Killed(BaseException):
    """The worker 'process' died: raised from every store call after the kill point."""


class CountingStore:
    """Counts each call by method and key kind; after `kill_after` calls every call raises Killed."""

    def __init__(self, store: Any, kill_after: int | None = None):
        self._store, self.kill_after = store, kill_after
        self.calls: Counter[str] = Counter()
        self.killed = threading.Event()
        self._lock = threading.Lock()
        self.url = store.url

    def __getattr__(self, name: str):
        fn = getattr(self._store, name)
        if not callable(fn):  # a property of the store (compare_and_swap), not a request
            return fn

        def call(*args, **kwargs):
            with self._lock:
                if self.killed.is_set():
                    raise Killed()
                kind = "image" if args and "/images/" in str(args[0]) and name != "head" else "coord"
                self.calls[f"{kind}:{name}"] += 1
                dying = self.kill_after is not None and sum(self.calls.values()) >= self.kill_after
                if dying:
                    self.killed.set()
            result = fn(*args, **kwargs)
            if dying:
                raise Killed()  # the request landed, the worker never saw the answer: the hard case
            return result
        return call

    @property
    def coordination(self) -> int:
        return sum(n for k, n in self.calls.items() if k.startswith("coord:"))
