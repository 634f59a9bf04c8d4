"""The rates this machine recorded and observed (sdcloud speeds), read from its state store."""

from __future__ import annotations


def user_book(trainer: str | None = None):
    """This machine's recorded and observed rates ($SDCLOUD_HOME/state.db); none where there is no
    state store yet, and none is made (`sdcloud offers` on a fresh machine writes nothing)."""
    from ... import config
    from ...speeds.book import Book, load_book
    from ..records.state import StateStore

    if not (config.home() / "state.db").exists():
        return Book([], trainer)
    state = StateStore()
    try:
        return load_book(state, trainer)
    finally:
        state.close()
