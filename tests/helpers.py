"""Arguments for tests, built by slime's own parser: a test sees every option with its real
default, never a hand-made partial namespace."""

from __future__ import annotations

from argparse import Namespace

from slime.arguments import parse_args, to_argv

REQUIRED = ["--rollout-batch-size", "1", "--num-rollout", "1"]


def make_args(*argv: str, **options) -> Namespace:
    """`parse_args` of the required options, then `options` (`rm_type="math"` -> `--rm-type math`,
    True -> a flag), then `argv` (later values win)."""
    return parse_args(REQUIRED + to_argv(options) + list(argv))
