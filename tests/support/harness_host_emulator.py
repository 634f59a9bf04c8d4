"""Plays the hardware behind a fake cloud: for every instance the cloud reports running, it starts
the real host agent on this machine with the config the controller put in the instance's user-data;
when the cloud reports the instance gone (a reclaim, a terminate), it takes the host away (SIGKILL)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

# (instance id, running?, user-data as sent to the cloud API)
Listing = Callable[[], Iterable[tuple[str, bool, str]]]


def agent_config_from_user_data(user_data: str) -> dict:
    text = user_data
    try:
        text = base64.b64decode(user_data).decode()
    except (ValueError, UnicodeDecodeError):
        pass
    start = text.index("<<'SDCLOUD_CONFIG'\n") + len("<<'SDCLOUD_CONFIG'\n")
    end = text.index("\nSDCLOUD_CONFIG", start)
    return json.loads(text[start:end])


class HostEmulator:
    def __init__(self, listing: Listing, workdir: Path, env: dict[str, str]):
        self.listing = listing
        self.workdir = workdir
        self.env = env
        self.procs: dict[str, subprocess.Popen] = {}
        self.configs: dict[str, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "HostEmulator":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # the cloud fake may be mid-request; try again next tick
                print(f"host emulator: {exc}", file=sys.stderr)
            time.sleep(0.3)

    def step(self) -> None:
        seen = set()
        for instance_id, running, user_data in self.listing():
            seen.add(instance_id)
            if running and instance_id not in self.procs:
                self._boot(instance_id, user_data)
            elif not running and instance_id in self.procs:
                self._kill(instance_id)
        for instance_id in list(self.procs):
            if instance_id not in seen:
                self._kill(instance_id)

    def _boot(self, instance_id: str, user_data: str) -> None:
        cfg = agent_config_from_user_data(user_data)
        host = self.workdir / instance_id
        host.mkdir(parents=True, exist_ok=True)
        # This machine has no GPU and no spare NVMe: the agent's checks for those are tested elsewhere.
        cfg.update({"require_gpu": False, "nvme": False, "workdir": str(host / "work"), "metadata": {"kind": "none"}})
        (host / "agent.json").write_text(json.dumps(cfg))
        self.configs[instance_id] = cfg
        log = open(host / "agent.log", "ab")
        self.procs[instance_id] = subprocess.Popen(
            [sys.executable, "-m", "sdcloud_agent", "run", "--config", str(host / "agent.json")],
            env={**os.environ, **self.env, "HF_HUB_OFFLINE": "1"}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def _kill(self, instance_id: str) -> None:
        proc = self.procs.pop(instance_id)
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(30)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for instance_id in list(self.procs):
            self._kill(instance_id)

    def alive(self) -> list[str]:
        return [i for i, p in self.procs.items() if p.poll() is None]
