"""A Vast.ai container: a stranger's machine with no metadata service, no role and no reclaim notice.

An outbid instance is paused at once (no notice: the agent uploads each checkpoint as it is saved),
and resumed later on the same machine, where the onstart command starts the agent again. The run's
store keys are the session keys the controller put in the container's environment (the create
request's `env`: scoped to the run's prefix, expiring; sdcloud/providers/vast/credentials.py), read
by boto3's own chain and by the boot's S3 client below. The agent never ends the machine: it exits,
and the controller destroys the instance.
"""

from __future__ import annotations

import os

KIND = "vast"
METADATA_BASE = None
ROLE_CREDENTIALS = None
ENDS_MACHINE = False
END_ACTION = "agent-exit"


def boot_role_keys(metadata: dict, opener) -> dict:
    """{"key", "secret", "token"} from the container's environment (no role to ask). userdata.py copies
    this function into the boot's S3 client, which travels alone: it uses only os."""
    env = os.environ
    if not env.get("AWS_ACCESS_KEY_ID") or not env.get("AWS_SECRET_ACCESS_KEY"):
        raise RuntimeError("no store keys in the container's environment (AWS_ACCESS_KEY_ID): the create request's env")
    return {"key": env["AWS_ACCESS_KEY_ID"], "secret": env["AWS_SECRET_ACCESS_KEY"], "token": env.get("AWS_SESSION_TOKEN", "")}


# As on a machine with no cloud of its own: no notice ever comes (an outbid pauses the container at
# once), boto3's own chain reads the keys from the environment, and the agent exits rather than end
# the machine (a stranger's: the controller destroys the instance).
from .none import end_machine, role_session, watcher  # noqa: E402,F401
