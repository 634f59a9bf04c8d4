"""The run's curves: THE one module that owns the metrics stream's layout in the run's store (the agent
appends it, the control plane's runs/records/metrics.py reads it).

Bucket layout, relative to the run's prefix (`runs/<run_id>`):

    metrics/<attempt:04d>-<seq:06d>.jsonl      one object per logging interval, one JSON record a line
    tensorboard/sdcloud/events.out.tfevents.<time:010d>.a<attempt:04d>-<seq:06d>
                                               the same figures as TensorBoard scalars, one event file
                                               per interval (`tensorboard --logdir` reads them in order)
    tensorboard/trainer/...                    the trainer's own TensorBoard logs (kohya's --log_with,
                                               the diffusers scripts' --report_to), copied at each
                                               checkpoint and at the end

A record: {"time", "attempt", "step", "loss", "loss_smoothed", "lr", "steps_per_s", "data_wait_s",
"gpu_util", "mem_used_mib", "temp_c", "power_w", "throttling"} (a figure the trainer or the GPU did not
give is null). The stream is never rewritten: each interval is a new object, so a reclaim loses at most
the interval in flight. A resumed attempt trains some steps again; readers keep the newest attempt's
record of a step. Records hold numbers only: no prompt, path, key or token.
"""

from __future__ import annotations

import json
import logging
import re
import struct
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger("sdcloud_agent.metrics")

METRICS = "metrics"
TENSORBOARD = "tensorboard"
OURS = "sdcloud"  # tensorboard/sdcloud/: the agent's event files
THEIRS = "trainer"  # tensorboard/trainer/: the trainer's own
FIELDS = ("time", "attempt", "step", "loss", "loss_smoothed", "lr", "steps_per_s", "data_wait_s", "gpu_util",
          "mem_used_mib", "temp_c", "power_w", "throttling")
# The TensorBoard scalars: record field -> tag.
SCALARS = {"loss": "loss", "loss_smoothed": "loss_smoothed", "lr": "lr", "steps_per_s": "steps_per_s",
           "data_wait_s": "data_wait_s", "gpu_util": "gpu/util", "mem_used_mib": "gpu/mem_used_mib",
           "temp_c": "gpu/temp_c", "power_w": "gpu/power_w"}
SMOOTHING = 0.9  # TensorBoard's default smoothing weight, so loss_smoothed reads as its chart does
DEFAULT_INTERVAL_S = 5.0
_KEY = re.compile(rf"/{METRICS}/(\d{{4}})-(\d{{6}})\.jsonl$")


def metrics_prefix(run_prefix: str) -> str:
    return f"{run_prefix}/{METRICS}/"


def metrics_key(run_prefix: str, attempt: int, seq: int) -> str:
    return f"{run_prefix}/{METRICS}/{attempt:04d}-{seq:06d}.jsonl"


def parse_key(key: str) -> tuple[int, int] | None:
    """(attempt, seq) of a metrics object's key, or None."""
    m = _KEY.search(key)
    return (int(m.group(1)), int(m.group(2))) if m else None


def events_key(run_prefix: str, attempt: int, seq: int, when: float) -> str:
    return f"{run_prefix}/{TENSORBOARD}/{OURS}/events.out.tfevents.{int(when):010d}.a{attempt:04d}-{seq:06d}"


def decode(data: bytes) -> list[dict]:
    """The records of one metrics object (a torn or foreign line is skipped)."""
    out = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            out.append(rec)
    return out


def throttling(reasons: list[str] | None) -> bool | None:
    """True when nvidia-smi names a slowdown (thermal, power brake) other than idle or a set clock."""
    if reasons is None:
        return None
    return any(r for r in reasons if r not in ("idle", "applications_clocks_setting", "gpu_idle"))


class MetricsStream:
    """Fed the trainer's progress (step, loss, lr, rate, data wait) and the latest GPU sample; every
    `interval` seconds the records since the last write go up as one new object and one event file."""

    def __init__(self, store, run_prefix: str, attempt: int, *, interval: float = DEFAULT_INTERVAL_S,
                 gpu=None, tensorboard: bool = True):
        self.store = store
        self.run_prefix = run_prefix
        self.attempt = attempt
        self.interval = max(0.5, float(interval))
        self.gpu = gpu  # () -> the latest combined GpuSample or None (health.Monitor.latest)
        self.tensorboard = tensorboard
        self._pending: list[dict] = []
        self._seq = 0
        self._smoothed: float | None = None
        self._last_step = -1
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tb_warned = False

    def feed_line(self, line: str, prog: dict) -> None:
        """A progress line: the builtin protocol's SDCLOUD_STEP also says the learning rate and the data wait."""
        extra: dict = {}
        if line.startswith("SDCLOUD_STEP "):
            try:
                doc = json.loads(line[len("SDCLOUD_STEP "):])
                extra = {k: doc.get(k) for k in ("lr", "data_wait_s") if isinstance(doc, dict)}
            except ValueError:
                pass
        self.feed({**extra, **prog})

    def feed(self, prog: dict) -> None:
        """One progress report of the trainer (a parsed line). A step seen before in this attempt
        (a tqdm bar redrawn) replaces nothing: the first report of a step is its record."""
        step = prog.get("step")
        if not isinstance(step, int) or step <= self._last_step:
            return
        self._last_step = step
        loss = _num(prog.get("loss"))
        if loss is not None:
            self._smoothed = loss if self._smoothed is None else SMOOTHING * self._smoothed + (1 - SMOOTHING) * loss
        wait = _num(prog.get("data_wait_s"))  # the step's own seconds waiting for its batch
        rec = {"time": round(time.time(), 3), "attempt": self.attempt, "step": step, "loss": loss,
               "loss_smoothed": None if loss is None else round(self._smoothed, 6), "lr": _num(prog.get("lr")),
               "steps_per_s": _num(prog.get("it_per_s")), "data_wait_s": wait}
        g = None
        if self.gpu is not None:
            try:
                g = self.gpu()
            except Exception:  # noqa: BLE001 - a gauge is best effort
                g = None
        rec.update(gpu_util=getattr(g, "util", None), mem_used_mib=getattr(g, "mem_used_mib", None),
                   temp_c=getattr(g, "temp_c", None), power_w=getattr(g, "power_w", None),
                   throttling=throttling(getattr(g, "reasons", None)) if g is not None else None)
        with self._lock:
            self._pending.append(rec)

    def flush(self) -> int:
        """Write what came since the last flush as a new object (and event file); the records written."""
        with self._write_lock:
            with self._lock:
                recs, self._pending = self._pending, []
            if not recs:
                return 0
            self._seq += 1
            data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in recs).encode()
            try:
                self.store.put(metrics_key(self.run_prefix, self.attempt, self._seq), data)
            except Exception as exc:  # noqa: BLE001 - keep them for the next interval
                log.warning("metrics upload failed (%s); kept for the next interval", exc)
                with self._lock:
                    self._pending = recs + self._pending
                return 0
            if self.tensorboard:
                self._event_file(recs)
            return len(recs)

    def _event_file(self, recs: list[dict]) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            if not self._tb_warned:
                log.info("tensorboardX is not installed: the curves go to metrics/ only")
                self._tb_warned = True
            return
        try:
            with tempfile.TemporaryDirectory(prefix="sdcloud-tb-") as tmp:
                w = SummaryWriter(logdir=tmp, flush_secs=3600)
                for r in recs:
                    for field_name, tag in SCALARS.items():
                        v = r.get(field_name)
                        if isinstance(v, (int, float)) and not isinstance(v, bool):
                            w.add_scalar(tag, v, r["step"], walltime=r["time"])
                w.close()
                files = list(Path(tmp).glob("events.out.tfevents.*"))
                for f in files:
                    self.store.put_file(events_key(self.run_prefix, self.attempt, self._seq, recs[0]["time"]), f)
                if not files:
                    log.warning("tensorboard wrote no event file for %d records", len(recs))
        except Exception as exc:  # noqa: BLE001 - the JSON stream is the record; the event file a view of it
            log.warning("tensorboard event file failed: %s", exc)

    def start(self) -> "MetricsStream":
        def loop() -> None:
            while not self._stop.wait(self.interval):
                self.flush()
        self._thread = threading.Thread(target=loop, name="sdcloud-metrics", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.flush()


def _num(v) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def upload_tree(store, folder: Path, prefix: str) -> int:
    """Copy a trainer's log folder under `prefix` (relative paths kept); the files sent."""
    n = 0
    if folder.is_dir():
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                store.put_file(f"{prefix}/{p.relative_to(folder).as_posix()}", p)
                n += 1
    return n


def read_event_images(path: Path, tag_prefix: str = "validation") -> list[tuple[int, float, str, bytes]]:
    """(step, wall time, tag, PNG bytes) of every image summary whose tag starts with `tag_prefix` in
    one TensorBoard event file: how the diffusers scripts' validation images are found. TFRecord
    framing (length, its CRC, the Event, its CRC) read here; the Event parsed by tensorboardX's protos."""
    from tensorboardX.proto.event_pb2 import Event

    out = []
    data = path.read_bytes()
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        start = pos + 12
        if start + length + 4 > len(data):
            break  # a record still being written
        ev = Event()
        ev.ParseFromString(data[start:start + length])
        pos = start + length + 4
        for v in ev.summary.value:
            if v.tag.startswith(tag_prefix) and v.HasField("image"):
                out.append((int(ev.step), float(ev.wall_time), v.tag, bytes(v.image.encoded_image_string)))
    return out
