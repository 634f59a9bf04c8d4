"""A mainland-China-like network for the bare-root boot: outside names are refused, the mirrors are
local fixtures.

- `RefusingProxy`: the host's HTTP(S)_PROXY. Every request through it (a CONNECT for https, an
  absolute URL for http) is recorded by host name and answered 403: the hub, GitHub, the torch
  download site and the package index are unreachable, as from a mainland host without mirrors.
  NO_PROXY names loopback only, where the bucket, the metadata fake and the mirrors listen.
- `StaticIndex`: a PEP 503 package index served over plain http from a folder
  (`simple/<name>/index.html` with links to `../../files/`), standing in for Tencent's
  VPC-internal PyPI mirror (http://mirrors.tencentyun.com/pypi/simple).
- `lock_index`: the folder such a mirror serves for a first boot: exactly the packages the host's
  environment installs (the pinned torch, the lock, and what they require that the lock leaves
  unpinned), made from this machine's own: torch's wheel from pip's find-links, every other one
  repacked from this checkout's environment (a few seconds; no network).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from functools import partial
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from tests.support.server_http import LoopbackServer

# Names a mainland host must not need: the hub, GitHub, torch's wheel site, the package index.
OUTSIDE = ("huggingface.co", "github.com", "download.pytorch.org", "pypi.org")


class RefusingProxy(LoopbackServer):
    def __init__(self) -> None:
        self.hosts: list[str] = []
        lock = threading.Lock()
        seen = self.hosts

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _refuse(self):
                target = self.path if self.command == "CONNECT" else (urlsplit(self.path).netloc or self.path)
                with lock:
                    seen.append(target.rsplit(":", 1)[0] if ":" in target else target)
                body = b"refused: outside the mainland network\n"
                self.send_response(403)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)

            do_CONNECT = do_GET = do_HEAD = do_POST = do_PUT = _refuse

        self.bind(Handler)
        self.url = self.address()
        self.start()

    def env(self) -> dict[str, str]:
        """What a host in this network has in its environment."""
        out = {k: self.url for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
        out.update({k: "127.0.0.1,localhost" for k in ("NO_PROXY", "no_proxy")})
        return out

    close = LoopbackServer.stop


class StaticIndex(LoopbackServer):
    def __init__(self, folder: str | Path) -> None:
        self.requests: list[str] = []
        seen = self.requests

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                seen.append(self.path)
                super().do_GET()

        self.bind(partial(Handler, directory=str(folder)))
        self.url = self.address() + "/simple"
        self.start()

    close = LoopbackServer.stop


def tiny_hub_repo(folder: Path) -> dict[str, bytes]:
    """The files of a saved tiny pipeline, as a hub repository holds them."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def outside_reachable(env: dict[str, str], python: str) -> dict[str, str]:
    """{name: what happened} for an https GET of each OUTSIDE name from a process with `env`."""
    code = ("import sys, urllib.request\n"
            "try:\n    urllib.request.urlopen('https://' + sys.argv[1] + '/', timeout=10); print('reached')\n"
            "except Exception as exc:\n    print(type(exc).__name__, str(exc)[:80])\n")
    out = {}
    for name in OUTSIDE:
        p = subprocess.run([python, "-c", code, name], env={**os.environ, **env}, capture_output=True, text=True,
                           timeout=60)
        out[name] = p.stdout.strip() or p.stderr.strip()[-200:]
    return out


def _lock_requirements(build: str = "cpu") -> list[tuple[str, str]]:
    """(name, version) of every package the host's environment installs: the pinned torch and the lock."""
    from sdcloud_agent import boot

    out = [tuple(boot.TORCH_PIN.split("=="))]
    for line in boot.lock_text(build).splitlines():
        line = line.split("#", 1)[0].strip()
        if line and "==" in line:
            out.append(tuple(line.split("==", 1)))
    return out


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _repack(dist, dest: Path) -> Path:
    """One installed distribution as a wheel again, from its RECORD (scripts and byte code left out:
    pip makes them at install)."""
    import base64
    import hashlib
    import zipfile

    info = next(f for f in dist.files if f.name == "WHEEL" and f.parent.name.endswith(".dist-info"))
    tags = [line.split(":", 1)[1].strip().split("-") for line in info.read_text().splitlines() if line.startswith("Tag:")]
    tag = "-".join(".".join(dict.fromkeys(t[i] for t in tags)) for i in range(3))  # py2.py3-none-any
    record_path = info.parent / "RECORD"
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    whl = dest / f"{name}-{dist.version}-{tag}.whl"
    rows = []
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_STORED) as z:
        for f in dist.files:
            p = str(f)
            if p.startswith("..") or p.endswith(".pyc") or f == record_path:
                continue
            data = dist.locate_file(f).read_bytes()
            z.writestr(p, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{p},sha256={digest},{len(data)}")
        rows.append(f"{record_path},,")
        z.writestr(str(record_path), "\n".join(rows) + "\n")
    return whl


# The lock's own wheels, for when this checkout's environment has drifted from the lock (a newer
# release on PyPI since): the suite fetches the ones it lacks itself, once, into this cache
# (`fetch_lock_wheels`, through the session fixture `lock_wheels`); SDCLOUD_LOCK_WHEELS moves it.
LOCK_WHEELS = Path(os.environ.get("SDCLOUD_LOCK_WHEELS") or Path.home() / ".cache/sdcloud-tests/lock-wheels")


def _lock_pins(build: str = "cpu") -> list[tuple[str, str]]:
    """(name, version) of the lock's own lines (torch, pinned apart, comes from pip's find-links or
    this environment)."""
    from sdcloud_agent import boot

    out = []
    for line in boot.lock_text(build).splitlines():
        line = line.split("#", 1)[0].strip()
        if line and "==" in line:
            name, version = line.split("==", 1)
            out.append((name.strip(), version.strip()))
    return out


def _wheel_of(folder: Path, name: str, version: str) -> Path | None:
    for whl in folder.glob("*.whl") if folder.is_dir() else ():
        parts = whl.name.split("-")
        if _normal(parts[0]) == _normal(name) and parts[1].split("+")[0] == version.split("+")[0]:
            return whl
    return None


def _installed_as_pinned(name: str, version: str) -> bool:
    from importlib import metadata

    try:
        return metadata.distribution(name).version.split("+")[0] == version.split("+")[0]
    except metadata.PackageNotFoundError:
        return False


def _find_links() -> list[Path]:
    return [Path(p) for p in os.environ.get("PIP_FIND_LINKS", "").split() if p]


def missing_lock_wheels(folder: Path, build: str = "cpu") -> list[str]:
    """The lock's pins that `lock_index` could not serve: no wheel in `folder` or pip's find-links,
    and not installed here at the pinned version (which it repacks)."""
    return [f"{n}=={v}" for n, v in _lock_pins(build)
            if all(_wheel_of(d, n, v) is None for d in [folder, *_find_links()]) and not _installed_as_pinned(n, v)]


def pip_download(pins: list[str], folder: Path) -> None:
    """The registry's wheels for `pins`, without their dependencies (the lock pins those too)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                    "-d", str(folder), *pins], check=True, timeout=1800)


def fetch_lock_wheels(folder: Path = LOCK_WHEELS, build: str = "cpu",
                      download: Callable[[list[str], Path], None] = pip_download) -> Path:
    """Fills `folder` with the lock's wheels this machine lacks, once for all the suite's workers:
    under an exclusive file lock the first worker downloads what is missing, and the next finds
    nothing missing and downloads nothing. A machine whose environment is the lock's downloads
    nothing at all. A failed download is left for `lock_index` to name."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".fetching", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        missing = missing_lock_wheels(folder, build)
        if missing:
            try:
                download(missing, folder)
            except (subprocess.SubprocessError, OSError) as exc:
                print(f"could not fetch the lock's wheels into {folder}: {exc}", file=sys.stderr)
    return folder


def lock_index(folder: Path, build: str = "cpu") -> Path:
    """A PEP 503 index of exactly the host environment's packages (the pinned torch and the lock),
    made from this machine's own: the lock's wheels where LOCK_WHEELS or pip's find-links hold them,
    else the distribution of this checkout's environment repacked as a wheel. No network: a package
    found in neither in the lock's version is named and refused."""
    from importlib import metadata

    files = folder / "files"
    files.mkdir(parents=True, exist_ok=True)
    links = [LOCK_WHEELS, *_find_links()]
    wheels = [w for d in links if d.is_dir() for w in d.glob("*.whl")]
    wrong = []
    for name, version in _lock_requirements(build):
        on_disk = [w for w in wheels if _normal(w.name.split("-")[0]) == _normal(name)
                   and w.name.split("-")[1].split("+")[0] == version]
        if on_disk:
            whl = files / on_disk[0].name
            if not whl.exists():
                whl.symlink_to(on_disk[0])
        else:
            try:
                dist = metadata.distribution(name)
            except metadata.PackageNotFoundError:
                wrong.append(f"{name}=={version} (not installed)")
                continue
            if dist.version.split("+")[0] != version.split("+")[0]:
                wrong.append(f"{name}=={version} (this environment has {dist.version})")
                continue
            whl = _repack(dist, files)
        page = folder / "simple" / _normal(name)
        page.mkdir(parents=True, exist_ok=True)
        (page / "index.html").write_text(f'<!DOCTYPE html>\n<a href="../../files/{whl.name}">{whl.name}</a>\n')
    if wrong:
        raise RuntimeError("the host's lock is neither in " + str(LOCK_WHEELS) + " nor installed here as pinned: "
                           + ", ".join(wrong) + " (the `lock_wheels` fixture fetches them: could it reach the index?)")
    # What the pinned packages require and the lock leaves unpinned (torch's setuptools): pip takes
    # it from the mirror as well, so the index holds this environment's.
    for extra in unpinned_requirements(build):
        whl = _repack(metadata.distribution(extra), files)
        page = folder / "simple" / _normal(extra)
        page.mkdir(parents=True, exist_ok=True)
        (page / "index.html").write_text(f'<!DOCTYPE html>\n<a href="../../files/{whl.name}">{whl.name}</a>\n')
    return folder


def unpinned_requirements(build: str = "cpu") -> list[str]:
    """Names the lock's packages require on this machine's platform that the lock does not pin."""
    from importlib import metadata

    from packaging.requirements import Requirement

    pinned = {_normal(n) for n, _ in _lock_requirements(build)}
    todo, out = sorted(pinned), []
    while todo:
        for text in metadata.distribution(todo.pop()).requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            name = _normal(req.name)
            if name not in pinned:
                pinned.add(name)
                out.append(name)
                todo.append(name)
    return sorted(out)
