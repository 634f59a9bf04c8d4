"""Provider adapters behind one protocol (base.Provider). Import the one you need: they are heavy."""

from __future__ import annotations

import importlib

from ..names import match_name

# Each provider's adapter module; a module's PROVIDER_CLASS is the Provider.
MODULES = {
    "aws": "sdcloud.providers.aws.compute",
    "tencent": "sdcloud.providers.tencent.compute",
    "local": "sdcloud.providers.local.provider",
    "ssh": "sdcloud.providers.ssh.provider",
}
NAMES = tuple(MODULES)


def get_provider(name: str, **kwargs):
    """Instantiate a provider by name, importing only that adapter."""
    name = match_name(name, NAMES, "provider")
    module = importlib.import_module(MODULES[name])
    return module.PROVIDER_CLASS(**kwargs)
