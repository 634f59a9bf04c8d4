"""Run the dashboard: check where it may listen, bind, and serve with uvicorn until Ctrl-C."""

from __future__ import annotations

import socket

from ..errors import UserError
from .access import check_bind


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, made here so that a taken port is one line before anything starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(host: str, port: int, token: str | None, stores: tuple[str, ...], say=print) -> None:
    check_bind(host, token)
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be 0 to 65535, got {port}")
    from .sources import Sources

    sources = Sources(stores)  # a --store bucket is opened and read once here: bad credentials are one line
    sock = bind(host, port)
    import uvicorn

    from .app import create_app

    app = create_app(sources, token)
    shown = f"[{host}]" if ":" in host else host
    say(f"sdcloud dashboard on http://{shown}:{sock.getsockname()[1]}/"
        + (" (every request needs the token)" if token else "") + "; Ctrl-C stops it")
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
        sources.close()
