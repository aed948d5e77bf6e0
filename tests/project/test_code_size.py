"""Sizes that keep the code readable, checked from the source: no module of the package over 600
lines, no function over 80, and the training actor a page of its own job (model, step, checkpoint)."""

from __future__ import annotations

import ast
from pathlib import Path

import slime

ROOT = Path(slime.__file__).parent
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_TRAIN_ACTOR_LINES = 250


def _sources() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def test_no_module_over_600_lines():
    long = {
        str(p.relative_to(ROOT.parent)): n
        for p in _sources()
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not long, f"modules over {MAX_FILE_LINES} lines: {long}"


def test_no_function_over_80_lines():
    long = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_train_actor_is_one_page():
    tree = ast.parse((ROOT / "backends" / "torch" / "actor.py").read_text())
    (actor,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainActor"]
    assert actor.end_lineno - actor.lineno + 1 <= MAX_TRAIN_ACTOR_LINES
