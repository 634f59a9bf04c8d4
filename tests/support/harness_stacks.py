"""The Pulumi stacks' modules, loaded by path as the tests need them.

A stack folder is a Pulumi program (stacks/<provider>/__main__.py), not a package: its modules import
one another by bare name (`import driver_policy`), and the stack program puts its own folder on the
path for that. A test takes a module with `stack_module("aws", "driver_policy")` (default: the
program's `sdcloud_<provider>_stack`), registered under that same bare name, so the stack's own
imports and the test's find one module, not two copies.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.support import ROOT

STACKS = ROOT / "stacks"


def stack_module(provider: str, module: str | None = None) -> ModuleType:
    name = module or f"sdcloud_{provider}_stack"
    if name in sys.modules:
        return sys.modules[name]
    path = STACKS / provider / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no stack module at {path}")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded
    try:
        spec.loader.exec_module(loaded)
    except BaseException:
        del sys.modules[name]
        raise
    return loaded
