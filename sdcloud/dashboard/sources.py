"""The jobs a dashboard shows: this home's state store, and each `--store` bucket's runs.

A bucket's runs are rebuilt from their journals (runs/records/journal.py) into a state store of the
dashboard's own, in a private temporary folder, and read again when older than REFRESH_S.
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REFRESH_S = 5.0
JOURNAL_SUFFIX = "/journal/run.json"


@dataclass
class Bucket:
    url: str
    store: Any
    state_path: Path
    run_ids: list[str] = field(default_factory=list)
    read_at: float = 0.0


class Sources:
    """Where each run shown comes from: its state store and, for a bucket's run, its store."""

    def __init__(self, store_urls: tuple[str, ...] = ()):
        self._lock = threading.Lock()
        self._tmp = tempfile.TemporaryDirectory(prefix="sdcloud-dashboard-")
        self.buckets: list[Bucket] = []
        for i, url in enumerate(store_urls):
            from ..runs.records.store_of import open_checked, url_conf

            self.buckets.append(Bucket(url=url, store=open_checked(url_conf(url)),
                                       state_path=Path(self._tmp.name) / f"bucket-{i}.db"))

    def home(self):
        from ..runs.records.state import StateStore

        return StateStore()

    def _refresh(self, b: Bucket):
        from ..runs.records.journal import restore
        from ..runs.records.state import StateStore

        state = StateStore(b.state_path)
        with self._lock:
            if time.monotonic() - b.read_at >= REFRESH_S:
                ids = sorted({o.key[len("runs/"):-len(JOURNAL_SUFFIX)] for o in b.store.list("runs/")
                              if o.key.endswith(JOURNAL_SUFFIX) and o.key.count("/") == 3})
                for rid in ids:
                    restore(state, b.store, rid)
                b.run_ids, b.read_at = ids, time.monotonic()
        return state

    def runs(self) -> list[tuple[Any, dict, Any]]:
        """(state store, run row, store or None) of every job, newest first; a home run wins over a copy."""
        home = self.home()
        out = [(home, r, None) for r in home.list_runs()]
        seen = {r["id"] for _, r, _ in out}
        for b in self.buckets:
            state = self._refresh(b)
            for rid in b.run_ids:
                run = state.get_run(rid)
                if run is not None and rid not in seen:
                    out.append((state, run, b.store))
                    seen.add(rid)
        return sorted(out, key=lambda t: t[1]["created"], reverse=True)

    def find(self, run_id: str) -> tuple[Any, dict, Any] | None:
        home = self.home()
        run = home.get_run(run_id)
        if run is not None:
            return home, run, None
        for b in self.buckets:
            state = self._refresh(b)
            run = state.get_run(run_id)
            if run is not None:
                return state, run, b.store
        return None

    def close(self) -> None:
        self._tmp.cleanup()
