"""The package's layers, checked from the source: no import circle (type-only and function-level
imports included), nothing imports a layer above its own, and the engine is a leaf service that
starts without loading any trainer-side module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import slime

ROOT = Path(slime.__file__).parent

# From the ground up; a module may import its own layer and the ones below it.
LAYERS = [
    (
        "ground",
        ("slime", "slime.errors", "slime.utils", "slime.runtime", "slime.algorithms", "slime.observability"),
    ),
    ("sandbox", ("slime.sandbox",)),
    ("engine", ("slime.engine",)),
    # slime's import paths `slime.utils.arguments` and `slime.utils.data` sit with what they adapt
    ("arguments", ("slime.arguments", "slime.utils.arguments")),
    ("data and rollout", ("slime.data", "slime.rollout", "slime.agent", "slime.utils.data")),
    ("weight sync", ("slime.sync",)),
    ("trainer", ("slime.backends",)),
    ("fleet", ("slime.ray",)),
    (
        "top",
        (
            "slime.preflight",
            "slime.checkpoint_sources",
            "slime.train",
            "slime.train_async",
            "slime.default_job",
            "slime.cli",
            "slime.__main__",
        ),
    ),
]
TRAINER_SIDE = (
    "slime.arguments",
    "slime.data",
    "slime.rollout",
    "slime.agent",
    "slime.sync",
    "slime.backends",
    "slime.ray",
    "slime.preflight",
    "slime.train",
    "slime.default_job",
    "slime.algorithms",
    "slime.observability",
)


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports anywhere in its source (TYPE_CHECKING and
    function-level imports included: a hidden edge is still an edge)."""
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
                names = [f"{base}.{a.name}" for a in node.names]
            for name in names:
                target = resolve(name) if name.startswith("slime") else None
                if target and target != mod:
                    edges.add(target)
        graph[mod] = edges
    return graph


def _layer(mod: str) -> int:
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    assert best is not None, f"{mod} belongs to no layer: add it to LAYERS"
    return best[0]


def test_no_import_circle():
    graph = _import_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(mod: str) -> None:
        state[mod] = 1
        path.append(mod)
        for dep in sorted(graph[mod]):
            if state.get(dep) == 1:
                cycle = path[path.index(dep) :] + [dep]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod)


def test_nothing_imports_upward():
    upward = [
        f"{mod} ({LAYERS[_layer(mod)][0]}) imports {dep} ({LAYERS[_layer(dep)][0]})"
        for mod, deps in _import_graph().items()
        for dep in deps
        if _layer(dep) > _layer(mod)
    ]
    assert not upward, upward


def test_engine_package_imports_only_itself_and_the_ground():
    graph = _import_graph()
    allowed = ("slime.engine", "slime.errors", "slime.utils", "slime.runtime")
    bad = [
        f"{mod} imports {dep}"
        for mod, deps in graph.items()
        if mod.startswith("slime.engine")
        for dep in deps
        if dep != "slime" and not any(dep == a or dep.startswith(a + ".") for a in allowed)
    ]
    assert not bad, bad


def test_engine_server_starts_without_the_trainer_side():
    """What `python -m slime.engine.server` (and `slime serve`) loads: the engine and the ground only."""
    code = (
        "import sys, slime.engine.server, slime.cli; print('\\n'.join(m for m in sys.modules if m.startswith('slime')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "slime.engine.server" in loaded
    trainer = [m for m in loaded if any(m == p or m.startswith(p + ".") for p in TRAINER_SIDE)]
    assert not trainer, trainer
    ray_or_tb = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, slime.engine.server; print([m for m in ('ray', 'tensorboard') if m in sys.modules])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert ray_or_tb == "[]"
