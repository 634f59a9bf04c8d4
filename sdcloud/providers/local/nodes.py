"""A multi-node group on this machine (`sdcloud up --provider local --nodes N`): N agent processes
as N hosts, one instance to the controller.

Each host is an agent of its own (its folder `hosts/<token>/node-<rank>/`, its config with its
`node_rank`, its own metadata endpoint, so a reclaim can be announced to one host alone); they
meet through the run's bucket at 127.0.0.1 on a port free at launch (sdcloud_agent/rendezvous.py)
and train with gloo on the CPU. The controller sees one instance whose price is the group's
(N times the host's), running while any host runs, ended as one: terminating it ends every host.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from ...events import Kind
from ...offers.groups import node_count
from ..base import EventSink, Instance, LaunchSpec
from .metadata import MetadataServer


def group_limit(gpus: int) -> tuple[int, str]:
    """The most hosts of a group this machine runs, and why: each host trains in a process of its own
    (a core each, at least), and where this machine has GPUs, on a GPU of its own (NCCL takes no two
    ranks on one GPU). `gpus`: this machine's NVIDIA GPUs (0: it trains on the CPU)."""
    try:
        cores = len(os.sched_getaffinity(0))  # the cores this process may use, not the machine's
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    words = f"{cores} CPU core{'s' if cores != 1 else ''}"
    if gpus and gpus < cores:
        return gpus, f"{gpus} GPU{'s' if gpus != 1 else ''}, one a host"
    return cores, f"{words}, one a host"


class GroupMetadata:
    """The metadata endpoints of a group's hosts, one per node: a reclaim is announced on one."""

    def __init__(self, n: int) -> None:
        self.nodes = [MetadataServer() for _ in range(n)]

    @property
    def base_url(self) -> str:
        return self.nodes[0].base_url

    def close(self) -> None:
        for server in self.nodes:
            server.close()


def free_port() -> int:
    """A TCP port free on loopback now, for rank 0 to listen on (a test machine runs many groups)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_group(provider: Any, offer: Any, spec: LaunchSpec, market: str, host_dir: Path,
                 events: EventSink) -> Instance:
    """`provider`: the LocalProvider (provider.py), whose one agent start serves every host.
    Start the group's N agents, rank 0 first; one record (the group) with each host's pid. The
    record's own folder is rank 0's: the controller reads the run's host-side status.json there."""
    n = node_count(spec.agent_config)
    metadata = GroupMetadata(n)
    port = free_port()
    nodes = []
    for rank in range(n):
        node_dir = host_dir / f"node-{rank}"
        node_dir.mkdir(parents=True, exist_ok=True)
        cfg = {**spec.agent_config, "node_rank": rank, "rendezvous_addr": "127.0.0.1", "rendezvous_port": port,
               "workdir": str(node_dir / "work")}
        proc = provider._start_agent(spec, node_dir, metadata.nodes[rank], cfg)
        nodes.append({"rank": rank, "pid": proc.pid, "host_dir": str(node_dir),
                      "metadata_url": metadata.nodes[rank].base_url})
    instance_id = f"local-{nodes[0]['pid']}-{spec.token[-8:]}"
    provider._metadata[instance_id] = metadata
    rec = {"id": instance_id, "pid": nodes[0]["pid"], "market": market, "price_per_hour": provider.price_per_hour,
           "tags": spec.tags, "created": time.time(), "host_dir": nodes[0]["host_dir"], "metadata_url": metadata.base_url,
           "nodes": nodes}
    provider._write_record(rec)
    events(Kind.HOST_STARTED, {"instance": instance_id, "pid": nodes[0]["pid"], "nodes": n,
                               "pids": [node["pid"] for node in nodes]})
    return provider._instance(rec)


def node_dirs(provider: Any, instance_id: str) -> dict[int, str]:
    """Each host's folder of a group instance ({0: its own folder} for a single host)."""
    rec = next((r for r in provider._records() if r["id"] == instance_id), None)
    if rec is None:
        return {}
    return {int(n["rank"]): n["host_dir"] for n in rec.get("nodes") or []} or {0: rec["host_dir"]}
