"""Small checks every argument group uses; each failure names the argument as the user typed it."""

from __future__ import annotations

import argparse

from slime.errors import SlimeError


def flag(name: str) -> str:
    """`rollout_batch_size` -> `--rollout-batch-size`."""
    return "--" + name.replace("_", "-")


def need(cond: bool, message: str) -> None:
    if not cond:
        raise SlimeError(message)


def require_positive(args: argparse.Namespace, *names: str) -> None:
    """Each named option, when set, is >= 1."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SlimeError(f"{flag(name)} must be >= 1, got {value}")
