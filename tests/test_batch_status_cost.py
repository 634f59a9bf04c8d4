"""`batch status` counts a local pool's worker processes as its hosts and prices them at the
[local] price_per_hour, as a local training run's host is priced (issue 23: it said hosts 0, cost 0)."""

from __future__ import annotations

import json

import pytest

from sdcloud.cli import main


def test_local_pool_hosts_are_counted_and_priced(tmp_path, sdcloud_home, capsys):
    from sdcloud.batch import jobs
    from sdcloud.runs.state import StateStore

    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text("[local]\nprice_per_hour = 36.0\n")  # a cent a second
    prompts = tmp_path / "p.txt"
    prompts.write_text("".join(f"prompt {n}\n" for n in range(6)))
    res = jobs.submit(jobs.SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(prompts), workers=2,
                                         provider="local", generator="fake", fake_delay=0.2))
    done = jobs.run_local(res["job"], ttl=5.0, poll=0.1)
    assert done["images_done"] == 6
    attempts = StateStore().attempts(res["job"])
    assert len(attempts) == done["workers_started"] >= 2
    assert all(a.end is not None and a.price == 36.0 and a.provider == "local" for a in attempts)
    capsys.readouterr()
    assert main(["batch", "status", res["job"], "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["hosts"] == len(attempts)
    assert st["cost_usd"] == pytest.approx(sum(36.0 * (a.end - a.start) / 3600 for a in attempts), abs=1e-4)
    assert st["cost_usd"] > 0 and st["cost_per_image_usd"] == pytest.approx(st["cost_usd"] / 6, rel=1e-3)
    assert main(["batch", "status", res["job"]]) == 0
    table = capsys.readouterr().out
    assert any("hosts" in line and f" {len(attempts)} " in line for line in table.splitlines()), table
