"""The host's health as the state store holds it: the figures a `health` event keeps and the latest
of them with the out-of-memory retries, read back for `status` and `watch` (the controller records
them: runs/driving/health_view.py)."""

from __future__ import annotations

from typing import Any

from ...events import Kind

# The figures kept in the event (and in `status --json`'s `health`).
# `verdict` is unknown until the host has the evidence (sdcloud_agent/health.py MIN_STEPS,
# MIN_GPU_SAMPLES) and null once the trainer exited (`trainer_exit` says how, `last_verdict` what it
# was judged while it ran). A figure that was not sampled is null in `status --json`.
FIELDS = ("verdict", "why", "gpu_util", "data_wait_pct", "step_s", "save_pct", "throttle_pct", "throttle_reasons",
          "sm_clock_pct", "power_w", "power_limit_w", "temp_c", "mem_used_gb", "mem_total_gb", "peak_mem_gb",
          "read_mb_s", "gpu_samples", "steps", "samples", "sampler_ms", "trainer_exit", "last_verdict",
          "save_seconds", "data_wait_seconds", "sample_seconds")


def latest(state: Any, run_id: str) -> dict | None:
    """The run's newest health figures and its out-of-memory retries, or None when it has neither.
    Every field of FIELDS is present: null where the host did not sample it."""
    health, retries = None, 0
    for ev in state.events(run_id):
        kind = ev["kind"]
        if kind is Kind.HEALTH:
            health = dict(ev["data"])
        elif kind is Kind.OOM_RETRY:
            retries += 1
    if health is None and not retries:
        return None
    out = {k: None for k in FIELDS} | (health or {})
    out["oom_retries"] = retries
    return out
