"""No cloud of the agent's own: this machine (the local provider) or a box of the user's over SSH.

No metadata service, no reclaim notice, no role (the store's keys come from the environment or the
controller's credentials file, cloudcreds.py), and the machine is never ended: the agent exits and
frees the GPU.
"""

from __future__ import annotations

KIND = "none"
METADATA_BASE = None
ROLE_CREDENTIALS = None
ENDS_MACHINE = False
END_ACTION = "agent-exit"
# The boot's S3 client has no role to ask here (clouds.boot_cloud falls back to IMDS).
boot_role_keys = None


def watcher(base_url: str | None = None) -> None:
    """No notice ever comes."""
    return None


def role_session() -> None:
    """None: boto3's own credential chain (the environment)."""
    return None


def end_machine(se) -> str:
    """Never power off a machine the user owns, nor this one: the agent exits."""
    return END_ACTION


def launch_index(base_url: str | None = None) -> None:
    """None: this cloud launches a group's hosts one request each, every host's rank in its own config."""
    return None
