"""No secret on a page: every value this machine knows to be one, replaced by its masked form.

A page shows chosen fields only; this is the second guard, at the boundary where text leaves for a
file or a browser, so that a secret copied into a field by mistake (a trainer argument, an event's
words) is still never shown.
"""

from __future__ import annotations

import os

# Where the hub and W&B read their keys from the environment.
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY")
# Shorter values are not masked: they would match ordinary words and numbers on the page.
MIN_SECRET_CHARS = 8


def _is_secret_key(key: str, value: object) -> bool:
    from ..config import looks_secret

    return looks_secret(key, value) or "api_key" in key.lower() or key.lower().endswith("_key")


def _walk(value: object, key: str = "") -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _walk(v, str(k))]
    if isinstance(value, list):
        return [s for v in value for s in _walk(v, key)]
    if isinstance(value, str) and key and _is_secret_key(key, value):
        return [value]
    return []


def known(extra: object = None) -> set[str]:
    """Every secret value of config.toml, of the environment's hub and W&B keys, and of `extra` (a
    run's spec: a trainer argument named like a key)."""
    from ..config import settings

    found = set(_walk(settings())) | set(_walk(extra))
    found |= {os.environ[n] for n in SECRET_ENV if os.environ.get(n)}
    return {s for s in found if len(s) >= MIN_SECRET_CHARS}


def scrub(text: str, secrets: set[str]) -> str:
    from ..config import masked

    for s in sorted(secrets, key=len, reverse=True):
        if s in text:
            text = text.replace(s, masked(s))
    return text
