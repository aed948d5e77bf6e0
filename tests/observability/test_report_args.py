"""`slime report`'s resolved arguments (slime.observability.report_args): the ones set for the run
first, the rest collapsed, from an args.json that save_args writes; with `options_given` recorded,
or else against `slime train`'s parser defaults."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slime.arguments import parse_args, save_args
from slime.arguments.parser import build_parser
from slime.observability import report
from slime.observability.report_args import args_html, defaults_of, split_args

ARGV = ["--rollout-batch-size", "4", "--num-rollout", "3", "--lr", "3e-5", "--colocate", "--n-samples-per-prompt", "8"]


@pytest.fixture(scope="module")
def defaults():
    return defaults_of(build_parser())


def _saved(tmp_path: Path, argv: list[str]) -> dict:
    save_args(parse_args(argv), tmp_path / "args.json")
    return json.loads((tmp_path / "args.json").read_text())


def test_options_set_come_first_and_the_defaults_are_the_rest(tmp_path, defaults):
    values = _saved(tmp_path, ARGV)
    assert len(values) > 500  # what "Run facts" listed alphabetically before
    set_, rest = split_args(values, defaults)
    shown = {name: (value, default) for name, value, default, _ in set_}
    for name, value in [("rollout_batch_size", 4), ("num_rollout", 3), ("lr", 3e-5), ("colocate", True)]:
        assert shown[name][0] == value, name
    assert shown["lr"][1] == 1e-6 and shown["n_samples_per_prompt"] == (8, 1)
    assert [n for n, *_ in set_] == sorted(n for n, *_ in set_)
    assert len(set_) < 40 and len(set_) + len(rest) == len(values)
    # at their defaults, or off/empty where the default is None (derived): collapsed
    for name in ("eps_clip", "micro_batch_size", "train_env_vars", "apply_chat_template_kwargs", "slime_options_given"):
        assert name in rest, name


def test_a_recorded_list_of_given_options_is_used_as_it_is(tmp_path, defaults):
    values = _saved(tmp_path, ARGV) | {"options_given": ["--lr", "--colocate"]}
    for known in (defaults, None):  # exact: the parser's defaults are not needed
        set_, _ = split_args(values, known)
        assert [(n, why) for n, _, _, why in set_] == [("colocate", "given"), ("lr", "given")]


def test_upstream_options_given_are_marked_given(tmp_path, defaults):
    values = _saved(tmp_path, ARGV) | {"slime_options_given": ["--lr"]}
    set_, _ = split_args(values, defaults)
    assert ("lr", "given") in [(n, why) for n, _, _, why in set_]


def test_nothing_to_tell_set_from_default_lists_every_argument(tmp_path):
    values = _saved(tmp_path, ARGV)
    values.pop("options_given")  # a run from before the options set were recorded, and no defaults
    assert split_args(values) is None
    page = args_html({"args.json": values})
    assert "not recorded" in page and "<details" not in page and "<td>eps_clip</td>" in page


def test_html_shows_the_set_table_then_the_rest_in_details(tmp_path, defaults):
    values = _saved(tmp_path, ARGV)
    page = args_html({"args.json": values}, defaults)
    set_table, rest = page.split("<details", 1)
    assert (
        "<td>rollout_batch_size</td><td>4</td>" in set_table and "<td>lr</td><td>3e-05</td><td>1e-06</td>" in set_table
    )
    assert "<td>eps_clip</td>" not in set_table and "<td>eps_clip</td>" in rest
    assert re.search(r"<summary>the other \d+ arguments", rest)
    assert "no args.json" in args_html({})


def test_report_run_facts_lead_with_the_arguments_set(tmp_path, defaults):
    _saved(tmp_path, ARGV)
    page = report.render(report.collect(tmp_path, arg_defaults=defaults))
    facts = page[page.index('<section id="facts">') :]
    assert facts.index("<td>rollout_batch_size</td>") < facts.index("<details class='args-rest'>")
    assert facts.index("<details class='args-rest'>") < facts.index("<td>eps_clip</td>")
