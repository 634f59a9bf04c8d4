"""`python -m sdcloud_agent run --config FILE`: exit 0 succeeded, 3 preempted, 1 failed."""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sdcloud_agent", description="sdcloud host agent")
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run one training attempt from a config file")
    run.add_argument("--config", required=True, help="the agent config (JSON)")
    disk = sub.add_parser("nvme", help="RAID0, format and mount the local NVMe disks (needs root)")
    disk.add_argument("--mount", default="/mnt/nvme")
    disk.add_argument("--dry-run", action="store_true", help="print the plan and the commands only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.cmd == "nvme":
        return _nvme(args.mount, args.dry_run)
    if _is_batch(args.config):  # a batch worker host: no trainer, items from the bucket
        from .batch.host import run_host

        return run_host(args.config)
    from .agent import EXIT_FAILED, Agent
    from .agent_nodes import resolve_rank
    from .config import ConfigError, load
    try:
        cfg = load(args.config)
        resolve_rank(cfg)  # a host of a group launched in one request: its rank is its launch index
    except ConfigError as exc:
        logging.getLogger("sdcloud_agent").error("%s", exc)
        return EXIT_FAILED
    agent = Agent(cfg)
    rc = agent.run()
    # Its terminal phase: the host ends itself after the grace unless the controller ends it first.
    agent.end_host(rc)
    return rc


def _is_batch(path: str) -> bool:
    import json

    try:
        with open(path, encoding="utf-8") as f:
            return "batch" in json.load(f)
    except (OSError, ValueError):
        return False


def _nvme(mount: str, dry_run: bool) -> int:
    import json

    from . import nvme
    if dry_run:
        p = nvme.plan(nvme.read_lsblk(), mount)
        print(json.dumps({"plan": p.__dict__, "commands": nvme.commands(p)}, indent=1))
        return 0
    path, _ = nvme.setup(mount)
    print(path or "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
