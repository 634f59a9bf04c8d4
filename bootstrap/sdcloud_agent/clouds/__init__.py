"""The host's side of the cloud seam: one module per cloud the agent runs on (docs/architecture.md).

Each of `aws`, `tencent`, `vast` and `none` gives the same four things, so that no other agent module asks
which cloud it is on:

- the metadata service: `METADATA_BASE` (None where there is none) and `KIND`, the value of the
  agent config's `"metadata": {"kind": ...}` that names it (the control plane writes it);
- the reclaim-notice watcher: `watcher(base_url)`, or None where no notice ever comes;
- role credentials: `boot_role_keys(metadata, opener)` for the boot's standard-library S3 client
  (s3lite.py), and `role_session()`, a boto3 session on the instance role where boto3 cannot find
  it by itself (None: boto3's own chain); `ROLE_CREDENTIALS` is the store config's
  `"credentials"` value that asks for it (None: not asked by name);
- how the machine ends itself: `ENDS_MACHINE`, `END_ACTION` and `end_machine(self_end)`;
- `launch_index(base_url)`: this host's index in a group launched in one request (its rank), or None
  where the cloud launches a group host by host.

The registry below maps the config's words to a module; callers ask it, never a name.
Standard library only at import: `python -m sdcloud_agent.selfend` runs on a failed boot without boto3.
"""

from __future__ import annotations

from types import ModuleType

from . import aws, none, tencent, vast

CLOUDS: dict[str, ModuleType] = {m.KIND: m for m in (aws, tencent, vast, none)}


def kinds() -> list[str]:
    """The metadata kinds the agent knows, in a fixed order."""
    return list(CLOUDS)


def for_kind(kind: str | None) -> ModuleType:
    """The cloud of a config's metadata kind; an empty kind is `none`."""
    cloud = CLOUDS.get(kind or none.KIND)
    if cloud is None:
        raise ValueError(f"unknown metadata kind {kind!r}: {', '.join(kinds()[:-1])} or {kinds()[-1]}")
    return cloud


def for_provider(provider: str | None) -> ModuleType:
    """The cloud that ends a host of this provider (the agent config's `self_end.provider`): a
    provider that is not a cloud of its own (a box over SSH, this machine) ends nothing."""
    return CLOUDS.get(provider or none.KIND, none)


def for_credentials(credentials: str | None) -> ModuleType | None:
    """The cloud whose role a store config's `"credentials"` value asks for, or None."""
    for cloud in CLOUDS.values():
        if cloud.ROLE_CREDENTIALS is not None and credentials == cloud.ROLE_CREDENTIALS:
            return cloud
    return None


def boot_cloud(metadata: dict | None, store: dict) -> ModuleType:
    """Whose role signs the boot's S3 requests: the one the store's credentials name, else the
    metadata kind's; a host with no metadata kind (or `none`) asks IMDS, as the boot always has."""
    named = for_credentials(store.get("credentials"))
    if named is not None:
        return named
    cloud = CLOUDS.get((metadata or {}).get("kind", aws.KIND))
    return cloud if cloud is not None and cloud.boot_role_keys is not None else aws


def make_watcher(metadata: dict | None):
    """The reclaim-notice watcher of the config's metadata, or None where no notice comes."""
    metadata = metadata or {}
    return for_kind(metadata.get("kind", none.KIND)).watcher(metadata.get("base_url"))
