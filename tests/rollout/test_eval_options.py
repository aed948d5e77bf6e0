"""slime's evaluation options: --eval-top-k, --eval-min-new-tokens, --eval-max-prompt-len,
--eval-max-context-len, --eval-tool-key and --eval-config (the multi-task YAML), with slime's dests,
defaults and fallbacks; each data set's settings reaching its generate calls; YAML errors."""

from __future__ import annotations

import asyncio
import json
from argparse import Namespace
from pathlib import Path

import pytest

from slime.arguments import build_parser, parse_args
from slime.errors import SlimeError
from slime.utils.eval_config import eval_dataset_configs
from slime.utils.types import Sample

BASE = ["--rollout-batch-size", "1", "--num-rollout", "1"]
HERE = "tests.rollout.test_eval_options."

# slime/utils/arguments.py (add_eval_arguments) at the commit slime_upstream.json names:
# parser.add_argument("--eval-...", type=..., default=None) for each of these.
SLIME_EVAL_OPTIONS = {
    "--eval-config": ("eval_config", None, str),
    "--eval-tool-key": ("eval_tool_key", None, str),
    "--eval-top-k": ("eval_top_k", None, int),
    "--eval-max-prompt-len": ("eval_max_prompt_len", None, int),
    "--eval-min-new-tokens": ("eval_min_new_tokens", None, int),
    "--eval-max-context-len": ("eval_max_context_len", None, int),
}


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _yaml(tmp_path: Path, text: str, name: str = "eval.yaml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# --------------------------------------------------------------------------------------- parsing
def test_dests_types_and_defaults_are_slimes():
    actions = {s: a for a in build_parser()._actions for s in a.option_strings}
    for name, (dest, default, type_) in SLIME_EVAL_OPTIONS.items():
        a = actions[name]
        assert (a.dest, a.default, a.type) == (dest, default, type_), name


def test_fallbacks_follow_slime():
    """slime: eval top-k and tool key fall back to the rollout's (eval_config.py's arg_attrs), the
    context to --rollout-max-context-len (slime_validate_args); min-new-tokens and max-prompt-len
    have no fallback (--rollout-max-prompt-len is not used for eval)."""
    args = parse_args(BASE)
    assert (args.eval_top_k, args.eval_tool_key, args.eval_max_context_len) == (-1, "tools", None)
    assert (args.eval_min_new_tokens, args.eval_max_prompt_len, args.eval_config) == (None, None, None)
    args = parse_args(
        BASE
        + [
            "--rollout-top-k",
            "20",
            "--tool-key",
            "fns",
            "--rollout-max-context-len",
            "64",
            "--rollout-max-prompt-len",
            "10",
        ]
    )
    assert (args.eval_top_k, args.eval_tool_key, args.eval_max_context_len) == (20, "fns", 64)
    assert args.eval_max_prompt_len is None
    args = parse_args(
        BASE
        + [
            "--rollout-top-k",
            "20",
            "--eval-top-k",
            "3",
            "--tool-key",
            "fns",
            "--eval-tool-key",
            "t",
            "--rollout-max-context-len",
            "64",
            "--eval-max-context-len",
            "32",
            "--eval-min-new-tokens",
            "2",
            "--eval-max-prompt-len",
            "9",
        ]
    )
    assert (args.eval_top_k, args.eval_tool_key, args.eval_max_context_len) == (3, "t", 32)
    assert (args.eval_min_new_tokens, args.eval_max_prompt_len) == (2, 9)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--eval-min-new-tokens", "-1"], "--eval-min-new-tokens must be >= 0"),
        (["--eval-max-prompt-len", "0"], "--eval-max-prompt-len must be >= 1"),
        (["--eval-max-context-len", "0"], "--eval-max-context-len must be >= 1"),
        (["--eval-min-new-tokens", "9", "--eval-max-response-len", "8"], "--eval-min-new-tokens 9 is more than"),
        (["--eval-min-new-tokens", "9", "--rollout-max-response-len", "8"], "--eval-min-new-tokens 9 is more than"),
        (["--eval-interval", "5"], "--eval-interval 5 needs eval data sets"),
        (["--eval-prompt-data", "a", "x.jsonl", "a", "y.jsonl"], "names 'a' twice"),
    ],
)
def test_bad_values_stop_at_parsing(argv, needle):
    with pytest.raises(SlimeError, match=needle):
        parse_args(BASE + argv)


def test_eval_prompt_data_gives_one_config_per_pair_with_the_eval_options():
    args = parse_args(
        BASE
        + [
            "--eval-prompt-data",
            "a",
            "a.jsonl",
            "b",
            "b.jsonl",
            "--eval-top-k",
            "4",
            "--eval-temperature",
            "0.5",
            "--eval-min-new-tokens",
            "1",
            "--input-key",
            "q",
            "--n-samples-per-eval-prompt",
            "3",
        ]
    )
    assert [(c.name, c.path) for c in args.eval_datasets] == [("a", "a.jsonl"), ("b", "b.jsonl")]
    for c in args.eval_datasets:
        assert (
            c.top_k,
            c.temperature,
            c.top_p,
            c.min_new_tokens,
            c.input_key,
            c.n_samples_per_eval_prompt,
            c.tool_key,
            c.max_response_len,
        ) == (4, 0.5, 1.0, 1, "q", 3, "tools", None)


# ----------------------------------------------------------------------------------- --eval-config
CONFIG = """
eval:
  defaults:
    temperature: 0.6
    max_response_len: 12
    top_k: 7
  datasets:
    - name: aime
      path: /data/aime.jsonl
      n_samples_per_eval_prompt: 4
      temperature: 0.9
      rm_type: math
      input_key: problem
      label_key: answer
      metadata_overrides: {split: test}
    - name: gpqa
      path: /data/gpqa.jsonl
"""


def test_config_resolution_order_is_dataset_then_defaults_then_command_line(tmp_path):
    args = parse_args(
        BASE
        + [
            "--eval-config",
            _yaml(tmp_path, CONFIG),
            "--eval-top-p",
            "0.8",
            "--rollout-top-p",
            "0.3",
            "--eval-min-new-tokens",
            "2",
            "--eval-label-key",
            "y",
        ]
    )
    aime, gpqa = args.eval_datasets
    assert (aime.name, aime.path, gpqa.name, gpqa.path) == ("aime", "/data/aime.jsonl", "gpqa", "/data/gpqa.jsonl")
    assert args.eval_prompt_data == ["aime", "/data/aime.jsonl", "gpqa", "/data/gpqa.jsonl"]
    # data set > defaults > --eval-* > --rollout-*
    assert (aime.temperature, gpqa.temperature) == (0.9, 0.6)
    assert (aime.max_response_len, gpqa.max_response_len) == (12, 12)
    assert (aime.top_k, gpqa.top_k) == (7, 7)
    assert (aime.top_p, gpqa.top_p) == (0.8, 0.8)
    assert (aime.min_new_tokens, gpqa.min_new_tokens) == (2, 2)
    assert (aime.n_samples_per_eval_prompt, gpqa.n_samples_per_eval_prompt) == (4, 1)
    assert (aime.input_key, aime.label_key, gpqa.input_key, gpqa.label_key) == ("problem", "answer", "input", "y")
    assert (aime.rm_type, gpqa.rm_type) == ("math", None)
    assert aime.inject_metadata({"a": 1, "split": "train"}) == {"a": 1, "split": "test", "rm_type": "math"}
    assert gpqa.inject_metadata(None) == {}


def test_mapping_form_and_no_eval_section_read_the_same(tmp_path):
    listed = parse_args(BASE + ["--eval-config", _yaml(tmp_path, CONFIG)]).eval_datasets
    mapping = """
defaults: {temperature: 0.6, max_response_len: 12, top_k: 7}
datasets:
  aime: {path: /data/aime.jsonl, n_samples_per_eval_prompt: 4, temperature: 0.9, rm_type: math,
         input_key: problem, label_key: answer, metadata_overrides: {split: test}}
  gpqa: {path: /data/gpqa.jsonl}
"""
    assert parse_args(BASE + ["--eval-config", _yaml(tmp_path, mapping, "m.yaml")]).eval_datasets == listed


def test_eval_config_replaces_eval_prompt_data_as_in_slime(tmp_path):
    args = parse_args(BASE + ["--eval-prompt-data", "old", "old.jsonl", "--eval-config", _yaml(tmp_path, CONFIG)])
    assert [c.name for c in args.eval_datasets] == ["aime", "gpqa"]
    assert args.eval_prompt_data == ["aime", "/data/aime.jsonl", "gpqa", "/data/gpqa.jsonl"]


def test_what_the_file_does_not_set_follows_the_args_the_eval_function_is_given(tmp_path):
    """An eval function may evaluate with a changed copy of the args (examples/multi_agent turns
    the chat template on): fields the file leaves out follow that copy, the file's own stay."""
    args = parse_args(BASE + ["--eval-config", _yaml(tmp_path, CONFIG)])
    changed = Namespace(**{**vars(args), "eval_top_p": 0.5, "apply_chat_template": True, "eval_temperature": 0.1})
    aime, gpqa = eval_dataset_configs(changed)
    assert (aime.top_p, gpqa.top_p, aime.apply_chat_template, gpqa.apply_chat_template) == (0.5, 0.5, True, True)
    assert (aime.temperature, gpqa.temperature) == (0.9, 0.6)  # the file's (data set, then defaults)
    # eval_prompt_data set by hand (tests/examples do): a data set the file does not know takes the args'
    changed.eval_prompt_data = ["x", "x.jsonl"]
    (x,) = eval_dataset_configs(changed)
    assert (x.name, x.path, x.temperature, x.top_k) == ("x", "x.jsonl", 0.1, -1)


@pytest.mark.parametrize(
    "text, needle",
    [
        (
            "eval:\n  datasets:\n    - {name: a, path: a.jsonl, temprature: 0.1}\n",
            "eval.datasets['a']: unknown key 'temprature'; did you mean 'temperature'?",
        ),
        (
            "eval:\n  defaults: {max_respone_len: 3}\n  datasets: [{name: a, path: a.jsonl}]\n",
            "eval.defaults: unknown key 'max_respone_len'; did you mean 'max_response_len'?",
        ),
        ("eval:\n  dataset: [{name: a, path: a.jsonl}]\n", "eval: unknown key 'dataset'; did you mean 'datasets'?"),
        ("eval:\n  datasets:\n    - {name: a}\n", "eval.datasets['a']: no `path`"),
        ("eval:\n  datasets:\n    - {path: a.jsonl}\n", "eval.datasets[0]: no `name`"),
        ("eval:\n  datasets: [{name: a, path: a.jsonl}, {name: a, path: b.jsonl}]\n", "a second data set of that name"),
        ("eval:\n  defaults: {temperature: 1.0}\n", "no data sets"),
        ("eval:\n  datasets: []\n", "no data sets"),
        (
            "eval:\n  datasets: [{name: a, path: a.jsonl, top_k: high}]\n",
            "eval.datasets['a']: top_k must be an int, got str",
        ),
        (
            "eval:\n  datasets: [{name: a, path: a.jsonl, n_samples_per_eval_prompt: true}]\n",
            "n_samples_per_eval_prompt must be an int, got bool",
        ),
        (
            "eval:\n  datasets: [{name: a, path: a.jsonl, stop_token_ids: [1, x]}]\n",
            "stop_token_ids must be a list[int]",
        ),
        (
            "eval:\n  datasets: [{name: a, path: a.jsonl, top_p: 0}]\n",
            "eval.datasets['a']: top_p must be in (0, 1], got 0",
        ),
        (
            "eval:\n  datasets: [{name: a, path: a.jsonl, n_samples_per_eval_prompt: 0}]\n",
            "n_samples_per_eval_prompt must be >= 1",
        ),
        (
            "eval:\n  datasets: [{name: a, path: a.jsonl, min_new_tokens: 9, max_response_len: 4}]\n",
            "min_new_tokens 9 is more than max_response_len 4",
        ),
        (
            "eval:\n  datasets: [{name: a, path: a.jsonl, multimodal_keys: {image: img}}]\n",
            "multimodal prompts are not supported yet",
        ),
        ("eval:\n  datasets: {a: [1, 2]}\n", "eval.datasets.a: expected a mapping"),
        ("eval: [1, 2]\n", "eval must be a mapping"),
        ("- 1\n- 2\n", "expected a mapping at the top"),
        ("eval:\n  datasets: [{name: a, path: a.jsonl}\n", "line 3: not valid YAML"),
    ],
)
def test_config_errors_name_the_file_and_the_key(tmp_path, text, needle):
    path = _yaml(tmp_path, text)
    with pytest.raises(SlimeError) as e:
        parse_args(BASE + ["--eval-config", path])
    assert f"--eval-config {path}" in str(e.value) and needle in str(e.value), str(e.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(SlimeError, match="--eval-config .*nope.yaml: no such file"):
        parse_args(BASE + ["--eval-config", str(tmp_path / "nope.yaml")])


def test_slime_fields_its_own_eval_does_not_read_are_accepted(tmp_path, caplog):
    text = "eval:\n  datasets: [{name: a, path: a.jsonl, eval_task_timeout: 30, min_eval_samples: 2}]\n"
    args = parse_args(BASE + ["--eval-config", _yaml(tmp_path, text)])
    assert args.eval_datasets[0].eval_task_timeout == 30
    assert "eval_task_timeout, min_eval_samples accepted but not used" in caplog.text


# ------------------------------------------------------------------------------ start-up checks
@pytest.fixture
def eval_files(tmp_path):
    a = _write_jsonl(tmp_path / "a.jsonl", [{"prompt": f"{i}+{i}=", "label": str(2 * i)} for i in range(3)])
    b = _write_jsonl(
        tmp_path / "b.jsonl", [{"question": "what is " + "two " * n, "answer": "2"} for n in (1, 8, 2, 30)]
    )
    return a, b


def test_each_data_set_is_checked_at_start_up_with_its_own_keys(tmp_path, eval_files):
    from slime.preflight import check_eval_data

    a, b = eval_files
    ok = (
        f"eval:\n  datasets:\n    - {{name: a, path: {a}, input_key: prompt}}\n"
        f"    - {{name: b, path: {b}, input_key: question, label_key: answer}}\n"
    )
    check_eval_data(parse_args(BASE + ["--eval-config", _yaml(tmp_path, ok)]))
    # the same files read with one --eval-input-key: b has no "prompt"
    args = parse_args(BASE + ["--eval-prompt-data", "a", a, "b", b, "--eval-input-key", "prompt"])
    with pytest.raises(SlimeError, match=r"eval data set 'b': .*b.jsonl: line 1: no key 'prompt'"):
        check_eval_data(args)
    for entry, needle in [
        (
            f"{{name: gone, path: {tmp_path / 'gone.jsonl'}}}",
            "eval data set 'gone': data file '.*gone.jsonl' does not exist",
        ),
        (f"{{name: a, path: {a}, input_key: prompt, rm_type: mth}}", "eval data set 'a': .*mth"),
        (
            f"{{name: a, path: {a}, input_key: prompt, custom_generate_function_path: no.such.module.fn}}",
            r"eval data set 'a': cannot import module 'no.such.module' \(from --custom-generate-function-path\)",
        ),
    ]:
        args = parse_args(BASE + ["--eval-config", _yaml(tmp_path, f"eval:\n  datasets:\n    - {entry}\n")])
        with pytest.raises(SlimeError, match=needle):
            check_eval_data(args)


def test_a_missing_eval_file_stops_the_run_before_anything_starts(
    without_shared_ray, tiny_model_dir, task_dir, tmp_path, capsys
):
    import ray

    from slime.train import main

    cfg = _yaml(
        tmp_path,
        f"eval:\n  datasets:\n    - {{name: arith, path: {task_dir / 'eval.jsonl'}, input_key: prompt}}\n"
        f"    - {{name: lost, path: {tmp_path / 'lost.jsonl'}}}\n",
    )
    argv = [
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--prompt-data",
        str(task_dir / "train.jsonl"),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--rm-type",
        "math",
        "--num-rollout",
        "1",
        "--rollout-batch-size",
        "4",
        "--rollout-max-response-len",
        "8",
        "--run-dir",
        str(tmp_path / "run"),
        "--eval-config",
        cfg,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "eval data set 'lost'" in err and "lost.jsonl' does not exist" in err and "Traceback" not in err
    assert not ray.is_initialized()


def test_eval_max_prompt_len_drops_and_counts_with_the_tokenizer(tiny_model_dir, tmp_path, eval_files):
    from transformers import AutoTokenizer

    from slime.preflight import check_eval_data

    _, b = eval_files
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    questions = [json.loads(line)["question"] for line in Path(b).read_text().splitlines()]
    lengths = [len(tok.encode(q, add_special_tokens=False)) for q in questions]
    limit = sorted(lengths)[1]  # keeps two of four (the lengths differ)
    args = parse_args(
        BASE
        + [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--eval-prompt-data",
            "b",
            b,
            "--eval-input-key",
            "question",
            "--eval-max-prompt-len",
            str(limit),
        ]
    )
    check_eval_data(args)
    from slime.rollout.sglang_rollout import load_eval_prompts

    prompts = load_eval_prompts(args, args.eval_datasets[0], tok)
    kept = [q for q, n in zip(questions, lengths, strict=True) if n <= limit]
    assert [s.prompt for s in prompts] == kept and prompts.num_dropped == 4 - len(kept) == 2
    args = parse_args(
        BASE
        + [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--eval-prompt-data",
            "b",
            b,
            "--eval-input-key",
            "question",
            "--eval-max-prompt-len",
            str(min(lengths) - 1),
        ]
    )
    with pytest.raises(
        SlimeError, match=r"eval data set 'b' .* holds no prompts \(4 longer than --eval-max-prompt-len"
    ):
        check_eval_data(args)


# --------------------------------------------------------------- the settings reach the generate calls
async def record(args, sample, sampling_params, evaluation=False):
    """A --custom-generate-function-path that answers one token and keeps what it was given."""
    sample.tokens = list(sample.tokens or [5]) + [1]
    sample.response, sample.response_length, sample.loss_mask = "r", 1, [1]
    sample.metadata.update(hook="record", params=dict(sampling_params), evaluation=evaluation)
    sample.status = Sample.Status.COMPLETED
    return sample


async def record_other(args, sample, sampling_params):
    """A data set's own custom_generate_function_path (no `evaluation` parameter, as slime allows)."""
    await record(args, sample, sampling_params)
    sample.metadata["hook"] = "other"
    return sample


def global_rm(args, sample):
    return 0.25


async def dataset_rm(args, sample):
    return {"acc": float(sample.label == "4"), "raw": 2.0}


def test_each_data_set_is_generated_and_scored_with_its_own_settings(tiny_model_dir, tmp_path, eval_files):
    from slime.rollout.sglang_rollout import GenerateState, generate_rollout

    a, b = eval_files
    cfg = _yaml(
        tmp_path,
        f"""
eval:
  defaults: {{temperature: 0.6, max_response_len: 12}}
  datasets:
    - name: arith
      path: {a}
      input_key: prompt
      label_key: label
      n_samples_per_eval_prompt: 2
      top_k: 5
      top_p: 0.9
      min_new_tokens: 3
      stop: ["\\n\\n"]
      stop_token_ids: [7]
      repetition_penalty: 1.1
      skip_special_tokens: true
      no_stop_trim: false
      rm_type: math
      custom_rm_path: {HERE}dataset_rm
      metadata_overrides: {{split: test}}
    - name: words
      path: {b}
      input_key: question
      label_key: answer
      temperature: 0.0
      custom_generate_function_path: {HERE}record_other
""",
    )
    args = parse_args(
        BASE
        + [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--eval-config",
            cfg,
            "--custom-generate-function-path",
            HERE + "record",
            "--custom-rm-path",
            HERE + "global_rm",
            "--eval-top-k",
            "40",
            "--rollout-top-p",
            "0.95",
            "--rollout-stop",
            "END",
            "--eval-reward-key",
            "acc",
            "--rm-type",
            "deepscaler",
        ]
    )
    GenerateState.reset()
    try:
        results = generate_rollout(args, 0, None, evaluation=True)
    finally:
        GenerateState.reset()
    assert list(results) == ["arith", "words"]
    arith, words = results["arith"]["samples"], results["words"]["samples"]
    assert len(arith) == 3 * 2 and len(words) == 4
    assert [(s.group_index, s.index) for s in arith] == [(i // 2, i) for i in range(6)]
    assert {s.metadata["hook"] for s in arith} == {"record"} and {s.metadata["hook"] for s in words} == {"other"}
    assert all(s.metadata["evaluation"] is True for s in arith)
    assert arith[0].metadata["params"] == {
        "temperature": 0.6,
        "top_p": 0.9,
        "top_k": 5,
        "max_new_tokens": 12,
        "min_new_tokens": 3,
        "stop": ["\n\n"],
        "stop_token_ids": [7],
        "repetition_penalty": 1.1,
        "skip_special_tokens": True,
        "no_stop_trim": False,
        "spaces_between_special_tokens": False,
    }
    assert words[0].metadata["params"] == {
        "temperature": 0.0,
        "top_p": 0.95,
        "top_k": 40,
        "max_new_tokens": 12,
        "stop": ["END"],
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
    assert all(s.metadata["params"] == arith[0].metadata["params"] for s in arith)
    # rm_type and metadata_overrides on each sample; the data set's reward, else --custom-rm-path
    assert all(s.metadata["rm_type"] == "math" and s.metadata["split"] == "test" for s in arith)
    assert all("rm_type" not in s.metadata for s in words)
    assert results["arith"]["rewards"] == [float(s.label == "4") for s in arith] and any(results["arith"]["rewards"])
    assert results["words"]["rewards"] == [0.25] * 4
    assert results["words"]["dropped_long_prompts"] == 0


def test_eval_rollout_single_dataset_takes_slimes_config_object(tiny_model_dir, tmp_path, eval_files):
    from slime.rollout.sglang_rollout import GenerateState, eval_rollout_single_dataset
    from slime.utils.eval_config import resolve_eval_dataset

    a, _ = eval_files
    args = parse_args(
        BASE
        + [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--custom-generate-function-path",
            HERE + "record",
            "--custom-rm-path",
            HERE + "global_rm",
            "--eval-min-new-tokens",
            "2",
        ]
    )
    cfg = resolve_eval_dataset(args, "mine", a, {"input_key": "prompt", "top_k": 9, "n_samples_per_eval_prompt": 3})
    GenerateState.reset()
    try:
        out = asyncio.run(eval_rollout_single_dataset(args, 0, cfg))
    finally:
        GenerateState.reset()
    samples = out["mine"]["samples"]
    assert len(samples) == 9 and out["mine"]["rewards"] == [0.25] * 9
    assert samples[0].metadata["params"]["top_k"] == 9 and samples[0].metadata["params"]["min_new_tokens"] == 2


def test_context_fit_caps_min_new_tokens_too():
    from slime.rollout.sglang_rollout import fit_context

    assert fit_context({"max_new_tokens": 50, "min_new_tokens": 20}, num_sent=90, context=100) == {
        "max_new_tokens": 10,
        "min_new_tokens": 10,
    }
    assert fit_context({"max_new_tokens": None, "min_new_tokens": 3}, num_sent=90, context=100) == {
        "max_new_tokens": 10,
        "min_new_tokens": 3,
    }
    assert fit_context({"max_new_tokens": 5}, num_sent=1, context=None) == {"max_new_tokens": 5}


def test_eval_passrate_groups_by_prompt_and_counts_dropped_prompts():
    """pass@k per prompt by group_index (an --eval-config data set may have its own sample count),
    checked against the closed form on a hand-made data set; dropped prompts are reported."""
    from slime.rollout.train_data import eval_metrics

    args = parse_args(
        BASE + ["--log-passrate", "--n-samples-per-eval-prompt", "8"]
    )  # the data set below has 2 per prompt
    samples = [Sample(group_index=g, index=i) for i, g in enumerate([0, 0, 1, 1])]
    rewards = [1.0, 0.0, 0.0, 0.0]
    m = eval_metrics(args, {"set": {"rewards": rewards, "samples": samples, "dropped_long_prompts": 3}})
    # prompt 0: one of two correct -> pass@1 0.5, pass@2 1; prompt 1: none -> 0, 0
    assert m["eval/set-pass@1"] == pytest.approx(0.25) and m["eval/set-pass@2"] == pytest.approx(0.5)
    assert m["eval/set/dropped_long_prompts"] == 3.0


def test_eval_config_limits_are_checked_before_launch(tmp_path, tiny_model_dir):
    """A data set's own max_response_len over the model's context, or a repetition_penalty the
    built-in engine cannot apply, stops at start-up naming the file and the data set."""
    import json as _json

    from slime.preflight import check_context_length, check_eval_sampling

    config = _json.loads((tiny_model_dir / "config.json").read_text())
    context = config["max_position_embeddings"]
    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "1+1", "label": "2"}\n')
    long = _yaml(tmp_path, f"eval:\n  datasets:\n    - {{name: a, path: {data}, max_response_len: {context}}}\n")
    with pytest.raises(SlimeError, match=f"data set 'a' max_response_len {context} does not fit"):
        check_context_length(parse_args(BASE + ["--eval-config", long]), config)
    penalty = _yaml(
        tmp_path, f"eval:\n  datasets:\n    - {{name: b, path: {data}, repetition_penalty: 1.1}}\n", name="p.yaml"
    )
    with pytest.raises(SlimeError, match="data set 'b' sets repetition_penalty 1.1"):
        check_eval_sampling(parse_args(BASE + ["--eval-config", penalty, "--rollout-backend", "builtin"]))
    check_eval_sampling(parse_args(BASE + ["--eval-config", penalty, "--rollout-backend", "sglang"]))
