"""Where a multi-node attempt meets: rank 0's address and port, through the run's bucket.

A run trained on N hosts (`sdcloud up --nodes N`) starts N agents with the same attempt number
and node ranks 0..N-1. The hosts know nothing of each other's addresses when they boot (a cloud
gives each its private address only once it runs), but all of them reach the run's bucket. So
rank 0's agent writes

    <run prefix>/rendezvous/<attempt>.json = {"addr", "port", "nodes", "attempt", "time"}

and every other rank polls that one object until it appears, then hands `addr:port` to
torch.distributed (MASTER_ADDR / MASTER_PORT; `accelerate launch --main_process_ip/port`). The
key carries the attempt, so a host of a newer attempt never joins an older attempt's rank 0. A
host that cannot join within its limit fails the attempt with the reason (`RendezvousTimeout`):
the controller then ends the whole group, which is one unit.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Callable

from .store import NotFound, ObjectStore, StoreError

# The port torch.distributed uses by default; the agent config's `rendezvous_port` overrides it.
DEFAULT_PORT = 29500
# How long a rank other than 0 waits for rank 0's address by default: rank 0's host may boot
# minutes later than the others (its own environment restore, a slower zone).
DEFAULT_TIMEOUT_S = 900.0
POLL_S = 1.0
# The trainer's limit on joining and on each collective (trainers/builtin/distributed.py reads it).
TIMEOUT_ENV = "SDCLOUD_RENDEZVOUS_TIMEOUT_S"


class RendezvousTimeout(Exception):
    """Rank 0's address did not appear in time: the attempt fails with this reason."""


@dataclass(frozen=True)
class Rendezvous:
    addr: str
    port: int
    nodes: int
    attempt: int

    def env(self, node_rank: int, procs_per_node: int = 1) -> dict[str, str]:
        """torch.distributed's environment for a single process per node (torchrun's variables);
        a launcher that starts several processes per node sets RANK/LOCAL_RANK itself."""
        return {"MASTER_ADDR": self.addr, "MASTER_PORT": str(self.port),
                "WORLD_SIZE": str(self.nodes * procs_per_node), "RANK": str(node_rank * procs_per_node),
                "LOCAL_RANK": "0", "NODE_RANK": str(node_rank)}


def key(attempt: int, run_prefix: str = "") -> str:
    """The rendezvous object of one attempt, under the run's prefix."""
    return "/".join(p for p in (run_prefix.strip("/"), f"rendezvous/{int(attempt)}.json") if p)


def publish(store: ObjectStore, attempt: int, addr: str, port: int, nodes: int, *,
            run_prefix: str = "") -> Rendezvous:
    """Rank 0: say where this attempt's group meets. Rewriting it is harmless (same attempt, same host)."""
    if nodes < 1 or not 0 < int(port) < 65536 or not addr:
        raise ValueError(f"bad rendezvous: addr={addr!r} port={port!r} nodes={nodes!r}")
    rv = Rendezvous(addr=str(addr), port=int(port), nodes=int(nodes), attempt=int(attempt))
    doc = {"addr": rv.addr, "port": rv.port, "nodes": rv.nodes, "attempt": rv.attempt, "time": time.time()}
    store.put(key(attempt, run_prefix), json.dumps(doc).encode())
    return rv


def read(store: ObjectStore, attempt: int, *, run_prefix: str = "") -> Rendezvous | None:
    """This attempt's rendezvous, or None while rank 0 has not published it."""
    try:
        doc = json.loads(store.get(key(attempt, run_prefix)))
    except NotFound:
        return None
    except ValueError:
        return None  # half-read on a store without atomic writes: the next poll sees it whole
    if int(doc.get("attempt", -1)) != int(attempt):
        return None
    return Rendezvous(addr=str(doc["addr"]), port=int(doc["port"]), nodes=int(doc["nodes"]), attempt=int(attempt))


def wait_for(store: ObjectStore, attempt: int, timeout_s: float = DEFAULT_TIMEOUT_S, *, run_prefix: str = "",
             poll_s: float = POLL_S, stop: Callable[[], bool] | None = None,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Rendezvous:
    """A rank other than 0: poll for rank 0's address until `timeout_s` has passed (then
    RendezvousTimeout), or until `stop()` says this host is being taken away (also a timeout,
    with that reason). A store error while polling is retried within the same limit."""
    deadline = clock() + max(0.0, timeout_s)
    last_error = ""
    while True:
        try:
            got = read(store, attempt, run_prefix=run_prefix)
        except StoreError as exc:
            got, last_error = None, f" (last store error: {exc})"
        if got is not None:
            return got
        if stop is not None and stop():
            raise RendezvousTimeout(f"stopped while waiting for rank 0 of attempt {attempt} to publish its address")
        if clock() >= deadline:
            raise RendezvousTimeout(
                f"rank 0 of attempt {attempt} did not publish its address within {timeout_s:g}s "
                f"({key(attempt, run_prefix)} absent){last_error}: this host cannot join the group")
        sleep(min(poll_s, max(0.01, deadline - clock())))


def private_address() -> str:
    """This host's private address as the other hosts of its zone reach it: the interface the
    route to a private range leaves by (nothing is sent), else loopback."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 1))
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        s.close()
