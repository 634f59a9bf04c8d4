"""Provider adapters behind one protocol (base.Provider). Import the one you need: they are heavy."""

from __future__ import annotations

import importlib

from ..errors import UserError

NAMES = ("aws", "tencent", "local", "ssh")


def get_provider(name: str, **kwargs):
    """Instantiate a provider by name, importing only that adapter."""
    if name not in NAMES:
        raise UserError(f"unknown provider {name!r}; valid: {', '.join(NAMES)}")
    module = importlib.import_module(f"sdcloud.providers.{name}")
    return module.PROVIDER_CLASS(**kwargs)
