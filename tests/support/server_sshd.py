"""A real OpenSSH server on 127.0.0.1 for the SSH provider's tests, run as the current user.

Host and user keys are generated with ssh-keygen into a temporary folder; the server accepts
only that user key (no passwords, no PAM) and logs to its own stderr file.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


from tests.support.server_seaweed import free_port  # noqa: E402  (below the kernel's ephemeral ports, one slice per xdist worker)


class Sshd:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sdcloud-sshd-"))
        self.port = free_port()
        self.user = getpass.getuser()
        self.host_key = self.dir / "host_ed25519"
        self.user_key = self.dir / "user_ed25519"
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def missing() -> str | None:
        """Why no server can be started here, or None."""
        if not os.path.exists(SSHD):
            return f"{SSHD} is missing: install openssh-server (.ci/run does)"
        if not shutil.which("ssh-keygen"):
            return "ssh-keygen is missing: install openssh-client"
        return None

    def start(self) -> "Sshd":
        for key in (self.host_key, self.user_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sdcloud-test", "-f", str(key)],
                           check=True, capture_output=True)
        (self.dir / "authorized_keys").write_text(Path(f"{self.user_key}.pub").read_text())
        os.chmod(self.dir / "authorized_keys", 0o600)
        for attempt in range(3):
            try:
                return self._serve()
            except RuntimeError as e:
                # The port was taken between choosing and binding it: try another one.
                if attempt == 2 or "Address already in use" not in str(e):
                    raise
                self.log.close()
                self.port = free_port()
        raise AssertionError("unreachable")

    def _serve(self) -> "Sshd":
        cfg = self.dir / "sshd_config"
        cfg.write_text("\n".join([
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {self.host_key}",
            f"AuthorizedKeysFile {self.dir}/authorized_keys",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",
            f"PidFile {self.dir}/sshd.pid",
            "Subsystem sftp internal-sftp",
            "LogLevel VERBOSE",
        ]) + "\n")
        if os.geteuid() == 0:
            # sshd run as root insists on its privilege separation folder (systemd makes it normally).
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.log = open(self.dir / "sshd.log", "wb")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.time() + 15
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self.proc.returncode}: {self.log_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"sshd did not answer on port {self.port}: {self.log_text()[-2000:]}")

    def log_text(self) -> str:
        try:
            return (self.dir / "sshd.log").read_text(errors="replace")
        except OSError:
            return ""

    def host_entry(self, name: str = "box", workdir: str | Path | None = None, **extra) -> dict:
        """One [[hosts]] table for this server."""
        entry = {"name": name, "host": "127.0.0.1", "port": self.port, "user": self.user, "key": str(self.user_key),
                 "gpu": "RTX 4090", "gpu_count": 1, "vram_gb": 24, "price_per_hour": 0.0}
        if workdir is not None:
            entry["workdir"] = str(workdir)
        entry.update(extra)
        return entry

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def write_hosts(path: Path, hosts: list[dict]) -> Path:
    """Write an ssh-hosts.toml (strings quoted, numbers bare)."""
    lines = []
    for h in hosts:
        lines.append("[[hosts]]")
        for k, v in h.items():
            lines.append(f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"')
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path
