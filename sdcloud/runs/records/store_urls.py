"""A store URL as the user typed it (`--store`, `status --store`), checked before anything is made."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

from sdcloud_agent.store import dialects

from ...errors import UserError
from ...providers.traits import is_cloud, names, traits

# S3 bucket names: 3-63 lowercase letters, digits, dots and hyphens (COS: name-appid, the same set).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def check_store_url(url: str, provider: str = "local", flag: str = "--store") -> str:
    """The store URL, checked (and a plain local path made a file:// URL); UserError otherwise."""
    text = str(url).strip()
    forms = dialects.forms()
    parsed = urlparse(text)
    if dialects.is_bucket(parsed.scheme):
        if not parsed.netloc:
            raise UserError(f"{flag} {text}: no bucket; use {forms}")
        if not _BUCKET.match(parsed.netloc):
            raise UserError(f"{flag} {text}: {parsed.netloc!r} is not a bucket name "
                            "(3-63 lowercase letters, digits, '.' and '-')")
        return text
    if parsed.scheme == dialects.FILE:
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise UserError(f"{flag} {text}: a file URL needs an absolute path, e.g. file:///srv/sdcloud "
                            "(file://x/y names the folder x/y relative to wherever the host runs)")
        if provider in names(where=is_cloud):
            raise UserError(f"{flag} {text}: a {provider} host cannot reach a folder on this machine; "
                            f"use {dialects.forms(traits(provider).stores, folder=False)}")
        return text
    if parsed.scheme == "" and text:
        if provider in names(where=is_cloud):
            raise UserError(f"{flag} {text}: a {provider} host cannot reach a folder on this machine; "
                            "use s3://BUCKET/PREFIX")
        return Path(text).expanduser().resolve().as_uri()
    raise UserError(f"{flag} {text}: unsupported store URL; use {forms}")
