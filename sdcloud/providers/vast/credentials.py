"""The run's store on a stranger's machine: keys that reach only the run's prefix, and expire.

A Vast.ai host is someone else's machine with no cloud role. No long-lived key of the user's goes
there: at launch the controller asks AWS STS for a session whose policy allows objects under
`runs/<run id>/` and the shared `cache/` only (the SSH provider's policy: providers/ssh/credentials.py,
reused), and hands it to the container in the create request's `env` (never the onstart script,
never a log or the state store). The session lasts `[vast] credentials_hours` (default 12; STS takes
0.25 to 36 h for GetFederationToken, at most the role's maximum for AssumeRole on
SDCLOUD_SSH_STORE_ROLE_ARN). No channel reaches a running Vast.ai container to renew them, so a run
longer than that fails its uploads once they expire and is relaunched with fresh keys (docs/providers-vast.md).
"""

from __future__ import annotations

from ... import config
from ...errors import UserError
from ..ssh.credentials import StoreCredentials
from .session import NAME

DEFAULT_HOURS = 12.0
MIN_HOURS, MAX_HOURS = 0.25, 36.0  # STS GetFederationToken's DurationSeconds: 900 to 129600


def credentials_hours() -> float:
    value = (config.settings().get(NAME) or {}).get("credentials_hours", DEFAULT_HOURS)
    try:
        hours = float(value)
    except (TypeError, ValueError):
        hours = -1.0
    if not MIN_HOURS <= hours <= MAX_HOURS:
        raise UserError(f"[{NAME}] credentials_hours must be from {MIN_HOURS:g} to {MAX_HOURS:g}, got {value!r}")
    return hours


def host_env(store_conf: dict, run_id: str, hours: float | None = None) -> dict[str, str]:
    """The environment that gives the host its scoped, expiring store keys ({} where the store needs none)."""
    if not StoreCredentials.needed(store_conf):
        return {}
    hours = credentials_hours() if hours is None else hours
    keys = StoreCredentials(store_conf, run_id, seconds=int(hours * 3600)).current()
    return {"AWS_ACCESS_KEY_ID": keys["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": keys["SecretAccessKey"],
            "AWS_SESSION_TOKEN": keys["SessionToken"], "SDCLOUD_STORE_KEYS_EXPIRE": str(keys["Expiration"])}
