"""Where the dashboard may listen, and who may ask it.

It listens on loopback unless told otherwise; anywhere else only with a token, and then every
request must carry it (an `Authorization: Bearer` header, or `?token=` as a link from the list page
carries it). The token is compared in constant time and never shown.
"""

from __future__ import annotations

import ipaddress
import secrets

from ..errors import UserError

LOOPBACK_NAMES = ("localhost",)
TOKEN_PARAM = "token"
MIN_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse, before anything listens, a host other than loopback without a token, and a weak token."""
    if not host.strip():
        raise UserError("--host must name an address")
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise UserError(f"--token must be at least {MIN_TOKEN_CHARS} characters (e.g. python -c "
                        "'import secrets; print(secrets.token_urlsafe())')")
    if not is_loopback(host) and not token:
        raise UserError(f"--host {host} is not loopback: the dashboard listens there only with --token "
                        "(every request must then carry it)")


def allowed(token: str | None, header: str | None, query: str | None) -> bool:
    """Whether a request may be answered: always without a token; with one, when it carries it."""
    if not token:
        return True
    given = ""
    if header and header.lower().startswith("bearer "):
        given = header[7:].strip()
    elif query:
        given = query
    return secrets.compare_digest(given.encode(), token.encode())
