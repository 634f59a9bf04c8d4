"""The local provider: hosts are agent processes on this machine; the bucket a local directory.

It is the embedded default for trying sdcloud and for a GPU box at hand. Each "instance" is a
`python -m sdcloud_agent run` process in its own session, recorded under
$SDCLOUD_HOME/local/instances/<id>.json with the same three tags a cloud instance carries, so
that adoption after a controller crash, `sdcloud down` and `sdcloud gc` work as on a cloud.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from ... import clock, config
from ...offers.catalog import CatalogRow
from ...offers.groups import group_price, node_count
from ...errors import UserError
from ...events import Kind
from ...offers.optimizer import Offer
from ..base import (FAILED, PENDING, RUNNING, TAG_TOKEN, TERMINATED, EventSink, Instance, LaunchSpec, no_events)
from ..traits import name_of
from .metadata import MetadataServer

NAME = name_of(__name__)  # "local", or the name a copy of this folder is registered under

# Seconds between the simulated reclaim notice and the kill. AWS gives 120 s, Tencent about the
# same; a local demo does not need to wait that long for a tiny model to save.
DEFAULT_NOTICE_SECONDS = 30.0
TERMINATE_GRACE_SECONDS = 60.0


def _local_gpu() -> tuple[str, int, float]:
    """(model, count, VRAM GB per GPU) of this machine, ("CPU", 0, 0) without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return "CPU", 0, 0.0
    try:
        out = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "CPU", 0, 0.0
    rows = [line.split(",") for line in out.strip().splitlines() if line.strip()]
    if not rows:
        return "CPU", 0, 0.0
    return rows[0][0].strip(), len(rows), round(float(rows[0][1]) / 1024, 1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state in ("Z", "X"):
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"sdcloud_agent" in f.read()
    except (FileNotFoundError, ProcessLookupError, IndexError, PermissionError):
        return False


class LocalProvider:
    name = NAME

    def __init__(self, price_per_hour: float | None = None, notice_seconds: float | None = None,
                 python: str | None = None, **_: object):
        conf = config.settings().get(NAME, {})
        self.price_per_hour = float(price_per_hour if price_per_hour is not None else conf.get("price_per_hour", 0.0))
        if self.price_per_hour < 0:
            raise UserError(f"local price_per_hour must be 0 or more, got {self.price_per_hour}")
        self.notice_seconds = float(notice_seconds if notice_seconds is not None
                                    else conf.get("notice_seconds", DEFAULT_NOTICE_SECONDS))
        self.python = python or sys.executable
        self.dir = config.home() / NAME
        (self.dir / "instances").mkdir(parents=True, exist_ok=True)
        self._children: dict[int, subprocess.Popen] = {}
        self._metadata: dict[str, MetadataServer] = {}
        self._timers: list[threading.Timer] = []

    # capabilities.LaunchesGroups: a group is N agent processes here (nodes.py), as many as this machine runs
    @staticmethod
    def group_limit() -> tuple[int, str]:
        from .nodes import group_limit

        return group_limit(_local_gpu()[1])

    # offers
    def offers(self, tier=None, market: str | None = None, regions: list[str] | None = None) -> list[Offer]:
        gpu, count, vram = _local_gpu()
        row = CatalogRow(provider=NAME, region="local", zone="local", instance_type="this-machine", gpu=gpu,
                         gpu_count=max(count, 1), vram_gb=vram, vcpus=os.cpu_count() or 1, memory_gb=_memory_gb(),
                         nvme_gb=0, ondemand_price=self.price_per_hour, spot_price=self.price_per_hour, currency="USD",
                         interruption_band=None, snapshot_date=clock.utc_now().date().isoformat(),
                         ondemand_estimate=False, spot_estimate=False, source="this machine")
        return [Offer(row, market or "on-demand")]

    # instance records
    def _record_path(self, instance_id: str) -> Path:
        return self.dir / "instances" / f"{instance_id}.json"

    def _records(self) -> list[dict]:
        out = []
        for path in sorted((self.dir / "instances").glob("*.json")):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, json.JSONDecodeError):
                continue
        return out

    def _write_record(self, rec: dict) -> None:
        path = self._record_path(rec["id"])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec, indent=1))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)

    def _state(self, rec: dict) -> str:
        if rec.get("ended"):
            return TERMINATED
        pids = [n["pid"] for n in rec.get("nodes") or []]
        if len(pids) > 1:  # a multi-node group (nodes.py): running while any of its hosts is
            states = [self._pid_state(pid) for pid in pids]
            return RUNNING if RUNNING in states else states[0]
        return self._pid_state(rec["pid"])

    def _pid_state(self, pid: int) -> str:
        child = self._children.get(pid)
        if child is not None:
            if child.poll() is None:
                return RUNNING
            return TERMINATED if child.returncode in (0, 3, -signal.SIGTERM, -signal.SIGKILL, 143) else FAILED
        return RUNNING if _alive(pid) else TERMINATED

    def _instance(self, rec: dict) -> Instance:
        return Instance(provider=NAME, id=rec["id"], region="local", zone="local", instance_type="this-machine",
                        market=rec["market"], state=self._state(rec),
                        price_per_hour=group_price(rec["price_per_hour"], len(rec.get("nodes") or [None])),
                        public_ip="127.0.0.1", private_ip="127.0.0.1",
                        launched_at=datetime.fromtimestamp(rec["created"], timezone.utc), tags=rec["tags"])

    # Provider protocol
    def launch(self, offer: Offer, spec: LaunchSpec, market: str, max_price: float | None = None,
               events: EventSink = no_events) -> Instance:
        for rec in self._records():
            if rec["tags"].get(TAG_TOKEN) == spec.token and self._state(rec) in (PENDING, RUNNING):
                events(Kind.ADOPTED, {"instance": rec["id"], "token": spec.token})
                inst = self._instance(rec)
                inst.adopted = True
                return inst
        if max_price is not None and self.price_per_hour > max_price:
            raise UserError(f"the local host costs ${self.price_per_hour:g}/h, above --max-price ${max_price:g}/h")
        host_dir = self.dir / "hosts" / spec.token
        host_dir.mkdir(parents=True, exist_ok=True)
        if node_count(spec.agent_config) > 1:
            from .nodes import launch_group

            return launch_group(self, offer, spec, market, host_dir, events)
        metadata = MetadataServer()
        proc = self._start_agent(spec, host_dir, metadata, spec.agent_config)
        instance_id = f"local-{proc.pid}-{spec.token[-8:]}"
        self._metadata[instance_id] = metadata
        rec = {"id": instance_id, "pid": proc.pid, "market": market, "price_per_hour": self.price_per_hour,
               "tags": spec.tags, "created": time.time(), "host_dir": str(host_dir), "metadata_url": metadata.base_url}
        self._write_record(rec)
        events(Kind.HOST_STARTED, {"instance": instance_id, "pid": proc.pid})
        return self._instance(rec)

    def _start_agent(self, spec: LaunchSpec, host_dir: Path, metadata: MetadataServer,
                     agent_config: dict) -> subprocess.Popen:
        """One agent process: its config in `host_dir`, its reclaim notice from `metadata`."""
        agent_config = dict(agent_config)
        agent_config.setdefault("workdir", str(host_dir / "work"))
        agent_config["metadata"] = {"kind": "aws", "base_url": metadata.base_url}
        cfg_path = host_dir / "agent.json"
        cfg_path.write_text(json.dumps(agent_config, indent=1))
        os.chmod(cfg_path, 0o600)
        env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
        # The agent from the same wheel cloud hosts get, first on the path (its training stack is
        # this machine's own packages).
        from sdcloud_agent.wheel import current

        wheel = current()
        wheel_path = self.dir / "agent" / wheel.filename
        if not wheel_path.exists():
            wheel_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = wheel_path.with_suffix(".tmp")
            tmp.write_bytes(wheel.data)
            os.replace(tmp, wheel_path)
        env["PYTHONPATH"] = os.pathsep.join([str(wheel_path)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        log = open(host_dir / "agent.log", "ab")
        proc = subprocess.Popen([self.python, "-m", "sdcloud_agent", "run", "--config", str(cfg_path)],
                                cwd=host_dir, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        log.close()
        self._children[proc.pid] = proc
        return proc

    def schedule_reclaim(self, instance_id: str, after_seconds: float, events: EventSink = no_events,
                         node: int | None = None) -> None:
        """Announce a reclaim `after_seconds` from now, then take the host away after the notice, as a cloud would.
        In a multi-node group one host is reclaimed: `node` (default its last)."""
        def announce() -> None:
            server = self._metadata.get(instance_id)
            if server is None:
                return
            group = getattr(server, "nodes", None)
            rank = (len(group) - 1 if node is None else node) if group else None
            at = (group[rank] if group else server).announce(self.notice_seconds)
            events(Kind.RECLAIM_NOTICE, {"instance": instance_id, "terminate_at": at.isoformat(), "simulated": True,
                                         **({"node": rank} if rank is not None else {})})
            kill = threading.Timer(self.notice_seconds, self._reclaim, args=(instance_id, rank))
            kill.daemon = True
            self._timers.append(kill)
            kill.start()

        timer = threading.Timer(after_seconds, announce)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _reclaim(self, instance_id: str, node: int | None = None) -> None:
        rec = next((r for r in self._records() if r["id"] == instance_id), None)
        if rec and self._state(rec) == RUNNING:
            pid = rec["pid"] if node is None else rec["nodes"][node]["pid"]
            if self._pid_state(pid) == RUNNING:
                self._signal(pid, signal.SIGKILL)

    def _signal(self, pid: int, sig: int) -> None:
        try:
            os.killpg(pid, sig)  # the agent leads its own session; its trainer has its own group
        except ProcessLookupError:
            pass

    def describe(self, ids: list[str], region: str | None = None) -> list[Instance]:
        wanted = set(ids)
        return [self._instance(r) for r in self._records() if r["id"] in wanted]

    def terminate(self, ids: list[str], region: str | None = None) -> None:
        """SIGTERM (the agent saves and uploads), then SIGKILL after a grace period, as a cloud shutdown does."""
        recs = [r for r in self._records() if r["id"] in set(ids)]
        for rec in recs:  # every host of a group: none bills past its purpose
            for pid in [n["pid"] for n in rec.get("nodes") or []] or [rec["pid"]]:
                if self._pid_state(pid) == RUNNING:
                    self._signal(pid, signal.SIGTERM)
        deadline = time.time() + TERMINATE_GRACE_SECONDS
        for rec in recs:
            while self._state(rec) == RUNNING and time.time() < deadline:
                time.sleep(0.2)
            if self._state(rec) == RUNNING:
                for pid in [n["pid"] for n in rec.get("nodes") or []] or [rec["pid"]]:
                    self._signal(pid, signal.SIGKILL)
                kill_deadline = time.time() + 10
                while self._state(rec) == RUNNING and time.time() < kill_deadline:
                    time.sleep(0.1)
            rec["ended"] = time.time()
            self._write_record(rec)
            server = self._metadata.pop(rec["id"], None)
            if server:
                server.close()

    def find_tagged(self, run_id: str | None = None, regions: list[str] | None = None) -> list[Instance]:
        out = []
        for rec in self._records():
            if rec.get("ended") or self._state(rec) != RUNNING:
                continue
            if run_id is None or rec["tags"].get("sdcloud:run") == run_id:
                out.append(self._instance(rec))
        return out

    def price_history(self, instance_type: str, zone: str, start: datetime, end: datetime) -> list[tuple[datetime, float]]:
        return [(start, self.price_per_hour), (end, self.price_per_hour)]

    def host_dir(self, instance_id: str) -> str | None:
        rec = next((r for r in self._records() if r["id"] == instance_id), None)
        return rec["host_dir"] if rec else None

    def close(self) -> None:
        for t in self._timers:
            t.cancel()
        for server in self._metadata.values():
            server.close()
        self._metadata.clear()


def _memory_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return 0.0


PROVIDER_CLASS = LocalProvider
