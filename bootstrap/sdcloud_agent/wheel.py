"""The host agent as a wheel, built by the control plane at launch and uploaded once per version to
the run's bucket (the agent never builds or imports anything of the control plane itself).

Hosts install the agent from this wheel (fetched with their instance role), never by a package
name from an index. The wheel is built from the `sdcloud_agent` package this control plane runs
(an editable checkout or an installed wheel alike), deterministically: sorted files, fixed
timestamps, so its version `<base>+<sha12 of the files>` and its bytes follow its content only.
Its metadata is bootstrap/pyproject.toml's (a test keeps the two the same).
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

NAME = "sdcloud_agent"
BASE_VERSION = "0.1.0"
REQUIRES_PYTHON = ">=3.10"
DEPENDENCIES = ["boto3>=1.34"]
EXTRAS = {"train": ["torch>=2.1", "diffusers>=0.30", "transformers>=4.40", "peft>=0.11", "accelerate>=0.30",
                    "safetensors>=0.4", "tensorboardX>=2.6"],
          "cuda": ["bitsandbytes>=0.43"],
          # The CRT transfer engine for checkpoints (transfer.py); without it the agent uses s3transfer.
          "crt": ["awscrt>=0.27"]}
KEY_PREFIX = "agent"
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class AgentWheel:
    filename: str
    version: str
    data: bytes

    @property
    def key(self) -> str:
        return f"{KEY_PREFIX}/{self.filename}"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def _package_files() -> list[tuple[str, bytes]]:
    import sdcloud_agent

    root = Path(sdcloud_agent.__file__).resolve().parent
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and "__pycache__" not in rel.parts and p.suffix not in (".pyc", ".pyo"):
            out.append((f"{NAME}/{rel.as_posix()}", p.read_bytes()))
    return out


def _metadata(version: str) -> str:
    lines = ["Metadata-Version: 2.1", "Name: sdcloud-agent", f"Version: {version}",
             "Summary: sdcloud host agent: trains, checkpoints to the bucket, survives spot reclaims",
             f"Requires-Python: {REQUIRES_PYTHON}"]
    lines += [f"Requires-Dist: {d}" for d in DEPENDENCIES]
    for extra, deps in EXTRAS.items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
    return "\n".join(lines) + "\n"


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build() -> AgentWheel:
    files = _package_files()
    content = hashlib.sha256()
    for path, data in files:
        content.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
    version = f"{BASE_VERSION}+{content.hexdigest()[:12]}"
    dist = f"{NAME}-{version}.dist-info"
    files += [(f"{dist}/METADATA", _metadata(version).encode()),
              (f"{dist}/WHEEL", b"Wheel-Version: 1.0\nGenerator: sdcloud\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
              (f"{dist}/top_level.txt", f"{NAME}\n".encode())]
    record = "\n".join(_record_line(p, d) for p, d in files) + f"\n{dist}/RECORD,,\n"
    files.append((f"{dist}/RECORD", record.encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files:
            info = zipfile.ZipInfo(path, _EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return AgentWheel(f"{NAME}-{version}-py3-none-any.whl", version, buf.getvalue())


_BUILT: AgentWheel | None = None


def current() -> AgentWheel:
    """The wheel of the agent this process runs (built once per process)."""
    global _BUILT
    if _BUILT is None:
        _BUILT = build()
    return _BUILT


def ensure_uploaded(store) -> AgentWheel:
    """Put the current wheel at agent/<filename> in the store unless that version is there already."""
    wheel = current()
    info = store.head(wheel.key)
    if info is None or info.size != len(wheel.data):
        store.put(wheel.key, wheel.data, {"sha256": wheel.sha256})
    return wheel
