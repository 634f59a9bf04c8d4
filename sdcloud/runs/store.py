"""The control plane's object store: the agent's (sdcloud_agent.store) plus how this machine reaches a
run's bucket, which differs from the host's for COS (the host uses its CAM role, we the user's keys)."""

from __future__ import annotations

import os

from sdcloud_agent.store import NotFound, ObjectInfo, ObjectStore, StoreError, open_store

from .. import config
from ..errors import UserError

__all__ = ["NotFound", "ObjectInfo", "ObjectStore", "StoreError", "open_store", "open_run_store", "store_config"]


def store_config(provider: str, store: str | None, region: str | None, infra: dict | None) -> dict:
    """Where an owner's (a training run's, a batch job's) objects live, as the agent's store config.

    An explicit `store` URL wins; local and SSH hosts share this machine's bucket folder; AWS and
    Tencent use the bucket of `sdcloud infra up` (Tencent: COS through its S3 endpoint, virtual
    addressing, and the host signing with its CVM role's temporary keys).
    """
    if store:
        conf = {"url": store}
        endpoint = os.environ.get("SDCLOUD_STORE_ENDPOINT")
        if endpoint:
            conf["endpoint_url"] = endpoint
        return conf
    if provider in ("local", "ssh"):
        return {"url": (config.home() / "bucket").resolve().as_uri()}
    if infra and infra.get("bucket"):
        conf = {"url": f"s3://{infra['bucket']}/{infra.get('prefix', 'sdcloud')}"}
        for key in ("endpoint_url", "region", "addressing_style"):
            if infra.get(key):
                conf[key] = infra[key]
        if provider == "tencent":
            conf.update({"endpoint_url": infra.get("endpoint") or infra.get("endpoint_url")
                         or f"https://cos.{infra.get('region') or region}.myqcloud.com",
                         "region": infra.get("region") or region, "addressing_style": "virtual",
                         "credentials": "tencent-cvm-role"})
        return conf
    raise UserError(f"no bucket for provider {provider}: run `sdcloud infra up --provider {provider}` "
                    "or pass --store s3://BUCKET/PREFIX")


def open_run_store(conf: dict) -> ObjectStore:
    """The store of a run's agent config, opened with this machine's credentials."""
    if conf.get("credentials") == "tencent-cvm-role":
        from urllib.parse import urlparse

        from ..providers.tencent import storage as tencent_cos

        url = urlparse(conf["url"])
        return tencent_cos.open_store(url.netloc, url.path.strip("/"), conf.get("region", ""), conf.get("endpoint_url"))
    return open_store(conf)
