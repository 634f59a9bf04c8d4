"""Headless Chromium (Debian's), driven over the DevTools protocol: open a page, run a script in it,
take a screenshot. The browser the run page and the dashboard are tested in, as a user opens them.

    with Chromium(tmp_path) as b:
        b.open(url)
        assert b.eval("document.images.length") > 0
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
START_S = 30.0  # the browser's DevTools port must appear within this
LOAD_S = 60.0  # a page's load event within this


class Chromium:
    def __init__(self, tmp_path: Path, width: int = 1280, height: int = 1800):
        if CHROMIUM is None:
            pytest.skip("chromium is not installed (apt-get install -y chromium)")
        self.profile = tmp_path / "chromium-profile"
        self.width, self.height = width, height
        self.proc: subprocess.Popen | None = None
        self.ws = None
        self._id = 0

    def __enter__(self) -> "Chromium":
        import websocket

        self.profile.mkdir(parents=True, exist_ok=True)
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--remote-debugging-port=0", "--remote-allow-origins=*", f"--window-size={self.width},{self.height}",
                 f"--user-data-dir={self.profile}", "about:blank"]
        self.proc = subprocess.Popen([CHROMIUM, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_S
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            targets = json.load(resp)
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=LOAD_S, suppress_origin=True)
        self.call("Page.enable")
        self.call("Runtime.enable")
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.ws is not None:
                self.ws.close()
        finally:
            if self.proc is not None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)

    def call(self, method: str, params: dict | None = None, until: str | None = None) -> dict:
        """Send one command and return its result; with `until`, also wait for that event after it."""
        self._id += 1
        me = self._id
        self.ws.send(json.dumps({"id": me, "method": method, "params": params or {}}))
        result: dict | None = None
        deadline = time.monotonic() + LOAD_S
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == me:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result = msg.get("result", {})
                if until is None:
                    return result
            elif until is not None and msg.get("method") == until and result is not None:
                return result
        raise TimeoutError(f"{method}: no answer{' and no ' + until if until else ''} within {LOAD_S} s")

    def open(self, url: str) -> None:
        self.call("Page.navigate", {"url": url}, until="Page.loadEventFired")

    def eval(self, expression: str):
        got = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in got:
            raise RuntimeError(f"{expression}: {got['exceptionDetails']}")
        return got["result"].get("value")

    def wait_for(self, expression: str, timeout: float, every: float = 0.25):
        """Poll `expression` in the page until it is truthy (its value), or fail after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression} stayed falsy for {timeout} s")
            time.sleep(every)

    def screenshot(self, path: Path) -> Path:
        """The whole page (up to 4000 px tall), at the browser's width."""
        # Measured in a short window: the page's own height, not the window's or the last shot's.
        self.call("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": 400, "deviceScaleFactor": 1,
                                                         "mobile": False})
        height = int(self.eval("Math.max(document.documentElement.scrollHeight, 400)"))
        self.call("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": min(height, 4000),
                                                         "deviceScaleFactor": 1, "mobile": False})
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        path.write_bytes(base64.b64decode(data))
        return path


def not_blank(png: Path) -> None:
    """Many distinct colours, and far from all white: text, images and charts were drawn."""
    import matplotlib.image

    pixels = matplotlib.image.imread(str(png))
    flat = (pixels[..., :3] * 255).astype(int).reshape(-1, 3)
    colours = {tuple(c) for c in flat[:: max(1, len(flat) // 200000)]}
    assert len(colours) > 50, len(colours)
    assert (flat.sum(axis=1) < 600).mean() > 0.01
