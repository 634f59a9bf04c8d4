"""Data-parallel training: one process per GPU (gloo processes on a CPU), as `accelerate launch` or
torchrun start them; rank 0 alone speaks the protocol and writes checkpoints.
"""

from __future__ import annotations

import os
from typing import Any


# Seconds every rank waits for the others (to join, and at each collective).
TIMEOUT_ENV = "SDCLOUD_RENDEZVOUS_TIMEOUT_S"


class Dist:
    """Data-parallel training across processes (one per GPU; gloo processes on a CPU), started by
    `accelerate launch` or torchrun, which set RANK / WORLD_SIZE / LOCAL_RANK. Every rank holds the
    same weights (same seeded init, the same summed gradients each step); a step's samples are
    split between ranks; rank 0 alone writes checkpoints, the output and protocol lines. Stop and
    save requests are agreed by all ranks after each step, so all stop at the same step."""

    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE") or 1)
        self.rank = int(os.environ.get("RANK") or 0)
        self.local_rank = int(os.environ.get("LOCAL_RANK") or 0)
        self.node = int(os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK") or 0)
        self.torch: Any = None

    @property
    def on(self) -> bool:
        return self.world > 1

    def init(self, torch: Any, device_type: str) -> None:
        if self.on and not torch.distributed.is_initialized():
            import datetime

            self.torch = torch
            # Across hosts (rendezvous.py) a rank that cannot reach the others fails within the
            # agent's limit, with torch's reason, rather than waiting torch's default half hour.
            limit = float(os.environ.get(TIMEOUT_ENV) or 1800)
            torch.distributed.init_process_group("nccl" if device_type == "cuda" else "gloo",
                                                 timeout=datetime.timedelta(seconds=limit))

    def any(self, flag: bool) -> bool:
        if not self.on:
            return flag
        t = self.torch.tensor([1 if flag else 0])
        self.torch.distributed.all_reduce(t, op=self.torch.distributed.ReduceOp.MAX)
        return bool(t.item())

    def sum_(self, tensor: Any) -> None:
        if self.on:
            self.torch.distributed.all_reduce(tensor, op=self.torch.distributed.ReduceOp.SUM)

    def barrier(self) -> None:
        if self.on:
            self.torch.distributed.barrier()

    def close(self) -> None:
        if self.on and self.torch is not None and self.torch.distributed.is_initialized():
            self.torch.distributed.destroy_process_group()


DIST = Dist()
