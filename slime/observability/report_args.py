"""The "Resolved arguments" of `slime report`'s run facts: the ones set for the run first, the
~900 others collapsed.

args.json (slime.arguments.save_args) holds every resolved argument; which of them the user gave
it tells only through lists of option strings: `options_given` (every option given on the command
line or in --config, where the run records it) and `slime_options_given` / `megatron_options_given`
(the upstream options given). With `options_given` the split is exact. Without it, an argument
counts as set when it was given upstream or its value differs from `slime train`'s parser default
(compared the way save_args writes values: through JSON), which also catches values derived from
what was given (e.g. eval_* from rollout_*); the table says which. The defaults come from the caller
(`ArgDefaults`, `defaults_of(build_parser())`): slime.arguments is a layer above this package.
"""

from __future__ import annotations

import argparse
import html
import json
from collections.abc import Sequence
from typing import Any

__all__ = ["ArgDefaults", "args_html", "defaults_of", "split_args"]

GIVEN_KEYS = ("options_given", "slime_options_given", "megatron_options_given")  # lists of option strings
PASSTHROUGH_KEYS = ("sglang_args", "router_args")  # options handed on to SGLang / the router: given when not empty

# (dest -> default as args.json holds it, option string -> dest) of `slime train`'s parser
ArgDefaults = tuple[dict[str, Any], dict[str, str]]


def _as_saved(value: Any) -> Any:
    """A value as it reads back from args.json (save_args: json.dumps(default=str))."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return str(value)


def defaults_of(parser: argparse.ArgumentParser) -> ArgDefaults:
    """The defaults and option names of a parser (`slime train`'s: slime.arguments.build_parser())."""
    actions = [a for a in parser._actions if a.dest != argparse.SUPPRESS]
    defaults = {a.dest: _as_saved(_parsed_default(parser, a)) for a in actions}
    options = {o: a.dest for a in actions for o in a.option_strings}
    return defaults, options


def _parsed_default(parser: argparse.ArgumentParser, action: argparse.Action) -> Any:
    """The value an option not given gets: argparse runs a string default through the option's type."""
    default = parser.get_default(action.dest)
    if isinstance(default, str) and action.type is not None:
        try:
            return parser._get_value(action, default)
        except (argparse.ArgumentError, TypeError, ValueError):
            return default
    return default


def _dest(option: str, options: dict[str, str]) -> str:
    # argparse's own rule where the parser is not at hand: --rollout-batch-size -> rollout_batch_size
    return options.get(option) or option.lstrip("-").replace("-", "_")


def _unset_like(value: Any, default: Any) -> bool:
    """A value that differs from a None default only by being empty or off: derived, not given
    (a user turns a flag on, or gives a value)."""
    return default is None and (value is False or value in ([], {}, ""))


def split_args(
    values: dict[str, Any], arg_defaults: ArgDefaults | None = None
) -> tuple[list[tuple[str, Any, Any, str]], dict[str, Any]] | None:
    """([(name, value, default, why set)] sorted by name, {the other arguments}) of one args file;
    None when nothing tells which arguments were set (no `options_given`, no defaults)."""
    exact = isinstance(values.get("options_given"), list)  # every option given is recorded: no guessing
    if not exact and arg_defaults is None:
        return None
    defaults, options = arg_defaults or ({}, {})
    given = {_dest(o, options) for k in GIVEN_KEYS for o in (values.get(k) or []) if isinstance(o, str)}
    set_: list[tuple[str, Any, Any, str]] = []
    rest: dict[str, Any] = {}
    for name in sorted(values):
        value, default = values[name], defaults.get(name)
        if name in given:
            set_.append((name, value, default, "given"))
        elif (
            not exact
            and name in defaults
            and name not in GIVEN_KEYS
            and value != default
            and not _unset_like(value, default)
        ):
            set_.append((name, value, default, "differs from the default"))
        elif name in PASSTHROUGH_KEYS and value:
            set_.append((name, value, None, "passed on"))
        else:
            rest[name] = value
    return set_, rest


def _show(value: Any) -> str:
    return "None" if value is None else value if isinstance(value, str) else json.dumps(value)


def _table(rows: Sequence[tuple[str, ...]], head: tuple[str, ...]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class='kv'><tr>{th}</tr>{body}</table>"


def _how(values: dict[str, Any]) -> str:
    if isinstance(values.get("options_given"), list):
        return "the options given on the command line or in --config"
    return (
        "the options given, as far as the file tells: values that differ from the parser's default "
        "(some of them derived from what was given, e.g. eval_* from rollout_*)"
    )


def _file_html(name: str, values: dict[str, Any], arg_defaults: ArgDefaults | None) -> str:
    split = split_args(values, arg_defaults)
    head = f"<div class='args-file' data-file='{html.escape(name)}'><h4>{html.escape(name)}"
    if split is None:
        rows = [(k, _show(values[k])) for k in sorted(values)]
        return (
            f"{head}</h4><div class='hint'>which options were given is not recorded in this file (no "
            f"options_given) and the parser's defaults were not at hand: every argument</div>"
            f"{_table(rows, ('argument', 'value'))}</div>"
        )
    set_, rest = split
    shown = [(k, _show(v), "" if why == "passed on" else _show(d), why) for k, v, d, why in set_]
    set_html = (
        _table(shown, ("argument", "value", "default", "why shown"))
        if shown
        else "<div class='empty'>every argument is at its default</div>"
    )
    other = _table([(k, _show(v)) for k, v in rest.items()], ("argument", "value"))
    return (
        f"{head}: {len(set_)} set for this run</h4><div class='hint'>{_how(values)}</div>{set_html}"
        f"<details class='args-rest'><summary>the other {len(rest)} arguments (defaults, derived, "
        f"bookkeeping)</summary>{other}</details></div>"
    )


def args_html(args_files: dict[str, dict[str, Any]], arg_defaults: ArgDefaults | None = None) -> str:
    """The resolved arguments of each args file (args.json, args.<stage>.json)."""
    if not args_files:
        return "<div class='empty'>no args.json</div>"
    return "".join(_file_html(name, values, arg_defaults) for name, values in args_files.items())
