"""All or none: ranks on different hosts agree each step whether to stop (trainers/builtin/
distributed.py), so a notice on one host stops every rank at the same step. Two gloo processes
with torch.distributed's environment as the rendezvous hands it out (sdcloud_agent/rendezvous.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from sdcloud_agent.rendezvous import Rendezvous

# Each rank steps until the group agrees to stop; rank 1 alone is asked to stop at its step 3 (a
# notice on its host), rank 0 never is. Both print the step they stopped at.
RANK_LOOP = """
import json, os, torch
from sdcloud_agent.trainers.builtin.distributed import DIST
DIST.init(torch, "cpu")
step, asked = 0, False
while step < 50 and not DIST.any(asked):
    step += 1
    asked = DIST.rank == 1 and step >= 3
print(json.dumps({"rank": DIST.rank, "node": DIST.node, "stopped_at": step}))
DIST.close()
"""


def test_a_notice_on_one_host_stops_every_rank_at_the_same_step():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rv = Rendezvous("127.0.0.1", port, 2, 1)
    procs = [subprocess.Popen([sys.executable, "-c", RANK_LOOP], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, **rv.env(rank), "SDCLOUD_RENDEZVOUS_TIMEOUT_S": "60"})
             for rank in (0, 1)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert outs == [{"rank": 0, "node": 0, "stopped_at": 3}, {"rank": 1, "node": 1, "stopped_at": 3}]
