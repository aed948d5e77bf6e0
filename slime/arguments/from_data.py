"""Options added from data: the option tables of other projects' parsers (Megatron-LM's, slime's),
each option described by {aliases, dest, action, nargs, type, default, choices} as the
`scripts/extract_*_args.py` scripts record them."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

FLAG_ACTIONS = {
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "BooleanOptionalAction": argparse.BooleanOptionalAction,
}


def add_options(
    group: argparse._ArgumentGroup,
    options: dict[str, dict[str, Any]],
    known: set[str],
    types: dict[str | None, Callable[[str], Any]],
) -> set[str]:
    """Add every option of `options` none of whose names is in `known`; a type the table names
    but `types` lacks (another project's own converters) leaves the value a string. Returns the
    option strings added."""
    added: set[str] = set()
    for name, spec in options.items():
        names = [name, *spec["aliases"]]
        if any(n in known for n in names):
            continue
        kw: dict[str, Any] = {"dest": spec["dest"], "default": spec["default"]}
        if spec["action"] in FLAG_ACTIONS:
            group.add_argument(*names, action=FLAG_ACTIONS[spec["action"]], **kw)
        else:
            if spec["nargs"] is not None:
                kw["nargs"] = spec["nargs"]
            if spec["choices"] is not None:
                kw["choices"] = spec["choices"]
            group.add_argument(*names, type=types.get(spec["type"], str), **kw)
        added.update(names)
    return added


def given_options(tokens: Sequence[str], names: set[str]) -> list[str]:
    """The options among command-line tokens that are in `names`, each once, in order."""
    out: list[str] = []
    for tok in tokens:
        name = tok.split("=", 1)[0]
        if name in names and name not in out:
            out.append(name)
    return out
