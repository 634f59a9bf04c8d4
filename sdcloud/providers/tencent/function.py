"""How Tencent SCF calls the cloud driver (TRAITS.function.entry): which events are its, the time an
invocation has left, its request id, the entry SCF loads and what the package needs for it.

SCF invokes `main_handler(event, context)` with a timer trigger's event `{"Type": "Timer",
"TriggerName": ..., "Time": ..., "Message": ...}` and a dict context whose `time_limit_in_ms`
bounds the invocation and whose `request_id` names it.

The files the package carries at its root, beside the control plane: the entry SCF loads, and the
two names of Python 3.11 that SCF's Python 3.10 lacks.

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

import time
from typing import Any, Callable

# The entry SCF calls, as the stack names it (stacks/tencent/scf_policy.py FUNCTION_HANDLER).
HANDLER = "sdcloud_driver.main_handler"
# An invocation whose context does not say its limit is given this long.
DEFAULT_INVOCATION_SECONDS = 60.0
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

COMPAT_TEXT = '''"""Python 3.11's enum.StrEnum and tomllib for the control plane on SCF's Python 3.10.

Imported by sdcloud_driver before the control plane, and only below 3.11 (sdcloud/providers/tencent/function.py)."""
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

# Files at the package's root beside the control plane (sdcloud/infra/function_package.py).
ENTRY_FILES = {ENTRY: ENTRY_TEXT, COMPAT: COMPAT_TEXT}
# Distributions the package carries for this cloud: the SDK's common and CVM packages for the
# provider, tomli for COMPAT's tomllib on SCF's Python 3.10.
REQUIREMENTS = ("tencentcloud-sdk-python-common>=3.0.1000", "tencentcloud-sdk-python-cvm>=3.0.1000", "tomli>=2")


def matches(event: Any) -> bool:
    """An event SCF hands over: a timer trigger's. Its `Type` is `Timer` in some of Tencent's documents
    and `timer` in others (and `timer` is the trigger's type in the API), so any case is taken."""
    return isinstance(event, dict) and str(event.get("Type", "")).lower() == "timer"


def time_left(context: Any, started: float) -> Callable[[], float] | None:
    """Seconds the invocation has left, from SCF's dict context (its `time_limit_in_ms`, else a
    default counted from `started`); None for a context of another shape."""
    if not isinstance(context, dict):
        return None
    limit_ms = context.get("time_limit_in_ms")
    limit = float(limit_ms) / 1000.0 if limit_ms else DEFAULT_INVOCATION_SECONDS
    return lambda: limit - (time.monotonic() - started)


def request_id(context: Any) -> str | None:
    """SCF's id of this invocation (the dict context's `request_id`); None for a context of another shape."""
    if not isinstance(context, dict):
        return None
    return context.get("request_id") or None
