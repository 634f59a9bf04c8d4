"""Where a host gets each outside thing: the run's `network` setting (no secrets, in the config).

    {"pip_index_url": "...", "hf_endpoint": "...", "torch_index_url": "...", "trainer_sources": "bucket"}

- pip_index_url: the package index of every pip install on the host (the environment, kohya's and
  the diffusers examples' venvs), as PIP_INDEX_URL; a mirror inside the cloud's network;
- hf_endpoint: the Hugging Face hub or a mirror of it, as HF_ENDPOINT, for the model phase and for
  what a trainer fetches at run time (kohya's tokenizers);
- torch_index_url: the base of torch's CUDA wheel indexes, `<base>/<cu126|cu130>` a PEP 503 index
  (default https://download.pytorch.org/whl/).
- trainer_sources: "git" (default) fetches kohya's sd-scripts and the diffusers examples with git
  when the run's bucket does not hold them yet; "bucket" takes them from the bucket only (the
  control plane put them there; a host in mainland China does not reach GitHub reliably).
Each one left out (or given as "") keeps the default (the environment's own setting, or the public service). The
agent and the boot's environment phase apply it to their own environment before anything is
fetched, so every process they start inherits it.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from urllib.parse import urlparse

ENV = {"pip_index_url": "PIP_INDEX_URL", "hf_endpoint": "HF_ENDPOINT", "torch_index_url": "SDCLOUD_TORCH_INDEX_URL"}
# Settings that are not environment variables: where the trainer sources come from.
SOURCES = ("git", "bucket")
SETTINGS = (*ENV, "trainer_sources")


def check(network: dict) -> None:
    """ValueError naming the first unknown key or a value that is not an http(s) URL."""
    if not isinstance(network, dict):
        raise ValueError("network must be a mapping of " + ", ".join(SETTINGS))
    for key, value in network.items():
        if key not in SETTINGS:
            raise ValueError(f"network has no setting {key!r}: use {', '.join(SETTINGS)}")
        if key == "trainer_sources":
            if value not in SOURCES:
                raise ValueError(f"network.trainer_sources must be one of {', '.join(SOURCES)}, got {value!r}")
            continue
        if value == "":
            continue  # the default (the public service) again, over a profile's mirror
        url = urlparse(str(value))
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ValueError(f"network.{key} must be an http(s) URL, got {value!r}")


def apply(network: dict | None, environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set the environment variables of the given settings; returns what was set."""
    out = {ENV[k]: str(v) for k, v in (network or {}).items() if k in ENV and v}
    pip = urlparse(out.get("PIP_INDEX_URL", ""))
    if pip.scheme == "http":  # a VPC-internal mirror over plain http (mirrors.tencentyun.com): pip must be told
        out["PIP_TRUSTED_HOST"] = pip.hostname or ""
    environ.update(out)
    return out
