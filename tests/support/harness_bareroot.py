"""The bare-root boot harness: runs the rendered user-data itself on a prefixed tree.

A host here is a folder (SDCLOUD_ROOT) with nothing of the project in it: the script runs with
/bin/bash under an environment holding only the system's PATH (/usr/bin/python3, no project venv,
no PYTHONPATH), the metadata fake's address (IMDSv2 role credentials, the reclaim notice) and the
CA bundle that makes the SeaweedFS certificate trusted, as a cloud host trusts its cloud's. The
`systemctl` on its PATH is a shim that starts the unit's ExecStart in the background.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SYSTEMCTL = r"""#!/bin/bash
# systemctl for the bare-root boot: `enable --now UNIT` runs the unit's ExecStart with its Environment=.
set -eu
[ "$1" = daemon-reload ] && exit 0
if [ "$1" = enable ] && [ "$2" = --now ]; then
  unit="$SDCLOUD_ROOT/etc/systemd/system/$3"
  exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
  environment=$(sed -n 's/^Environment=//p' "$unit")
  mkdir -p "$SDCLOUD_ROOT/run"
  env $environment setsid $exec_start >> "$SDCLOUD_ROOT/var/log/sdcloud-agent.log" 2>&1 < /dev/null &
  echo $! > "$SDCLOUD_ROOT/run/${3%.service}.pid"
  exit 0
fi
echo "systemctl shim: unsupported: $*" >&2
exit 1
"""


@dataclass
class Boot:
    root: Path
    rc: int
    seconds: float
    log: str
    agent_pid: int | None

    def agent_rc(self, timeout: float) -> int | None:
        """Wait for the agent to exit; its exit status is not ours to read, so poll /proc."""
        if self.agent_pid is None:
            return None
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not Path(f"/proc/{self.agent_pid}").exists():
                return 0
            try:
                if Path(f"/proc/{self.agent_pid}/stat").read_text().split()[2] == "Z":
                    return 0
            except OSError:
                return 0
            time.sleep(0.5)
        return None

    def kill(self) -> None:
        if self.agent_pid is not None:
            try:
                os.killpg(self.agent_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def agent_log(self) -> str:
        p = self.root / "var/log/sdcloud-agent.log"
        return p.read_text(errors="replace") if p.exists() else ""


def system_env(root: Path, shim: Path, ca_file: Path, metadata_url: str) -> dict[str, str]:
    env = {"PATH": f"{shim}:/usr/sbin:/usr/bin:/sbin:/bin", "SDCLOUD_ROOT": str(root), "HOME": str(root / "root"),
           "LANG": "C.UTF-8", "AWS_CA_BUNDLE": str(ca_file), "AWS_EC2_METADATA_SERVICE_ENDPOINT": metadata_url,
           "HF_HUB_OFFLINE": "1"}
    # The package mirror this machine is configured with (a host has its cloud's): where pip looks.
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
    # The clock the suite runs on, when docs/testing.md's run at another hour moved it: a host's
    # clock is its cloud's, the same as the control plane's.
    env.update({k: v for k, v in os.environ.items() if k.startswith("FAKETIME") or k == "LD_PRELOAD"})
    return env


# An image whose python3 is too old for the lock (Ubuntu 22.04's 3.10) and has no python3.11 yet:
# both answer the user-data's version check with "too old" and run nothing else. Its apt-get
# "installs" python3.11 by pointing the name at the real interpreter, and logs what it was asked.
OLD_PYTHON = r"""#!/bin/bash
for a in "$@"; do case "$a" in *version_info*) exit 1;; esac; done
echo "python shim: this image's python is 3.10" >&2; exit 1
"""
APT_GET = r"""#!/bin/bash
echo "apt-get $*" >> "$SDCLOUD_ROOT/var/log/apt-shim.log"
# The dpkg lock as apt takes it: without -o DPkg::Lock::Timeout=N a held lock fails at once
# (exit 100, "Could not get lock"), with it apt waits up to N seconds.
lock="$SDCLOUD_ROOT/var/lib/dpkg/lock-frontend"; mkdir -p "${lock%/*}"
wait=""; cmd=""
for a in "$@"; do
  case "$a" in DPkg::Lock::Timeout=*) wait="${a#*=}";; update|install) [ -z "$cmd" ] && cmd=$a;; esac
done
t0=$(date +%s.%N)
if [ -n "$wait" ]; then flock -w "$wait" "$lock" true; else flock -n "$lock" true; fi || {
  echo "E: Could not get lock $lock. It is held by process 1234 (unattended-upgr)" >&2; exit 100; }
waited=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "apt-get $cmd: lock after ${waited}s" >> "$SDCLOUD_ROOT/var/log/apt-shim.log"
if [ "$cmd" = install ]; then
  for p in "$@"; do
    if [ "$p" = python3.11 ]; then printf '#!/bin/bash\nexec %s "$@"\n' "$REAL_PYTHON" > "$(dirname "$0")/python3.11"; fi
  done
fi
exit 0
"""


def hold_dpkg_lock(root: Path, seconds: float) -> subprocess.Popen:
    """Hold the image's dpkg lock for `seconds`, as unattended-upgrades does in a new instance's
    first minutes; returns once the lock is held."""
    lock = root / "var/lib/dpkg/lock-frontend"
    lock.parent.mkdir(parents=True, exist_ok=True)
    held = root / "var/lib/dpkg/held"
    proc = subprocess.Popen(["flock", str(lock), "sh", "-c", f'touch "{held}"; sleep {seconds}'])
    deadline = time.monotonic() + 10
    while not held.exists():
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("could not take the dpkg lock")
        time.sleep(0.02)
    return proc


def old_python_image(real_python: str) -> dict[str, str]:
    """Shims for `boot(..., shims=)`: python3 and python3.11 too old, apt-get that installs 3.11."""
    return {"python3": OLD_PYTHON, "python3.11": OLD_PYTHON, "python3.12": OLD_PYTHON, "python3.13": OLD_PYTHON,
            "apt-get": APT_GET.replace("$REAL_PYTHON", real_python)}


def boot(root: Path, user_data: str, ca_file: Path, metadata_url: str, timeout: float = 900,
         shims: dict[str, str] | None = None, env: dict[str, str | None] | None = None) -> Boot:
    """Run the user-data on `root`; `env` adds to (or, as None values, removes from) the host's
    environment: a network in which only some names are reached (tests/support/fake_mainland.py)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "root").mkdir(exist_ok=True)
    shim = root.parent / f"{root.name}-shim"
    shim.mkdir(exist_ok=True)
    for name, text in {"systemctl": SYSTEMCTL, **(shims or {})}.items():
        (shim / name).write_text(text)
        (shim / name).chmod(0o755)
    script = root / "var/lib/cloud/instance/user-data.txt"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(user_data)
    t0 = time.time()
    host_env = system_env(root, shim, ca_file, metadata_url)
    for k, v in (env or {}).items():
        if v is None:
            host_env.pop(k, None)
        else:
            host_env[k] = v
    proc = subprocess.run(["/bin/bash", str(script)], env=host_env,
                          capture_output=True, text=True, timeout=timeout, cwd=root)
    pid_file = root / "run/sdcloud-agent.pid"
    pid = int(pid_file.read_text()) if pid_file.exists() else None
    return Boot(root, proc.returncode, time.time() - t0, proc.stdout + proc.stderr, pid)


def phases(store, run_id: str, attempt: int) -> dict[str, dict]:
    doc = json.loads(store.get(f"runs/{run_id}/boot/attempt-{attempt}.json"))
    return {p["name"]: p for p in doc["phases"]}


def time_to_first_step(ph: dict[str, dict]) -> float:
    """Seconds from the start of the user-data ("instance running") to the first training step."""
    start = min(p["at"] - p["seconds"] for p in ph.values() if p["name"] != "first-step")
    return ph["first-step"]["at"] - start
