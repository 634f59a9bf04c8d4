"""The control plane's object store: the agent's (sdcloud_agent.store) plus how this machine reaches a
run's bucket, which differs from the host's where the provider says so (`traits(name).run_store`:
Tencent's COS, where the host uses its CAM role and this machine the user's keys)."""

from __future__ import annotations

import os

from sdcloud_agent.store import NotFound, ObjectInfo, ObjectStore, StoreError, dialects, open_store

from ... import config
from ...errors import UserError
from ...providers.loader import run_store
from ...providers.traits import every, names

__all__ = ["NotFound", "ObjectInfo", "ObjectStore", "StoreError", "open_store", "open_run_store", "store_config"]


def store_config(provider: str, store: str | None, region: str | None, infra: dict | None) -> dict:
    """Where an owner's (a training run's, a batch job's) objects live, as the agent's store config.

    An explicit `store` URL wins; hosts that are not a cloud's (this machine, the user's boxes)
    share this machine's bucket folder; a cloud's hosts use the bucket of `sdcloud infra up`, in
    the provider's own dialect where it has one (Tencent: COS through its S3 endpoint, virtual
    addressing, and the host signing with its CVM role's temporary keys).
    """
    if store:
        conf = {"url": store}
        endpoint = os.environ.get("SDCLOUD_STORE_ENDPOINT")
        if endpoint:
            conf["endpoint_url"] = endpoint
        return conf
    if provider in names(where=lambda t: not t.is_cloud):
        return {"url": (config.home() / "bucket").resolve().as_uri()}
    if infra and infra.get("bucket"):
        conf = {"url": f"{dialects.S3}://{infra['bucket']}/{infra.get('prefix', 'sdcloud')}"}
        for key in ("endpoint_url", "region", "addressing_style"):
            if infra.get(key):
                conf[key] = infra[key]
        dialect = run_store(provider) if provider in names() else None
        if dialect is not None:
            conf = dialect.run_store_config(conf, infra, region)
        return conf
    raise UserError(f"no bucket for provider {provider}: run `sdcloud infra up --provider {provider}` "
                    f"or pass --store {dialects.forms((dialects.S3,), folder=False)}")


def open_run_store(conf: dict) -> ObjectStore:
    """The store of a run's agent config, opened with this machine's credentials."""
    for t in every():
        dialect = run_store(t.name)
        if dialect is not None and conf.get("credentials") == dialect.CREDENTIALS:
            return dialect.open_run_store(conf)
    return open_store(conf)

