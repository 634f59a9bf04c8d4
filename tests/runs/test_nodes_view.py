"""`status` and `watch` on a multi-node run: each host's rank, phase, step and heartbeat from its
status.json in the run's bucket; each node's hours in the cost summary; `logs --node` checked."""

from __future__ import annotations

import json

from sdcloud.runs.records.nodes_view import node_hours, node_hours_line, node_lines, read_nodes
from sdcloud_agent.store import open_store


def test_each_host_of_the_newest_attempt_with_its_health(tmp_path):
    store = open_store(f"file://{tmp_path}/bucket")
    run = {"id": "r1", "spec": {"nodes": 3}}
    store.put("runs/r1/status.json", json.dumps({"attempt": 2, "phase": "training", "step": 7, "time": 995,
                                                  "health": {"verdict": "healthy"}}).encode())
    store.put("runs/r1/nodes/1/status.json", json.dumps({"attempt": 2, "phase": "training", "step": 7,
                                                          "time": 900}).encode())
    # Node 2's report is of the attempt before: its fresh host has not written yet.
    store.put("runs/r1/nodes/2/status.json", json.dumps({"attempt": 1, "phase": "preempted", "time": 500}).encode())
    nodes = read_nodes(run, store, now=1000)
    assert [(n["node"], n["phase"], n["step"], n["health"]) for n in nodes] == [
        (0, "training", 7, "healthy"), (1, "training", 7, "silent"), (2, "waiting", None, "no report yet")]
    assert node_lines(nodes)[0] == "node 0 (rank 0): training, step 7, healthy, beat 5s ago"
    assert read_nodes({"id": "r1", "spec": {}}, store) is None  # a single host: nothing extra to show


def test_each_nodes_hours_and_price_in_the_cost_summary():
    rows = node_hours([{"n": 1, "hours": 0.5, "price": 2.0, "cost": 1.0},
                       {"n": 2, "hours": 0.25, "price": 2.0, "cost": 0.5}], 2)
    assert rows[0] == {"attempt": 1, "node": 0, "hours": 0.5, "price": 1.0, "cost": 0.5}
    assert len(rows) == 4
    assert node_hours_line({"node_hours": rows}) == "2 nodes: 1.500 node-hours (node 0 0.750 h, node 1 0.750 h)"
    assert node_hours_line({}) is None


def test_logs_node_beyond_the_group_is_one_line_exit_2(sdcloud_home, capsys):
    from sdcloud.cli import main
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    state.create_run("r-one", "sd15-lora", {"tier": "sd15-lora", "provider": "local", "nodes": 2}, 10)
    code = main(["logs", "r-one", "--node", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--node 2: r-one runs on 2 hosts (nodes 0 to 1)" in err


def test_a_failed_host_fails_the_groups_attempt_at_once(tmp_path):
    from sdcloud.runs.records.nodes_view import group_status

    store = open_store(f"file://{tmp_path}/bucket")
    rank0 = {"attempt": 3, "phase": "training", "step": 4}
    assert group_status(rank0, store, "r1", 2) == rank0  # node 1 has not written
    store.put("runs/r1/nodes/1/status.json", json.dumps(
        {"attempt": 3, "phase": "failed", "reason": "rank 0 of attempt 3 did not publish its address",
         "failure_cause": "rendezvous-timeout", "boot_phase": "rendezvous"}).encode())
    got = group_status(rank0, store, "r1", 2)
    assert got["phase"] == "failed" and got["failure_cause"] == "rendezvous-timeout" and got["failed_node"] == 1
    assert got["reason"].startswith("node 1: rank 0 of attempt 3")
    assert got["boot_phase"] == "rendezvous"  # the controller relaunches the group, as after a failed boot
    assert group_status({**rank0, "attempt": 4}, store, "r1", 2)["phase"] == "training"  # an older attempt's failure
    assert group_status({**rank0, "phase": "preempted"}, store, "r1", 2)["phase"] == "preempted"


def test_watch_says_a_nodes_line_when_its_phase_or_health_changes(monkeypatch, capsys):
    from sdcloud.commands import watch
    from sdcloud.runs.records import nodes_view

    reports = [[{"node": 0, "rank": 0, "attempt": 1, "phase": "training", "step": 3, "age_s": 1.0, "health": "ok"},
                {"node": 1, "rank": 1, "attempt": 1, "phase": "training", "step": 3, "age_s": 1.0, "health": "ok"}]]
    monkeypatch.setattr(nodes_view, "read_nodes", lambda run: reports[-1])
    seen: dict = {}
    run = {"id": "r1", "spec": {"nodes": 2}}
    watch._show_nodes(run, seen)
    watch._show_nodes(run, seen)  # nothing changed: nothing said again
    reports.append([reports[0][0], {**reports[0][1], "phase": "preempted", "health": "ended"}])
    watch._show_nodes(run, seen)
    err = capsys.readouterr().err.splitlines()
    assert err == ["node 0 (rank 0): training, step 3, ok, beat 1s ago", "node 1 (rank 1): training, step 3, ok, beat 1s ago",
                   "node 1 (rank 1): preempted, step 3, ended, beat 1s ago"]
    watch._show_nodes({"id": "r2", "spec": {}}, seen)  # a single host: no node lines
    assert capsys.readouterr().err == ""
