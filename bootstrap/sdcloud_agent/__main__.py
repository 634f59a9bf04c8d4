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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .agent import EXIT_FAILED, Agent
    from .config import ConfigError, load
    try:
        cfg = load(args.config)
    except ConfigError as exc:
        logging.getLogger("sdcloud_agent").error("%s", exc)
        return EXIT_FAILED
    return Agent(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
