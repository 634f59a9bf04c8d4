"""`offers --nodes N`: groups of N same-type hosts in one zone, their speed-up from the multi-node model
(sdcloud/offers/groups.py) and their price as one unit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from sdcloud.cli import main
from sdcloud.errors import UserError
from sdcloud.offers import groups
from sdcloud.offers.catalog import load_catalog
from sdcloud.offers.groups import Link, check_nodes, group_estimate, rank_groups, speedup
from sdcloud.offers.optimizer import rank
from sdcloud.offers.tiers import get_tier
from sdcloud.providers import loader
from sdcloud.runs.inputs.spec import RunSpec


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_model_scales_a_lora_nearly_linearly_and_a_full_finetune_by_its_network():
    lora, full = get_tier("sdxl-lora"), get_tier("sdxl-finetune")
    fast = Link(100.0, "listed", "cluster", "test", flow_gbps=10.0)
    slow = Link(2.5, "baseline", "cluster", "test", flow_gbps=10.0)
    assert speedup(lora, 1.0, 1, fast) == 1.0
    assert 1.9 < speedup(lora, 1.0, 2, fast) <= 2.0  # a LoRA's adapters are a small all-reduce
    # A full SDXL fine-tune all-reduces 2.6B fp32 gradients: the network decides.
    assert speedup(full, 1.0, 2, fast) > 1.5 * speedup(full, 1.0, 2, slow)
    # Outside a cluster placement group one flow is capped at 5 Gbps rather than 10: never faster.
    zone = Link(100.0, "listed", "zone", "test", flow_gbps=5.0)
    assert speedup(full, 1.0, 4, zone) < speedup(full, 1.0, 4, fast)
    # The flow limits are the provider's (its network trait): EC2's, as the AWS folder declares them.
    aws_cluster, tencent = groups.link_of("aws", "g5.48xlarge"), groups.link_of("tencent", "GN7.2XLARGE32")
    assert (aws_cluster.flows, aws_cluster.flow_gbps) == (16, 10.0) and "EC2 User Guide" in aws_cluster.flow_source
    assert tencent.flow_gbps == 5.0 and tencent.flow_source.startswith("assumed")
    # More hosts are never slower in total than fewer in this model, and never more than linear.
    ups = [speedup(full, 0.5, n, fast) for n in (1, 2, 4, 8)]
    assert ups == sorted(ups) and all(u <= n for u, n in zip(ups, (1, 2, 4, 8)))


def test_a_group_is_priced_as_one_unit_and_reclaimed_n_times_as_often():
    tier = get_tier("sdxl-finetune")
    host = next(e for e in rank(tier, load_catalog(), market="spot", provider="aws")
                if e.offer.band and groups.link_of("aws", e.offer.row.instance_type).gbps >= 100)
    g = group_estimate(tier, host, 3)
    assert g.price_per_hour_usd == pytest.approx(3 * host.offer.price_per_hour_usd)
    assert g.overhead - 1 == pytest.approx(3 * (host.overhead - 1))  # any host's reclaim stops the group
    hours = (g.est_hours / g.overhead)
    assert g.est_cost == pytest.approx(g.price_per_hour_usd * hours * g.overhead)
    assert g.est_hours / g.overhead < host.est_hours / host.overhead  # the group finishes sooner


def test_aws_types_are_placed_in_a_cluster_placement_group_and_tencent_ones_in_one_zone():
    assert groups.link_of("aws", "g5.48xlarge").placement == "cluster"
    assert groups.link_of("aws", "g5.48xlarge").gbps == 100
    t = groups.link_of("tencent", "GN7.2XLARGE32")
    assert t.placement == "zone" and t.basis == "assumed"
    # Every AWS type of the bundled catalog has its own figure (no silent assumption), parsed by the loader.
    types = {r.instance_type for r in load_catalog().rows if r.provider == "aws"}
    assert types <= set(loader.interconnect("aws"))


@pytest.mark.parametrize("itype, cards", [("p4d.24xlarge", 4), ("p4de.24xlarge", 4), ("p5.48xlarge", 32)])
def test_multi_card_types_count_the_one_interface_sdcloud_attaches(itype, cards):
    """p4d/p4de/p5.48xlarge list the sum over several network cards; a host gets one interface (card 0)."""
    link = groups.link_of("aws", itype)
    assert link.cards == cards and link.host_gbps is not None
    assert link.gbps == pytest.approx(link.host_gbps / cards) and link.gbps <= 100
    tier = get_tier("sdxl-finetune")
    one_card = groups.speedup(tier, 1.0, 8, link)
    whole_host = groups.speedup(tier, 1.0, 8, replace(link, gbps=link.host_gbps))
    assert one_card <= whole_host  # the whole-host figure would have ranked it faster than it runs


def test_the_group_price_is_one_function_of_the_hosts_price_and_count():
    assert groups.group_price(1.25, 4) == pytest.approx(5.0)
    assert groups.group_price(None, 4) is None and groups.group_price(2.0, 0) == pytest.approx(2.0)
    # The node count, however the spec carries it: a run row's spec, an agent config, a RunSpec.
    assert groups.node_count({"nodes": 3}) == 3 and groups.node_count({"nodes": None}) == 1
    assert groups.node_count({"nodes": "x"}) == 1 and groups.node_count(RunSpec(tier="sdxl-finetune", nodes=2)) == 2
    assert groups.node_count(None) == 1


def test_offers_ranks_groups_of_two_with_the_speedup_and_group_price_explained(capsys):
    code, out, _ = run_cli(capsys, "offers", "--tier", "sdxl-finetune", "--nodes", "2", "--json", "--limit", "0")
    assert code == 0
    rows = json.loads(out)
    assert rows and all(r["nodes"] == 2 for r in rows)
    assert [r["est_cost"] for r in rows] == sorted(r["est_cost"] for r in rows)
    for r in rows[:20]:
        assert r["price_per_hour_usd"] == pytest.approx(2 * r["host_price_per_hour_usd"], abs=2e-4)
        assert 1 < r["speedup"] <= 2 and r["placement"] in ("cluster placement group", "one zone")
    assert {r["placement"] for r in rows if r["provider"] == "aws"} == {"cluster placement group"}
    code, out, _ = run_cli(capsys, "offers", "--wide", "--tier", "sdxl-finetune", "--nodes", "2", "--explain",
                           "--limit", "3")
    assert code == 0
    assert "speed-up" in out and "2x" in out and "all-reduce" in out and "Gbps" in out


def test_offers_explain_for_a_group_fits_80_columns_and_keeps_what_it_ranks_by(tmp_path):
    """`COLUMNS=80 sdcloud offers --nodes 2 --tier sdxl-finetune --explain`, as a user runs it (a fresh
    process: every provider's network facts reach the ranking without any earlier call)."""
    env = {**os.environ, "COLUMNS": "80", "SDCLOUD_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "sdcloud.cli", "offers", "--nodes", "2", "--tier", "sdxl-finetune",
                           "--explain", "--limit", "5"], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines and max(len(line) for line in lines) <= 80
    header = next(line for line in lines if "offer" in line)
    for column in ("speed-up", "est h", "est $"):
        assert column in header
    assert "speed-up = N x step" in done.stdout and "est h and est $ include" in done.stdout
    # The footer explains only what is shown; what gave way is named, with --wide.
    assert "overhead =" not in done.stdout and "--wide" in done.stdout + done.stderr
    rows = [line for line in lines if line.startswith("│") and line.split("│")[1].strip().isdigit()]
    speedups = [float(line.split("│")[3].strip().rstrip("x")) for line in rows]
    assert len(rows) == 5 and all(1.0 < s <= 2.0 for s in speedups)  # network facts read: not the assumed 5 Gbps
    listed = subprocess.run([sys.executable, "-m", "sdcloud.cli", "offers", "--nodes", "2", "--tier", "sdxl-finetune",
                             "--limit", "0", "--json", "--provider", "aws", "--region", "us-east-1", "--on-demand"],
                            capture_output=True, text=True, timeout=120, env=env)
    [p4d] = [g for g in json.loads(listed.stdout) if g["instance_type"] == "p4d.24xlarge"]
    assert (p4d["network_gbps"], p4d["network_cards"], p4d["host_network_gbps"]) == (100, 4, 400)  # one interface


def test_a_batch_tier_or_a_bad_group_size_is_refused_in_one_line(capsys):
    code, out, err = run_cli(capsys, "offers", "--tier", "batch-sdxl", "--nodes", "2")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "training tiers" in err
    for bad in ("0", "65"):
        code, _, err = run_cli(capsys, "offers", "--tier", "sdxl-finetune", "--nodes", bad)
        assert code == 2 and len(err.strip().splitlines()) == 1
    with pytest.raises(UserError):
        check_nodes(get_tier("sdxl-lora"), True)  # a flag's True is not a group size
    assert rank_groups(get_tier("sdxl-lora"), load_catalog(), 1, provider="aws")[0].speedup == 1.0


def test_a_group_no_faster_than_one_host_is_not_offered(monkeypatch):
    tier = get_tier("sdxl-finetune")
    ranked = rank_groups(tier, load_catalog(), 2, provider="aws")
    assert ranked and all(g.speedup > 1.0 for g in ranked)
    slow_type = ranked[0].host.offer.row.instance_type
    real = groups.link_of
    monkeypatch.setattr(groups, "link_of", lambda p, t: Link(1.0, "assumed", "zone", "x") if t == slow_type else real(p, t))
    again = rank_groups(tier, load_catalog(), 2, provider="aws")
    assert again and slow_type not in {g.host.offer.row.instance_type for g in again}


def test_up_refuses_a_group_on_the_users_own_boxes_before_anything_is_recorded(sdcloud_home):
    from sdcloud.providers.groups import check_group
    from sdcloud.providers.traits import names, traits
    from sdcloud.runs.inputs.spec import build_spec

    own = [n for n in names() if traits(n).hosts == "own"]
    assert own
    for name in own:
        with pytest.raises(UserError, match="--nodes 2"):
            check_group(name, 2)
        check_group(name, 1)
    assert build_spec(None, {"tier": "sdxl-finetune", "provider": "local", "nodes": 2}).spec.nodes == 2
    with pytest.raises(UserError, match="makes images"):
        build_spec(None, {"tier": "batch-sdxl", "nodes": 2})
    assert not (sdcloud_home / "state.db").exists()


def test_a_groups_fleet_candidates_are_ranked_as_groups(monkeypatch):
    from sdcloud.fleet.candidates import candidates

    class NoZones:
        name = "aws"

    tier = get_tier("sdxl-finetune")
    one = candidates(NoZones(), tier, "spot", max_price=None, region="us-east-1", job_size=tier.job_size,
                     events=lambda k, d: None)
    two = candidates(NoZones(), tier, "spot", max_price=None, region="us-east-1", job_size=tier.job_size,
                     events=lambda k, d: None, nodes=2)
    ranked = rank_groups(tier, load_catalog(), 2, provider="aws", region="us-east-1")
    assert two and [o.key for o in two if o.market == "spot"] == [g.host.offer.key for g in ranked
                                                                  if g.host.offer.market == "spot"][:6]
    assert [o.key for o in one] != [o.key for o in two]  # the group's order is its own


def test_up_checks_a_groups_deadline_and_budget_by_the_group(sdcloud_home):
    """A deadline only a group can meet is taken for a group and refused for one host; a budget that
    covers one host's job but not the group's N hosts is refused for the group."""
    from sdcloud.commands.run import _check_estimates
    from sdcloud.offers.groups import rank_job
    from sdcloud.runs.inputs.spec import build_spec

    tier = get_tier("sdxl-finetune")
    base = {"tier": tier.name, "provider": "aws", "region": "us-east-1", "market": "on-demand"}
    one = rank_job(tier, load_catalog(), 1, tier.job_size, market="on-demand", provider="aws", region="us-east-1")
    four = rank_job(tier, load_catalog(), 4, tier.job_size, market="on-demand", provider="aws", region="us-east-1")
    fastest_one, fastest_four = min(e.est_hours for e in one), min(g.est_hours for g in four)
    assert fastest_four < fastest_one
    deadline = f"{(fastest_one + fastest_four) / 2:.3f}h"
    group = build_spec(None, {**base, "nodes": 4, "deadline_hours": deadline}).spec
    _check_estimates(group, tier, tier.job_size)  # the group meets it
    with pytest.raises(UserError, match="deadline"):
        _check_estimates(build_spec(None, {**base, "deadline_hours": deadline}).spec, tier, tier.job_size)
    # A budget of the cheapest single host's job is below the cheapest group's.
    budget = round(one[0].est_cost * 1.05, 2)
    _check_estimates(build_spec(None, {**base, "budget": budget}).spec, tier, tier.job_size)
    with pytest.raises(UserError, match="budget"):
        _check_estimates(build_spec(None, {**base, "nodes": 4, "budget": budget}).spec, tier, tier.job_size)


def test_a_run_that_asks_for_a_group_gets_one_even_where_no_group_is_faster(capsys):
    """Where the model finds no group faster (Tencent's assumed 5 Gbps for a full fine-tune), `offers`
    says so in one line, and `up --nodes 2` still ranks the groups by their cost to launch one."""
    tier = get_tier("sdxl-finetune")
    assert rank_groups(tier, load_catalog(), 2, provider="tencent") == []
    kept = rank_groups(tier, load_catalog(), 2, provider="tencent", keep_slower=True)
    assert kept and [g.est_cost for g in kept] == sorted(g.est_cost for g in kept)
    code, out, err = run_cli(capsys, "offers", "--tier", "sdxl-finetune", "--nodes", "2", "--provider", "tencent")
    assert code == 0 and out == "" and "no group of 2" in err
