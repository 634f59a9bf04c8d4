"""Provider adapters behind one protocol (base.Provider). Import the one you need: they are heavy.

Which adapter a name means is the provider's own declaration (`traits(name).adapter`, loaded by
loader.py), so a new provider is one folder under `providers/`, not an entry here too.
"""

from __future__ import annotations

from ..names import match_name
from .traits import names


def get_provider(name: str, **kwargs):
    """Instantiate a provider by name, importing only that adapter."""
    from .loader import provider_class

    name = match_name(name, names(), "provider")
    return provider_class(name)(**kwargs)
