"""`sdcloud dashboard` as a user starts it: its own process, on a free loopback port."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

from tests.support.server_seaweed import free_port
from tests.views.conftest import trained_run  # noqa: F401 - the fixture, shared with the run page's tests

START_LIMIT_S = 30.0  # the test's own patience; the 2 s promise is measured and asserted apart


def get(url: str, headers: dict | None = None, timeout: float = 30) -> tuple[int, dict, str]:
    """(status, headers, body); redirects are not followed, so a 303 is seen as one."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


@contextmanager
def dashboard(*args: str, port: int | None = None):
    """Start `sdcloud dashboard`, wait until it answers; yields (base URL, seconds it took to answer)."""
    port = port or free_port()
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "sdcloud.cli", "dashboard", "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    host = next((args[i + 1] for i, a in enumerate(args) if a == "--host"), "127.0.0.1")
    base = f"http://{'127.0.0.1' if host in ('0.0.0.0', '127.0.0.1') else host}:{port}"
    try:
        while True:
            try:
                get(base + "/api/jobs", timeout=2)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"the dashboard exited: {proc.stderr.read()[-2000:]}") from None
                if time.monotonic() - started > START_LIMIT_S:
                    raise
                time.sleep(0.05)
        yield base, time.monotonic() - started
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
