"""The cloud driver's function package: the control plane's own wheel, unpacked with the few
distributions its handler needs, in the zip layout Lambda and SCF load code from.

The function runs `sdcloud.driver.unattended` (issue 27): the same Controller step as the laptop, not
a second implementation. So the package is built from the control plane this process runs (an
editable checkout or an installed wheel alike), deterministically like the agent's wheel
(bootstrap/sdcloud_agent/wheel.py): sorted files, fixed timestamps, a version `<base>+<sha12>` that
follows the content only, so an unchanged control plane redeploys nothing.

What goes in, and why only that (measured: `python -X importtime` of a step on each provider, and
the static import walk in tests/infra/test_function_package.py):
- `sdcloud` and `sdcloud_agent` (the store, the agent's wheel a relaunch uploads), as the wheel
  `sdcloud-<version>-py3-none-any.whl` would install them, with its dist-info;
- DEPENDENCIES and what they require (their Requires-Dist without extras): boto3 for the bucket and
  EC2, tenacity for the providers' retries, PyYAML for run specs, tzdata for a schedule's fire
  (zoneinfo reads the system's zone files first, and a function's image need not have them: without
  tzdata a fire in Europe/Berlin would fail with ZoneInfoNotFoundError), then each cloud's own (its
  function.py REQUIREMENTS: the Tencent Cloud SDK's common and CVM packages for the Tencent
  provider, tomli for SCF's Python 3.10). The handler's import
  closure reaches nothing else: torch, diffusers, numpy, matplotlib, paramiko, rich and click are
  imported lazily, by the trainers, reports, SSH provider and CLI, none of which a step calls.
  awscrt is left out too: without it the transfer module falls back to s3transfer;
- at the root, each platform's ENTRY_FILES: the entry SCF loads and the two 3.11 names SCF's
  Python 3.10 lacks (providers/tencent/function.py).

For which Python: every provider's cloud function names its runtime in its traits (Lambda
`python3.13`, SCF `Python3.10`), and one package serves both, so it is built for each of those
versions and for any machine: pure Python only. The distributions are copied from this
interpreter's site-packages (as a Lambda zip is made with `pip install -t`), and a compiled module
copied from here would be built for this interpreter and this machine (a cp311 .so, or a macOS
one), which the function's Python ignores at best. So every compiled file is left out, and the
build refuses one whose module has no pure-Python fallback (BINARY_FALLBACKS lists the fallbacks
that are not a same-named .py: PyYAML's). Then the build checks what the runtimes' versions
would refuse: each distribution's Requires-Python, and the control plane's own sources parsed
at the oldest runtime's grammar; the tests run the handler from the built zip under each
runtime's own interpreter.

Its limits are each cloud's (providers/<name>/limits.py, in the traits' CloudFunction.code_limits):
`over_limits` says which the package exceeds, and `sdcloud infra up` stops there.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..providers import functions as platforms
from ..providers.traits import CloudFunction, every

NAME = "sdcloud"
BASE_VERSION = "0.1.0"
# The package's Python: 3.10 with the two names SCF's entry files give it, 3.11 and newer as is.
REQUIRES_PYTHON = ">=3.10"
# The handler's third-party imports on a step (see the module docstring), the control plane's own and
# then each cloud's; their own requirements follow.
DEPENDENCIES = tuple(dict.fromkeys(("boto3>=1.36", "tenacity>=8.2", "pyyaml>=6", "tzdata>=2024.1",
                                    *platforms.requirements())))
_EPOCH = (1980, 1, 1, 0, 0, 0)
_SKIP_SUFFIXES = (".pyc", ".pyo")
# Package data the function never reads: the Pulumi programs (the function deploys nothing).
_SKIP_PARTS = ("__pycache__",)
_SKIP_PREFIXES = ("sdcloud/infra/stacks/",)
# Compiled files: extension modules and the shared libraries wheels vendor for them (`<dist>.libs/`).
_BINARY = re.compile(r"\.(so|pyd|dylib)(\.[0-9]+)*$")
# Compiled modules whose pure-Python fallback is not a same-named .py beside them, and why the
# package runs without them. A mypyc helper (`<hash>__mypyc`) goes with the modules it compiled.
BINARY_FALLBACKS = {
    "yaml/_yaml": "yaml/__init__.py imports the libyaml binding in a try and loads YAML in pure Python without it",
}


class PackageError(RuntimeError):
    """The package would not run on a function's Python: a compiled module without a fallback, a
    distribution or a source file the runtime's version refuses."""


def runtimes() -> list[CloudFunction]:
    """Every provider's cloud function (its runtime and limits), from the traits."""
    return [t.function for t in every() if t.function is not None]


@dataclass
class FunctionPackage:
    """The built zip and what the limits are checked on."""

    data: bytes
    version: str
    unzipped_bytes: int
    distributions: list[str] = field(default_factory=list)
    # Compiled files left out (the package is pure Python), each with the fallback its module runs on.
    left_out: dict[str, str] = field(default_factory=dict)

    @property
    def zipped_bytes(self) -> int:
        return len(self.data)

    @property
    def inline_request_bytes(self) -> int:
        """The least a create request with this zip inline weighs: the zip base64-encoded (its other
        fields add a few hundred bytes more; tests/stacks/test_stacks_driver.py serialises the real one)."""
        return 4 * ((self.zipped_bytes + 2) // 3)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def filename(self) -> str:
        return f"sdcloud-driver-{self.version}.zip"

    def over_limits(self, functions: Iterable[CloudFunction] | None = None) -> list[str]:
        """The limits of the functions' clouds this package exceeds, one line each (empty: it fits).
        A function whose stack creates it from the bucket sends no zip in its request."""
        out = []
        for fn in runtimes() if functions is None else functions:
            limits = fn.code_limits
            if limits is None:
                continue
            if self.unzipped_bytes > limits.unzipped_bytes:
                out.append(f"{self.unzipped_bytes} bytes unzipped > {fn.name}'s {limits.unzipped_bytes}")
            if fn.code_from_bucket:
                continue
            if self.zipped_bytes > limits.inline_zip_bytes:
                out.append(f"{self.zipped_bytes} bytes zipped > {fn.name}'s {limits.inline_zip_bytes} for a zip in the request")
            if self.inline_request_bytes > limits.request_bytes:
                out.append(f"a {self.inline_request_bytes}-byte create request > {fn.name}'s {limits.request_bytes}")
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
    import importlib.util

    spec = importlib.util.find_spec(module_name)
    assert spec is not None and spec.origin is not None, module_name
    root = Path(spec.origin).resolve().parent
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
            info.external_attr = 0o644 << 16
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


def _leave_out_binaries(files: dict[str, bytes]) -> dict[str, str]:
    """Drop every compiled file (in place); return each with the pure-Python fallback its module
    runs on. Refuses a compiled module that has none: the package would fail where it lacks it."""
    left: dict[str, str] = {}
    for rel in [r for r in files if _BINARY.search(r)]:
        del files[rel]
        folder, _, name = rel.rpartition("/")
        module = f"{folder}/{name.split('.')[0]}" if folder else name.split(".")[0]
        if any(part.endswith(".libs") for part in folder.split("/")):
            left[rel] = "a shared library vendored for the compiled modules left out with it"
        elif module.endswith("__mypyc"):
            left[rel] = "mypyc's helper for the compiled modules left out with it"
        elif f"{module}.py" in files or f"{module}/__init__.py" in files:
            left[rel] = f"{module}.py"
        elif module in BINARY_FALLBACKS:
            left[rel] = BINARY_FALLBACKS[module]
        else:
            raise PackageError(f"{rel} is compiled for this machine's Python and {module} has no pure-Python "
                               "fallback: the function's Python could not import it")
    return left


def _check_versions(files: dict[str, bytes], dists: list[str], versions: list[tuple[int, int]]) -> None:
    """What each runtime's Python would refuse: a distribution's Requires-Python, or (parsed at the
    oldest runtime's grammar) a construct of a newer Python in the control plane's own sources."""
    import importlib.metadata as md

    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:  # pragma: no cover - pip and setuptools bring packaging with them
        SpecifierSet = None  # noqa: N806
    for name in dists:
        wanted = md.distribution(name).metadata.get("Requires-Python")
        for major, minor in versions:
            if wanted and SpecifierSet is not None and not SpecifierSet(wanted).contains(f"{major}.{minor}"):
                raise PackageError(f"{name} requires Python {wanted}: a function runs Python {major}.{minor}")
    oldest = min(versions)
    own = [p for p in files if p.endswith(".py") and (p.startswith(("sdcloud/", "sdcloud_agent/")) or "/" not in p)]
    for path in own:
        try:
            ast.parse(files[path], filename=path, feature_version=oldest)
        except SyntaxError as exc:
            raise PackageError(f"{path}:{exc.lineno}: {exc.msg} (a function runs Python {oldest[0]}.{oldest[1]})") from None


def build(functions: Iterable[CloudFunction] | None = None) -> FunctionPackage:
    """The function's zip, for every runtime's Python: the control plane's wheel unpacked, its
    dependencies without compiled files, the entry SCF loads and the 3.11 names 3.10 lacks."""
    versions = sorted({fn.python for fn in (runtimes() if functions is None else functions)})
    _, version, _, files = control_plane_wheel()
    dists = _closure(DEPENDENCIES)
    for name in dists:
        files = files + _distribution_files(name)
    files += [(name, text.encode()) for name, text in platforms.entry_files().items()]
    by_path = dict(files)  # one copy of each path; sorted, so the bytes follow the content only
    left_out = _leave_out_binaries(by_path)
    _check_versions(by_path, dists, versions)
    ordered = sorted(by_path.items())
    return FunctionPackage(_zip(ordered), version, sum(len(d) for _, d in ordered), dists, left_out)


_BUILT: FunctionPackage | None = None


def current() -> FunctionPackage:
    """The package of the control plane this process runs (built once per process)."""
    global _BUILT
    if _BUILT is None:
        _BUILT = build()
    return _BUILT
