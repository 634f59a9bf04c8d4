"""`accelerate launch`'s options for a host of a multi-node group (kohya's and the diffusers scripts).

Every host of the group runs the same command but its rank: accelerate starts this host's processes
and joins them to rank 0's torch.distributed store at the address rank 0 published in the run's
bucket (sdcloud_agent/rendezvous.py). `--num_processes` is the whole world's (accelerate divides it
by `--num_machines`), `--multi_gpu` because a world of several machines is distributed even with one
GPU each. Options the user put on the launcher that say the same (a machine count, a rank, an
address, a process count) give way to the group's: the group is what sdcloud launched.
"""

from __future__ import annotations

from typing import Any

# accelerate launch's options that the group decides (accelerate/commands/launch.py).
GROUP_OPTIONS = ("--num_machines", "--machine_rank", "--main_process_ip", "--main_process_port", "--num_processes")


def without_group_options(options: list[str]) -> list[str]:
    """`options` less those the group decides (`--flag value` and `--flag=value`)."""
    out, skip = [], False
    for opt in options:
        if skip:
            skip = False
            continue
        name = opt.split("=", 1)[0]
        if name in GROUP_OPTIONS:
            skip = "=" not in opt
            continue
        out.append(opt)
    return out


def machine_options(ctx: Any, options: list[str]) -> list[str]:
    """The launcher's options for this host: `options` as given on one host, the group's on several.
    `ctx` is the adapter's trainers.base.Context (its rendezvous, node_rank and gpus)."""
    rv = ctx.rendezvous
    if rv is None or int(rv.nodes) <= 1:
        return list(options)
    per_host = max(1, int(ctx.gpus or 0))
    kept = [o for o in without_group_options(options) if o != "--multi_gpu"]
    return ["--multi_gpu", "--num_processes", str(per_host * int(rv.nodes)), "--num_machines", str(rv.nodes),
            "--machine_rank", str(ctx.node_rank), "--main_process_ip", str(rv.addr),
            "--main_process_port", str(rv.port), *kept]
