"""The simulator's periodic checkpoints (spot/simulate.py, docs/policies.md "Checkpoints spaced by
risk"): work on a running spot host with a save every `every` hours of work, each `save` hours
without progress and durable once done."""

from __future__ import annotations


def work_with_saves(p: float, durable: float, saving: float, hours: float, c: float, every: float,
          save: float) -> tuple[float, float, float, float]:
    """`hours` on a running host with a periodic checkpoint every `every` hours of work, each taking
    `save` hours without progress and durable when done. Returns progress, durable progress, save
    hours still to go, and the hours used (less than `hours` only when the job ends)."""
    spent = 0.0
    for _ in range(int(hours / min(every, save or every)) + 4):  # saves and work alternate: bounded
        left = hours - spent
        if left <= 1e-12 or p >= c - 1e-12:
            break
        if saving > 0:
            s = min(saving, left)
            saving -= s
            spent += s
            if saving <= 1e-12:
                saving, durable = 0.0, p
            continue
        work = min(left, c - p, durable + every - p)
        p += work
        spent += work
        if p >= durable + every - 1e-12 and p < c - 1e-12:
            saving = save
    if p >= c - 1e-12:
        p = c
    return p, durable, saving, spent
