"""The Pythons that sdcloud's code meets outside this process, found on this machine: each cloud
function's runtime version (the traits' CloudFunction.python: Lambda's python3.13, SCF's Python3.10).

Where they come from: $SDCLOUD_PYTHONXY, then pyenv's versions folder (PYENV_ROOT, or ~/.pyenv),
then `pythonX.Y` on PATH.
This project's machine image has 3.10, 3.12 and 3.13 under pyenv; Debian 12's apt packages 3.11
only, and no package on PyPI ships an interpreter (the ones that install Python download it from
elsewhere at run time, which CI cannot reach). So `.ci/run` runs this file first and stops there
when one is missing, and a test that needs one fails under CI (CI=true) instead of skipping;
on a developer's machine without it, it skips and says which.

    python tests/support/harness_interpreters.py     # one line per version the functions need; exit 1 if one is missing
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path


def _reports(path: str, version: tuple[int, int]) -> bool:
    """The interpreter at `path` runs and is `version` (a pyenv shim of an inactive version is not)."""
    try:
        out = subprocess.run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == "%d.%d" % version


@cache
def find_python(version: tuple[int, int]) -> str | None:
    """An interpreter of exactly `version` (major, minor), or None."""
    name = "python%d.%d" % version
    # One named by the environment first: SDCLOUD_PYTHON310 for 3.10 (docs/testing.md).
    candidates = [c for c in [os.environ.get("SDCLOUD_PYTHON%d%d" % version)] if c]
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    # pyenv's own builds first: newest patch release of the version.
    found = glob.glob(os.path.join(root, "versions", "%d.%d.*" % version, "bin", name))
    candidates += sorted(found, key=lambda p: [int(x) if x.isdigit() else 0
                                               for x in Path(p).parents[1].name.split(".")], reverse=True)
    on_path = shutil.which(name)
    if on_path:
        candidates.append(on_path)
    return next((c for c in candidates if _reports(c, version)), None)


def python_for(version: tuple[int, int], why: str) -> str:
    """The interpreter for `version`; skips the calling test without one, but fails it under CI."""
    import pytest

    path = find_python(version)
    if path is None:
        message = "no Python %d.%d on this machine (%s): install it under pyenv" % (*version, why)
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def needed() -> dict[tuple[int, int], list[str]]:
    """The versions the cloud functions run, with the runtimes that run each."""
    from sdcloud.providers.traits import every

    out: dict[tuple[int, int], list[str]] = {}
    for t in every():
        if t.function is not None:
            out.setdefault(t.function.python, []).append(f"{t.name}: {t.function.runtime}")
    return out


def main() -> int:
    try:
        versions = needed()
    except ImportError as exc:  # the control plane's dependencies are not installed yet: the tests check
        print(f"cannot read the functions' runtimes before the install ({exc}); tests/infra/test_function_package.py checks")
        return 0
    missing = 0
    for version, users in sorted(versions.items()):
        path = find_python(version)
        print("Python %d.%d (%s): %s" % (*version, ", ".join(users), path or "MISSING"))
        missing += path is None
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
