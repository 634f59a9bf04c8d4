"""A mainland-China-like network for the bare-root boot: outside names are refused, the mirrors are
local fixtures.

- `RefusingProxy`: the host's HTTP(S)_PROXY. Every request through it (a CONNECT for https, an
  absolute URL for http) is recorded by host name and answered 403: the hub, GitHub, the torch
  download site and the package index are unreachable, as from a mainland host without mirrors.
  NO_PROXY names loopback only, where the bucket, the metadata fake and the mirrors listen.
- `StaticIndex`: a PEP 503 package index served over plain http from a folder (this machine's
  /opt/pypi: `simple/<name>/index.html` with links to `../../files/`), standing in for Tencent's
  VPC-internal PyPI mirror (http://mirrors.tencentyun.com/pypi/simple).
- `seed_env`: the environment cache (`cache/env/<key>`) a first boot in that bucket would have
  left: a venv of the image's python whose `.pth` layers this checkout's virtualenv (torch, the
  lock's packages) after its own site-packages. The boot then restores it from the bucket and
  installs only the agent wheel into it, with no index at all.
"""

from __future__ import annotations

import os
import subprocess
import sysconfig
import tempfile
import threading
from functools import partial
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

# Names a mainland host must not need: the hub, GitHub, torch's wheel site, the package index.
OUTSIDE = ("huggingface.co", "github.com", "download.pytorch.org", "pypi.org")


class RefusingProxy:
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

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def env(self) -> dict[str, str]:
        """What a host in this network has in its environment."""
        out = {k: self.url for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
        out.update({k: "127.0.0.1,localhost" for k in ("NO_PROXY", "no_proxy")})
        return out

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class StaticIndex:
    def __init__(self, folder: str | Path) -> None:
        self.requests: list[str] = []
        seen = self.requests

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                seen.append(self.path)
                super().do_GET()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(folder)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/simple"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def seed_env(store, system_python: str = "/usr/bin/python3") -> str:
    """Put the environment cache a first boot would have left into the bucket; its key."""
    from sdcloud_agent import boot, gpu

    key, compressor = boot.env_key(gpu.host_torch_build())
    with tempfile.TemporaryDirectory() as tmp:
        env = Path(tmp) / "env"
        subprocess.run([system_python, "-m", "venv", str(env)], check=True)
        site = subprocess.run([str(env / "bin" / "python"), "-c",
                               "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        (Path(site) / "sdcloud-test-layers.pth").write_text("\n".join(ours) + "\n")
        packed = Path(tmp) / Path(key).name
        subprocess.run(["tar", "-C", tmp, "-I", compressor, "-cf", str(packed), "env"], check=True)
        store.put_file(key, packed)
    return key


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
