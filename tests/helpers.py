"""Shared test helpers. Arguments are built by slime's own parser: a test sees every option with
its real default, never a hand-made partial namespace."""

from __future__ import annotations

import os
from argparse import Namespace

from slime.arguments import parse_args, to_argv

REQUIRED = ["--rollout-batch-size", "1", "--num-rollout", "1"]


def run_ranks(target, world: int, *args, timeout: float = 300) -> None:
    """`target(rank, world, *args)` in `world` spawned processes (one per training rank, as torch
    launches them); every one must exit 0 within `timeout` seconds."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=(rank, world, *args)) for rank in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert codes == [0] * world, f"{world} rank(s): exit codes {codes}"


def make_args(*argv: str, **options) -> Namespace:
    """`parse_args` of the required options, then `options` (`rm_type="math"` -> `--rm-type math`,
    True -> a flag), then `argv` (later values win)."""
    return parse_args(REQUIRED + to_argv(options) + list(argv))


def short_run_argv(model_dir, task_dir, run_dir, *extra: str) -> list[str]:
    """A two-rollout colocated run on the addition task (2 prompts x 2 samples, 8 new tokens, one
    optimizer step each, lr 1e-2), then `extra` (later values win)."""
    return [
        *("--hf-checkpoint", str(model_dir), "--prompt-data", str(task_dir / "train.jsonl")),
        *("--input-key", "prompt", "--label-key", "label", "--num-rollout", "2"),
        *("--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8"),
        *("--global-batch-size", "4", "--micro-batch-size", "4", "--lr", "1e-2", "--colocate"),
        *("--run-dir", str(run_dir)),
        *extra,
    ]


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
