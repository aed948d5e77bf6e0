"""slime's own options (slime_upstream.json, extracted from slime's parser): every one is defined
here or sorted into not used / not built / not supported, with slime's dest and default."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slime.arguments import build_parser, parse_args, startup_notes
from slime.arguments.upstream import NOT_SUPPORTED, NOT_USED, slime_data, slime_options
from slime.errors import SlimeError

ROOT = Path(__file__).parents[2]
BASE = ["--rollout-batch-size", "2", "--num-rollout", "1"]


def _own_options() -> set[str]:
    """Options slime-rl's own groups define (the ones added from data excluded)."""
    p = build_parser()
    return {s for a in p._actions for s in a.option_strings} - p.slime_names - p.megatron_names


def test_the_data_is_slimes_parser():
    data = slime_data()
    assert data["source"]["repo"] == "THUDM/slime" and len(data["source"]["commit"]) == 40
    opts = slime_options()
    assert len(opts) >= 200
    # a few facts of slime's parser, read from slime/utils/arguments.py at that commit
    assert opts["--rollout-batch-size"]["dest"] == "rollout_batch_size"
    assert opts["--disable-rollout-global-dataset"]["dest"] == "rollout_global_dataset"
    assert opts["--disable-rollout-global-dataset"]["action"] == "_StoreFalseAction"
    assert opts["--update-weight-mode"]["choices"] == ["full", "delta"]
    assert opts["--tool-key"]["default"] == "tools"
    assert opts["--debug-rollout-only"]["group"] == "_pre_parse_mode"
    assert opts["--sglang-config"]["group"] == "add_sglang_arguments"


def test_every_slime_option_is_defined_here_or_sorted_exactly_once():
    own = _own_options()
    megatron = build_parser().megatron_names
    tables = (NOT_USED, NOT_SUPPORTED)
    for name in slime_options():
        homes = int(name in own) + int(name in megatron) + sum(name in t for t in tables)
        assert homes == 1, (
            f"{name}: defined by slime-rl {name in own}, Megatron's {name in megatron}, "
            f"in {sum(name in t for t in tables)} table(s)"
        )
    stale = [n for t in tables for n in t if n not in slime_options()]
    assert not stale, f"table entries that are not slime options: {stale}"


def test_options_added_from_data_carry_slimes_dest_and_default():
    """Also the Megatron-LM options slime re-defaults (slime's reset_arg: --mtp-loss-scaling-factor 0.2)."""
    args = parse_args(BASE)
    own = _own_options()
    for name, spec in slime_options().items():
        if name in own:
            continue
        want = spec["default"]
        if isinstance(want, str) and spec["type"] == "loads":  # argparse converts a string default too
            want = json.loads(want)
        assert getattr(args, spec["dest"]) == want, name
    assert args.mtp_loss_scaling_factor == 0.2


def test_slime_rl_own_definitions_keep_slimes_dest():
    """Same name, same dest: a hook reading args.<dest> finds what slime's would."""
    p = build_parser()
    dests = {s: a.dest for a in p._actions for s in a.option_strings}
    wrong = {
        n: (dests[n], spec["dest"]) for n, spec in slime_options().items() if n in dests and dests[n] != spec["dest"]
    }
    assert not wrong, wrong


def test_not_used_options_parse_and_are_named_once_at_start_up():
    args = parse_args(
        BASE
        + [
            "--allgather-cp",
            "--megatron-deepgemm-forward-layers",
            "1",
            "2",
            "--data-pad-size-multiplier",
            "64",
            "--tensor-model-parallel-size",
            "2",
        ]
    )
    assert args.megatron_deepgemm_forward_layers == [1, 2] and args.allgather_cp is True
    notes = startup_notes(args)
    assert len(notes) == 2  # slime's and Megatron-LM's, one line each
    slime_note = next(n for n in notes if n.startswith("slime options"))
    for opt in ("--allgather-cp", "--megatron-deepgemm-forward-layers", "--data-pad-size-multiplier"):
        assert slime_note.count(opt) == 1
    assert "--tensor-model-parallel-size" in next(n for n in notes if n.startswith("Megatron"))
    assert startup_notes(parse_args(BASE)) == []


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--update-weights-interval", "0"], "--update-weights-interval must be >= 1, got 0"),
        (["--rollout-buffer-url", "http://x"], "--rollout-buffer-url: slime's external rollout buffer"),
        (["--multimodal-keys", '{"image": "images"}'], "multimodal prompts are not supported yet"),
    ],
)
def test_options_not_built_or_not_supported_stop_at_parsing(argv, needle):
    with pytest.raises(SlimeError) as e:
        parse_args(BASE + argv)
    assert needle in str(e.value)


def test_typos_of_slime_options_still_get_did_you_mean():
    with pytest.raises(SlimeError, match="unknown argument --allgather-cpp; did you mean --allgather-cp"):
        parse_args(BASE + ["--allgather-cpp"])


def test_extraction_script_reproduces_the_shipped_data(tmp_path):
    """scripts/extract_slime_args.py on slime's source at the recorded commit writes the same file
    (skipped where the slime mirror is not on this machine)."""
    mirror = Path("/work/.mirror/THUDM+slime/repo")
    commit = slime_data()["source"]["commit"]
    if not mirror.exists():
        pytest.skip("no local mirror of THUDM/slime")
    try:
        tar = subprocess.run(
            ["git", "-C", str(mirror), "archive", commit, "slime"], check=True, capture_output=True
        ).stdout
    except subprocess.CalledProcessError:
        pytest.skip(f"the mirror does not hold commit {commit}")
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=tar, check=True)
    out = tmp_path / "out.json"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts/extract_slime_args.py"), str(tmp_path), commit, str(out)],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    assert json.loads(out.read_text()) == slime_data()


# Where slime-rl's default differs from slime's, it is because the meaning differs on this backend.
DIFFERENT_MEANING = {
    "--actor-num-gpus-per-node": "trainer processes on CPU cores, not GPUs (slime: 8)",
    "--train-backend": "the fsdp backend here; slime has only megatron",
    "--update-weight-transport": "resolved from --rollout-backend: nccl with SGLang, tensor with the built-in engine",
}


def test_own_definitions_take_slimes_and_megatrons_defaults():
    """Same name, same default where the meaning is the same: slime's for its own options, Megatron-LM's
    for the ones slime takes from Megatron (--adam-beta2, --weight-decay, --lr-decay-style, ...)."""
    from slime.arguments.megatron import megatron_options

    p = build_parser()
    own = _own_options()
    actions = {s: a for a in p._actions for s in a.option_strings}
    wrong = {}
    for name in own:
        reference = slime_options().get(name) or megatron_options().get(name)
        if reference is None or name in DIFFERENT_MEANING:
            continue
        want = reference["default"]
        if isinstance(want, str) and reference.get("type") == "loads":
            want = json.loads(want)
        have = actions[name].default
        if isinstance(have, str) and actions[name].type not in (None, str):  # argparse converts it too
            have = actions[name].type(have)
        if have != want:
            wrong[name] = (have, want)
    assert not wrong, f"slime-rl default vs slime/Megatron default: {wrong}"
    args = parse_args(BASE)
    assert (args.lr_decay_style, args.weight_decay, args.adam_beta2) == ("linear", 0.01, 0.999)
    assert args.rollout_max_response_len is None and args.tool_key == "tools"
    assert args.apply_chat_template_kwargs == {}


def test_single_eval_prompt_data_path_keeps_slimes_legacy_meaning():
    assert parse_args(BASE + ["--eval-prompt-data", "/data/aime.jsonl"]).eval_prompt_data == [
        "aime",
        "/data/aime.jsonl",
    ]
    assert parse_args(BASE + ["--eval-prompt-data", "m", "m.jsonl"]).eval_prompt_data == ["m", "m.jsonl"]
    with pytest.raises(SlimeError, match="pairs"):
        parse_args(BASE + ["--eval-prompt-data", "a", "a.jsonl", "b"])


def test_config_lists_of_an_append_option(tmp_path):
    """--config: a YAML list for slime's action="append" options (--rollout-sample-hook-path) gives
    one item per flag, as the command line does."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text("rollout_sample_hook_path: [a.b.one, a.b.two]\neval_prompt_data: [x, x.jsonl]\n")
    args = parse_args(BASE + ["--config", str(cfg)])
    assert args.rollout_sample_hook_path == ["a.b.one", "a.b.two"]
    assert args.eval_prompt_data == ["x", "x.jsonl"]
