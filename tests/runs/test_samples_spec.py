"""A run's samples and tracker as asked (runs/inputs/samples.py), what its host is told
(runs/inputs/agent_config.py, the adapters' command lines), and its events on the curves' time axis
(runs/records/metrics.py)."""

from __future__ import annotations

from sdcloud.runs.inputs.agent_config import agent_config
from sdcloud.runs.inputs.spec import build_spec
from sdcloud_agent.samples import SampleSettings
from sdcloud_agent.trainers.base import Context
from sdcloud_agent.trainers.builtin import arguments
from sdcloud_agent.trainers.builtin_adapter import BuiltinTrainer


def test_the_run_files_sample_prompts_and_the_flags_over_them(tmp_path, sdcloud_home):
    rf = tmp_path / "run.yaml"
    rf.write_text("tier: sd15-lora\nprovider: local\nsample_prompts:\n  - a red cube\n  - a blue ball\nsample-seed: 9\n")
    spec = build_spec(str(rf), {}).spec
    assert spec.sample_prompts == ["a red cube", "a blue ball"] and spec.sample_seed == 9 and spec.sample_every is None
    spec = build_spec(str(rf), {"sample_prompts": ["a green cone"], "sample_every": "50"}).spec
    assert spec.sample_prompts == ["a green cone"] and spec.sample_every == 50 and spec.sample_seed == 9


def test_the_host_is_told_the_samples_and_nothing_when_none_are_asked(sdcloud_home):
    plan = build_spec(None, {"tier": "sd15-lora", "provider": "local", "steps": 30, "checkpoint_every": 10,
                             "sample_prompts": ["a red cube"], "sample_seed": 4})
    cfg = agent_config(plan, "r-1", 1, 30, {"url": "file:///tmp/b"})
    assert SampleSettings.from_dict(cfg["samples"]) == SampleSettings(prompts=("a red cube",), seed=4)
    bare = build_spec(None, {"tier": "sd15-lora", "provider": "local", "steps": 30})
    assert "samples" not in agent_config(bare, "r-1", 1, 30, {"url": "file:///tmp/b"})


def test_the_builtin_trainer_is_given_the_prompts_seed_and_interval_its_parser_takes(tmp_path):
    ctx = Context(steps=30, checkpoint_every=10, model="tiny", workdir=tmp_path, checkpoint_dir=tmp_path / "c",
                  output_dir=tmp_path / "o", samples=SampleSettings(prompts=("-a dash first", "a blue ball"), seed=3))
    cmd = BuiltinTrainer().command(ctx)
    args = arguments.parse_args(cmd[cmd.index("--model"):])
    assert args.validation_prompt == ["-a dash first", "a blue ball"]
    assert (args.sample_every, args.sample_seed) == (10, 3)
    ctx.samples = SampleSettings(prompts=("x",), every=20)
    cmd = BuiltinTrainer().command(ctx)
    assert arguments.parse_args(cmd[cmd.index("--model"):]).sample_every == 20


def test_the_cost_so_far_cuts_each_attempt_at_the_events_time():
    from types import SimpleNamespace as A

    from sdcloud.runs.records.metrics import cost_at

    attempts = [A(start=0.0, end=3600.0, price=1.0), A(start=7200.0, end=None, price=2.0)]
    assert cost_at(attempts, 1800.0) == 0.5
    assert cost_at(attempts, 5000.0) == 1.0
    assert cost_at(attempts, 9000.0) == 2.0


def test_run_events_keep_the_turns_and_leave_the_routine(sdcloud_home, tmp_path):
    from sdcloud.events import Kind
    from sdcloud.runs.records.metrics import read_run_events
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    state.create_run("r-ev", "sd15-lora", {"tier": "sd15-lora"}, 30)
    state.add_attempt("r-ev", 1, "local", "t1", start=1.0, price=3600.0, state="running")
    state.event("r-ev", Kind.PROGRESS, {"step": 3})
    state.event("r-ev", Kind.RECLAIMED, {"attempt": 1})
    events = read_run_events(state, None, "r-ev")
    assert [e.kind for e in events] == ["reclaimed"]
    assert events[0].cost_usd > 0 and events[0].words
