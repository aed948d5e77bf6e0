"""One argument parser for `slime train`, composed of the per-concern groups of this package.

* Names follow slime (`--rollout-batch-size`, `--n-samples-per-prompt`, ...), so a slime
  launch script needs only backend changes.
* `--sglang-<arg> [value]` is captured verbatim into `args.sglang_args` and forwarded to the
  engine as `--<arg>` (slime's own `--sglang-router-ip/port` and `--sglang-server-concurrency`
  excepted); with the built-in engine, SGLang's options it does not have are named at start-up
  instead (`engine.sort_passthrough`), and a name neither knows is an error.
* `--router-<arg> [value]` (sglang-router's own options, as slime takes them) is captured into
  `args.router_args` as `--<arg>` and given to sglang-router, checked against its parser at start-up.
* `--config file.yaml` supplies the same arguments (keys with `-` or `_`); the command line wins.
* Every default is defined once, in the group that adds the option; values that follow other
  options (`--eval-temperature` from `--rollout-temperature`, ...) are filled in by the group's
  `finalize`. Every user error raises `SlimeError` naming the argument, with a "did you mean"
  hint, before any process is launched. Nothing here reads data files.
"""

from __future__ import annotations

import argparse
import difflib
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from slime.arguments import (
    algorithm,
    cluster,
    data,
    debug,
    engine,
    evaluation,
    logs,
    lora,
    megatron,
    rollout,
    training,
    upstream,
)
from slime.arguments.from_data import given_options
from slime.errors import SlimeError

# The groups in the order their `finalize` runs: each may read what an earlier one resolved.
GROUPS = (cluster, rollout, data, evaluation, engine, logs, training, lora, algorithm, debug)


class SlimeArgumentParser(argparse.ArgumentParser):
    """argparse that raises SlimeError (with a suggestion) instead of exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        hint = ""
        if "invalid choice" in message:
            bad = message.split("invalid choice: ", 1)[1].split(" (", 1)[0].strip("'\"")
            choices = message.split("choose from ", 1)[1].rstrip(")").replace("'", "").split(", ")
            close = difflib.get_close_matches(bad, choices, n=1)
            if close:
                hint = f"; did you mean {close[0]!r}?"
        raise SlimeError(f"{message}{hint}")


class _HelpFormatter(argparse.HelpFormatter):
    """Each option's default after its help line, unless the help already says it (or there is none);
    short value names (N, X, PATH, VALUE) instead of the option's name again in capitals."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=44, width=min(120, shutil.get_terminal_size((120, 24)).columns))

    def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
        if action.type is int:
            return "N"
        if action.type is float:
            return "X"
        if action.dest.endswith(("_path", "_dir", "_data", "_load", "_checkpoint")) or action.dest in ("load", "save"):
            return "PATH"
        return "VALUE"

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            text
            and text != argparse.SUPPRESS
            and "default" not in text.lower()
            and default not in (None, False, argparse.SUPPRESS, [], "")
            and action.nargs != 0  # flags: their default is "off"
        ):
            text += " (default: %(default)s)"
        return text


class _HelpAll(argparse.Action):
    """`--help-all`: the help with slime's and Megatron-LM's pass-through options too."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        build_parser(full_help=True, prog=parser.prog).print_help()
        parser.exit()


def build_parser(full_help: bool = False, prog: str = "slime train") -> SlimeArgumentParser:
    """`slime train`'s parser. Its `--help` shows slime-rl's own options, grouped by concern, each
    with a help line and its default; slime's and Megatron-LM's other options are accepted too
    and listed by `--help-all` (`full_help`)."""
    p = SlimeArgumentParser(
        prog=prog,
        usage=f"{prog} [options]   (--help: the options by concern; --help-all: every option)",
        description="RL post-training with slime's arguments.",
        allow_abbrev=False,
        formatter_class=_HelpFormatter,
    )
    p.add_argument("--config", type=str, default=None, help="YAML file of arguments (command line wins).")
    p.add_argument("--help-all", action=_HelpAll, help="Show every option, slime's and Megatron-LM's too, and exit.")
    for group in GROUPS:
        group.add_arguments(p)
    own = len(p._actions)
    # then slime's and Megatron-LM's other options, as data: slime-rl's own definitions win
    p.slime_names = upstream.add_arguments(p, megatron_names=set(megatron.megatron_options()))
    p.megatron_names = megatron.add_arguments(p)
    upstream.set_slime_defaults(p, p.megatron_names)
    if not full_help:  # accepted, but ~700 of them: listed by --help-all only
        for action in p._actions[own:]:
            action.help = argparse.SUPPRESS
    return p


def parse_args(argv: Sequence[str] | None = None, prog: str = "slime train") -> argparse.Namespace:
    """Parse and validate `slime train` arguments (`prog`: the command, for --help). Raises SlimeError
    on any user error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog=prog)
    known = {s for a in parser._actions for s in a.option_strings}

    own, passthrough = engine.split_passthrough(argv, known)
    own, router = engine.split_passthrough(own, known, prefix="--router-")
    # --config first, so the command line overrides it.
    config_path = None
    for i, tok in enumerate(own):
        if tok == "--config" and i + 1 < len(own):
            config_path = own[i + 1]
        elif tok.startswith("--config="):
            config_path = tok.split("=", 1)[1]
    if config_path:
        cfg_own, cfg_pass = engine.split_passthrough(_config_to_argv(config_path, parser, known), known)
        cfg_own, cfg_router = engine.split_passthrough(cfg_own, known, prefix="--router-")
        own = cfg_own + own
        passthrough = cfg_pass + passthrough
        router = cfg_router + router

    args, unknown = parser.parse_known_args(own)
    if unknown:
        bad = unknown[0]
        name = bad.split("=", 1)[0]
        if name.startswith("-"):
            raise SlimeError(f"unknown argument {name}{_suggest(name, sorted(known))}")
        raise SlimeError(f"unexpected value {bad!r} (no argument takes it)")
    args.sglang_args = passthrough
    args.router_args = router  # sglang-router's own options, checked against its parser at start-up
    args.options_given = given_options(own, known)  # what the user set (the report lists these first)
    args.slime_options_given = given_options(own, parser.slime_names)
    upstream.check_given(args.slime_options_given)
    args.megatron_options_given = given_options(own, parser.megatron_names)
    return finalize_args(args)


def finalize_args(args: argparse.Namespace) -> argparse.Namespace:
    """Derived values and cross-argument checks, group by group (no process is launched before this passes)."""
    for group in GROUPS:
        if hasattr(group, "finalize"):
            group.finalize(args)
    return args


def startup_notes(args: argparse.Namespace) -> list[str]:
    """What the command line set that this backend accepts but does not use: one line per source,
    printed once at start-up so nothing a user wrote is dropped silently; and what LoRA changes."""
    notes = (
        lora.startup_note(args),
        upstream.unused_note(args),
        logs.unused_note(args),
        megatron.unused_note(args),
        engine.unused_note(args),
        debug.unused_note(args),
    )
    return [note for note in notes if note]


def set_num_rollout(args: argparse.Namespace, num_prompts: int) -> None:
    """--num-epoch without --num-rollout: (prompts // --rollout-batch-size) x epochs (slime's rule:
    each epoch is whole rollouts; its leftover prompts start the next), once the data source has
    counted its prompts; then the schedule that depends on it."""
    if args.num_rollout is None:
        args.num_rollout = num_prompts // args.rollout_batch_size * args.num_epoch
        if args.num_rollout < 1:
            raise SlimeError(
                f"--num-epoch {args.num_epoch} over {num_prompts} prompts is less than one rollout of "
                f"--rollout-batch-size {args.rollout_batch_size}"
            )
        training.finalize_schedule(args)


def _suggest(name: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _config_to_argv(path: str, parser: SlimeArgumentParser, known_options: set[str]) -> list[str]:
    """Turn a YAML mapping into command-line tokens, checking every key."""
    p = Path(path)
    if not p.is_file():
        raise SlimeError(f"--config: file not found: {path}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise SlimeError(f"--config {path}: invalid YAML: {e}") from e
    if not isinstance(data, dict):
        raise SlimeError(f"--config {path}: expected a mapping of argument names to values")
    store_true = {a.option_strings[0] for a in parser._actions if isinstance(a, argparse._StoreTrueAction)}
    append = {a.option_strings[0] for a in parser._actions if isinstance(a, argparse._AppendAction)}
    argv: list[str] = []
    for key, value in data.items():
        opt = "--" + str(key).replace("_", "-")
        if opt not in known_options and not opt.startswith(("--sglang-", "--router-")):
            raise SlimeError(f"--config {path}: unknown key {key!r}{_suggest(opt, sorted(known_options))}")
        if opt in store_true or (opt.startswith(("--sglang-", "--router-")) and isinstance(value, bool)):
            if not isinstance(value, bool):
                raise SlimeError(f"--config {path}: {key!r} is a flag; use true or false, got {value!r}")
            if value:
                argv.append(opt)
        elif isinstance(value, list) and opt in append:  # slime's action="append": the flag once per item
            for item in value:
                argv += [opt, str(item)]
        elif isinstance(value, list):
            argv += [opt, *map(str, value)]
        elif isinstance(value, dict):
            argv += [opt, json.dumps(value)]
        elif value is not None:
            argv += [opt, str(value)]
    return argv


# never written to the run directory
SECRETS = ("wandb_key", "engine_api_key", "engine_admin_api_key")


def save_args(args: argparse.Namespace, path: str | Path) -> None:
    """Write the resolved arguments (JSON) so a run can be inspected and repeated."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    values = {k: v for k, v in vars(args).items() if k not in SECRETS}
    Path(path).write_text(json.dumps(values, indent=2, sort_keys=True, default=str) + "\n")


def to_argv(values: dict[str, Any]) -> list[str]:
    """{"rollout_batch_size": 32, "colocate": True} -> ["--rollout-batch-size", "32", "--colocate"]."""
    argv: list[str] = []
    for key, value in values.items():
        opt = "--" + key.replace("_", "-")
        if value is True:
            argv.append(opt)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            argv += [opt, *map(str, value)]
        else:
            argv += [opt, str(value)]
    return argv
