"""A trained run as the run page finds it: its row, attempts and events in the state store, and in its
bucket the samples and the metrics stream, written by the agent's own writers (sdcloud_agent.samples,
sdcloud_agent.metrics) as a host writes them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sdcloud.events import Kind
from sdcloud.runs.records.state import StateStore

PROMPTS = ("a red cube", "a blue ball")
STEPS = 30
CHECKPOINTS = (10, 20, 30)
PRICE = 0.48  # USD an hour, both attempts


def png(path: Path, colour: tuple[int, int, int], size: int = 64) -> Path:
    from PIL import Image

    Image.new("RGB", (size, size), colour).save(path)
    return path


def write_samples(store, run_id: str, step: int, folder: Path) -> None:
    from sdcloud_agent import samples

    settings = samples.SampleSettings(prompts=PROMPTS, seed=7)
    found = [samples.Found(path=png(folder / f"s{step}-{i}.png", (40 * i + step, 90, 200 - step)), step=step, index=i)
             for i in range(len(PROMPTS))]
    samples.upload(store, f"runs/{run_id}", found, settings, "builtin")


def write_metrics(store, run_id: str, attempt: int, steps: range, t0: float) -> None:
    from sdcloud_agent.metrics import MetricsStream

    stream = MetricsStream(store, f"runs/{run_id}", attempt, tensorboard=False)
    for s in steps:
        stream.feed({"step": s, "loss": 1.0 / s, "lr": 1e-4, "it_per_s": 2.0, "data_wait_s": 0.0})
        if s % 10 == 0:
            stream.flush()
    stream.flush()
    # The records carry the time they were fed; the chart's axis is the run's, so give them theirs.
    from sdcloud_agent import metrics

    for info in store.list(metrics.metrics_prefix(f"runs/{run_id}")):
        if metrics.parse_key(info.key)[0] != attempt:
            continue
        recs = metrics.decode(store.get(info.key))
        import json

        store.put(info.key, "".join(json.dumps({**r, "time": t0 + 10.0 * r["step"]}) + "\n" for r in recs).encode())


@pytest.fixture
def trained_run(tmp_path, sdcloud_home):
    """A local run of 30 steps, checkpoints at 10, 20, 30 with two samples each, reclaimed after step 15."""
    from sdcloud.runs.records.store_of import store_of

    state = StateStore()
    run_id = "r-page0001"
    spec = {"tier": "sd15-lora", "provider": "local", "model": "tiny", "steps": STEPS, "checkpoint_every": 10,
            "trainer": "builtin"}
    state.create_run(run_id, "sd15-lora", spec, STEPS, "red-cube")
    t0 = time.time() - 3600
    state._db.execute("UPDATE runs SET created = ? WHERE id = ?", (t0, run_id))
    state._db.commit()
    for n, (start, end, why) in enumerate(((t0 + 5, t0 + 160, "preempted"), (t0 + 200, t0 + 320, "succeeded")), 1):
        state.add_attempt(run_id, n, "local", f"tok{n}", region="local", zone="local", instance_type="this-machine",
                          market="spot", price=PRICE, currency="USD")
        state.update_attempt(run_id, n, state="ended", start=start, end=end, end_reason=why, instance_id=f"local-{n}")
    state.update_run(run_id, step=STEPS, state="succeeded")
    state.event(run_id, Kind.RECLAIMED, {"attempt": 1, "instance": "local-1"})
    state._db.execute("UPDATE events SET time = ? WHERE run_id = ?", (t0 + 160, run_id))  # when attempt 1 ended
    state._db.commit()
    run = state.get_run(run_id)
    store = store_of(run)
    folder = tmp_path / "host-samples"
    folder.mkdir()
    for step in CHECKPOINTS:
        write_samples(store, run_id, step, folder)
    write_metrics(store, run_id, 1, range(1, 16), t0)
    write_metrics(store, run_id, 2, range(11, STEPS + 1), t0)  # the resumed attempt trains 11..15 again
    return state, run_id, store
