"""`sdcloud dashboard`: where it listens, who it answers, what its pages and JSON say, and what it
never says (a secret)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sdcloud.cli import main
from tests.dashboard.conftest import dashboard, get
from tests.support.server_seaweed import free_port
from tests.views.conftest import CHECKPOINTS, PROMPTS, write_samples

TOKEN = "tok-" + "x7Qm" * 6


def listening(port: int) -> set[str]:
    """The local addresses a socket listens on at `port` (from /proc/net/tcp and tcp6)."""
    found = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(name).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.rsplit(":", 1)
            if state == "0A" and int(p, 16) == port:  # 0A: LISTEN
                found.add(addr)
    return found


@pytest.mark.parametrize("args, needle", [
    (["--host", "0.0.0.0"], "--host 0.0.0.0 is not loopback"),
    (["--host", "192.168.1.7"], "--host 192.168.1.7 is not loopback"),
    (["--host", "0.0.0.0", "--token", "short"], "--token must be at least 16 characters"),
    (["--port", "70000"], "--port must be 0 to 65535"),
    (["--host", " "], "--host must name an address"),
])
def test_refused_before_anything_listens(capsys, args, needle):
    port = free_port()
    code = main(["dashboard", *(["--port", str(port)] if "--port" not in args else []), *args])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert not listening(port)
    assert TOKEN not in err


def test_a_taken_port_is_one_line():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "sdcloud.cli", "dashboard", "--port", str(port)],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in proc.stderr


def test_listens_on_loopback_only_and_answers_within_2_s(trained_run):
    _, run_id, _ = trained_run
    port = free_port()
    with dashboard(port=port) as (base, seconds):
        assert seconds < 2.0, f"the dashboard took {seconds:.2f} s to answer"
        assert listening(port) == {"0100007F"}  # 127.0.0.1, and nothing else
        status, headers, body = get(base + "/")
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert f'data-run="{run_id}"' in body


def test_the_list_shows_state_progress_cost_and_last_sample(trained_run):
    state, run_id, _ = trained_run
    with dashboard() as (base, _):
        jobs = json.loads(get(base + "/api/jobs")[2])["jobs"]
        (job,) = jobs
        assert (job["run"], job["state"], job["step"], job["total_steps"]) == (run_id, "succeeded", 30, 30)
        from sdcloud.costs.ledger import live_cost_usd

        assert job["cost_usd"] == live_cost_usd(state, state.get_run(run_id)) > 0
        assert job["last_sample"].startswith("data:image/png;base64,")
        body = get(base + "/")[2]
        row = body[body.index(f'<tr data-run="{run_id}"'):]
        assert 'data-field="state">succeeded<' in row and "30 / 30" in row and 'class="sample last"' in row


def test_the_run_page_and_its_json_are_the_reports(trained_run, capsys):
    _, run_id, _ = trained_run
    capsys.readouterr()
    assert main(["report", run_id, "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    with dashboard() as (base, _):
        served = json.loads(get(f"{base}/api/runs/{run_id}")[2])
        for key in ("header", "samples", "metrics", "events", "attempts"):
            if key == "header":
                assert served[key] == report[key]
            else:
                assert len(served[key]) == len(report[key]) and served[key][-1] == report[key][-1], key
        status, _, page = get(f"{base}/runs/{run_id}")
        assert status == 200 and page.count('class="sample"') == len(PROMPTS) * len(CHECKPOINTS)
        assert f'data-live="{run_id}/live"' in page
        for path in ("/runs/r-nosuch", "/runs/r-nosuch/live", "/api/runs/r-nosuch"):
            assert get(base + path)[0] == 404, path


def test_live_answers_the_version_alone_until_something_lands(trained_run, tmp_path):
    state, run_id, store = trained_run
    with dashboard() as (base, _):
        first = json.loads(get(f"{base}/runs/{run_id}/live?since=")[2])
        assert set(first["sections"]) == {"header", "samples", "charts", "attempts", "cost"}
        same = json.loads(get(f"{base}/runs/{run_id}/live?since={first['version']}")[2])
        assert same == {"version": first["version"]}
        # A new checkpoint's samples land in the bucket: the next poll brings the new grid.
        (tmp_path / "more").mkdir()
        write_samples(store, run_id, 40, tmp_path / "more")
        moved = json.loads(get(f"{base}/runs/{run_id}/live?since={first['version']}")[2])
        assert moved["version"] != first["version"]
        assert moved["sections"]["samples"].count('class="sample"') == len(PROMPTS) * (len(CHECKPOINTS) + 1)
        assert "step 40" in moved["sections"]["samples"]


def test_with_a_token_every_request_needs_it(trained_run):
    _, run_id, _ = trained_run
    with dashboard("--host", "0.0.0.0", "--token", TOKEN) as (base, _):
        for path in ("/", "/api/jobs", f"/runs/{run_id}", f"/runs/{run_id}/live", f"/api/runs/{run_id}"):
            status, _, body = get(base + path)
            assert status == 401 and run_id not in body, path
            assert get(base + path, {"Authorization": "Bearer wrong-token-0000000"})[0] == 401
        assert get(base + "/api/jobs", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
        # ?token= once: swapped for a cookie, and the token leaves the address.
        status, headers, _ = get(f"{base}/runs/{run_id}?token={TOKEN}")
        assert status == 303 and headers["location"] == f"/runs/{run_id}" and "HttpOnly" in headers["set-cookie"]
        cookie = headers["set-cookie"].split(";", 1)[0]
        status, _, page = get(f"{base}/runs/{run_id}", {"Cookie": cookie})
        assert status == 200 and TOKEN not in page and 'class="sample"' in page


def test_no_secret_in_any_page_json_or_metrics_object(trained_run, monkeypatch, sdcloud_home, capsys, tmp_path):
    state, run_id, store = trained_run
    hf = "hf_" + "Zq8rT2vLmN4pXw6yBc1dEf"
    wandb = "wandb-" + "0123456789abcdef0123456789abcdef"
    monkeypatch.setenv("HF_TOKEN", hf)
    monkeypatch.setenv("WANDB_API_KEY", wandb)
    (sdcloud_home / "config.toml").write_text(f'[huggingface]\ntoken = "{hf}"\n')
    # A secret pasted where it does not belong: a trainer argument, the run's name, an event's words.
    run = state.get_run(run_id)
    state._db.execute("UPDATE runs SET spec = ?, name = ? WHERE id = ?",
                      (json.dumps({**run["spec"], "trainer_args": {"wandb_key": wandb}}), f"run {hf}", run_id))
    state._db.commit()
    from sdcloud.events import Kind

    state.event(run_id, Kind.HEALTH_ACTION, {"attempt": 2, "action": f"restart {wandb}"})
    texts = []
    for fmt in ("json", "html"):
        capsys.readouterr()
        assert main(["report", run_id, "--format", fmt]) == 0
        texts.append(capsys.readouterr().out)
    assert "hf_…" in texts[1]  # the name is shown, masked
    with dashboard() as (base, _):
        for path in ("/", "/api/jobs", f"/runs/{run_id}", f"/runs/{run_id}/live?since=", f"/api/runs/{run_id}"):
            texts.append(get(base + path)[2])
    texts += [store.get(o.key).decode("utf-8", "replace") for o in store.list(f"runs/{run_id}/metrics/")]
    texts += [store.get(o.key).decode() for o in store.list(f"runs/{run_id}/samples/") if o.key.endswith(".json")]
    assert len(texts) > 10
    for text in texts:
        assert hf not in text and wandb not in text


def test_a_buckets_runs_are_shown_with_store(trained_run, monkeypatch, tmp_path):
    """Another machine's run, reached through its bucket: rebuilt from its journal, its samples read there."""
    from sdcloud.runs.records.journal import Journal

    state, run_id, store = trained_run
    Journal(state, store, run_id).flush()
    bucket = store_root(store)
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "another-home"))  # this machine has never seen the run
    with dashboard("--store", bucket.as_uri()) as (base, _):
        (job,) = json.loads(get(base + "/api/jobs")[2])["jobs"]
        assert (job["run"], job["state"], job["from"]) == (run_id, "succeeded", "bucket")
        page = json.loads(get(f"{base}/api/runs/{run_id}")[2])
        assert len(page["samples"]) == len(PROMPTS) * len(CHECKPOINTS) and len(page["metrics"]) == 30
        assert [a["cause"] for a in page["attempts"]] == ["preempted", "succeeded"]
    from sdcloud.runs.records.state import StateStore

    assert StateStore().list_runs() == []  # the bucket's runs are shown, not taken into this home


def store_root(store):
    from pathlib import Path

    return Path(store.root)


def test_a_store_that_cannot_be_read_is_one_line(tmp_path, capsys):
    code = main(["dashboard", "--port", str(free_port()), "--store", "gs://nowhere/x"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err


def test_objects_never_rewritten_are_read_once_across_polls(trained_run, monkeypatch):
    from sdcloud.dashboard.store_cache import ImmutableCache
    from sdcloud.views.page import build

    state, run_id, store = trained_run
    reads: list[str] = []
    real_get = store.get
    monkeypatch.setattr(store, "get", lambda key: reads.append(key) or real_get(key))
    cached = ImmutableCache(store)
    first = build(state, run_id, store=cached)
    n = len(reads)
    assert n >= len(store.list(f"runs/{run_id}/metrics/")) + len(first["samples"])
    second = build(state, run_id, store=cached)
    assert second["metrics"] == first["metrics"] and len(second["samples"]) == len(first["samples"])
    assert not [k for k in reads[n:] if "/metrics/" in k or "/samples/" in k]


def test_big_samples_are_inlined_as_thumbnails_and_served_whole(trained_run, tmp_path):
    """A 1024 px sample is a 256 px thumbnail on the page; a click on the dashboard gets the original."""
    import base64
    import io
    import re
    from urllib.parse import unquote

    from PIL import Image

    from sdcloud.views.sources import THUMB_PX
    from tests.views.conftest import png

    state, run_id, store = trained_run
    big = png(tmp_path / "big.png", (200, 30, 30), size=1024)
    key = f"runs/{run_id}/samples/000000030/00.png"
    store.put_file(key, big)
    with dashboard() as (base, _):
        page = get(f"{base}/runs/{run_id}")[2]
        tag = re.search(r'<img class="sample" data-step="30" data-index="0"[^>]*>', page).group(0)
        thumb = base64.b64decode(re.search(r'src="data:image/png;base64,([^"]+)"', tag).group(1))
        assert Image.open(io.BytesIO(thumb)).size == (THUMB_PX, THUMB_PX)
        full = re.search(r'data-full="([^"]+)"', tag).group(1)
        assert unquote(full.split("key=", 1)[1]) == key
        # The page is at /runs/RUN: its relative data-full resolves under /runs/.
        assert urllib_get_bytes(f"{base}/runs/{full}") == big.read_bytes()
        for bad in (f"runs/{run_id}/checkpoints/000000030/lora.safetensors", f"runs/{run_id}/samples/../journal/run.json",
                    "runs/r-other/samples/000000010/00.png"):
            assert get(f"{base}/runs/{run_id}/image?key={bad}")[0] == 404


def urllib_get_bytes(url: str) -> bytes:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as resp:
        assert resp.status == 200 and resp.headers["content-type"] == "image/png"
        return resp.read()
