"""The dependency floors in pyproject.toml cover what the code uses."""

from __future__ import annotations

import re
import tomllib

from botocore.config import Config

from tests.support import ROOT

PYPROJECT = ROOT / "pyproject.toml"


def _floor(name: str) -> tuple[int, ...] | None:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    for dep in deps:
        m = re.fullmatch(rf"{name}\s*>=\s*([0-9.]+)(?:\s*,.*)?", dep.strip())
        if m:
            return tuple(int(p) for p in m[1].split("."))
    return None


def test_boto3_and_botocore_floors_have_the_checksum_options():
    # request_checksum_calculation / response_checksum_validation (the COS store turns off trailer
    # uploads with them) first shipped in botocore 1.36.0 and boto3 1.36.0 (2025-01-15 changelogs).
    Config(request_checksum_calculation="when_required", response_checksum_validation="when_required")
    assert (_floor("boto3") or (0,)) >= (1, 36), "boto3 must be >= 1.36 in pyproject.toml"
    assert (_floor("botocore") or (0,)) >= (1, 36), "botocore must be stated, >= 1.36, in pyproject.toml"
