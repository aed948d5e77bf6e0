"""Shared test helpers. Arguments are built by slime's own parser: a test sees every option with
its real default, never a hand-made partial namespace."""

from __future__ import annotations

import os
from argparse import Namespace

from slime.arguments import parse_args, to_argv

REQUIRED = ["--rollout-batch-size", "1", "--num-rollout", "1"]


def make_args(*argv: str, **options) -> Namespace:
    """`parse_args` of the required options, then `options` (`rm_type="math"` -> `--rm-type math`,
    True -> a flag), then `argv` (later values win)."""
    return parse_args(REQUIRED + to_argv(options) + list(argv))


def stub_generate_state(monkeypatch, args: Namespace):
    """Install a GenerateState without tokenizer or engine (hooks stand in for the engine): the real
    state for `args`, built by `GenerateState.build`. The caller resets `GenerateState` afterwards."""
    from slime.rollout import sglang_rollout

    st = sglang_rollout.GenerateState.build(args, tokenizer=None)
    monkeypatch.setattr(sglang_rollout.GenerateState, "_instance", st)
    return st


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def alive(pid: int) -> bool:
    """Whether `pid` is running (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
