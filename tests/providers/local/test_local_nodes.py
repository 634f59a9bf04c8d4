"""The local provider's multi-node group (sdcloud/providers/local/nodes.py): N agent processes as
N hosts, one instance; their configs meet at one rendezvous; a reclaim is announced to one host;
terminating the instance ends every host. The "agent" here is a stand-in interpreter that sleeps,
so the test sees what the provider starts without training anything."""

from __future__ import annotations

import json
import os
import stat
import time
import urllib.error
import urllib.request
from pathlib import Path

from sdcloud.providers.base import RUNNING, TERMINATED, LaunchSpec


def _fake_python(tmp_path):
    """Stands in for the interpreter: records its arguments, then waits to be ended."""
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\necho \"$@\" > \"$PWD/argv\"\nexec sleep 60\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def _announced(url: str) -> bool:
    token = urllib.request.urlopen(urllib.request.Request(
        f"{url}/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})).read().decode()
    try:
        urllib.request.urlopen(urllib.request.Request(f"{url}/latest/meta-data/spot/instance-action",
                                                      headers={"X-aws-ec2-metadata-token": token}))
        return True
    except urllib.error.HTTPError as exc:
        assert exc.code == 404
        return False


def test_a_group_is_n_hosts_one_instance_one_rendezvous_one_end(sdcloud_home, tmp_path):
    from sdcloud.providers.local.nodes import node_dirs
    from sdcloud.providers.local.provider import LocalProvider

    prov = LocalProvider(price_per_hour=0.5, notice_seconds=30, python=_fake_python(tmp_path))
    offer = prov.offers()[0]
    spec = LaunchSpec(run_id="r-nodes", attempt=1, agent_config={"run_id": "r-nodes", "nodes": 2, "node_rank": 0,
                                                                  "store": "file:///tmp/none"})
    inst = prov.launch(offer, spec, "spot")
    try:
        assert inst.state == RUNNING and inst.price_per_hour == 1.0  # the group's price: two hosts
        dirs = node_dirs(prov, inst.id)
        assert sorted(dirs) == [0, 1]
        cfgs = [json.loads((Path(dirs[k]) / "agent.json").read_text()) for k in (0, 1)]
        assert [c["node_rank"] for c in cfgs] == [0, 1]
        assert {c["rendezvous_addr"] for c in cfgs} == {"127.0.0.1"}
        assert cfgs[0]["rendezvous_port"] == cfgs[1]["rendezvous_port"] > 0
        assert cfgs[0]["workdir"] != cfgs[1]["workdir"]
        assert cfgs[0]["metadata"]["base_url"] != cfgs[1]["metadata"]["base_url"]
        # Adopted on its token as one instance, not launched again.
        assert prov.launch(offer, spec, "spot").id == inst.id
        # A simulated reclaim lands on the group's last host alone.
        events = []
        prov.schedule_reclaim(inst.id, 0.01, events=lambda k, d: events.append(d))
        deadline = time.monotonic() + 5
        while not events and time.monotonic() < deadline:
            time.sleep(0.02)
        assert events and events[0]["node"] == 1
        assert _announced(cfgs[1]["metadata"]["base_url"]) and not _announced(cfgs[0]["metadata"]["base_url"])
        rec = next(r for r in prov._records() if r["id"] == inst.id)
        pids = [n["pid"] for n in rec["nodes"]]
    finally:
        prov.terminate([inst.id])
        prov.close()
    assert prov.describe([inst.id])[0].state == TERMINATED
    for pid in pids:  # every host ended, none left billing
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
