"""How a run's bucket on COS is reached: the host with its CVM role, this machine with the user's keys.

runs/records/store.py asks this module (through `traits("tencent").run_store`) instead of naming Tencent:
the bucket `sdcloud infra up` made is COS behind its S3 endpoint, addressed virtually, and the
agent config says that the host signs with its role's temporary keys (`CREDENTIALS`), which this
machine does not have, so it opens the same bucket through a COS client on the user's keys.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

# The store config's `credentials` value (a wire value the agent reads too: sdcloud_agent.store):
# the host signs with its CVM role's temporary keys.
CREDENTIALS = "tencent-cvm-role"


def run_store_config(conf: dict, infra: dict, region: str | None) -> dict:
    """The generic S3 store config of the stack's bucket, made COS's: endpoint, region, addressing, role."""
    conf.update({"endpoint_url": infra.get("endpoint") or infra.get("endpoint_url")
                 or f"https://cos.{infra.get('region') or region}.myqcloud.com",
                 "region": infra.get("region") or region, "addressing_style": "virtual",
                 "credentials": CREDENTIALS})
    return conf


def open_run_store(conf: dict) -> Any:
    """The run's COS bucket, opened with this machine's credentials (the user's keys)."""
    from . import storage

    url = urlparse(conf["url"])
    return storage.open_store(url.netloc, url.path.strip("/"), conf.get("region", ""), conf.get("endpoint_url"))
