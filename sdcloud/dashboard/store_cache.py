"""A run's store as the dashboard reads it: objects that are never rewritten are fetched once.

The metrics stream is appended one new object per interval and never rewritten, and a sample's
PNG and JSON are put once (sdcloud_agent/metrics.py, samples.py). A page polled every second and a
half would otherwise GET every one of them again each time: a ten-hour run has thousands. Listing
still goes to the store, so what is new is seen at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

IMMUTABLE_PARTS = ("/metrics/", "/samples/")
CACHE_BYTES = 256 * 1024 * 1024


class ImmutableCache:
    """Wraps an ObjectStore: `get` of an immutable key from memory after its first read (least recently
    used out past CACHE_BYTES); everything else is the store's own."""

    def __init__(self, store: Any, limit: int = CACHE_BYTES):
        self._store = store
        self._limit = limit
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes:
        if not any(p in key for p in IMMUTABLE_PARTS):
            return self._store.get(key)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        data = self._store.get(key)
        with self._lock:
            if key not in self._items:
                self._items[key] = data
                self._bytes += len(data)
            while self._bytes > self._limit and self._items:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)
        return data

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not yet set (a copy being made): never the wrapped store's privates
            raise AttributeError(name)
        return getattr(self._store, name)
