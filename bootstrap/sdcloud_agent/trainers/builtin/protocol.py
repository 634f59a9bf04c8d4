"""The trainer's side of its contract with the host agent (the package docstring has it whole):
exit codes, protocol lines on a reserved stdout, the signals that ask for a stop or a save, and
the test hooks.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from .distributed import DIST


EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


EXIT_SIGTERM, EXIT_SIGINT = 143, 130


# Test hook: seconds to sleep inside a checkpoint save, after the weights are written and before
# trainer_state.json, so a test can kill -9 the process mid-save. Never set it in production.
SAVE_PAUSE_ENV = "SDCLOUD_TRAINER_SAVE_PAUSE"


# Test hook: "STEP:FLAG" raises torch.cuda.OutOfMemoryError at global step STEP unless FLAG (an
# attribute of the parsed flags, e.g. gradient_checkpointing) is on: the agent's OOM ladder
# (sdcloud_agent/oom.py) is driven by it without a GPU. Never set it in production.
OOM_AT_ENV = "SDCLOUD_TRAINER_OOM_AT"


# Test hook: seconds each sample's read takes (a slow dataset disk), counted as data wait.
READ_DELAY_ENV = "SDCLOUD_TRAINER_READ_DELAY"
# With it, only a dataset under this folder reads slowly (a network disk beside the fast local one).
READ_SLOW_DIR_ENV = "SDCLOUD_TRAINER_SLOW_DIR"


class UsageError(Exception):
    """Bad flags or an unusable checkpoint: exit 2 with one line on stderr."""


class Stopped(Exception):
    """SIGTERM/SIGINT before training started: nothing new to save."""


_protocol = sys.stdout  # replaced by reserve_stdout() in main()


def reserve_stdout() -> None:
    """Keep stdout for protocol lines only: protocol writes go to a duplicate of fd 1, and fd 1
    itself (Python prints, C libraries, tqdm misconfigured to stdout) now points at stderr."""
    global _protocol
    sys.stdout.flush()
    _protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def emit(kind: str, payload: dict[str, Any]) -> None:
    if DIST.local_rank:  # one voice per host: its first process (rank 0 alone writes checkpoints)
        return
    _protocol.write(f"SDCLOUD_{kind} {json.dumps(payload, separators=(', ', ': '))}\n")
    _protocol.flush()


def log(msg: str) -> None:
    print(f"[sdcloud-builtin] {msg}", file=sys.stderr, flush=True)


class Signals:
    """Flags set by signal handlers; the training loop polls them between optimizer steps."""

    def __init__(self) -> None:
        self.stop: int | None = None  # the signal number that asked us to stop
        self.save = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGUSR1, self._on_save)

    def _on_stop(self, signum: int, _frame: Any) -> None:
        self.stop = self.stop or signum

    def _on_save(self, _signum: int, _frame: Any) -> None:
        self.save = True

    def exit_code(self) -> int:
        return EXIT_SIGINT if self.stop == signal.SIGINT else EXIT_SIGTERM

    def wait(self, seconds: float) -> None:
        """Sleep up to `seconds`, waking early when a signal asks to stop or save."""
        end = time.monotonic() + seconds
        while not (self.stop or self.save) and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.05))
