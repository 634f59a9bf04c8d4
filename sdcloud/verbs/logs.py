"""A run's log as `sdcloud logs` shows it: the controller's events and the hosts' logs, merged in time order.

The hosts' logs are in the run's bucket (`runs/<id>/logs/`); a batch job on this machine adds its
pool's worker logs ($SDCLOUD_HOME/batch/<job>/). A host line carries the agent's time stamp; the
trainer's protocol lines (`SDCLOUD_STEP {...}`) read in plain words and libraries' Python warnings
are marked, so that the command can leave them out unless -v.
"""

from __future__ import annotations

import json
import re
import time

from .. import render
from .progress_view import plain

_LOG_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:[.,](\d+))?")
_STEP_LINE = re.compile(r"SDCLOUD_STEP \{")
# The trainer's protocol lines (sdcloud_agent.trainers.base, the builtin trainer's START and OOM):
# for the agent, not for people. Shown in words; one without words only under -v.
_PROTOCOL = re.compile(r"\bSDCLOUD_([A-Z]+) (\{.*\})\s*$")
# Libraries' notes that are not Python warnings but say nothing a user acts on (diffusers' float32
# note when a model is cast, deprecation notices): under -v only, as warnings are.
_LIBRARY_NOTE = re.compile(r"should be kept in float32|Casting directly with `to\(\)`|is deprecated and will be "
                           r"removed|\bwill be removed in (?:version|diffusers|transformers)")
# A Python warning as the warnings module prints it (`file.py:12: FutureWarning: ...`, or bare
# `UserWarning: ...`), and the indented source line it prints next: library noise unless -v.
_PY_WARNING = re.compile(r"(?:^|\.py:\d+: |: )[A-Z]\w*Warning: ")
_AGENT_PREFIX = re.compile(r"^[A-Z]+ sdcloud_agent\.trainer: ")


# Host line kinds shown only under -v: libraries' warnings and notes, protocol lines without words.
QUIET_KINDS = frozenset({"warning", "note", "protocol"})


def _parse_time(line: str) -> float | None:
    m = _LOG_TIME.match(line)
    if not m:
        return None
    try:
        stamp = time.mktime(time.strptime(m.group(1).replace("T", " "), "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None
    return stamp + (float("0." + m.group(2)) if m.group(2) else 0.0)


def log_records(state, run: dict, offsets: dict, steps: bool = False, node: int | None = None) -> list[dict]:
    """New records of the run's events and hosts' logs since `offsets`, each with its own time.

    Host log lines carry the agent's timestamp; a line without one (a trainer's traceback) takes the
    time of the line before it, so that a merge by time keeps it in place. `node`: one host of a
    multi-node group alone (its log, without the controller's events; 0 is rank 0, the run's own).
    """
    from ..runs.records.store import StoreError

    out = []
    for ev in state.events(run["id"], after_id=offsets.get("events", 0)) if node is None else ():
        offsets["events"] = ev["id"]
        out.append({"time": ev["time"], "source": "controller", "attempt": ev["data"].get("attempt"),
                    "kind": ev["kind"], "text": plain(ev["kind"], ev["data"]) or ev["kind"],
                    "detail": " ".join(f"{k}={v}" for k, v in ev["data"].items()), "verbose_only": False})
    try:
        for key, name, data, born in _log_sources(run, node):
            seen = offsets.get(key, 0)
            if len(data) <= seen:
                continue
            m = re.search(r"attempt-(\d+)", name)
            attempt = int(m.group(1)) if m else None
            last = offsets.get(key + "#t", born)
            in_warning = offsets.get(key + "#w", False)
            for line in data[seen:].decode(errors="replace").splitlines():
                at = _parse_time(line) or last
                last = at
                if not steps and _STEP_LINE.search(line):
                    continue
                kind, in_warning = _line_kind(line, in_warning)
                out.append({"time": at, "source": name.removesuffix(".log"), "attempt": attempt, "kind": kind,
                            "text": line, "detail": "", "verbose_only": kind in QUIET_KINDS})
            offsets[key + "#w"] = in_warning
            offsets[key] = len(data)
            offsets[key + "#t"] = last
    except (StoreError, OSError, ValueError):
        pass
    out.sort(key=lambda r: r["time"])
    return out


def _log_sources(run: dict, node: int | None = None):
    """(key, name, bytes, a time for lines before the first stamped one) of every log the run has: its
    hosts' logs in the bucket, and for a batch job on this machine its pool's worker logs."""
    from .. import config
    from ..offers.kinds import RunKind
    from ..runs.records.state import run_kind
    from ..runs.records.store_of import store_of

    store = store_of(run)
    if node:  # another host of a multi-node group reports under nodes/<rank>/ (sdcloud_agent/agent_nodes.py)
        for info in store.list(f"runs/{run['id']}/nodes/{node}/logs/"):
            yield info.key, f"node-{node}/" + info.key.rsplit("/", 1)[-1], store.get(info.key), 0.0
        return
    for info in store.list(f"runs/{run['id']}/logs/"):
        yield info.key, info.key.rsplit("/", 1)[-1], store.get(info.key), 0.0
    if run_kind(run) is RunKind.BATCH:
        folder = config.home() / "batch" / run["id"]
        for f in sorted(folder.glob("*.log")) if folder.is_dir() else []:
            yield str(f), f.name, f.read_bytes(), f.stat().st_ctime


def _line_kind(line: str, in_warning: bool) -> tuple[str, bool]:
    """A host log line's kind: "log", "warning" (a library's Python warning, with the source line
    the warnings module prints under it) or a protocol tag ("step", "checkpoint", "done"); and
    whether the next line may still belong to a warning."""
    proto = _PROTOCOL.search(line)
    if proto:
        words = _protocol_words(proto.group(1), proto.group(2))
        return (proto.group(1).lower() if words is not None else "protocol"), False
    body = _AGENT_PREFIX.sub("", _LOG_TIME.sub("", line).lstrip())
    if _PY_WARNING.search(body):
        return "warning", True
    if _LIBRARY_NOTE.search(body):
        return "note", False
    if in_warning and (body.startswith((" ", "\t")) or not body.strip()):
        return "warning", True
    return "log", False


def _protocol_words(tag: str, payload: str) -> str | None:
    """A protocol line in plain words; None when it cannot be read (then it is shown as it is)."""
    try:
        doc = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    if tag == "CHECKPOINT":
        return f"checkpoint step {doc.get('step', '?')} saved"
    if tag == "DONE":
        return "trainer finished" + (f" at step {doc['step']}" if "step" in doc else "")
    if tag == "START":
        resumed = " (resumed from its checkpoint)" if doc.get("resumed_from") else ""
        return f"trainer started at step {doc.get('step', '?')} of {doc.get('total_steps', '?')}{resumed}"
    if tag == "OOM":
        peak = (f" (peak {doc['peak_gb']} of {doc['total_gb']} GB)" if doc.get("peak_gb") is not None
                and doc.get("total_gb") is not None else "")
        return f"out of GPU memory at step {doc.get('step', '?')}{peak}"
    if tag != "STEP":
        return None
    parts = [f"step {doc.get('step', '?')}"]
    if doc.get("loss") is not None:
        parts.append(f"loss {doc['loss']:.4g}" if isinstance(doc["loss"], (int, float)) else f"loss {doc['loss']}")
    if doc.get("it_per_s") is not None:
        parts.append(f"{doc['it_per_s']} it/s")
    return ", ".join(parts)


def log_line(r: dict) -> str:
    """One line per record, with one time stamp: the record's own (a host line's is taken off its text)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"]))
    if r["source"] == "controller":
        text = f"{r['kind']} {r['detail']}".strip() if render.VERBOSITY > 0 else r["text"]
        return f"{stamp} controller {text}"
    text = _LOG_TIME.sub("", r["text"], count=1).lstrip() if _LOG_TIME.match(r["text"]) else r["text"]
    proto = _PROTOCOL.search(text)
    if proto and render.VERBOSITY <= 0:
        words = _protocol_words(proto.group(1), proto.group(2))
        if words is not None:
            text = text[:proto.start()] + words
    return f"{stamp} {r['source']}: {text}"
