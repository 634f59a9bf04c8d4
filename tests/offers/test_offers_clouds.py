"""`offers --provider aws,tencent`: both clouds in one table, an offer outside the home cloud (the
first named) carrying the move there: the copy's hours and the home cloud's egress (offers/moves.py)."""

from __future__ import annotations

import json

import pytest

from sdcloud.cli import main

GIB = 2**30


def offers(capsys, *args: str) -> list[dict]:
    assert main(["offers", "--tier", "sdxl-lora", "--spot", "--json", "--limit", "0", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_two_clouds_ranked_in_one_table_with_the_move_priced_in(capsys):
    alone = {(r["provider"], r["region"], r["instance_type"]): r for r in offers(capsys, "--provider", "tencent")}
    rows = offers(capsys, "--provider", "aws,tencent")
    assert {r["provider"] for r in rows} == {"aws", "tencent"}
    assert [r["est_cost"] for r in rows] == sorted(r["est_cost"] for r in rows)
    for r in rows:
        if r["provider"] == "aws":
            assert r["move"] is None  # the home cloud: nothing to copy
            continue
        m = r["move"]
        # 10 GB (10^9 bytes) at AWS's 0.09 $/GB list egress (us-east-1), copied by the destination host
        # at its network figure, one flow (capped at EC2's single-flow 5 Gbps): not a laptop's 40 MB/s.
        from sdcloud.offers.groups import link_of
        from sdcloud.providers.traits import traits

        gbps = min(link_of(r["provider"], r["instance_type"]).gbps, traits(r["provider"]).network.zone_flow_gbps)
        assert m["egress_usd"] == pytest.approx(10e9 / GIB * 0.09, abs=1e-4)
        assert m["transfer_hours"] == pytest.approx(10e9 / (gbps * 125e6) / 3600, abs=1e-4)  # JSON keeps 4 places
        assert m["transfer_hours"] < 250 / 3600
        base = alone[(r["provider"], r["region"], r["instance_type"])]
        extra = r["price_per_hour_usd"] * m["transfer_hours"] + m["egress_usd"]
        assert r["est_cost"] == pytest.approx(base["est_cost"] + extra, abs=2e-3)
        assert r["est_hours"] == pytest.approx(base["est_hours"] + m["transfer_hours"], abs=2e-3)


def test_the_egress_is_the_home_clouds_in_its_currency_converted(capsys, monkeypatch):
    monkeypatch.setenv("SDCLOUD_CNY_PER_USD", "5")
    rows = offers(capsys, "--provider", "tencent,aws", "--move-gb", "2")
    aws = [r for r in rows if r["provider"] == "aws"]
    assert aws and all(r["provider"] == "aws" or r["move"] is None for r in rows)
    # Tencent COS: 0.50 CNY per GB at 5 CNY per USD.
    assert aws[0]["move"]["egress_usd"] == pytest.approx(2e9 / GIB * 0.5 / 5, abs=1e-4)
    assert "tencent list egress 0.5 CNY/GB" in aws[0]["move"]["reason"]


def test_explain_shows_the_move(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # the narrow form: each row's inputs as lines
    assert main(["offers", "--tier", "sdxl-lora", "--spot", "--provider", "aws,tencent", "--explain", "--limit", "0"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.split("\n\n")[0].splitlines() if "move:" in ln) if "move:" in out else ""
    flat = out.replace("\n  ", " ")
    # The move's bytes, its price at the source region's egress, and its minutes at the host's rate.
    assert "move: 9.31 GB (10,000,000,000 bytes) from aws to tencent: aws us-east-1 list egress 0.09 USD/GB" in flat, line
    assert "0.8382 USD egress, 0.3 min at 625 MB/s (the host's 5 Gbps, assumed)" in flat and "40 MB/s" not in flat
    assert "offers outside the home cloud (the first --provider) add a move" in out.replace("\n  ", " ")


def test_a_bad_move_size_is_refused_in_one_line(capsys):
    assert main(["offers", "--tier", "sdxl-lora", "--provider", "aws,tencent", "--move-gb", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--move-gb must be 0 or more" in err and err.count("\n") == 1
