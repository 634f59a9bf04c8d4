"""Render the host's user-data: a shell script for cloud-init that boots a bare image into a running agent.

The per-run script carries the run's agent config (no secrets: credentials come from the instance
role), the bucket key of the agent wheel, and `s3lite.py` (the standard-library S3 client that
fetches that wheel before anything is installed) with its run's cloud's role-key fetch put in
(`boot_client`): the script travels alone, and one cloud's fetch is all it needs. Nothing is installed by a package name we do not
publish: the agent comes from the run's bucket, the training environment from a pinned lock.
With no config it renders the launch templates' generic part only, which installs nothing: the
per-run user-data that the controller sends with every launch replaces it.
"""

from __future__ import annotations

import base64
import gzip
import inspect
import json
from importlib import resources

from . import clouds
from .config import SECRET_WORDS as FORBIDDEN_KEYS  # noqa: F401 - kept for callers of the old name
from .config import check_no_secrets as _check_no_secrets

# AWS refuses user-data over 16 KB before base64, Tencent over 16 KB after it: the script must fit both.
MAX_USER_DATA = 16 * 1024

GENERIC = """#!/bin/bash
# sdcloud host template: the per-run user-data sent with each launch boots the host (see docs/host-agent.md).
echo "sdcloud: host template booted without a run; nothing to do"
"""


def _compact(source: str) -> str:
    """The module without its docstrings and comment-only lines: the 16 KB limit is tight. A
    function's or class's docstring goes by its lines (from the parse tree) when more follows it;
    everything else stays as written."""
    import ast

    if source.startswith('"""'):
        source = source[source.index('"""', 3) + 3:].lstrip("\n")
    drop: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and len(body) > 1
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            drop.update(range(body[0].lineno, body[0].end_lineno + 1))
    return "".join(line for i, line in enumerate(source.splitlines(keepends=True), 1)
                   if i not in drop and not line.lstrip().startswith("#"))


def _without_comments(template: str) -> str:
    """The template without its comment-only lines, but for the shebang and the header line after
    it: they explain the script to its readers here, and each launch would carry them under the
    16 KB limit (over 1 KB of the script). Placeholders stay where they are, so nothing that is
    substituted later (the config, s3lite) is touched."""
    lines = template.splitlines(keepends=True)
    return "".join(lines[:2]) + "".join(line for line in lines[2:] if not line.lstrip().startswith("#"))


CLOUD_MARKER = "# @@CLOUD_ROLE_KEYS@@"


def boot_client(agent_config: dict) -> str:
    """s3lite.py with the role-key fetch of the cloud that the config's store and metadata name
    (clouds.boot_cloud): the function's source and the module's string constants it reads."""
    store = agent_config["store"] if isinstance(agent_config["store"], dict) else {"url": agent_config["store"]}
    cloud = clouds.boot_cloud(agent_config.get("metadata"), store)
    fetch = cloud.boot_role_keys
    consts = [f"{n} = {getattr(cloud, n)!r}\n" for n in fetch.__code__.co_names
              if isinstance(getattr(cloud, n, None), str)]
    source = resources.files("sdcloud_agent").joinpath("s3lite.py").read_text()
    if CLOUD_MARKER not in source:
        raise ValueError(f"s3lite.py lost its {CLOUD_MARKER} line")
    lines = source.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith(CLOUD_MARKER))
    lines[at] = "".join(consts) + inspect.getsource(fetch).rstrip("\n")
    return "\n".join(lines)


def render_user_data(agent_config: dict | None = None, wheel_key: str = "", driver: str = "",
                     agent_source: str | None = None) -> str:
    """The user-data script. `wheel_key` is the agent wheel's key in the run's store;
    `driver` an NVIDIA driver series to install when the image has none (Tencent: "535-server").
    `agent_source` is accepted for old callers and ignored: nothing is installed by name."""
    if not agent_config:
        return GENERIC
    if not wheel_key:
        raise ValueError("the per-run user-data needs the agent wheel's key in the bucket")
    _check_no_secrets(agent_config)
    pkg = resources.files("sdcloud_agent")
    template = _without_comments(pkg.joinpath("templates/user-data.sh.tmpl").read_text())
    s3lite = _compact(boot_client(agent_config))
    s3lite_packed = base64.encodebytes(gzip.compress(s3lite.encode(), 9, mtime=0)).decode()
    config_json = json.dumps(agent_config, separators=(",", ":"), sort_keys=True)
    for marker, value in (("SDCLOUD_CONFIG", config_json), ("SDCLOUD_S3LITE", s3lite)):
        if f"\n{marker}\n" in f"\n{value}\n":
            raise ValueError(f"a value contains the heredoc marker {marker}")
    for name, value in (("wheel key", wheel_key), ("driver", driver)):
        if "'" in value or "\n" in value:
            raise ValueError(f"the {name} must not contain quotes or newlines: {value!r}")
    text = (template.replace("@@AGENT_CONFIG@@", config_json)
            .replace("@@S3LITE@@", s3lite_packed.rstrip("\n"))
            .replace("@@WHEEL_KEY@@", wheel_key)
            .replace("@@DRIVER@@", driver)
            .replace("@@REQUIRE_GPU@@", "1" if agent_config.get("require_gpu", True) else "0"))
    size = len(base64.b64encode(text.encode()))
    if size > MAX_USER_DATA:
        raise ValueError(f"user-data is {size} bytes in base64, over the {MAX_USER_DATA}-byte limit")
    return text
