"""Rebuild sdcloud_agent/data/trainer-options.json: the option names (and value kinds) that the
pinned kohya sd-scripts and diffusers example scripts accept, read from their sources.

    python -m sdcloud.runs.inputs.trainer_options_build --kohya SD_SCRIPTS_CHECKOUT --kohya-commit SHA --kohya-ref TAG \
        --diffusers DIFFUSERS_CHECKOUT --diffusers-commit SHA --diffusers-ref REF > trainer-options.json

The scripts cannot be imported here (torch, CUDA libraries), so their argparse calls are read with
`ast`: every `*.add_argument("--x", ...)` in the script's parser function and in the functions it
calls (followed into the repository's own modules, constant arguments bound, so that a branch such
as `if support_dreambooth:` is taken only when the script asks for it). `sdcloud up` checks
`--trainer-arg` keys against the result before anything launches (sdcloud_agent/trainers/options.py).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

# The scripts sdcloud picks (runs/inputs/training.py) or that its adapters know by name.
KOHYA_SCRIPTS = ("train_network.py", "sdxl_train_network.py", "train_db.py", "sdxl_train.py", "fine_tune.py",
                 "sd3_train_network.py", "sd3_train.py")
DIFFUSERS_SCRIPTS = ("dreambooth/train_dreambooth_lora.py", "dreambooth/train_dreambooth_lora_sdxl.py",
                     "dreambooth/train_dreambooth.py", "text_to_image/train_text_to_image.py",
                     "text_to_image/train_text_to_image_lora.py", "text_to_image/train_text_to_image_sdxl.py",
                     "text_to_image/train_text_to_image_lora_sdxl.py",
                     "dreambooth/train_dreambooth_lora_sd3.py", "dreambooth/train_dreambooth_sd3.py")
FLAG_ACTIONS = ("store_true", "store_false", "store_const", "count", "help", "version")


class _Module:
    def __init__(self, root: Path, path: Path):
        self.root, self.path = root, path
        self.tree = ast.parse(path.read_text(encoding="utf-8"))
        self.functions = {n.name: n for n in self.tree.body if isinstance(n, ast.FunctionDef)}
        self.aliases: dict[str, str] = {}  # local name -> dotted module
        self.imported: dict[str, tuple[str, str]] = {}  # local name -> (dotted module, function)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if _module_file(root, f"{node.module}.{a.name}"):
                        self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                    else:
                        self.imported[a.asname or a.name] = (node.module, a.name)


def _module_file(root: Path, dotted: str) -> Path | None:
    base = root.joinpath(*dotted.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _kind(call: ast.Call) -> str:
    """A compact description: flag, int, float, str, or str:choice|choice."""
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = kw.get("action")
    if isinstance(action, ast.Constant) and action.value in FLAG_ACTIONS:
        return "flag"
    if isinstance(action, ast.Attribute) and action.attr == "BooleanOptionalAction":
        return "flag"
    kind = "str"
    typ = kw.get("type")
    if isinstance(typ, ast.Name) and typ.id in ("int", "float"):
        kind = typ.id
    choices = kw.get("choices")
    if choices is not None:
        try:
            values = ast.literal_eval(choices)
            kind += ":" + "|".join(str(v) for v in values if v is not None)
        except ValueError:
            pass
    if kw.get("nargs") is not None:
        kind += "*"  # several values (or none): a list
    return kind


class Extractor:
    def __init__(self, root: Path):
        self.root = root
        self.modules: dict[Path, _Module] = {}

    def module(self, path: Path) -> _Module:
        if path not in self.modules:
            self.modules[path] = _Module(self.root, path)
        return self.modules[path]

    def options(self, script: Path, function: str) -> dict[str, str]:
        out: dict[str, str] = {}
        mod = self.module(script)
        self._function(mod, function, [], {}, out, set())
        return dict(sorted(out.items()))

    def _function(self, mod: _Module, name: str, args: list[ast.expr], kwargs: dict[str, ast.expr],
                  out: dict[str, str], seen: set) -> None:
        fn = mod.functions.get(name)
        if fn is None or (mod.path, name) in seen:
            return
        env: dict[str, Any] = {}
        params = [a.arg for a in fn.args.args]
        for p, a in zip(params, args):
            if isinstance(a, ast.Constant):
                env[p] = a.value
        for p, a in kwargs.items():
            if isinstance(a, ast.Constant):
                env[p] = a.value
        for p, d in zip(params[len(params) - len(fn.args.defaults):], fn.args.defaults):
            if p not in env and isinstance(d, ast.Constant):
                env[p] = d.value
        for stmt in fn.body:
            self._visit(mod, stmt, env, out, seen | {(mod.path, name)})

    def _visit(self, mod: _Module, node: ast.AST, env: dict, out: dict[str, str], seen: set) -> None:
        if isinstance(node, ast.If):
            value = _truth(node.test, env)
            branches = [node.body] if value is True else [node.orelse] if value is False else [node.body, node.orelse]
            for body in branches:
                for stmt in body:
                    self._visit(mod, stmt, env, out, seen)
            return
        if isinstance(node, ast.Call):
            self._call(mod, node, out, seen)
        for child in ast.iter_child_nodes(node):
            self._visit(mod, child, env, out, seen)

    def _call(self, mod: _Module, call: ast.Call, out: dict[str, str], seen: set) -> None:
        func = call.func
        kwargs = {k.arg: k.value for k in call.keywords if k.arg}
        if isinstance(func, ast.Attribute) and func.attr == "add_argument":
            kind = _kind(call)
            for a in call.args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-"):
                    out[a.value] = kind
                    if kind == "flag" and any(isinstance(k.value, ast.Attribute) and k.value.attr == "BooleanOptionalAction"
                                              for k in call.keywords if k.arg == "action"):
                        out["--no-" + a.value.lstrip("-")] = "flag"
            return
        if isinstance(func, ast.Name):
            if func.id in mod.functions:
                self._function(mod, func.id, call.args, kwargs, out, seen)
            elif func.id in mod.imported:
                dotted, name = mod.imported[func.id]
                path = _module_file(self.root, dotted)
                if path:
                    self._function(self.module(path), name, call.args, kwargs, out, seen)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in mod.aliases:
            path = _module_file(self.root, mod.aliases[func.value.id])
            if path:
                self._function(self.module(path), func.attr, call.args, kwargs, out, seen)


def _truth(test: ast.expr, env: dict) -> bool | None:
    """The value of a test made of bound parameters, `not` and and/or; None when unknown."""
    if isinstance(test, ast.Name) and test.id in env:
        return bool(env[test.id])
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _truth(test.operand, env)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        values = [_truth(v, env) for v in test.values]
        if isinstance(test.op, ast.And):
            return False if False in values else (None if None in values else True)
        return True if True in values else (None if None in values else False)
    return None


def build(kohya: Path, kohya_commit: str, kohya_ref: str, diffusers: Path, diffusers_commit: str,
          diffusers_ref: str, diffusers_note: str = "") -> dict:
    ko = Extractor(kohya)
    di = Extractor(diffusers / "examples")
    return {
        "about": "Options the pinned trainer scripts accept, read from their argparse calls with ast by "
                 "python -m sdcloud.runs.inputs.trainer_options_build. Kinds: flag (no value), int, float, str; "
                 "':a|b' lists the choices; '*' takes several values.",
        "kohya": {"source": "https://github.com/kohya-ss/sd-scripts", "commit": kohya_commit, "ref": kohya_ref,
                  "pinned_in": "sdcloud_agent/data/trainer-sources.txt",
                  "scripts": {s: ko.options(kohya / s, "setup_parser") for s in KOHYA_SCRIPTS}},
        "diffusers": {"source": "https://github.com/huggingface/diffusers", "commit": diffusers_commit,
                      "ref": diffusers_ref, "pinned_in": "sdcloud_agent/data/trainer-sources.txt",
                      **({"note": diffusers_note} if diffusers_note else {}),
                      "scripts": {Path(s).name: di.options(diffusers / "examples" / s, "parse_args")
                                  for s in DIFFUSERS_SCRIPTS}},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sdcloud.runs.inputs.trainer_options_build")
    p.add_argument("--kohya", type=Path, required=True)
    p.add_argument("--kohya-commit", required=True)
    p.add_argument("--kohya-ref", required=True)
    p.add_argument("--diffusers", type=Path, required=True)
    p.add_argument("--diffusers-commit", required=True)
    p.add_argument("--diffusers-ref", required=True)
    p.add_argument("--diffusers-note", default="", help="why this commit, when it is not the pinned tag")
    a = p.parse_args(argv)
    doc = build(a.kohya, a.kohya_commit, a.kohya_ref, a.diffusers, a.diffusers_commit, a.diffusers_ref,
                a.diffusers_note)
    json.dump(doc, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
