"""Render the host's user-data: a shell script for cloud-init that installs and starts the agent.

The rendered text carries the run's agent config (no secrets: credentials come from the
instance role) and never any credential. With no config it renders the generic part only
(install the agent, mount NVMe), which the stacks put in their launch templates.
"""

from __future__ import annotations

import json
from importlib import resources

from .config import SECRET_WORDS as FORBIDDEN_KEYS  # one list for the renderer and the agent

# Values that look like credentials even under an innocent key (AWS key ids, PEM blocks).
_SECRET_VALUE_PREFIXES = ("AKIA", "ASIA", "-----BEGIN")


def _check_no_secrets(obj, path: str = "") -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            if any(word in str(k).lower() for word in FORBIDDEN_KEYS):
                raise ValueError(f"agent config key {path + str(k)!r} looks like a secret: credentials come from the instance role")
            _check_no_secrets(v, f"{path}{k}.")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _check_no_secrets(v, f"{path}{i}.")
    elif isinstance(obj, str) and obj.startswith(_SECRET_VALUE_PREFIXES) and len(obj) >= 16:
        raise ValueError(f"agent config value at {path.rstrip('.')!r} looks like a credential")


def render_user_data(agent_config: dict | None = None, agent_source: str = "sdcloud") -> str:
    """The user-data script. `agent_source` is what `pip install` gets for the agent (a requirement or URL)."""
    if agent_config:
        _check_no_secrets(agent_config)
    template = resources.files("sdcloud_agent").joinpath("templates/user-data.sh.tmpl").read_text()
    config_json = json.dumps(agent_config or {}, indent=1, sort_keys=True)
    return (template.replace("@@AGENT_SOURCE@@", agent_source)
            .replace("@@AGENT_CONFIG@@", config_json)
            .replace("@@HAS_CONFIG@@", "1" if agent_config else "0"))
