"""Argument parsing: slime's names, pass-through, YAML config, and clear errors."""

import ast
from pathlib import Path

import pytest

import slime
from slime.arguments import build_parser, parse_args, to_argv
from slime.errors import SlimeError
from slime.ray.engine_launch import LaunchSpec, launch_spec

BASE = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--num-rollout", "3"]


def test_slime_names_and_derived_values():
    a = parse_args(BASE + ["--eps-clip", "0.1", "--colocate", "--actor-num-gpus-per-node", "2"])
    assert a.rollout_batch_size == 4 and a.n_samples_per_prompt == 2
    assert a.global_batch_size == 8 and a.num_steps_per_rollout == 1
    assert a.eps_clip_high == 0.1  # defaults to --eps-clip
    assert a.actor_world_size == 2 and a.rollout_num_gpus == 2 and a.num_engines == 2  # colocate: same slots


def test_num_steps_per_rollout_from_global_batch():
    a = parse_args(BASE + ["--global-batch-size", "4", "--micro-batch-size", "2"])
    assert a.num_steps_per_rollout == 2


def test_sglang_passthrough_is_verbatim_but_router_args_are_slimes():
    a = parse_args(
        BASE
        + [
            "--sglang-dtype",
            "bfloat16",
            "--sglang-disable-radix-cache",
            "--sglang-mem-fraction-static=0.7",
            "--sglang-router-ip",
            "127.0.0.1",
            "--sglang-router-port",
            "30000",
        ]
    )
    assert a.sglang_args == ["--dtype", "bfloat16", "--disable-radix-cache", "--mem-fraction-static=0.7"]
    assert a.sglang_router_ip == "127.0.0.1" and a.sglang_router_port == 30000


def test_unknown_argument_suggests_closest():
    with pytest.raises(SlimeError, match=r"unknown argument --rollout-batchsize; did you mean --rollout-batch-size"):
        parse_args(BASE + ["--rollout-batchsize", "3"])
    with pytest.raises(SlimeError, match="unknown argument --rollout-batch"):  # no silent prefix matching
        parse_args(["--rollout-batch", "4", "--num-rollout", "1"])


def test_invalid_choice_suggests_closest():
    with pytest.raises(SlimeError, match=r"--advantage-estimator.*'grpoo'.*did you mean 'grpo'"):
        parse_args(BASE + ["--advantage-estimator", "grpoo"])


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--global-batch-size", "3"], r"--global-batch-size \(3\) must divide"),
        (["--global-batch-size", "8", "--micro-batch-size", "3"], r"divisible by --micro-batch-size \(3\)"),
        (["--rollout-num-gpus", "3", "--rollout-num-gpus-per-engine", "2"], r"multiple of"),
        (["--train-backend", "megatron", "--release-train"], r"--release-train: the megatron backend does not"),
        (["--n-samples-per-prompt", "0"], r"--n-samples-per-prompt must be >= 1"),
        # SGLang's sampling ranges and the learning rate, at parse time (not after the engines start)
        (["--rollout-temperature=-1"], r"--rollout-temperature must be > 0, got -1.0"),
        (["--rollout-top-p", "0"], r"--rollout-top-p must be in \(0, 1\], got 0.0"),
        (["--rollout-top-p", "1.5"], r"--rollout-top-p must be in \(0, 1\]"),
        (["--rollout-top-k", "0"], r"--rollout-top-k must be -1 \(disabled\) or >= 1, got 0"),
        (["--eval-temperature", "nan"], r"--eval-temperature must be >= 0"),
        (["--eval-top-k=-2"], r"--eval-top-k must be -1"),
        (["--lr=-1e-3"], r"--lr must be a finite number >= 0, got -0.001"),
    ],
)
def test_invalid_combinations_name_the_arguments(extra, message):
    with pytest.raises(SlimeError, match=message):
        parse_args(BASE + extra)


def test_required_arguments():
    with pytest.raises(SlimeError, match="^--rollout-batch-size is required$"):
        parse_args(["--num-rollout", "1"])
    with pytest.raises(SlimeError, match=r"^--rollout-batch-size and --num-rollout \(or --num-epoch\) are required$"):
        parse_args([])  # every missing one in one line


def test_yaml_config_supplies_arguments_and_cli_wins(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("rollout_batch_size: 4\nnum-rollout: 7\ncolocate: true\nlr: 1.0e-4\nsglang-dtype: bfloat16\n")
    a = parse_args(["--config", str(cfg), "--num-rollout", "2"])
    assert a.rollout_batch_size == 4 and a.num_rollout == 2 and a.colocate and a.lr == 1e-4
    assert a.sglang_args == ["--dtype", "bfloat16"]


def test_yaml_config_unknown_key(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("rollout_batch_size: 4\nnum_rollouts: 7\n")
    with pytest.raises(SlimeError, match=r"run.yaml: unknown key 'num_rollouts'; did you mean --num-rollout"):
        parse_args(["--config", str(cfg)])


def test_to_argv_round_trip():
    argv = to_argv(
        {
            "rollout_batch_size": 4,
            "num_rollout": 2,
            "colocate": True,
            "rollout_shuffle": False,
            "eval_prompt_data": ["a", "b.jsonl"],
        }
    )
    assert argv == [
        "--rollout-batch-size",
        "4",
        "--num-rollout",
        "2",
        "--colocate",
        "--eval-prompt-data",
        "a",
        "b.jsonl",
    ]
    assert parse_args(argv).eval_prompt_data == ["a", "b.jsonl"]


def test_engine_launch_spec_honours_passthrough():
    """One builder reads host, port and seed from --sglang-* for both backends."""
    a = parse_args(
        BASE
        + ["--sglang-host", "0.0.0.0", "--sglang-port=31000", "--sglang-dtype", "bfloat16", "--sglang-num-threads", "3"]
    )
    assert launch_spec(a, rank=1) == LaunchSpec(
        "0.0.0.0", 31001, ["--dtype", "bfloat16", "--num-threads", "3", "--random-seed", str(a.seed + 1)]
    )
    plain = parse_args(BASE)
    assert launch_spec(plain, rank=0) == LaunchSpec("127.0.0.1", None, ["--random-seed", str(plain.seed)])
    seeded = parse_args(BASE + ["--sglang-random-seed", "7"])
    assert launch_spec(seeded, rank=2).extra == ["--random-seed", "7"]


def test_options_belong_to_a_concern_group():
    """Each option is added by one concern's group of slime.arguments (none left in argparse's catch-all)."""
    parser = build_parser()
    titles = {g.title for g in parser._action_groups if g._group_actions}
    loose = [
        a.dest
        for g in parser._action_groups
        if g.title == "options"
        for a in g._group_actions
        if a.dest not in ("help", "config") and a.option_strings != ["--help-all"]
    ]
    assert not loose, loose
    assert {
        "cluster",
        "rollout",
        "rewards",
        "data",
        "eval",
        "engines",
        "logging",
        "checkpoints",
        "batching",
        "optimizer",
        "algorithm",
    } <= titles


def _is_args(node: ast.expr) -> bool:
    """`args` or `<something>.args`: the parsed namespace, as the package names it everywhere."""
    return (isinstance(node, ast.Name) and node.id == "args") or (
        isinstance(node, ast.Attribute) and node.attr == "args"
    )


def test_code_reads_options_without_second_defaults():
    """A default lives in the parser only: no `getattr(args, "<option>", default)` in the package."""
    options = {a.dest for a in build_parser()._actions}
    found = []
    for path in Path(slime.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) == 3
                and _is_args(node.args[0])
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in options
            ):
                found.append(f"{path}:{node.lineno} {node.args[1].value}")
    assert not found, found


def test_the_options_the_user_set_are_recorded():
    """args.json keeps them (`options_given`): the run report lists them first."""
    args = parse_args(BASE + ["--lr=1e-5", "--colocate", "--moe-router-topk", "2"])
    assert {"--lr", "--colocate", "--moe-router-topk"} <= set(args.options_given)
    assert "--eps-clip" not in args.options_given
