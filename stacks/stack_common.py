"""What both sdcloud stacks check and render the same way: the bucket prefix, the SSH network, and
the generic host user-data from bootstrap/. Each stack puts this folder on sys.path to import it,
so that it also runs alone with `pulumi up` in its own folder."""

from __future__ import annotations

import ipaddress
import re
import sys
from pathlib import Path


def check_prefix(prefix: str) -> str:
    """The key prefix inside the bucket: a few path segments of safe characters, no slashes at the ends."""
    prefix = prefix.strip().strip("/")
    if not prefix or not re.fullmatch(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*", prefix) or ".." in prefix:
        raise ValueError(f"sdcloud:prefix must be path segments of letters, digits, '.', '_' or '-', got {prefix!r}")
    return prefix


def check_ssh_cidr(cidr: str) -> str:
    """'' (no SSH at all) or one network; never the whole internet."""
    cidr = (cidr or "").strip()
    if not cidr:
        return ""
    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise ValueError(f"sdcloud:sshCidr must be a network such as 203.0.113.7/32, got {cidr!r}") from None
    if net.prefixlen == 0:
        raise ValueError("sdcloud:sshCidr must not be the whole internet: give your own address, e.g. 203.0.113.7/32")
    return str(net)


def generic_user_data(agent_source: str) -> str:
    """The generic host user-data from bootstrap/ (installs the agent; no run config, no secrets)."""
    try:
        from sdcloud_agent.userdata import render_user_data as render
    except ImportError:
        # Run alone with `pulumi up` from a checkout: use the bootstrap/ folder beside stacks/.
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bootstrap"))
        from sdcloud_agent.userdata import render_user_data as render
    return render(None, agent_source=agent_source)


# Ports the hosts of one multi-node group open to each other, and to nobody else (a rule whose source is
# the hosts' own security group): rank 0's rendezvous (torch.distributed's default port, the agent
# config's rendezvous_port) and the ports NCCL and gloo listen on for their data, which Linux picks
# from its ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by default). docs/training.md.
GROUP_PORTS = ((29500, 29500, "rendezvous of a multi-node run, between sdcloud hosts only"),
               (32768, 60999, "NCCL and gloo of a multi-node run, between sdcloud hosts only"))
