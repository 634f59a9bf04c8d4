"""CUDA out-of-memory recognised in any trainer's output, with the memory figures around it
(the detection half of oom.py, which heals it).

Pure: no torch; the agent feeds it lines.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# What PyTorch, the CUDA runtime and cuBLAS print when an allocation fails. The first two are
# torch's OutOfMemoryError text in both its formats (torch < 2.1: "(GPU 0; 11.76 GiB total
# capacity; ...)", later: "GPU 0 has a total capacity of ..."); tests/data/oom/ has real lines.
OOM_TEXT = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED"
    r"|cudaErrorMemoryAllocation", re.IGNORECASE)
_GIB = {"kib": 1 / 1024 ** 2, "mib": 1 / 1024, "gib": 1.0, "tib": 1024.0}
# Memory in use when it failed: "Process 118916 has 39.55 GiB memory in use" (torch >= 2.1) or
# "10.92 GiB already allocated" (older); the total: "total capacity of 39.56 GiB" / "11.76 GiB total capacity".
_IN_USE = re.compile(r"has ([\d.]+) ([KMGT]iB) memory in use|([\d.]+) ([KMGT]iB) already allocated", re.I)
_TOTAL = re.compile(r"total capacity of ([\d.]+) ([KMGT]iB)|([\d.]+) ([KMGT]iB) total capacity", re.I)
# The builtin trainer's own line (trainers/builtin/loop.py) with torch's peak allocation.
OOM_LINE = "SDCLOUD_OOM "
START_LINE = "SDCLOUD_START "


def _gib(num: str, unit: str) -> float:
    return float(num) * _GIB[unit.lower()]


@dataclass
class OomSeen:
    """What the output said about the failure."""
    line: str
    peak_gb: float | None = None  # memory in use (or torch's peak) when it failed
    total_gb: float | None = None


class Detector:
    """Fed every output line; remembers the first OOM and the memory figures around it."""

    def __init__(self) -> None:
        self.seen: OomSeen | None = None
        # The builtin trainer's memory settings in force (its SDCLOUD_START line), when it said.
        self.effective: dict = {}

    def reset(self) -> None:
        self.seen = None

    def feed(self, line: str) -> bool:
        if line.startswith(START_LINE):
            try:
                recipe = json.loads(line[len(START_LINE):]).get("recipe")
            except ValueError:
                recipe = None
            if isinstance(recipe, dict):
                self.effective = recipe
            return False
        if line.startswith(OOM_LINE):
            try:
                doc = json.loads(line[len(OOM_LINE):])
            except ValueError:
                doc = {}
            seen = self.seen or OomSeen(line=doc.get("error") or line)
            if doc.get("peak_gb") is not None:
                seen.peak_gb = float(doc["peak_gb"])
            if doc.get("total_gb") is not None:
                seen.total_gb = float(doc["total_gb"])
            self.seen = seen
            return True
        if not OOM_TEXT.search(line):
            return False
        if self.seen is None:
            self.seen = OomSeen(line=line.strip()[:400])
        m = _IN_USE.search(line)
        if m and self.seen.peak_gb is None:
            self.seen.peak_gb = round(_gib(m.group(1), m.group(2)) if m.group(1) else _gib(m.group(3), m.group(4)), 2)
        m = _TOTAL.search(line)
        if m and self.seen.total_gb is None:
            self.seen.total_gb = round(_gib(m.group(1), m.group(2)) if m.group(1) else _gib(m.group(3), m.group(4)), 2)
        return True


def scan(text: str) -> OomSeen | None:
    """The OOM in a whole log, or None (for recorded output and the failure's tail)."""
    d = Detector()
    for line in text.replace("\r", "\n").splitlines():
        d.feed(line)
    return d.seen
