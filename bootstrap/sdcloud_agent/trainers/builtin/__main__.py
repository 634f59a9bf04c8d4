"""`python -m sdcloud_agent.trainers.builtin`: the trainer as the agent (or `accelerate launch`) starts it."""

import logging
import os
import sys

from .loop import main

code = main()
# Leave without the interpreter's teardown. Unloading torch, diffusers and transformers takes about
# 1.7 s of CPU after the last checkpoint is on disk, and the agent (on a reclaim notice, with a
# deadline) waits for the exit. By now every file the trainer wrote is closed and synced and no
# thread of ours runs; only the streams need their buffers written out.
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code if isinstance(code, int) else 1)
