"""`slime train --help` a person can read: slime-rl's own options grouped by concern, each with a
help line and its default; the ~700 options accepted from slime and Megatron-LM listed by
`--help-all` only; usage lines that name the command as it is typed."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from slime.arguments.parser import GROUPS, SlimeArgumentParser, build_parser


def _own_actions() -> list[argparse.Action]:
    """The options slime-rl's own groups define (what `--help` shows)."""
    p = SlimeArgumentParser(prog="slime train")
    for group in GROUPS:
        group.add_arguments(p)
    return [a for a in p._actions if a.option_strings and a.dest != "help"]


def test_every_own_option_has_a_help_line():
    missing = [a.option_strings[0] for a in _own_actions() if not a.help or a.help == argparse.SUPPRESS]
    assert not missing, f"options without a help line: {missing}"


def test_help_shows_own_options_with_defaults_and_help_all_shows_the_rest(monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # argparse wraps to the terminal; a test process may have none (80)
    text = build_parser().format_help()
    assert text.startswith("usage: slime train [options]")
    assert len(text.splitlines()) < 650
    for a in _own_actions():
        assert a.option_strings[0] in text, a.option_strings[0]
    assert "--moe-router-topk" not in text and "--tensor-model-parallel-size" not in text  # Megatron-LM's
    assert "Sampling temperature of rollouts (> 0, slime's rule). (default: 1.0)" in " ".join(text.split())
    full = build_parser(full_help=True).format_help()
    assert "--moe-router-topk" in full and "--tensor-model-parallel-size" in full


def test_help_all_prints_everything_and_exits():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--help-all"])
    assert exit_info.value.code == 0 and "--moe-router-topk" in out.getvalue()


@pytest.mark.parametrize(
    "module, command",
    [
        ("slime.train_async", "slime train-async"),
        ("slime.data.tiny_model", "slime tiny-model"),
        ("slime.data.arithmetic", "slime make-data"),
        ("slime.observability.report", "slime report"),
        ("slime.engine.server", "slime serve"),
    ],
)
def test_every_command_names_itself_in_its_usage_line(module, command):
    import importlib

    main = importlib.import_module(module).main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code in (0, None)
    assert out.getvalue().startswith(f"usage: {command} "), out.getvalue()[:200]


def test_help_loads_the_parser_only():
    """`slime train --help` answers in about a second: no Ray, transformers or trainer imported."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom slime.cli import main\ntry:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('ray', 'transformers', 'slime.train') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "usage: slime train [options]" in out and out.strip().endswith("[]"), out[-300:]
