"""How offers come to know a provider's facts: offers sit below providers and import none of them, so a
provider tells them what it declares when its traits are read (providers/traits.py: where its catalog
lies, its network between hosts). A fact asked for before anyone read that provider's traits has them
read first, through the one function providers/traits.py leaves here: nothing outside providers/ opens
a provider's folder."""

from __future__ import annotations

from collections.abc import Callable

_read_traits: Callable[[str], object] | None = None


def read_traits_with(read: Callable[[str], object]) -> None:
    """Called once by providers/traits.py: `read(name)` reads provider `name`'s traits, which tell their facts."""
    global _read_traits
    _read_traits = read


def ask(provider: str) -> None:
    """Have `provider`'s traits read, so that it tells its facts; nothing where it is not a provider."""
    if _read_traits is None:
        return
    try:
        _read_traits(provider)
    except (KeyError, ValueError, ImportError):  # not a registered provider (a test's stand-in row): assumed facts
        return
