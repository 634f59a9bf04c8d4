"""The cost report's line under a run says each figure once (issue 46): an estimated total is
"total $X (estimate)", not "total $X (estimate); estimate $X"; a billed total keeps the estimate it
replaces beside it."""

from __future__ import annotations

from tests.costs.test_cost_output import even_run, out_of  # noqa: F401 - a finished local run in the state store


def _line(capsys, run_id: str) -> str:
    return " ".join(out_of(capsys, "cost", "report", run_id).split())


def test_an_estimated_total_says_estimate_once(even_run, capsys):  # noqa: F811
    _, run_id = even_run
    text = _line(capsys, run_id)
    assert "(estimate)" in text and "(estimate); estimate" not in text, text
    assert text.count("estimate $") == 0


def test_a_billed_total_keeps_the_estimate_beside_it(even_run, capsys):  # noqa: F811
    state, run_id = even_run
    state.set_billed(run_id, "local", 0.01, "USD", 0.01, "test bill")
    text = _line(capsys, run_id)
    assert "(billed); estimate $" in text, text
