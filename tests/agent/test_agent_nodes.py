"""One host of a multi-node group (sdcloud_agent/agent_nodes.py): where it reports, what it joins,
and how it ends its attempt when another host's notice stopped the group."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from sdcloud_agent import agent_nodes, rendezvous
from sdcloud_agent.config import from_dict
from sdcloud_agent.outcome import Failure
from sdcloud_agent.store import open_store
from sdcloud_agent.trainers.base import Context


class Host(agent_nodes.NodeGroup):
    def __init__(self, tmp_path, **cfg):
        self.cfg = from_dict({"run_id": "r1", "store": f"file://{tmp_path}/bucket", **cfg})
        self.store = open_store(self.cfg.store)
        self.notice, self.notice_event = None, threading.Event()
        self.status = SimpleNamespace(fields={}, update=lambda **kw: self.status.fields.update(kw))
        self.handled = None

    def _handle_notice(self, ctx, proc):
        self.handled = self.notice
        return 3


def _ctx(tmp_path) -> Context:
    return Context(steps=10, checkpoint_every=5, model="tiny", workdir=tmp_path, checkpoint_dir=tmp_path / "c",
                   output_dir=tmp_path / "o")


def test_rank0_reports_for_the_run_and_the_others_under_nodes(tmp_path):
    assert Host(tmp_path).node_prefix == "runs/r1"
    assert Host(tmp_path, nodes=3, node_rank=2).node_prefix == "runs/r1/nodes/2"
    assert isinstance(Host(tmp_path, nodes=2, node_rank=1)._make_lease(lambda: "lease"), agent_nodes._NoLease)
    assert Host(tmp_path, nodes=2)._make_lease(lambda: "lease") == "lease"  # rank 0 holds the run's lease


def test_the_group_meets_and_each_trainer_gets_its_rank(tmp_path):
    lead = Host(tmp_path, nodes=2, attempt=4, rendezvous_addr="127.0.0.1", rendezvous_port=29555)
    other = Host(tmp_path, nodes=2, node_rank=1, attempt=4, rendezvous_timeout_s=5)
    a, b = _ctx(tmp_path), _ctx(tmp_path)
    lead._join_group(a)
    other._join_group(b)
    assert a.env["MASTER_ADDR"] == b.env["MASTER_ADDR"] == "127.0.0.1"
    assert a.env["MASTER_PORT"] == b.env["MASTER_PORT"] == "29555"
    assert (a.env["RANK"], b.env["RANK"], b.env["WORLD_SIZE"]) == ("0", "1", "2")
    assert b.env[rendezvous.TIMEOUT_ENV] == "5" and b.node_rank == 1
    assert other.status.fields["rendezvous"] == "127.0.0.1:29555"


def test_a_host_that_cannot_join_fails_the_attempt_with_the_reason(tmp_path):
    late = Host(tmp_path, nodes=2, node_rank=1, attempt=2, rendezvous_timeout_s=0.2)
    with pytest.raises(Failure) as err:
        late._join_group(_ctx(tmp_path))
    assert (err.value.cause, err.value.boot_phase) == ("rendezvous-timeout", "rendezvous")
    assert "node 1: rank 0 of attempt 2 did not publish its address" in str(err.value)


def test_a_host_told_another_group_size_than_rank0_does_not_join(tmp_path):
    rendezvous.publish(open_store(f"file://{tmp_path}/bucket"), 1, "10.0.0.1", 29500, 3, run_prefix="runs/r1")
    with pytest.raises(Failure, match="leads 3 hosts, this host was told 2"):
        Host(tmp_path, nodes=2, node_rank=1, rendezvous_timeout_s=1)._join_group(_ctx(tmp_path))


def test_a_trainer_stopped_by_another_hosts_notice_ends_the_attempt_as_the_groups(tmp_path):
    host = Host(tmp_path, nodes=2)
    assert host._stopped_with_group(_ctx(tmp_path), None, 143) == 3
    assert "another host of the group was reclaimed" in host.handled.detail
    # Not a group stop: a single host, another exit code, or this host's own notice.
    assert Host(tmp_path)._stopped_with_group(_ctx(tmp_path), None, 143) is None
    assert Host(tmp_path, nodes=2)._stopped_with_group(_ctx(tmp_path), None, 1) is None
    own = Host(tmp_path, nodes=2)
    own.notice_event.set()
    assert own._stopped_with_group(_ctx(tmp_path), None, 143) is None


def test_several_gpus_a_host_launch_every_hosts_gpus_in_one_world(tmp_path):
    from sdcloud_agent.trainers.builtin_adapter import BuiltinTrainer

    ctx = _ctx(tmp_path)
    ctx.gpus, ctx.node_rank = 4, 1
    ctx.rendezvous = rendezvous.Rendezvous("10.0.0.5", 29500, 2, 1)
    cmd = BuiltinTrainer().command(ctx)
    at = {flag: cmd[cmd.index(flag) + 1] for flag in ("--num_processes", "--num_machines", "--machine_rank",
                                                     "--main_process_ip", "--main_process_port")}
    assert at == {"--num_processes": "8", "--num_machines": "2", "--machine_rank": "1",
                  "--main_process_ip": "10.0.0.5", "--main_process_port": "29500"}
