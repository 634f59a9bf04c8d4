"""`python -m sdcloud_agent.trainers.builtin`: the trainer as the agent (or `accelerate launch`) starts it."""

import sys

from .loop import main

sys.exit(main())
