"""Resolve once, carry typed values: a run's tier is looked up where the run's spec enters (build_spec,
a row read back), its USD amounts are checked by money.usd alone, and one controller step reads the
run's row once (runs/driving/run_row.py)."""

from __future__ import annotations

import sys

import pytest

from sdcloud.errors import UserError
from sdcloud.offers import tiers
from sdcloud.runs.driving.controller import Controller
from sdcloud.runs.inputs.spec import RunPlan, build_spec
from sdcloud.runs.records.state import StateStore
from tests.fleet.test_fleet import CloudDouble


def _count_tier_lookups(monkeypatch) -> list[str]:
    """Every get_tier call from now on, whichever module imported it (by name, or lazily from tiers)."""
    calls: list[str] = []
    real = tiers.get_tier

    def counted(name):
        calls.append(name)
        return real(name)

    for mod in list(sys.modules.values()):
        if mod is not None and mod.__name__.startswith("sdcloud") and getattr(mod, "get_tier", None) is real:
            monkeypatch.setattr(mod, "get_tier", counted)
    return calls


def _count_row_reads(monkeypatch, state: StateStore) -> list[str]:
    """The step's reads of the run's row; the journal's snapshot of the whole run for the bucket
    (StateStore.export_run, after the step) is the records' own and not counted."""
    reads: list[str] = []
    real, export = state.get_run, state.export_run
    exporting = []

    def counted(run_id):
        if not exporting:
            reads.append(run_id)
        return real(run_id)

    def exported(*args, **kwargs):
        exporting.append(True)
        try:
            return export(*args, **kwargs)
        finally:
            exporting.pop()

    monkeypatch.setattr(state, "get_run", counted)
    monkeypatch.setattr(state, "export_run", exported)
    return reads


@pytest.fixture
def driven(sdcloud_home, tmp_path):
    """A controller over an in-process cloud, holding its run's lease as `run()` would."""
    state = StateStore()
    spec = {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1", "model": "tiny", "steps": 100,
            "market": "spot", "budget": 50.0, "store": (tmp_path / "bucket").as_uri()}
    state.create_run("r-once0001", "sd15-lora", spec, 100)
    ctl = Controller(state, "r-once0001", provider=CloudDouble())
    ctl.lease.acquire_or_refuse()
    return ctl, state


def test_one_step_reads_the_run_row_once_and_looks_up_no_tier(driven, monkeypatch):
    ctl, state = driven
    lookups = _count_tier_lookups(monkeypatch)
    reads = _count_row_reads(monkeypatch, state)
    # The launching step: its one read, and the one read again after the policy decided (a `down`
    # from another process meanwhile launches nothing). The launch builds the agent config from the plan.
    assert ctl.step() is False
    assert ctl.current() is not None and state.get_run(ctl.run_id)["state"] == "running"
    assert len(reads) - 1 == 2, reads  # the -1: the assertion's own read just above
    reads.clear()
    # A step that watches the host: the row once, whatever its helpers ask of it (budget, progress).
    assert ctl.step() is False
    assert reads == [ctl.run_id]
    assert lookups == []


def test_a_step_sees_its_own_writes(driven, monkeypatch):
    ctl, state = driven
    ctl.step()
    # What a step writes, a later read in the same step sees (the state end_run wrote, the host's
    # step), without reading the row again; the step's copy is dropped when it ends.
    reads = _count_row_reads(monkeypatch, state)
    with ctl.row.step() as run:
        ctl.row.update(state="recovering", step=7)
        assert run["state"] == "recovering" and ctl.row.get()["step"] == 7
        ctl.set_state("running")  # the helpers' write (hostboot, oom_move) through the owner contract
        ctl.end_run("stopped", "for the test")  # its "resume with" line from the step's copy
        assert run["state"] == "stopped" and run["reason"].endswith("sdcloud resume r-once0001")
    assert len(reads) == 1
    row = ctl.row.get()  # outside a step: state.db itself, which holds every write
    assert (row["state"], row["step"]) == ("stopped", 7) and row["reason"] == run["reason"]


def test_the_plan_carries_the_tier_and_traits_resolved_once(sdcloud_home, monkeypatch):
    lookups = _count_tier_lookups(monkeypatch)
    plan = build_spec(None, {"tier": "SD15-LoRA", "provider": "aws", "region": "us-east-1", "budget": "$12"})
    assert lookups == ["SD15-LoRA"]
    assert plan.tier is tiers.get_tier("sd15-lora") and plan.spec.tier == "sd15-lora"
    assert plan.traits.is_cloud and plan.budget == 12.0 and plan.max_price is None
    assert plan.as_dict() == plan.spec.as_dict()
    from sdcloud.runs.inputs.agent_config import agent_config

    lookups.clear()
    assert agent_config(plan, "r1", 1, 10, {"url": "file:///tmp/x"})["tier"] == "sd15-lora"
    assert lookups == []
    back = RunPlan.of_run({"spec": plan.as_dict()})
    assert back.tier is plan.tier and back.spec == plan.spec


@pytest.mark.parametrize("field,value,message", [
    ("budget", -5, "--budget must be a positive number of USD, got -5"),
    ("budget", "0", "--budget 0 cannot buy anything"),
    ("max_price", 0, "--max-price must be a positive number of USD per hour, got 0"),
    ("max_price", "cheap", "--max-price must be a number of USD per hour, got 'cheap'"),
])
def test_every_entry_refuses_a_non_positive_amount_in_money_usds_words(sdcloud_home, tmp_path, field, value,
                                                                        message):
    from sdcloud.money import usd

    with pytest.raises(UserError) as expected:
        usd(value, "--" + field.replace("_", "-"), per_hour=field == "max_price")
    assert str(expected.value).startswith(message)
    run = tmp_path / "run.yaml"
    run.write_text(f"tier: sd15-lora\n{field}: {value!r}\n" if isinstance(value, str) else
                   f"tier: sd15-lora\n{field}: {value}\n")
    with pytest.raises(UserError) as refused:  # the run file, through build_spec
        build_spec(str(run), {})
    assert str(refused.value) == str(expected.value)
    if field == "max_price":
        from sdcloud.offers.catalog import load_catalog
        from sdcloud.offers.optimizer import rank

        with pytest.raises(UserError) as ranked:  # code that ranks offers (the fleet, batch submit)
            rank(tiers.get_tier("sd15-lora"), load_catalog(["aws"]), max_price=value)
        assert str(ranked.value) == str(expected.value)
