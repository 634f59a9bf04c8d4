"""The cloud driver's function package: the control plane's own wheel, unpacked with the few
distributions its handler needs, in the zip layout Lambda and SCF load code from.

The function runs `sdcloud.runs.unattended` (issue 27): the same Controller step as the laptop, not
a second implementation. So the package is built from the control plane this process runs (an
editable checkout or an installed wheel alike), deterministically like the agent's wheel
(bootstrap/sdcloud_agent/wheel.py): sorted files, fixed timestamps, a version `<base>+<sha12>` that
follows the content only, so an unchanged control plane redeploys nothing.

What goes in, and why only that (measured: `python -X importtime` of a step on each provider, and
the static import walk in tests/test_function_package.py):
- `sdcloud` and `sdcloud_agent` (the store, the agent's wheel a relaunch uploads), as the wheel
  `sdcloud-<version>-py3-none-any.whl` would install them, with its dist-info;
- DEPENDENCIES and what they require (their Requires-Dist without extras): boto3 for the bucket and
  EC2, tenacity for the providers' retries, the Tencent Cloud SDK's common and CVM packages for
  the Tencent provider, PyYAML for run specs. The handler's import closure reaches nothing else:
  torch, diffusers, numpy, matplotlib, paramiko, rich and click are imported lazily, by the
  trainers, reports, SSH provider and CLI, none of which a step calls. awscrt is left out too:
  without it the transfer module falls back to s3transfer, and a step transfers no checkpoints.
- a top-level `sdcloud_driver.py` with both entry points, and SCF's Custom Runtime files: the
  `scf_bootstrap` that SCF executes and the runtime loop it starts (SCF's Python runtimes stop at
  3.10; the control plane needs 3.11).

The distributions are copied from this interpreter's site-packages (as a Lambda zip is made with
`pip install -t`), so the package is built for the Python that builds it: `sdcloud infra up` must
run on CPython 3.11 (Lambda's python3.11 runtime) on x86_64 Linux when a dependency carries a
compiled module. Of those chosen, only PyYAML and charset-normalizer carry one, and both fall back
to pure Python when it does not load.

Size limits it is checked against:
- Lambda: 50 MB zipped for a direct upload, 250 MB unzipped including layers
  (https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html; the same figures are
  the defaults of AccountLimit.CodeSizeZipped/CodeSizeUnzipped,
  https://docs.aws.amazon.com/lambda/latest/api/API_AccountLimit.html);
- SCF: 500 MB of code before compression per function version, layers included
  (https://www.tencentcloud.com/document/product/583/11637, "Quota Limits", updated 2025-03-28).
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

NAME = "sdcloud"
BASE_VERSION = "0.1.0"
REQUIRES_PYTHON = ">=3.11"
# The handler's third-party imports on a step (see the module docstring); their own requirements follow.
DEPENDENCIES = ("boto3>=1.36", "tenacity>=8.2", "tencentcloud-sdk-python-common>=3.0.1000",
                "tencentcloud-sdk-python-cvm>=3.0.1000", "pyyaml>=6")
# The entry points each platform calls.
LAMBDA_HANDLER = "sdcloud.runs.unattended.handler"
SCF_HANDLER = "sdcloud_driver.main_handler"
SHIM = "sdcloud_driver.py"
LAMBDA_ZIPPED_MAX = 50 * 1024 * 1024
LAMBDA_UNZIPPED_MAX = 250 * 1024 * 1024
SCF_UNZIPPED_MAX = 500 * 1024 * 1024
_EPOCH = (1980, 1, 1, 0, 0, 0)
_SKIP_SUFFIXES = (".pyc", ".pyo")
# Package data the function never reads: the Pulumi programs (the function deploys nothing).
_SKIP_PARTS = ("__pycache__",)
_SKIP_PREFIXES = ("sdcloud/infra/stacks/",)

_SHIM_TEXT = '''"""SCF loads `<file>.<function>` from the package root; Lambda may use either name."""
from sdcloud.runs.unattended import handler, main_handler  # noqa: F401
'''

# SCF's Python runtimes stop at 3.10 and the control plane needs 3.11 (tomllib and more), so on
# SCF the function is a Custom Runtime: SCF runs the package's bootstrap file, which starts a
# Python 3.11+ from the image (or SDCLOUD_PYTHON) on SCF_RUNTIME_LOOP. The loop speaks SCF's
# runtime API (https://cloud.tencent.com/document/product/583/47274): POST /runtime/init/ready
# once, then GET /runtime/invocation/next for each event and POST its result to
# /runtime/invocation/response (or /runtime/invocation/error).
SCF_RUNTIME_LOOP = "sdcloud_scf_runtime.py"
SCF_BOOTSTRAPS = ("scf_bootstrap", "bootstrap")  # the current name, and the one older docs give
_SCF_RUNTIME_TEXT = '''"""SCF Custom Runtime loop for the sdcloud cloud driver (started by scf_bootstrap)."""
import json
import os
import sys
import urllib.request


def _url(path):
    return "http://%s:%s%s" % (os.environ["SCF_RUNTIME_API"], os.environ["SCF_RUNTIME_API_PORT"], path)


def _post(path, body):
    urllib.request.urlopen(urllib.request.Request(_url(path), data=body, method="POST"), timeout=30).read()


def role_credentials(env=os.environ):
    """SCF gives the function role's temporary keys as TENCENTCLOUD_SECRETID, _SECRETKEY and
    _SESSIONTOKEN (https://cloud.tencent.com/document/product/583/32748); the Tencent provider reads
    TENCENTCLOUD_SECRET_ID and the others, the store's S3 client reads AWS_*. Set both from them."""
    sid, skey, token = (env.get(k, "") for k in ("TENCENTCLOUD_SECRETID", "TENCENTCLOUD_SECRETKEY",
                                                  "TENCENTCLOUD_SESSIONTOKEN"))
    if not (sid and skey):
        return
    env.update({"TENCENTCLOUD_SECRET_ID": sid, "TENCENTCLOUD_SECRET_KEY": skey,
                "AWS_ACCESS_KEY_ID": sid, "AWS_SECRET_ACCESS_KEY": skey})
    if token:
        env.update({"TENCENTCLOUD_SESSION_TOKEN": token, "AWS_SESSION_TOKEN": token})


def main():
    from sdcloud.runs.unattended import main_handler

    # The stack sets the function's own timeout here: the handler stops taking steps before it.
    limit_ms = int(os.environ.get("SDCLOUD_TIME_LIMIT_MS") or 60000)
    _post("/runtime/init/ready", b" ")
    while True:
        try:
            with urllib.request.urlopen(_url("/runtime/invocation/next"), timeout=None) as resp:
                raw = resp.read()
        except OSError as exc:  # the runtime API went away: the instance is being recycled
            print("sdcloud driver: runtime API closed: %s" % exc, file=sys.stderr)
            return 0
        try:
            role_credentials()  # per invocation: SCF may renew the role's keys between them
            event = json.loads(raw or b"{}")
            result = main_handler(event, {"time_limit_in_ms": limit_ms})
            _post("/runtime/invocation/response", json.dumps(result).encode())
        except Exception as exc:  # noqa: BLE001 - reported to SCF as the invocation's error
            _post("/runtime/invocation/error", json.dumps({"error": "%s: %s" % (type(exc).__name__, exc)}).encode())


if __name__ == "__main__":
    sys.exit(main())
'''
_SCF_BOOTSTRAP_TEXT = f'''#!/bin/bash
# sdcloud cloud driver on SCF (Custom Runtime): start the runtime loop on a Python 3.11 or newer.
cd "$(dirname "$0")"
for py in "${{SDCLOUD_PYTHON:-}}" /var/lang/python3*/bin/python3 python3.13 python3.12 python3.11 python3; do
  [ -n "$py" ] && command -v "$py" >/dev/null 2>&1 || continue
  if "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    # -S: only what the package carries (its dependencies are beside this file).
    PYTHONPATH="$PWD" exec "$py" -S {SCF_RUNTIME_LOOP}
  fi
done
echo "sdcloud driver: no Python 3.11 or newer on this SCF image; set SDCLOUD_PYTHON to one" >&2
exit 1
'''
_EXECUTABLE = set(SCF_BOOTSTRAPS)


@dataclass
class FunctionPackage:
    """The built zip and what the limits are checked on."""

    data: bytes
    version: str
    unzipped_bytes: int
    distributions: list[str] = field(default_factory=list)

    @property
    def zipped_bytes(self) -> int:
        return len(self.data)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def filename(self) -> str:
        return f"sdcloud-driver-{self.version}.zip"

    def over_limits(self) -> list[str]:
        """The limits this package exceeds, one line each (empty: fits both services)."""
        out = []
        if self.zipped_bytes > LAMBDA_ZIPPED_MAX:
            out.append(f"{self.zipped_bytes} bytes zipped > Lambda's {LAMBDA_ZIPPED_MAX} for a direct upload")
        if self.unzipped_bytes > LAMBDA_UNZIPPED_MAX:
            out.append(f"{self.unzipped_bytes} bytes unzipped > Lambda's {LAMBDA_UNZIPPED_MAX}")
        if self.unzipped_bytes > SCF_UNZIPPED_MAX:
            out.append(f"{self.unzipped_bytes} bytes unzipped > SCF's {SCF_UNZIPPED_MAX}")
        return out

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / self.filename
        if not path.exists() or path.stat().st_size != len(self.data):
            tmp = path.with_suffix(".part")
            tmp.write_bytes(self.data)
            tmp.replace(path)
        return path


def _skip(rel: str) -> bool:
    parts = rel.split("/")
    return (rel.endswith(_SKIP_SUFFIXES) or any(p in _SKIP_PARTS for p in parts)
            or rel.startswith(_SKIP_PREFIXES))


def _package_files(module_name: str) -> list[tuple[str, bytes]]:
    import importlib

    root = Path(importlib.import_module(module_name).__file__).resolve().parent
    out = []
    for p in sorted(root.rglob("*")):
        rel = f"{module_name}/{p.relative_to(root).as_posix()}"
        if p.is_file() and not _skip(rel):
            out.append((rel, p.read_bytes()))
    return out


def _requirement_name(req: str) -> str | None:
    """The distribution a Requires-Dist line names, or None when it applies only to an extra."""
    if ";" in req and "extra" in req.split(";", 1)[1]:
        return None
    name = re.split(r"[\s<>=!~;\[\(]", req.strip(), maxsplit=1)[0]
    if ";" in req:
        try:
            from packaging.markers import Marker
        except ImportError:  # without packaging, keep it: a spare distribution beats a missing one
            return name
        if not Marker(req.split(";", 1)[1]).evaluate():
            return None
    return name


def _closure(requirements: tuple[str, ...] | list[str]) -> list[str]:
    """Every distribution the requirements pull in (no extras), as installed here."""
    import importlib.metadata as md

    seen: dict[str, str] = {}
    todo = [r for r in (_requirement_name(x) for x in requirements) if r]
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        dist = md.distribution(name)
        seen[key] = dist.metadata["Name"]
        todo += [r for r in (_requirement_name(x) for x in (dist.requires or [])) if r]
    return sorted(seen.values(), key=str.lower)


def _distribution_files(name: str) -> list[tuple[str, bytes]]:
    """A distribution's installed files as `pip install -t` lays them out (no scripts, no caches)."""
    import importlib.metadata as md

    dist = md.distribution(name)
    out = []
    for f in dist.files or []:
        rel = f.as_posix()
        if rel.startswith("..") or rel.startswith("/") or _skip(rel) or rel.endswith("/RECORD") \
                or rel.endswith("/INSTALLER") or rel.endswith("/direct_url.json"):
            continue
        path = Path(dist.locate_file(f))
        if path.is_file():
            out.append((rel, path.read_bytes()))
    return out


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _zip(files: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for path, data in files:
            info = zipfile.ZipInfo(path, _EPOCH)
            # SCF runs the bootstrap file only when it is executable.
            info.external_attr = (0o755 if path in _EXECUTABLE else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return buf.getvalue()


def control_plane_wheel() -> tuple[str, str, bytes, list[tuple[str, bytes]]]:
    """The control plane's own wheel (sdcloud and sdcloud_agent): filename, version, bytes, files."""
    files = _package_files("sdcloud") + _package_files("sdcloud_agent")
    content = hashlib.sha256()
    for path, data in files:
        content.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
    version = f"{BASE_VERSION}+{content.hexdigest()[:12]}"
    dist = f"{NAME}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {NAME}", f"Version: {version}",
            "Summary: sdcloud control plane (the cloud driver's build)", f"Requires-Python: {REQUIRES_PYTHON}"]
    meta += [f"Requires-Dist: {d}" for d in DEPENDENCIES]
    files = files + [(f"{dist}/METADATA", ("\n".join(meta) + "\n").encode()),
                     (f"{dist}/WHEEL", b"Wheel-Version: 1.0\nGenerator: sdcloud\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
                     (f"{dist}/top_level.txt", b"sdcloud\nsdcloud_agent\n")]
    record = "\n".join(_record_line(p, d) for p, d in files) + f"\n{dist}/RECORD,,\n"
    files.append((f"{dist}/RECORD", record.encode()))
    return f"{NAME}-{version}-py3-none-any.whl", version, _zip(files), files


def build() -> FunctionPackage:
    """The function's zip: the control plane's wheel unpacked, its dependencies, the SCF entry file."""
    _, version, _, files = control_plane_wheel()
    dists = _closure(DEPENDENCIES)
    for name in dists:
        files = files + _distribution_files(name)
    files.append((SHIM, _SHIM_TEXT.encode()))
    files.append((SCF_RUNTIME_LOOP, _SCF_RUNTIME_TEXT.encode()))
    files += [(name, _SCF_BOOTSTRAP_TEXT.encode()) for name in SCF_BOOTSTRAPS]
    by_path = dict(files)  # one copy of each path; sorted, so the bytes follow the content only
    ordered = sorted(by_path.items())
    return FunctionPackage(_zip(ordered), version, sum(len(d) for _, d in ordered), dists)


_BUILT: FunctionPackage | None = None


def current() -> FunctionPackage:
    """The package of the control plane this process runs (built once per process)."""
    global _BUILT
    if _BUILT is None:
        _BUILT = build()
    return _BUILT
