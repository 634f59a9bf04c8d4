"""The agent's config: one JSON file written by the control plane (no secrets; see docs/host-agent.md)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

TRAINERS = ("builtin", "diffusers", "kohya", "command")
RANK_SOURCES = ("", "launch-index")  # where a group's host takes its rank: its config, or its launch index
SECRET_WORDS = ("secret", "password", "access_key", "secretkey", "secret_key", "token_value", "session_token")


class ConfigError(ValueError):
    pass


@dataclass
class AgentConfig:
    run_id: str
    attempt: int = 1
    tier: str = ""
    min_vram_gb: float = 0.0
    rec_vram_gb: float = 0.0
    trainer: str = "builtin"
    trainer_args: Any = field(default_factory=dict)  # dict of flags, or a list (argv; the command for "command")
    model: str = "tiny"
    steps: int = 100
    checkpoint_every: int = 50
    # How far a save-bound run's save interval may grow (health_act.py): the user's bound in steps
    # (None: 4x checkpoint_every); the reclaim risk bounds it too (checkpoint_spacing.py).
    checkpoint_every_max: int | None = None
    keep_checkpoints: int = 3
    store: dict = field(default_factory=dict)  # {"url", "endpoint_url", "region", "addressing_style"}
    dataset: str | None = None
    metadata: dict = field(default_factory=lambda: {"kind": "none"})
    workdir: str = "/var/lib/sdcloud"
    nvme: bool | str = True
    heartbeat_seconds: float = 5.0
    poll_seconds: float = 5.0
    require_gpu: bool = True
    # Seconds kept in hand before the notice deadline for the final upload; the trainer gets the rest.
    upload_reserve_seconds: float = 30.0
    # The reclaim risk of a spot host (checkpoint_spacing.py): the provider's notice and the zone's
    # mean time between reclaims. Where a save cannot be durable within the notice, periodic
    # checkpoints are spaced by Young/Daly from these and the measured save time. None: unknown.
    reclaim_notice_seconds: float | None = None
    reclaim_mean_seconds: float | None = None
    # Where the external trainers' sources come from (sdcloud_agent/scripts.py): overrides of the
    # pins in data/trainer-sources.txt, {"kohya_url", "kohya_commit", "diffusers_url", "diffusers_tag"},
    # and "diffusers_examples_lock": a path that replaces data/examples-lock.txt.
    trainer_sources: dict = field(default_factory=dict)
    # How this host ends itself after its terminal phase and its lifetime cap (sdcloud_agent/selfend.py):
    # {"provider", "grace_s", "unattended_after_s", "price_per_hour", "budget_left", "deadline_at",
    # "estimate_hours", "launched_at", "region"}. Absent: the agent just exits, as before.
    self_end: dict = field(default_factory=dict)
    # Where the host gets the package index, the model hub and torch's wheels (network.py).
    network: dict = field(default_factory=dict)
    # The resolution in trainer_args is the tier's fallback: the host replaces it with the model's
    # own once the model is on disk (resolution.py). False when the user chose a resolution.
    resolution_from_model: bool = False
    # A run trained on several hosts (rendezvous.py): how many, this host's rank among them, the port
    # rank 0 listens on, the address it publishes ("" finds this host's private address), and how
    # long another rank waits for it before the attempt fails.
    nodes: int = 1
    node_rank: int = 0
    # "launch-index": the group was launched in one request (one user-data for every host) and this host's
    # rank is its launch index, read from the cloud's metadata at start (agent_nodes.resolve_rank); "" node_rank.
    node_rank_from: str = ""
    rendezvous_port: int = 29500
    rendezvous_addr: str = ""
    rendezvous_timeout_s: float = 900.0
    # Sample images at the checkpoints (samples.py SampleSettings: prompts, every, seed, sampler, steps);
    # empty: none. The curves go to the run's metrics stream every `metrics_seconds` (metrics.py).
    samples: dict = field(default_factory=dict)
    keep_sampled: bool = True  # a checkpoint with samples outlives the newest-`keep_checkpoints` rule (sync.py)
    metrics_seconds: float = 5.0
    # The trainer's own logging besides TensorBoard: "wandb" (its key in the environment, never here).
    report_to: str | None = None

    @property
    def run_prefix(self) -> str:
        return f"runs/{self.run_id}"

    @property
    def mount_point(self) -> str | None:
        if self.nvme is False or self.nvme is None:
            return None
        return self.nvme if isinstance(self.nvme, str) else "/mnt/nvme"


# Values that look like credentials even under an innocent key (AWS key ids, PEM blocks).
SECRET_VALUE_PREFIXES = ("AKIA", "ASIA", "-----BEGIN", "hf_")  # hf_: a Hugging Face token


def check_no_secrets(obj: Any, path: str = "") -> None:
    """Refuse anything that looks like a credential: the config travels in user-data and logs."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if any(w in str(k).lower() for w in SECRET_WORDS):
                raise ConfigError(f"config key {path + str(k)!r} looks like a secret: "
                                  "credentials come from the instance role or the environment")
            check_no_secrets(v, f"{path}{k}.")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            check_no_secrets(v, f"{path}{i}.")
    elif isinstance(obj, str) and obj.startswith(SECRET_VALUE_PREFIXES) and len(obj) >= 16:
        raise ConfigError(f"config value at {path.rstrip('.')!r} looks like a credential")


def from_dict(d: dict) -> AgentConfig:
    check_no_secrets(d)
    known = {f.name for f in fields(AgentConfig)}
    unknown = set(d) - known
    if unknown:
        # A newer control plane may send keys this agent does not know: say so, do not fail.
        logging.getLogger("sdcloud_agent").warning("ignoring unknown config keys: %s", ", ".join(sorted(unknown)))
        d = {k: v for k, v in d.items() if k in known}
    if not d.get("run_id"):
        raise ConfigError("config needs run_id")
    store = d.get("store")
    if isinstance(store, str):
        d = {**d, "store": {"url": store}}
    elif not isinstance(store, dict) or not store.get("url"):
        raise ConfigError("config needs store.url (s3://bucket/prefix or file:///dir)")
    cfg = AgentConfig(**d)
    if cfg.trainer not in TRAINERS:
        raise ConfigError(f"trainer must be one of {', '.join(TRAINERS)}, not {cfg.trainer!r}")
    if cfg.steps <= 0 or cfg.checkpoint_every <= 0:
        raise ConfigError("steps and checkpoint_every must be positive")
    from .network import check as check_network
    try:
        check_network(cfg.network)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.node_rank_from not in RANK_SOURCES:
        raise ConfigError(f"node_rank_from must be one of {', '.join(map(repr, RANK_SOURCES))}, not {cfg.node_rank_from!r}")
    if cfg.nodes < 1 or not 0 <= cfg.node_rank < cfg.nodes:
        raise ConfigError(f"node_rank must be within 0..nodes-1 (nodes={cfg.nodes}, node_rank={cfg.node_rank})")
    if not 0 < cfg.rendezvous_port < 65536:
        raise ConfigError(f"rendezvous_port must be a TCP port, not {cfg.rendezvous_port}")
    if cfg.trainer == "command" and not cfg.trainer_args:
        raise ConfigError("trainer 'command' needs trainer_args: the command line (a list, or {'command': [...]})")
    return cfg


def load(path: str | Path) -> AgentConfig:
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    if not isinstance(d, dict):
        raise ConfigError("config must be a JSON object")
    return from_dict(d)
