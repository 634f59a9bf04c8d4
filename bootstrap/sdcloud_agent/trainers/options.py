"""Which flags a trainer script accepts, checked without running it (pure: no torch, no sources).

kohya sd-scripts and the diffusers example scripts: their option names and value kinds, read from
the pinned sources into data/trainer-options.json (source URL and commit recorded there; rebuilt by
`python -m sdcloud.runs.inputs.trainer_options_build`). The control plane checks `--trainer-arg` keys
against it before launch, so that a misspelt flag is one line on the user's machine instead of a
host that boots, stages and dies on the script's usage text.
"""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any


@lru_cache(maxsize=1)
def table() -> dict:
    return json.loads(resources.files("sdcloud_agent").joinpath("data", "trainer-options.json").read_text())


def known_scripts(trainer: str) -> tuple[str, ...]:
    return tuple(table().get(trainer, {}).get("scripts", {}))


def script_options(trainer: str, script: str) -> dict[str, str] | None:
    """{"--flag": kind} of a script by its file name, or None when the table does not know it."""
    return table().get(trainer, {}).get("scripts", {}).get(Path(str(script)).name)


def resolve(flag: str, options: dict[str, str] | list[str]) -> list[str]:
    """The options argparse would take `flag` for: itself, else every option it is a prefix of
    (argparse's allow_abbrev, on in these scripts): one is a match, several are ambiguous."""
    if flag in options:
        return [flag]
    return [o for o in options if o.startswith(flag) and o.startswith("--")]


def suggestion(flag: str, options) -> str:
    """ "; did you mean --x" for a near miss (dashes and underscores alike), else ""."""
    names = list(options)
    norm = {o.replace("-", "_").lstrip("_"): o for o in names}
    close = difflib.get_close_matches(flag.replace("-", "_").lstrip("_"), list(norm), n=1, cutoff=0.75)
    return f"; did you mean {norm[close[0]]}" if close else ""


def _value_problem(kind: str, value: Any) -> str | None:
    """Why argparse would refuse `value` for an option of this kind, or None."""
    if value is False or value is None:
        return None  # the flag is left out (base.flag_args)
    if kind == "flag":
        return None if value is True else "takes no value (give KEY or KEY=true)"
    base, _, rest = kind.partition(":")
    many = kind.endswith("*")
    base = base.rstrip("*")
    choices = [c for c in rest.rstrip("*").split("|") if c] if rest else []
    if value is True:
        return None if many else "needs a value (KEY=VALUE)"
    values = value if isinstance(value, (list, tuple)) else [value]
    if len(values) > 1 and not many:
        return "takes one value"
    for v in values:
        text = str(v)
        if base in ("int", "float"):
            try:
                int(text) if base == "int" else float(text)
            except ValueError:
                return f"must be {'a whole number' if base == 'int' else 'a number'}, got {text!r}"
        if choices and text not in choices:
            return f"must be one of {', '.join(choices)}, got {text!r}"
    return None


def problems(trainer: str, script: str, args: dict[str, Any], skip: tuple[str, ...] = (),
             settled: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """One sentence per flag of `args` ({key: value}, as the adapter turns it into --key value) that
    the script would refuse. `skip`: keys the adapter consumes itself; `settled`: values the agent
    replaces on the host (mixed_precision "auto"). Empty when the script is not in the table."""
    options = script_options(trainer, script)
    if options is None:
        return []
    out = []
    for key, value in args.items():
        if key in skip:
            continue
        flag = key if str(key).startswith("-") else f"--{key}"
        found = resolve(flag, options)
        if not found:
            out.append(f"{Path(script).name} has no flag {flag}{suggestion(flag, options)}")
            continue
        if len(found) > 1:
            out.append(f"{flag} is ambiguous in {Path(script).name}: {', '.join(sorted(found)[:4])}")
            continue
        if settled and str(value) in settled.get(key, ()):
            continue
        why = _value_problem(options[found[0]], value)
        if why:
            out.append(f"{found[0]} {why}")
    return out
