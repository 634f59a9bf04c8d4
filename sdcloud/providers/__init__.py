"""Provider adapters behind one protocol (base.Provider). Import the one you need: they are heavy.

Which adapter a name means is the provider's own declaration (`traits(name).adapter`), so a new
provider is one folder under `providers/`, not an entry here too.
"""

from __future__ import annotations

import importlib

from ..names import match_name
from .traits import names, traits

NAMES = names()


def get_provider(name: str, **kwargs):
    """Instantiate a provider by name, importing only that adapter."""
    name = match_name(name, NAMES, "provider")
    module = importlib.import_module(traits(name).adapter)
    return module.PROVIDER_CLASS(**kwargs)

# Each provider's adapter module, by name (read from its traits; kept for callers that import it).
MODULES = {n: traits(n).adapter for n in NAMES}
