"""The metrics stream and the samples' layout in a run's store (sdcloud_agent/metrics.py, samples.py), and
their readers (sdcloud/runs/records/metrics.py, samples.py): appended, never rewritten; the newest attempt's
record of a step wins; a sample's image goes up before its checkpoint's manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdcloud_agent import manifest as mf
from sdcloud_agent import samples as layout
from sdcloud_agent.metrics import MetricsStream, metrics_key, read_event_images
from sdcloud_agent.store import StoreError, open_store
from sdcloud_agent.sync import CheckpointSync

from sdcloud.runs.records.metrics import read_metrics
from sdcloud.runs.records.samples import list_samples
from tests.support.fake_kohya import write_png


@pytest.fixture
def store(tmp_path):
    return open_store({"url": (tmp_path / "bucket").as_uri()})


def test_each_interval_is_a_new_object_and_the_earlier_ones_stay_as_they_were(store):
    m = MetricsStream(store, "runs/r1", 1, tensorboard=False)
    for step in (1, 2, 3):
        m.feed({"step": step, "loss": 0.5 + step, "it_per_s": 2.0})
    assert m.flush() == 3
    first = store.get(metrics_key("runs/r1", 1, 1))
    m.feed({"step": 3, "loss": 9.0})  # a redrawn bar of a step already recorded: nothing new
    m.feed({"step": 4, "loss": 0.1})
    assert m.flush() == 1 and m.flush() == 0
    assert store.get(metrics_key("runs/r1", 1, 1)) == first
    assert [json.loads(x)["step"] for x in store.get(metrics_key("runs/r1", 1, 2)).splitlines()] == [4]


def test_records_smooth_the_loss_as_tensorboard_does_and_hold_only_numbers(store):
    m = MetricsStream(store, "runs/r1", 1, tensorboard=False)
    m.feed_line('SDCLOUD_STEP {"step": 1, "loss": 1.0, "lr": 0.001, "data_wait_s": 0.25}', {"step": 1, "loss": 1.0})
    m.feed({"step": 2, "loss": 0.0})
    m.flush()
    recs = [json.loads(x) for x in store.get(metrics_key("runs/r1", 1, 1)).splitlines()]
    assert recs[0]["lr"] == 0.001 and recs[0]["data_wait_s"] == 0.25
    assert recs[1]["loss_smoothed"] == pytest.approx(0.9)
    for rec in recs:
        assert all(v is None or isinstance(v, (int, float)) for v in rec.values())


def test_the_gpu_gauges_and_throttling_come_from_the_latest_sample(store):
    from sdcloud_agent.health import GpuSample

    g = GpuSample(util=87.0, mem_used_mib=5000.0, power_w=250.0, temp_c=84.0)
    g.reasons = ["hw_thermal_slowdown"]
    m = MetricsStream(store, "runs/r1", 1, tensorboard=False, gpu=lambda: g)
    m.feed({"step": 1, "loss": 0.3})
    m.flush()
    (p,) = read_metrics(store, "r1")
    assert (p.gpu_util, p.mem_used_mib, p.temp_c, p.power_w, p.throttling) == (87.0, 5000.0, 84.0, 250.0, True)


class Flaky:
    """A store whose PUTs fail while `down` is set (a store outage)."""

    def __init__(self, inner):
        self.inner, self.down = inner, True

    def put(self, key, data, metadata=None):
        if self.down:
            raise StoreError("503 Slow Down")
        return self.inner.put(key, data, metadata)


def test_a_failed_write_keeps_the_records_for_the_next_interval(store):
    flaky = Flaky(store)
    m = MetricsStream(flaky, "runs/r1", 1, tensorboard=False)
    m.feed({"step": 1, "loss": 0.3})
    assert m.flush() == 0
    flaky.down = False
    m.feed({"step": 2, "loss": 0.2})
    assert m.flush() == 2
    assert [p.step for p in read_metrics(store, "r1")] == [1, 2]


def test_the_newest_attempts_record_of_a_step_wins(store):
    for attempt, steps, loss in ((1, range(1, 8), 1.0), (2, range(5, 11), 2.0)):
        m = MetricsStream(store, "runs/r1", attempt, tensorboard=False)
        for s in steps:
            m.feed({"step": s, "loss": loss})
        m.flush()
    points = read_metrics(store, "r1")
    assert [p.step for p in points] == list(range(1, 11))
    assert [p.attempt for p in points] == [1] * 4 + [2] * 6


def test_event_files_carry_the_scalars_for_tensorboard(store, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    m = MetricsStream(store, "runs/r1", 1)
    for s in range(1, 6):
        m.feed({"step": s, "loss": 1.0 / s, "it_per_s": 3.0})
    m.flush()
    m.feed({"step": 6, "loss": 0.1})
    m.flush()
    keys = [i.key for i in store.list("runs/r1/tensorboard/sdcloud/")]
    assert len(keys) == 2
    for k in keys:
        store.get_file(k, tmp_path / "tb" / Path(k).name)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [1, 2, 3, 4, 5, 6]
    assert [e.step for e in acc.Scalars("steps_per_s")] == [1, 2, 3, 4, 5]


def test_validation_images_are_read_back_from_a_trackers_event_file(tmp_path):
    import numpy as np
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(tmp_path / "logs"))
    w.add_images("validation", np.full((2, 8, 8, 3), 120, dtype=np.uint8), 3, dataformats="NHWC")
    w.add_scalar("loss", 0.5, 3)
    w.close()
    (f,) = (tmp_path / "logs").glob("events.out.tfevents.*")
    got = read_event_images(f)
    assert [(step, tag) for step, _, tag, _ in got] == [(3, "validation")]
    assert got[0][3][:4] == b"\x89PNG"


def _sample(store, step: int, index: int, meta: bool = True) -> None:
    store.put(layout.image_key("runs/r1", step, index), b"\x89PNG fake")
    if meta:
        store.put(layout.meta_key("runs/r1", step, index), json.dumps({"prompt": f"p{index}", "seed": 3 + index,
                                                                       "sampler": "euler"}).encode())


def test_list_samples_by_step_and_index_and_an_image_without_its_json_still_counts(store):
    _sample(store, 20, 1)
    _sample(store, 10, 0)
    _sample(store, 20, 0, meta=False)
    store.put(layout.meta_key("runs/r1", 30, 0), b"{}")  # a JSON without its image is no sample
    got = list_samples(store, "r1")
    assert [(s.step, s.index, s.prompt, s.seed) for s in got] == [(10, 0, "p0", 3), (20, 0, "", None), (20, 1, "p1", 4)]
    assert [s.index for s in list_samples(store, "r1", step=20)] == [0, 1]
    assert got[0].read_bytes() == b"\x89PNG fake"


def test_samples_go_up_before_the_manifest_and_a_failing_upload_never_blocks_the_checkpoint(store, tmp_path):
    folder = tmp_path / "step-000000010"
    folder.mkdir()
    (folder / "lora.safetensors").write_bytes(b"w" * 100)
    write_png(folder / "sample-00.png", (10, 20, 30))
    (folder / "samples.json").write_text(json.dumps({"images": [{"index": 0, "seed": 5, "gpu_s": 0.5}]}))
    settings = layout.SampleSettings(prompts=("a red cube",), seed=5)
    seen = []

    def hook(step: int, path: Path) -> None:
        seen.append(mf.complete_steps(store, "runs/r1"))  # the manifest is not there yet
        layout.upload(store, "runs/r1", layout.builtin_samples(path, step), settings, "builtin")

    sync = CheckpointSync(store, "runs/r1", base_delay=0.01)
    sync.before_manifest = hook
    sync.upload(folder, 10)
    assert seen == [[]] and mf.complete_steps(store, "runs/r1") == [10]
    meta = json.loads(store.get(layout.meta_key("runs/r1", 10, 0)))
    assert (meta["prompt"], meta["seed"], meta["gpu_s"], meta["width"]) == ("a red cube", 5, 0.5, 8)

    def broken(step: int, path: Path) -> None:
        raise StoreError("403 AccessDenied")

    sync.before_manifest = broken
    sync.upload(folder, 20)
    assert mf.complete_steps(store, "runs/r1") == [10, 20]


def test_kohyas_newest_image_of_a_step_is_taken(tmp_path):
    folder = tmp_path / "sample"
    folder.mkdir()
    for name in ("sdcloud_000010_00_20261207101010_7.png", "sdcloud_000010_00_20261207111111_7.png",
                 "sdcloud_000010_01_20261207101010_8.png", "sdcloud_000020_00_20261207121212_7.png",
                 "sdcloud_e000001_00_20261207101010.png", "notes.txt"):
        (folder / name).write_bytes(b"x")
    got = layout.kohya_samples(tmp_path, 28, local_step=10)
    assert [(f.step, f.index, f.path.name) for f in got] == [
        (28, 0, "sdcloud_000010_00_20261207111111_7.png"), (28, 1, "sdcloud_000010_01_20261207101010_8.png")]


def test_a_checkpoint_with_samples_outlives_the_newest_k_rule(store, tmp_path):
    settings = layout.SampleSettings(prompts=("a red cube",))
    sync = CheckpointSync(store, "runs/r1", keep=1, base_delay=0.01)
    for step in (10, 20, 30, 40):
        folder = tmp_path / f"step-{step:09d}"
        folder.mkdir()
        (folder / "lora.safetensors").write_bytes(bytes([step]) * 64)
        if step == 20:
            write_png(folder / "sample-00.png", (1, 2, 3))
            found = layout.builtin_samples(folder, step)
            layout.upload(store, "runs/r1", found, settings, "builtin")
            sync.keep_also.update(layout.sampled_steps(store, "runs/r1"))
        sync.upload(folder, step)
    assert mf.complete_steps(store, "runs/r1") == [20, 40]
    assert [s.step for s in list_samples(store, "r1")] == [20]


def test_retention_keep_sampled_reaches_the_host(sdcloud_home):
    from sdcloud.runs.inputs.agent_config import agent_config
    from sdcloud.runs.inputs.spec import build_spec

    sdcloud_home.mkdir(parents=True, exist_ok=True)
    plan = build_spec(None, {"tier": "sd15-lora", "provider": "local", "steps": 30, "sample_prompts": ["x"]})
    assert agent_config(plan, "r-1", 1, 30, {"url": "file:///b"})["keep_sampled"] is True
    (sdcloud_home / "config.toml").write_text("[retention]\nkeep_sampled = false\n")
    assert agent_config(plan, "r-1", 1, 30, {"url": "file:///b"})["keep_sampled"] is False


def test_a_polling_reader_gets_only_what_landed_since_its_last_poll(store):
    from sdcloud.runs.records.metrics import MetricsCursor

    cursor = MetricsCursor(store, "r1")
    assert cursor.poll() == []
    m = MetricsStream(store, "runs/r1", 1, tensorboard=False)
    for s in (1, 2, 3):
        m.feed({"step": s, "loss": 1.0})
    m.flush()
    assert [p.step for p in cursor.poll()] == [1, 2, 3]
    assert cursor.poll() == []
    resumed = MetricsStream(store, "runs/r1", 2, tensorboard=False)
    for s in (3, 4):
        resumed.feed({"step": s, "loss": 0.5})
    resumed.flush()
    assert [(p.step, p.attempt) for p in cursor.poll()] == [(3, 2), (4, 2)]
    assert [(p.step, p.attempt) for p in cursor.points()] == [(1, 1), (2, 1), (3, 2), (4, 2)]
