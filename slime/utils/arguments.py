"""slime's `slime.utils.arguments`: `parse_args(add_custom_arguments=None)`, the entry point
slime's own train scripts call, with a hook adding a script's own options.

The options are this repo's parser (slime.arguments: slime-rl's options, slime's and Megatron-LM's
other options as data, `--sglang-*` pass-through) and the checks it runs; the custom options are
parsed by a parser of their own from the same command line and set on the same namespace, so a
custom option that is also one of slime's is an error, as in slime's argparse.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from slime.arguments import build_parser, finalize_args
from slime.arguments import parse_args as _parse_slime_args
from slime.errors import SlimeError
from slime.observability.logging_utils import configure_logger

__all__ = ["parse_args", "get_slime_extra_args_provider", "reset_arg", "slime_validate_args"]

CustomArguments = Callable[[argparse.ArgumentParser], argparse.ArgumentParser | None]


def reset_arg(parser: argparse.ArgumentParser, name: str, **kwargs) -> None:
    """Set the default of option `name` (`default=`), or add the option with `kwargs` when the
    parser does not have it."""
    for action in parser._actions:
        if name in action.option_strings:
            if "default" in kwargs:
                action.default = kwargs["default"]
            return
    parser.add_argument(name, **kwargs)


def get_slime_extra_args_provider(add_custom_arguments: CustomArguments | None = None):
    """A function adding slime's options (this repo's parser's), then the custom ones, to a
    parser, and returning it. Options the parser already has (e.g. `-h`) keep its definition."""

    def add_slime_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        have = {s for a in parser._actions for s in a.option_strings}
        for action in build_parser()._actions:
            if action.option_strings and not have.intersection(action.option_strings):
                parser._add_action(action)
        if add_custom_arguments is not None:
            parser = add_custom_arguments(parser) or parser
        return parser

    return add_slime_arguments


def _custom_parser(add_custom_arguments: CustomArguments) -> argparse.ArgumentParser:
    custom = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    custom = add_custom_arguments(custom) or custom
    slime_options = {s for a in build_parser()._actions for s in a.option_strings}
    clash = sorted({s for a in custom._actions for s in a.option_strings} & slime_options)
    if clash:
        raise SlimeError(f"add_custom_arguments adds {', '.join(clash)}, which slime already has")
    return custom


def parse_args(add_custom_arguments: CustomArguments | None = None) -> argparse.Namespace:
    """Parse and check the command line (`sys.argv[1:]`); `add_custom_arguments(parser)` adds a
    script's own options (it may return the parser), whose values land on the same namespace."""
    configure_logger()
    argv = sys.argv[1:]
    if add_custom_arguments is None:
        return _parse_slime_args(argv)
    custom = _custom_parser(add_custom_arguments)
    custom_args, rest = custom.parse_known_args(argv)
    args = _parse_slime_args(rest)
    for key, value in vars(custom_args).items():
        setattr(args, key, value)
    return args


def slime_validate_args(args: argparse.Namespace) -> argparse.Namespace:
    """The derived values and cross-option checks of a parsed namespace (slime.arguments.finalize_args)."""
    return finalize_args(args)
