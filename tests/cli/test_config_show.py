"""`sdcloud config show` shows every setting in effect, [local] included (issue 23)."""

from __future__ import annotations

import json

from sdcloud.cli import main


def show(capsys, *args) -> tuple[int, str, str]:
    rc = main(["config", "show", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_config_show_includes_the_local_price_and_notice(capsys, sdcloud_home):
    rc, out, _ = show(capsys, "--json")
    shown = json.loads(out)
    assert rc == 0
    assert shown["local.price_per_hour"] == {"value": "0 USD/h", "source": "built-in default"}
    assert shown["local.notice_seconds"] == {"value": "30 s", "source": "built-in default"}
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text("[local]\nprice_per_hour = 0.35\n\n[catalog]\nmax_age_days = 30\n")
    rc, out, _ = show(capsys, "--json")
    shown = json.loads(out)
    assert shown["local.price_per_hour"] == {"value": "0.35 USD/h", "source": "config.toml [local]"}
    assert shown["local.notice_seconds"]["source"] == "built-in default"
    assert shown["catalog.max_age_days"] == {"value": "30", "source": "config.toml [catalog]"}  # nothing left out
    rc, out, _ = show(capsys)
    assert rc == 0 and "local.price_per_hour" in out and "0.35 USD/h" in out


def test_a_bad_local_price_is_one_line_exit_2(capsys, sdcloud_home):
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text('[local]\nprice_per_hour = "cheap"\n')
    rc, out, err = show(capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "[local] price_per_hour" in err
