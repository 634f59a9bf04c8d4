"""The two kinds of work sdcloud runs. Below tiers.py and gpus.py, which both ask it, so that every
"is this a batch job?" in the house is one comparison with a member, not a spelled-out word."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class RunKind(StrEnum):
    """What a job does, and how its size is counted: a training run (steps) or a batch job (images).

    A tier declares one; a row of the runs table carries it as its spec's "kind", and a summary as
    its own "kind". Stored as the plain word, so rows written before this type read the same.
    """
    TRAIN = "train"
    BATCH = "batch"

    @classmethod
    def of(cls, record: Mapping | None) -> RunKind:
        """The kind of a run row (its spec's "kind"), a spec, or a summary: a batch job where either
        says so. Anything else (a row of unknown shape, a spec without a kind: rows from before batch
        jobs existed) is a training run."""
        if not isinstance(record, Mapping):
            return cls.TRAIN
        spec = record.get("spec")
        words = (record.get("kind"), spec.get("kind") if isinstance(spec, Mapping) else None)
        return cls.BATCH if cls.BATCH in words else cls.TRAIN
