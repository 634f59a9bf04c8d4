"""The files the cloud driver's package carries at its root, beside the control plane: the entry SCF
loads, and the two names of Python 3.11 that SCF's Python 3.10 lacks.

SCF runs the function on its own Python runtime, `Python3.10` (the newest it offers: "Runtime
Environment", tencentcloud.com/document/product/583/40323), and loads `sdcloud_driver.main_handler`
from the package root, which is on its PYTHONPATH (/var/user). The control plane is written for
3.11, and what a step imports of it needs two names 3.10 does not have (measured by running the
handler and every module a step reaches under a real 3.10: tests/infra/test_function_package.py):
`enum.StrEnum` (sdcloud.events.Kind, providers.traits.Hosts) and `tomllib` (config, tiers, billing
rules). `sdcloud_py310` gives both, before anything of the control plane is imported, and only
below 3.11: StrEnum as 3.11 defines it, and tomllib as `tomli`, the package from which 3.11's
tomllib was made (same API), which the package carries. Lambda's python3.13 never imports it.
"""

from __future__ import annotations

ENTRY = "sdcloud_driver.py"
COMPAT = "sdcloud_py310.py"
# What COMPAT gives 3.10: the only names of a newer Python the package's own code uses (checked with
# vermin over the whole package at 3.10: tests/infra/test_function_package.py).
COMPAT_NAMES = ("enum.StrEnum", "tomllib")

ENTRY_TEXT = '''"""The sdcloud cloud driver's entry at the package root: SCF calls `sdcloud_driver.main_handler`
(Lambda calls sdcloud.driver.unattended.handler, which this file also names)."""
import os
import sys

if sys.version_info < (3, 11):
    import sdcloud_py310  # noqa: F401  (enum.StrEnum and tomllib, before the control plane)

from sdcloud.driver import unattended

handler = unattended.handler


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


def main_handler(event, context):
    """SCF's timer event; its context is a dict whose time_limit_in_ms bounds the invocation."""
    role_credentials()  # per invocation: SCF may renew the role's keys between them
    return unattended.main_handler(event, context)
'''

# Lambdas deployed before the cloud driver had its own package (sdcloud/driver/) were configured with
# the handler `sdcloud.runs.unattended.handler`. The package keeps that name as an alias, so a
# function whose code is updated before its configuration (or whose configuration update failed)
# still finds its handler.
LEGACY_HANDLER = "sdcloud/runs/unattended.py"
LEGACY_HANDLER_TEXT = '''"""The cloud driver's entry under its name before it moved to sdcloud.driver.unattended."""
from sdcloud.driver.unattended import handler, main_handler  # noqa: F401
'''

COMPAT_TEXT = '''"""Python 3.11's enum.StrEnum and tomllib for the control plane on SCF's Python 3.10.

Imported by sdcloud_driver before the control plane, and only below 3.11 (sdcloud/infra/function_entry.py)."""
import enum
import sys

if not hasattr(enum, "StrEnum"):
    class StrEnum(str, enum.Enum):
        """As 3.11 defines it: members are str; str() and format() give the value; auto() the lower-case name."""

        def __str__(self):
            return str.__str__(self)

        def _generate_next_value_(name, start, count, last_values):
            return name.lower()

    enum.StrEnum = StrEnum

try:
    import tomllib  # noqa: F401
except ImportError:
    import tomli

    sys.modules["tomllib"] = tomli
'''
