"""The clouds' functions as the cloud driver and its package see them: which platform an event came
from, the time its invocation has left, its request id, and what the package must carry.

Each provider with a cloud function says how its platform calls it (`CloudFunction.entry`, its
`function.py`): the driver (driver/unattended.py) and the package (infra/function_package.py) ask
here, never tell the clouds apart by an event's or a context's shape themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from .loader import module
from .traits import CloudFunction, every, has_function

# An invocation whose context says nothing of its limit is given this long.
DEFAULT_INVOCATION_SECONDS = 60.0


@runtime_checkable
class FunctionPlatform(Protocol):
    """How one cloud's function platform calls the driver (providers/<name>/function.py)."""

    HANDLER: str  # the handler the stack names
    ENTRY_FILES: dict[str, str]  # files at the package's root: name -> text
    REQUIREMENTS: tuple[str, ...]  # distributions the package carries for this cloud

    def matches(self, event: Any) -> bool: ...

    def time_left(self, context: Any, started: float) -> Callable[[], float] | None: ...

    def request_id(self, context: Any) -> str | None: ...


def platforms() -> list[tuple[CloudFunction, FunctionPlatform]]:
    """Every provider's cloud function with its platform, in registration order."""
    out = []
    for t in every():
        if has_function(t):
            assert t.function is not None
            found = module(t.name, t.function.entry)
            assert isinstance(found, FunctionPlatform), f"{found.__name__} does not say how its platform calls the driver"
            out.append((t.function, found))
    return out


def called(event: Any) -> CloudFunction:
    """The function an event came to: the first whose platform claims it; an event none claims (a
    local dry run's `{}`) is the first registered function's."""
    known = platforms()
    return next((fn for fn, p in known if p.matches(event)), known[0][0])


def _answers(event: Any) -> list[FunctionPlatform]:
    """The platforms in the order to ask about a context: the event's own first."""
    known = platforms()
    own = called(event)
    return [p for fn, p in known if fn == own] + [p for fn, p in known if fn != own]


def time_left(event: Any, context: Any, started: float) -> Callable[[], float]:
    """Seconds the invocation has left, from the context its platform passed (a context of another
    shape is read by the platform it is; none: DEFAULT_INVOCATION_SECONDS from `started`)."""
    for p in _answers(event):
        left = p.time_left(context, started)
        if left is not None:
            return left
    return lambda: DEFAULT_INVOCATION_SECONDS - (time.monotonic() - started)


def request_id(event: Any, context: Any) -> str | None:
    """The platform's id of this invocation, or None."""
    for p in _answers(event):
        found = p.request_id(context)
        if found:
            return found
    return None


def entry_files() -> dict[str, str]:
    """Every platform's files at the package's root."""
    return {name: text for _, p in platforms() for name, text in p.ENTRY_FILES.items()}


def requirements() -> tuple[str, ...]:
    """Every platform's distributions, each once, in registration order."""
    return tuple(dict.fromkeys(r for _, p in platforms() for r in p.REQUIREMENTS))


def handler(name: str) -> str:
    """The handler provider `name`'s stack names for its function."""
    return next(p.HANDLER for fn, p in platforms() if fn == _function_of(name))


def _function_of(name: str) -> CloudFunction:
    from .traits import traits

    fn = traits(name).function
    if fn is None:
        raise KeyError(f"{name} has no cloud function")
    return fn
