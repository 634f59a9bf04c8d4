"""Training health: sampled every few seconds on the host, judged into one verdict at a time.

Samples (docs/training.md has the thresholds and their sources):
- the GPU, from `nvidia-smi -q -d UTILIZATION,MEMORY,CLOCK,PERFORMANCE,POWER,TEMPERATURE`:
  utilisation, memory used/total, SM clock against its maximum, the clock event (throttle)
  reasons, power draw against its limit, temperature. Skipped on a host without nvidia-smi.
- the trainer: each step's seconds and the seconds of it spent waiting for data (the builtin
  trainer's SDCLOUD_STEP lines; an external trainer's step time from its logged rate), and each
  checkpoint save's seconds (SDCLOUD_CHECKPOINT lines).
- the trainer's disk reads (read_bytes of /proc/<pid>/io, the trainer and its children).

No verdict without evidence: `unknown` until MIN_STEPS training steps are seen and, on a host with
nvidia-smi, MIN_GPU_SAMPLES GPU samples; a trainer that exited has no verdict, only its exit code
(`trainer_exit`). A figure that was not measured is null, never a guess.

Verdicts, one at a time, the first that holds in this order:
  io-bound    the trainer waits for data >= IO_WAIT_SHARE of its step time and the GPU (when there
              is one) is busy < IO_GPU_UTIL percent; for a trainer that does not report its data
              wait (kohya, diffusers), the GPU busy < IO_GPU_UTIL percent while it trains
  save-bound  checkpoint saves take >= SAVE_SHARE of the training's wall time
  throttled   a thermal, power or hardware slowdown reason is active in >= THROTTLE_SHARE of the
              GPU samples
  healthy     none of these

Pure parsing and judging here; the agent runs `Monitor.sample()` on a thread.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

SMI_QUERY = ["nvidia-smi", "-q", "-d", "UTILIZATION,MEMORY,CLOCK,PERFORMANCE,POWER,TEMPERATURE"]
SAMPLE_SECONDS = 5.0  # SDCLOUD_HEALTH_SECONDS overrides (< 0: no sampling)
WINDOW = 24  # samples judged together (two minutes at the default interval)
IO_WAIT_SHARE = 0.30
IO_GPU_UTIL = 50.0
SAVE_SHARE = 0.15
THROTTLE_SHARE = 0.20
# A recorded `nvidia-smi -q` report read in place of the real one at every sample (the tests'
# throttling source); the file may change while the run goes on.
RECORDED_SMI_ENV = "SDCLOUD_HEALTH_SMI_FILE"
MIN_STEPS = 5  # steps seen before any verdict
MIN_GPU_SAMPLES = 3  # GPU samples before any verdict, where there is a GPU to sample
# The clock event reasons that slow a busy GPU (nvidia-smi's names). Idle, applications clocks,
# sync boost and display clock settings are not slowdowns of a training job (NVML's nvml.h).
SLOWDOWNS = {"sw power cap": "power cap", "hw slowdown": "hw slowdown", "hw thermal slowdown": "hw thermal",
             "hw power brake slowdown": "hw power brake", "sw thermal slowdown": "sw thermal"}
_KV = re.compile(r"^(\s*)([^:]+?)\s*:\s*(.*?)\s*$")
_NUM = re.compile(r"([-\d.]+)")


@dataclass
class GpuSample:
    util: float | None = None  # percent
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    sm_mhz: float | None = None
    sm_max_mhz: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    reasons: list[str] = field(default_factory=list)  # active slowdowns (SLOWDOWNS values)
    idle: bool = False


def _num(text: str) -> float | None:
    m = _NUM.search(text)
    try:
        return float(m.group(1)) if m else None
    except ValueError:
        return None


# A GPU's row of the plain `nvidia-smi` table: fan, temp, perf, power/cap | memory | util.
_TABLE_ROW = re.compile(r"^\|\s*\S+\s+(\d+)C\s+P\d+\s+(?:(\d+)W|N/A)\s*/\s*(?:(\d+)W|N/A)\s*\|"
                        r"\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|\s*(\d+)%")


def parse_table(text: str) -> list[GpuSample]:
    """Each GPU of the plain `nvidia-smi` table (no clocks or reasons in it)."""
    out = []
    for line in text.splitlines():
        m = _TABLE_ROW.match(line.strip())
        if m:
            t, pw, cap, used, total, util = m.groups()
            out.append(GpuSample(util=float(util), mem_used_mib=float(used), mem_total_mib=float(total),
                                 power_w=float(pw) if pw else None, power_limit_w=float(cap) if cap else None,
                                 temp_c=float(t)))
    return out


def parse_smi(text: str) -> list[GpuSample]:
    """Each GPU of an `nvidia-smi -q` report (any subset of its sections; older drivers call
    the reasons "Clocks Throttle Reasons", 535 and later "Clocks Event Reasons"; 550 and later
    report power as "GPU Power Readings" with average and instantaneous draws), or of the plain
    table."""
    if "Pwr:Usage/Cap" in text:
        return parse_table(text)
    gpus: list[GpuSample] = []
    cur: GpuSample | None = None
    section = ""
    for raw in text.splitlines():
        if re.match(r"^GPU [0-9A-Fa-f:.]+\s*$", raw):
            cur = GpuSample()
            gpus.append(cur)
            section = ""
            continue
        m = _KV.match(raw)
        if not m:
            if raw.strip() and ":" not in raw:  # a section heading ("    Clocks Event Reasons")
                m = re.match(r"^(\s*)(.+?)\s*$", raw)
                indent, key, value = len(m.group(1)), m.group(2).lower(), ""
            else:
                continue
        else:
            indent, key, value = len(m.group(1)), m.group(2).strip().lower(), m.group(3)
        if cur is None:
            if indent == 0:
                continue
            cur = GpuSample()  # a trimmed report without the "GPU <bus id>" line
            gpus.append(cur)
        if value == "" and indent <= 4:
            section = key
            continue
        if indent <= 4:
            section = "" if value else section
        if section in ("clocks event reasons", "clocks throttle reasons"):
            if key in SLOWDOWNS and value.lower() == "active":
                cur.reasons.append(SLOWDOWNS[key])
            elif key == "idle" and value.lower() == "active":
                cur.idle = True
        elif section == "utilization" and key == "gpu":
            cur.util = _num(value)
        elif section == "fb memory usage":
            if key == "total":
                cur.mem_total_mib = _num(value)
            elif key == "used":
                cur.mem_used_mib = _num(value)
        elif section == "clocks" and key == "sm":
            cur.sm_mhz = _num(value)
        elif section == "max clocks" and key == "sm":
            cur.sm_max_mhz = _num(value)
        elif section in ("power readings", "gpu power readings"):
            # <= R545 "Power Readings": Power Draw, Power Limit. R550+ "GPU Power Readings":
            # Average Power Draw (N/A on boards that only measure instantly), Instantaneous Power
            # Draw, Current Power Limit; "GPU Memory" and "Module" power sections are not the GPU's.
            if key in ("power draw", "average power draw"):
                cur.power_w = _num(value) if _num(value) is not None else cur.power_w
            elif key == "instantaneous power draw" and cur.power_w is None:
                cur.power_w = _num(value)
            elif key in ("power limit", "current power limit"):
                cur.power_limit_w = _num(value)
        elif section == "temperature" and key == "gpu current temp":
            cur.temp_c = _num(value)
    return gpus


def combine(gpus: list[GpuSample]) -> GpuSample | None:
    """One sample for the host: mean utilisation, the most memory, any GPU's slowdown."""
    if not gpus:
        return None
    def vals(attr: str) -> list[float]:
        return [getattr(g, attr) for g in gpus if getattr(g, attr) is not None]
    util = vals("util")
    out = GpuSample(util=sum(util) / len(util) if util else None,
                    mem_used_mib=max(vals("mem_used_mib"), default=None),
                    mem_total_mib=max(vals("mem_total_mib"), default=None),
                    sm_mhz=min(vals("sm_mhz"), default=None), sm_max_mhz=max(vals("sm_max_mhz"), default=None),
                    power_w=max(vals("power_w"), default=None), power_limit_w=max(vals("power_limit_w"), default=None),
                    temp_c=max(vals("temp_c"), default=None))
    out.reasons = sorted({r for g in gpus for r in g.reasons})
    out.idle = all(g.idle for g in gpus)
    return out


@dataclass
class Verdict:
    verdict: str  # healthy | io-bound | save-bound | throttled
    why: str
    figures: dict

    def as_dict(self) -> dict:
        return {"verdict": self.verdict, "why": self.why, **self.figures}


def _pct(x: float | None) -> float | None:
    return None if x is None else round(100.0 * x, 1)


def judge(gpu: list[GpuSample], steps: list[tuple[float, float | None]], save_s: float, wall_s: float,
          read_mb_s: float | None = None, *, gpu_expected: bool | None = None) -> Verdict:
    """The verdict over a window: GPU samples, (step seconds, data-wait seconds or None) of the
    trainer's steps, the seconds its saves took and the wall time they fall in. `gpu_expected`:
    the host has a GPU to sample (None: as many as were given)."""
    utils = [g.util for g in gpu if g.util is not None]
    util = sum(utils) / len(utils) if utils else None
    waits = [(s, w) for s, w in steps if w is not None and s > 0]
    wait_share = sum(w for _, w in waits) / sum(s for s, _ in waits) if waits else None
    step_s = sum(s for s, _ in steps) / len(steps) if steps else None
    save_share = save_s / wall_s if wall_s > 0 else None
    busy = [g for g in gpu if not g.idle]
    slowed = [g for g in busy if g.reasons]
    throttle_share = len(slowed) / len(busy) if busy else None
    reasons = sorted({r for g in slowed for r in g.reasons})
    clocks = [g.sm_mhz / g.sm_max_mhz for g in gpu if g.sm_mhz and g.sm_max_mhz]
    power = [g for g in gpu if g.power_w is not None]
    temps = [g.temp_c for g in gpu if g.temp_c is not None]
    mem = [g for g in gpu if g.mem_used_mib is not None]
    figures = {
        "gpu_util": None if util is None else round(util, 1),
        "data_wait_pct": _pct(wait_share),
        "step_s": None if step_s is None else round(step_s, 4),
        "save_pct": _pct(save_share),
        "throttle_pct": _pct(throttle_share),
        "throttle_reasons": reasons,
        "sm_clock_pct": _pct(sum(clocks) / len(clocks)) if clocks else None,
        "power_w": round(power[-1].power_w, 1) if power else None,
        "power_limit_w": power[-1].power_limit_w if power else None,
        "temp_c": max(temps) if temps else None,
        "mem_used_gb": round(max(g.mem_used_mib for g in mem) / 1024, 2) if mem else None,
        "mem_total_gb": round(mem[-1].mem_total_mib / 1024, 2) if mem and mem[-1].mem_total_mib else None,
        "read_mb_s": None if read_mb_s is None else round(read_mb_s, 2),
        "gpu_samples": len(gpu), "steps": len(steps),
    }
    need_gpu = MIN_GPU_SAMPLES if (gpu_expected if gpu_expected is not None else bool(gpu)) else 0
    if len(steps) < MIN_STEPS or len(gpu) < need_gpu:
        have = f"{len(steps)} of {MIN_STEPS} steps" + (f", {len(gpu)} of {need_gpu} GPU samples" if need_gpu else "")
        return Verdict("unknown", f"not enough evidence yet ({have})", figures)
    if wait_share is not None and wait_share >= IO_WAIT_SHARE and (util is None or util < IO_GPU_UTIL):
        gpu_part = f"GPU {util:.0f}% busy while " if util is not None else ""
        return Verdict("io-bound", f"{gpu_part}the trainer waits for data {100 * wait_share:.0f}% of each step "
                                   f"(io-bound at >= {100 * IO_WAIT_SHARE:.0f}%)", figures)
    if wait_share is None and util is not None and util < IO_GPU_UTIL and not waits:
        # kohya and diffusers do not say their data wait: a GPU idle half the time while it trains
        # is the mark of a starved one (or of a loader short of CPU, which the same cures help).
        return Verdict("io-bound", f"GPU {util:.0f}% busy while training (io-bound under {IO_GPU_UTIL:.0f}%; "
                                   "the trainer does not report its data wait)", figures)
    if save_share is not None and save_share >= SAVE_SHARE:
        return Verdict("save-bound", f"checkpoint saves take {100 * save_share:.0f}% of the wall time "
                                     f"(save-bound at >= {100 * SAVE_SHARE:.0f}%)", figures)
    if throttle_share is not None and throttle_share >= THROTTLE_SHARE:
        clock = f", SM clock {figures['sm_clock_pct']:.0f}% of its max" if figures["sm_clock_pct"] else ""
        return Verdict("throttled", f"{', '.join(reasons)} active in {100 * throttle_share:.0f}% of the GPU "
                                    f"samples{clock}", figures)
    bits = [f"GPU {util:.0f}%" if util is not None else "no GPU sampled"]
    if wait_share is not None:
        bits.append(f"data wait {100 * wait_share:.0f}%")
    return Verdict("healthy", ", ".join(bits), figures)


# ---------------------------------------------------------------------------------------------
# The agent's monitor


def _proc_read_bytes(pid: int) -> int | None:
    """Bytes read from storage by a process and its live children (/proc/<pid>/io read_bytes)."""
    total, found = 0, False
    pids = [pid]
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(k) for k in kids]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/io").read_text().splitlines():
                if line.startswith("read_bytes:"):
                    total += int(line.split()[1])
                    found = True
        except (OSError, ValueError):
            continue
    return total if found else None


class Monitor:
    """Fed the trainer's lines; samples the GPU and the trainer's reads on `sample()`."""

    def __init__(self, *, use_gpu: bool | None = None, run_smi: Callable[[], str] | None = None,
                 clock: Callable[[], float] = time.monotonic, window: int = WINDOW):
        recorded = os.environ.get(RECORDED_SMI_ENV)
        if recorded and run_smi is None:  # a recorded report stands in for nvidia-smi (tests)
            run_smi, use_gpu = (lambda: Path(recorded).read_text()), True
        self.use_gpu = (shutil.which("nvidia-smi") is not None) if use_gpu is None else use_gpu
        self._run_smi = run_smi or self._smi
        self.clock = clock
        self.gpu: deque[GpuSample] = deque(maxlen=window)
        self.steps: deque[tuple[float, float | None]] = deque(maxlen=window * 50)
        self.save_s = 0.0
        self.saves = 0
        # The attempt's seconds in saves and in waiting for data, over every start of its trainer
        # (reset() keeps them): what the run lost to each, as measured, for the cost report.
        self.save_seconds = 0.0
        self.sample_seconds = 0.0  # rendering the samples at the checkpoints (the builtin trainer says it)
        self.data_wait_seconds: float | None = None  # None: the trainer never said its data wait
        self.started: float | None = None  # the first step: save share counts from there
        self.peak_mem_gb: float | None = None
        self.pid: int | None = None
        self._read: tuple[float, int] | None = None
        self.read_mb_s: float | None = None
        self.cost_s = 0.0  # the sampler's own seconds (bench/health_overhead.py)
        self.samples = 0
        self.exit_code: int | None = None  # the trainer's, once it exited (no verdict then)
        self._lock = threading.Lock()
        self._stop = threading.Event()

    @staticmethod
    def _smi() -> str:
        return subprocess.run(SMI_QUERY, capture_output=True, text=True, timeout=20).stdout

    # -- fed by the agent ------------------------------------------------------------------------
    def feed_line(self, line: str, prog: dict | None = None) -> None:
        if line.startswith("SDCLOUD_STEP "):
            try:
                doc = json.loads(line[len("SDCLOUD_STEP "):])
            except ValueError:
                return
            if doc.get("step_s"):
                self._step(float(doc["step_s"]), doc.get("data_wait_s"))
                return
        if line.startswith("SDCLOUD_CHECKPOINT "):
            try:
                doc = json.loads(line[len("SDCLOUD_CHECKPOINT "):])
            except ValueError:
                return
            if doc.get("save_s") is not None:
                with self._lock:
                    self.save_s += float(doc["save_s"])
                    self.save_seconds += float(doc["save_s"])
                    self.sample_seconds += float(doc.get("sample_s") or 0.0)
                    self.saves += 1
            return
        if prog and prog.get("it_per_s"):
            # An external trainer: its logged rate gives the step time; it does not say its data wait.
            self._step(1.0 / float(prog["it_per_s"]), None)

    def _step(self, step_s: float, wait: object) -> None:
        with self._lock:
            if self.started is None:
                self.started = self.clock() - step_s
            self.steps.append((step_s, float(wait) if wait is not None else None))
            if wait is not None:
                self.data_wait_seconds = (self.data_wait_seconds or 0.0) + float(wait)

    def judged_s(self) -> float:
        """Seconds of training the current window covers (0 before the first step)."""
        return self.clock() - self.started if self.started is not None else 0.0

    def reset(self) -> None:
        """Judge afresh (after a health action restarted the trainer): the window's steps, GPU
        samples and saves are those of the old setup."""
        with self._lock:
            self.gpu.clear()
            self.steps.clear()
            self.save_s, self.saves, self.started = 0.0, 0, None
        self.read_mb_s = None

    def set_pid(self, pid: int | None) -> None:
        self.pid, self._read, self.exit_code = pid, None, None

    def set_exit(self, code: int) -> None:
        """The trainer exited: from now on its health has no verdict, only this exit."""
        self.exit_code = code

    # -- sampling --------------------------------------------------------------------------------
    def sample(self) -> None:
        t0 = time.perf_counter()
        if self.use_gpu:
            try:
                g = combine(parse_smi(self._run_smi()))
            except (OSError, subprocess.SubprocessError):
                g = None
            if g is not None:
                with self._lock:
                    self.gpu.append(g)
                    if g.mem_used_mib is not None:
                        self.peak_mem_gb = max(self.peak_mem_gb or 0.0, round(g.mem_used_mib / 1024, 2))
        if self.pid is not None:
            now, got = self.clock(), _proc_read_bytes(self.pid)
            if got is not None:
                if self._read is not None and now > self._read[0]:
                    self.read_mb_s = max(0.0, (got - self._read[1]) / (now - self._read[0]) / 1e6)
                self._read = (now, got)
        self.samples += 1
        self.cost_s += time.perf_counter() - t0

    def latest(self) -> GpuSample | None:
        """The newest GPU sample (the metrics stream's gauges), or None."""
        with self._lock:
            return self.gpu[-1] if self.gpu else None

    def verdict(self) -> Verdict:
        with self._lock:
            gpu, steps = list(self.gpu), list(self.steps)[-WINDOW * 10:]
            wall = self.clock() - self.started if self.started is not None else 0.0
            save_s = self.save_s
        return judge(gpu, steps, save_s, wall, self.read_mb_s, gpu_expected=self.use_gpu)

    def summary(self) -> dict:
        """What status.json carries as `health`."""
        out = self.verdict().as_dict()
        out["trainer_exit"] = self.exit_code
        if self.exit_code is not None:  # what it was judged while it ran stays, as last_verdict
            out.update(verdict=None, last_verdict=out["verdict"], why=f"the trainer exited with code {self.exit_code}")
        out.update(samples=self.samples, sampler_ms=round(1000 * self.cost_s / self.samples, 1) if self.samples else None,
                   saves=self.saves, peak_mem_gb=self.peak_mem_gb, save_seconds=round(self.save_seconds, 3),
                   sample_seconds=round(self.sample_seconds, 3),
                   data_wait_seconds=None if self.data_wait_seconds is None else round(self.data_wait_seconds, 3))
        return out

    def start(self, every: float | None = None) -> "Monitor":
        every = every or float(os.environ.get("SDCLOUD_HEALTH_SECONDS") or SAMPLE_SECONDS)
        if every <= 0:
            return self  # sampling off (bench/health_overhead.py's baseline); the trainer's lines still count

        def loop() -> None:
            while not self._stop.wait(every):
                try:
                    self.sample()
                except Exception:  # noqa: BLE001 - health is best effort; training goes on
                    pass

        threading.Thread(target=loop, name="sdcloud-health", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
