"""Render the host's user-data: a shell script for cloud-init that installs and starts the agent.

The rendered text carries the run's agent config (no secrets: credentials come from the
instance role) and never any credential. With no config it renders the generic part only
(install the agent, mount NVMe), which the stacks put in their launch templates.
"""

from __future__ import annotations

import json
from importlib import resources

from .config import SECRET_WORDS as FORBIDDEN_KEYS  # noqa: F401 - kept for callers of the old name
from .config import check_no_secrets as _check_no_secrets


def render_user_data(agent_config: dict | None = None, agent_source: str = "sdcloud") -> str:
    """The user-data script. `agent_source` is what `pip install` gets for the agent (a requirement or URL)."""
    if agent_config:
        _check_no_secrets(agent_config)
    template = resources.files("sdcloud_agent").joinpath("templates/user-data.sh.tmpl").read_text()
    config_json = json.dumps(agent_config or {}, indent=1, sort_keys=True)
    return (template.replace("@@AGENT_SOURCE@@", agent_source)
            .replace("@@AGENT_CONFIG@@", config_json)
            .replace("@@HAS_CONFIG@@", "1" if agent_config else "0"))
