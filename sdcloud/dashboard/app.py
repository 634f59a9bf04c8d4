"""The dashboard's ASGI app (starlette): the list page, each job's live page, and their JSON.

    GET /                      every job: state, progress, cost, last sample (refreshed in place)
    GET /live?since=V          the list's table when its version moved
    GET /runs/<id>             the run page (views/html.py) with its refresh script
    GET /runs/<id>/live?since=V  the page's sections when its version moved, else only the version
    GET /runs/<id>/image?key=K   a sample at full size (the page inlines thumbnails)
    GET /api/jobs, /api/runs/<id>   the same as JSON (the run's is `sdcloud report --format json`)

Endpoints are plain functions: starlette runs them in its thread pool, so a slow bucket read holds
one request, not the server. Every body passes through views/secrets.scrub on its way out.
"""

from __future__ import annotations

import hashlib
import html
import threading
from typing import Any

from .access import TOKEN_PARAM, allowed

COOKIE = "sdcloud_dashboard"
LIST_LIMIT = 60  # the newest jobs on the list page
REFRESH_MS = 1500
_CACHE_SIZE = 32


class _Sections:
    """Rendered sections by (run, version): a page polled by several tabs is drawn once per change."""

    def __init__(self):
        self._lock = threading.Lock()
        self._items: dict[tuple[str, str], dict[str, str]] = {}

    def get(self, key, make):
        with self._lock:
            hit = self._items.get(key)
        if hit is not None:
            return hit
        value = make()
        with self._lock:
            if len(self._items) >= _CACHE_SIZE:
                self._items.pop(next(iter(self._items)))
            self._items[key] = value
        return value


def _last_sample(state, run: dict, store) -> str | None:
    """The newest sample (a training run) or image (a batch job) as a data URI, or None."""
    from ..offers.kinds import RunKind
    from ..views.sources import batch_images, data_uri

    try:
        if RunKind.of(run.get("spec")) is RunKind.BATCH:
            shown, _ = batch_images(run, limit=1)
            return shown[-1]["src"] if shown else None
        from ..runs.records.samples import list_samples
        from ..runs.records.store_of import store_of

        store = store or store_of(run)
        found = list_samples(store, run["id"])
        return data_uri(store.get(found[-1].key)) if found else None
    except Exception:  # noqa: BLE001 - no bucket here, or none yet: the row shows no sample
        return None


def job_rows(sources, store_for=None) -> list[dict]:
    """The list page's rows; store_for(run, store): the store to read a run's samples from."""
    from ..costs import ledger
    from ..offers.kinds import RunKind

    rows = []
    for state, run, store in sources.runs()[:LIST_LIMIT]:
        try:
            cost = ledger.live_cost_usd(state, run)
        except Exception:  # noqa: BLE001 - a row the ledger cannot price still lists
            cost = None
        rows.append({"run": run["id"], "name": run.get("name"), "kind": str(RunKind.of(run.get("spec"))),
                     "tier": run["tier"], "state": run["state"], "step": run["step"] or 0,
                     "total_steps": run["total_steps"], "cost_usd": cost, "created": run["created"],
                     "from": "home" if store is None else "bucket",
                     "last_sample": _last_sample(state, run, store_for(run, store) if store_for else store)})
    return rows


def jobs_html(rows: list[dict]) -> str:
    from ..costs.report import fmt

    e = html.escape
    if not rows:
        return "<p class=\"muted\">No runs or batch jobs in this home yet: sdcloud up, sdcloud batch submit.</p>"
    parts = ['<table><tr><th class="l">job</th><th class="l">kind</th><th class="l">tier</th><th class="l">state</th>'
             '<th class="l">progress</th><th>cost $</th><th>last sample</th></tr>']
    for r in rows:
        total = r["total_steps"] or 0
        pct = 100.0 * r["step"] / total if total else 0.0
        img = f'<img class="sample last" alt="last sample of {e(r["run"])}" src="{r["last_sample"]}" width="64">' \
            if r["last_sample"] else ""
        parts.append(f'<tr data-run="{e(r["run"])}"><td class="l"><a href="runs/{e(r["run"])}">{e(r["name"] or r["run"])}</a>'
                     f'</td><td class="l">{e(r["kind"])}</td><td class="l">{e(r["tier"])}</td>'
                     f'<td class="l state" data-field="state">{e(r["state"])}</td>'
                     f'<td class="l" data-field="progress"><progress max="{total or 1}" value="{r["step"]}"></progress> '
                     f'{r["step"]} / {total} ({pct:.0f}%)</td><td data-field="cost_usd">{e(fmt(r["cost_usd"]))}</td>'
                     f"<td>{img}</td></tr>")
    parts.append("</table>")
    return "".join(parts)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def list_page(body: str, version: str) -> str:
    from ..views.html import CSS, LIVE_JS

    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>sdcloud dashboard</title>'
            f'<style>{CSS}</style></head><body data-live="live" data-version="{version}">'
            f'<h1>sdcloud dashboard</h1><section id="jobs">{body}</section>'
            f"<script>{LIVE_JS.replace('INTERVAL', str(REFRESH_MS))}</script></body></html>\n")


def create_app(sources, token: str | None = None):
    """The app over `sources` (dashboard/sources.py); with `token`, every request must carry it."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
    from starlette.routing import Route

    from ..errors import UserError
    from ..views import html as view_html
    from ..views.page import build, version
    from ..views.secrets import known, scrub

    cache = _Sections()
    stores: dict[str, Any] = {}  # run id -> its store, wrapped so that immutable objects are read once

    def store_for(run: dict, store: Any) -> Any:
        from ..runs.records.store_of import store_of
        from .store_cache import ImmutableCache

        key = run["id"]
        if key not in stores:
            try:
                stores[key] = ImmutableCache(store or store_of(run))
            except Exception:  # noqa: BLE001 - no bucket here: the page says so (views/page.py)
                return store
        return stores[key]

    def clean(text: str, specs: list[Any]) -> str:
        return scrub(text, known(specs))

    def as_html(text: str, specs: list[Any]) -> Response:
        return HTMLResponse(clean(text, specs), headers={"Cache-Control": "no-store"})

    def as_json(value: Any, specs: list[Any], status: int = 200) -> Response:
        import json

        return Response(clean(json.dumps(value, default=str), specs), media_type="application/json", status_code=status,
                        headers={"Cache-Control": "no-store"})

    def found(request: Request):
        got = sources.find(request.path_params["run_id"])
        if got is None:
            return None
        state, run, store = got
        return state, run, store_for(run, store)

    def home(request: Request) -> Response:
        rows = job_rows(sources, store_for)
        body = jobs_html(rows)
        return as_html(list_page(body, _digest(body)), [])

    def home_live(request: Request) -> Response:
        rows = job_rows(sources, store_for)
        body = jobs_html(rows)
        v = _digest(body)
        if request.query_params.get("since") == v:
            return as_json({"version": v}, [])
        return as_json({"version": v, "sections": {"jobs": body}}, [])

    def api_jobs(request: Request) -> Response:
        return as_json({"jobs": job_rows(sources, store_for)}, [])

    def run_page(request: Request) -> Response:
        got = found(request)
        if got is None:
            return PlainTextResponse("no such run or batch job", status_code=404)
        state, run, store = got
        page = {**build(state, run["id"], store=store), "image_base": f"{run['id']}/image"}
        v = version(page)
        return as_html(view_html.render(page, live_url=f"{run['id']}/live", version=v, interval_ms=REFRESH_MS,
                                        back="../"), [run["spec"]])

    def run_live(request: Request) -> Response:
        got = found(request)
        if got is None:
            return as_json({"error": "no such run or batch job"}, [], 404)
        state, run, store = got
        # The version first, from a page without its images; the whole page only when it moved.
        v = version(build(state, run["id"], store=store, with_images=False))
        if request.query_params.get("since") == v:
            return as_json({"version": v}, [run["spec"]])
        sections = cache.get((run["id"], v), lambda: view_html.sections(
            {**build(state, run["id"], store=store), "image_base": f"{run['id']}/image"}))
        return as_json({"version": v, "sections": sections}, [run["spec"]])

    def sample_image(request: Request) -> Response:
        """A sample at full size (the page inlines thumbnails): only a PNG under the run's samples/."""
        got = found(request)
        key = request.query_params.get("key") or ""
        if got is None or not key.startswith(f"runs/{got[1]['id']}/samples/") or not key.endswith(".png") or ".." in key:
            return PlainTextResponse("no such sample", status_code=404)
        try:
            return Response(got[2].get(key), media_type="image/png", headers={"Cache-Control": "private, max-age=3600"})
        except Exception:  # noqa: BLE001 - gone with a pruned checkpoint, or not there yet
            return PlainTextResponse("no such sample", status_code=404)

    def api_run(request: Request) -> Response:
        got = found(request)
        if got is None:
            return as_json({"error": "no such run or batch job"}, [], 404)
        state, run, store = got
        return as_json(build(state, run["id"], store=store), [run["spec"]])

    class Guard(BaseHTTPMiddleware):
        async def dispatch(self, request: Request, call_next):
            if not token:
                return await call_next(request)
            query = request.query_params.get(TOKEN_PARAM)
            if allowed(token, request.headers.get("authorization"), request.cookies.get(COOKIE)):
                return await call_next(request)
            if query and allowed(token, None, query):
                # Swapped for a cookie at once, so that the token leaves the address bar and no page holds it.
                rest = "&".join(f"{k}={v}" for k, v in request.query_params.multi_items() if k != TOKEN_PARAM)
                resp = RedirectResponse(request.url.path + (f"?{rest}" if rest else ""), status_code=303)
                resp.set_cookie(COOKIE, token, httponly=True, samesite="strict")
                return resp
            return PlainTextResponse("a token is needed: open the address with ?token=...", status_code=401)

    async def errors(request: Request, exc: Exception) -> Response:
        return PlainTextResponse(str(exc), status_code=400)

    routes = [Route("/", home), Route("/live", home_live), Route("/api/jobs", api_jobs),
              Route("/runs/{run_id}", run_page), Route("/runs/{run_id}/live", run_live),
              Route("/runs/{run_id}/image", sample_image),
              Route("/api/runs/{run_id}", api_run)]
    return Starlette(routes=routes, middleware=[Middleware(Guard)], exception_handlers={UserError: errors})
