"""One host of a multi-node group (`sdcloud up --nodes N`): its rank, where it reports, how it
meets the others, and how it stops with them. A part of the Agent class (agent.py).

Every host of the group runs the same attempt with its own `node_rank`. Rank 0 leads: it holds
the run's lease, writes the run's status.json, uploads checkpoints (its trainer's rank 0 alone
saves them) and the finished model. The others report under `runs/<id>/nodes/<rank>/` (their
status.json and log), restore the same checkpoint from the bucket and upload nothing.

All or none: a reclaim notice on any host makes that host's trainer stop after its step; the
trainer's ranks agree on stopping every step (an all-reduce, trainers/builtin/distributed.py),
so every rank stops at the same step and rank 0 saves one checkpoint. The other hosts see their
trainer exit with the stop code without a notice of their own: the group stopped. Each then ends
its attempt `preempted` (rank 0 after the checkpoint is durable), and the controller relaunches
the whole group from that checkpoint.
"""

from __future__ import annotations

import logging
import subprocess
import time

from . import rendezvous
from .outcome import Failure
from .trainers.base import Context
from .watchers import Notice

log = logging.getLogger("sdcloud_agent")

# The exit code of a trainer that stopped on request and saved (trainers/builtin/protocol.py).
STOPPED_EXIT = 143
# Seconds rank 0 allows itself to make the group's checkpoint durable after the group stopped.
GROUP_STOP_UPLOAD_S = 120.0


RANK_TRIES = 5  # the metadata service answers within a second of boot; a few tries, 1 s apart


def resolve_rank(cfg, sleep=time.sleep) -> None:
    """A host of a group launched in one request (`node_rank_from: launch-index`, one user-data for
    every host) takes its rank from its launch index, read from the cloud's metadata before anything
    uses the rank. A cloud that launches host by host (no launch index) keeps the config's rank.
    Raises ConfigError where the index cannot be read or lies outside the group."""
    from .clouds import for_kind
    from .config import ConfigError

    if cfg.nodes <= 1 or cfg.node_rank_from != "launch-index":
        return
    metadata = cfg.metadata or {}
    cloud = for_kind(metadata.get("kind"))
    error: Exception | None = None
    for attempt in range(RANK_TRIES):
        try:
            index = cloud.launch_index(metadata.get("base_url"))
            break
        except OSError as exc:
            error = exc
            if attempt + 1 < RANK_TRIES:
                sleep(1.0)
    else:
        raise ConfigError(f"this host's rank: {error}")
    if index is None:
        return
    if not 0 <= index < cfg.nodes:
        raise ConfigError(f"launch index {index} is outside the group of {cfg.nodes} hosts")
    cfg.node_rank = index
    log.info("rank %d of %d: this host's launch index", index, cfg.nodes)


class _NoLease:
    """A host other than rank 0 writes nothing the run's lease guards."""

    def acquire(self) -> None:
        return None

    def start(self, every: float, on_lost) -> "_NoLease":
        return self

    def release(self) -> None:
        return None


class NodeGroup:
    @property
    def multi_node(self) -> bool:
        return self.cfg.nodes > 1

    @property
    def leads(self) -> bool:
        """Rank 0 (and every single-host run) speaks for the run."""
        return self.cfg.node_rank == 0

    @property
    def node_prefix(self) -> str:
        """Where this host reports: the run's prefix for rank 0, runs/<id>/nodes/<rank> for the others."""
        return node_prefix(self.cfg.run_prefix, self.cfg.node_rank)

    def _make_lease(self, make):
        return make() if self.leads else _NoLease()

    def _join_group(self, ctx: Context) -> None:
        """Rank 0 publishes its address and port; the others wait for it (the config's limit),
        then the trainer gets torch.distributed's environment. A host that cannot join fails the
        attempt with the reason; the controller ends the whole group."""
        cfg = self.cfg
        if not self.multi_node:
            return
        t0 = time.monotonic()
        if self.leads:
            addr = cfg.rendezvous_addr or rendezvous.private_address()
            rv = rendezvous.publish(self.store, cfg.attempt, addr, cfg.rendezvous_port, cfg.nodes,
                                    run_prefix=cfg.run_prefix)
            log.info("rendezvous: rank 0 of %d listens on %s:%d", cfg.nodes, rv.addr, rv.port)
        else:
            log.info("rendezvous: node %d of %d waits for rank 0 (at most %.0fs)", cfg.node_rank, cfg.nodes,
                     cfg.rendezvous_timeout_s)
            try:
                rv = rendezvous.wait_for(self.store, cfg.attempt, cfg.rendezvous_timeout_s,
                                         run_prefix=cfg.run_prefix, stop=self.notice_event.is_set)
            except rendezvous.RendezvousTimeout as exc:
                # This host's problem, as a boot that failed: the controller ends the group's attempt
                # and launches a fresh group (failed boots in a row end the run).
                raise Failure(f"node {cfg.node_rank}: {exc}", boot_phase="rendezvous",
                              cause="rendezvous-timeout") from None
            if rv.nodes != cfg.nodes:  # hosts of one attempt told different group sizes: none can join
                raise Failure(f"node {cfg.node_rank}: rank 0 of attempt {cfg.attempt} leads {rv.nodes} hosts, "
                              f"this host was told {cfg.nodes}", cause="bad-config")
            log.info("rendezvous: joining rank 0 at %s:%d after %.1fs", rv.addr, rv.port, time.monotonic() - t0)
        ctx.rendezvous, ctx.node_rank = rv, cfg.node_rank
        ctx.env[rendezvous.TIMEOUT_ENV] = str(int(cfg.rendezvous_timeout_s))
        if ctx.gpus <= 1:  # one process on this host: torchrun's variables; a launcher sets them per GPU
            ctx.env.update(rv.env(cfg.node_rank))
        self.status.update(nodes=cfg.nodes, node_rank=cfg.node_rank, rendezvous=f"{rv.addr}:{rv.port}")

    def _stopped_with_group(self, ctx: Context, proc: subprocess.Popen, rc: int) -> int | None:
        """The trainer stopped and saved without a notice on this host: another host of the group
        was reclaimed (or asked to end), and every rank stopped at the same step. End this
        attempt as the group's: rank 0 makes the one checkpoint durable first. None: not that."""
        if not self.multi_node or rc != STOPPED_EXIT or self.notice_event.is_set():
            return None
        now = time.time()
        self.notice = Notice("terminate", now + GROUP_STOP_UPLOAD_S, now,
                             "another host of the group was reclaimed: every node stopped at the same step")
        self.notice_event.set()
        return self._handle_notice(ctx, proc)


def node_prefix(run_prefix: str, node_rank: int) -> str:
    """The prefix one host of a run reports under (status.json, logs/): rank 0 the run's own."""
    return run_prefix if node_rank == 0 else f"{run_prefix}/nodes/{int(node_rank)}"
