"""The control plane's object store: the agent's (sdcloud_agent.store) plus how this machine reaches a
run's bucket, which differs from the host's for COS (the host uses its CAM role, we the user's keys)."""

from __future__ import annotations

from sdcloud_agent.store import NotFound, ObjectInfo, ObjectStore, StoreError, open_store

__all__ = ["NotFound", "ObjectInfo", "ObjectStore", "StoreError", "open_store", "open_run_store"]


def open_run_store(conf: dict) -> ObjectStore:
    """The store of a run's agent config, opened with this machine's credentials."""
    if conf.get("credentials") == "tencent-cvm-role":
        from urllib.parse import urlparse

        from ..providers.tencent import storage as tencent_cos

        url = urlparse(conf["url"])
        return tencent_cos.open_store(url.netloc, url.path.strip("/"), conf.get("region", ""), conf.get("endpoint_url"))
    return open_store(conf)
