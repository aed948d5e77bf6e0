"""The Data Buffer and data options: buffer state in checkpoints, --tool-key, --num-epoch,
--rollout-max-prompt-len, and eval pass@k against a brute-force reference."""

import itertools
import json
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
from transformers import AutoTokenizer

from slime.arguments import parse_args
from slime.data.data_source import RolloutDataSourceWithBuffer
from slime.data.dataset import load_prompt_samples
from slime.errors import SlimeError
from slime.preflight import preflight
from slime.rollout.train_data import eval_metrics, pass_at_k
from slime.utils.checkpoint_layout import ROLLOUT_STATE_FILE
from slime.utils.types import Sample
from tests.helpers import make_args


def _prompts(tmp_path, n=10, name="p.jsonl", extra=None):
    rows = [{"prompt": f"what is {i}+{i}?", "label": str(2 * i), **(extra or {})} for i in range(n)]
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _args(path, **kw):
    return make_args(
        **{
            "prompt_data": str(path),
            "input_key": "prompt",
            "label_key": "label",
            "rollout_shuffle": True,
            "rollout_seed": 3,
            "n_samples_per_prompt": 2,
            **kw,
        }
    )


# ---------------------------------------------------------------- buffer and checkpoints


def test_buffer_is_served_first_and_survives_a_checkpoint(tmp_path):
    src = RolloutDataSourceWithBuffer(_args(_prompts(tmp_path), save=str(tmp_path / "ckpt")))
    first = src.get_samples(3)
    # a partial sample, as a --partial-rollout abort leaves it
    partial = first[1]
    partial[0].tokens, partial[0].response_length, partial[0].response = [5, 6, 7, 8], 2, "ab"
    partial[0].loss_mask, partial[0].rollout_log_probs = [1, 1], [-0.5, -1.25]
    partial[0].status, partial[0].weight_versions = Sample.Status.ABORTED, ["3"]
    src.add_samples([partial])

    src.save(4)  # slime's save(rollout_id): <save>/iter_0000004/rollout_state.json
    state_file = tmp_path / "ckpt" / "iter_0000004" / ROLLOUT_STATE_FILE
    assert json.loads(state_file.read_text())["buffer"][0][0]["rollout_log_probs"] == [-0.5, -1.25]
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("4\n")

    resumed = RolloutDataSourceWithBuffer(_args(_prompts(tmp_path), load=str(tmp_path / "ckpt")))
    resumed.load()  # the latest checkpoint under --load
    assert resumed.get_buffer_length() == 1 and resumed.state_dict() == src.state_dict()
    expected_next = src.get_samples(2)
    got = resumed.get_samples(2)
    assert got[0][0] == partial[0]  # the buffered group comes back first, field for field
    assert got[0][0].status is Sample.Status.ABORTED
    assert [g[0].prompt for g in got[1:]] == [g[0].prompt for g in expected_next[1:]]


def test_data_source_from_an_older_version_without_buffer_loads(tmp_path):
    src = RolloutDataSourceWithBuffer(_args(_prompts(tmp_path)))
    src.get_samples(2)
    state = src.state_dict()
    del state["buffer"]
    other = RolloutDataSourceWithBuffer(_args(_prompts(tmp_path)))
    other.load_state_dict(state)
    assert other.get_buffer_length() == 0 and other.offset == 2


def test_load_without_load_dir_says_which_argument(tmp_path):
    src = RolloutDataSourceWithBuffer(_args(_prompts(tmp_path)))
    with pytest.raises(SlimeError, match="--load is not set"):
        src.load(1)


# ---------------------------------------------------------------- --tool-key

TOOLS_TEMPLATE = (
    "{%- if tools -%}<|system|>tools:{% for t in tools %} {{ t['name'] }}{% endfor %}<|end|>{%- endif -%}"
    "{%- for m in messages -%}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)


def test_tool_key_reaches_the_chat_template_and_metadata(tmp_path, tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    tok.chat_template = TOOLS_TEMPLATE
    rows = [
        {"prompt": "add", "label": "1", "tools": [{"name": "calculator"}, {"name": "search"}]},
        {"prompt": "add", "label": "1", "tools": json.dumps([{"name": "python"}])},  # a JSON string
        {"prompt": "add", "label": "1"},  # no tools on this row
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    src = RolloutDataSourceWithBuffer(
        _args(
            path,
            tool_key="tools",
            apply_chat_template=True,
            rollout_shuffle=False,
            apply_chat_template_kwargs=None,
            n_samples_per_prompt=1,
        ),
        tokenizer=tok,
    )
    prompts = [g[0] for g in src.get_samples(3)]
    assert prompts[0].prompt == "<|system|>tools: calculator search<|end|><|user|>add<|end|><|assistant|>"
    assert prompts[0].metadata["tools"] == [{"name": "calculator"}, {"name": "search"}]
    assert prompts[1].prompt.startswith("<|system|>tools: python<|end|>")
    assert prompts[2].prompt == "<|user|>add<|end|><|assistant|>" and "tools" not in prompts[2].metadata


def test_tool_key_with_a_bad_value_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "tools": []}\n{"prompt": "b", "tools": "not json"}\n')
    with pytest.raises(SlimeError, match=r"bad.jsonl: line 2: 'tools' \(--tool-key\) is a string but not JSON"):
        load_prompt_samples(path, input_key="prompt", tool_key="tools")
    path.write_text('{"prompt": "a", "tools": 3}\n')
    with pytest.raises(SlimeError, match=r"line 1: 'tools' \(--tool-key\) must be a list of tools, got int"):
        load_prompt_samples(path, input_key="prompt", tool_key="tools")


# ---------------------------------------------------------------- --num-epoch, --rollout-max-prompt-len


def _parse(tmp_path, model_dir, *extra):
    return parse_args(
        [
            "--hf-checkpoint",
            str(model_dir),
            "--prompt-data",
            str(_prompts(tmp_path, n=10)),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--rollout-batch-size",
            "4",
            "--rm-type",
            "math",
            "--rollout-max-response-len",
            "8",
            "--run-dir",
            str(tmp_path / "run"),
            *extra,
        ]
    )


def _counted(args):
    """--num-epoch is counted by the start-up checks (which read the data anyway), not by parsing."""
    preflight(args)
    return args


def test_num_epoch_sets_num_rollout(tmp_path, tiny_model_dir):
    args = _parse(tmp_path, tiny_model_dir, "--num-epoch", "2")
    assert args.num_rollout is None and args.lr_decay_iters is None  # parsing reads no data
    # slime's rule: whole rollouts per epoch, (10 // 4) x 2 (not 2 x 10 // 4 = 5); one step each
    assert _counted(args).num_rollout == 4 and args.lr_decay_iters == 4
    assert _counted(_parse(tmp_path, tiny_model_dir, "--num-epoch", "2", "--num-rollout", "3")).num_rollout == 3
    with pytest.raises(SlimeError, match=r"--num-epoch 1 over 10 prompts is less than one rollout"):
        _counted(_parse(tmp_path, tiny_model_dir, "--num-epoch", "1", "--rollout-batch-size", "11"))
    with pytest.raises(SlimeError, match=r"--num-rollout \(or --num-epoch\) is required"):
        _parse(tmp_path, tiny_model_dir)
    with pytest.raises(SlimeError, match="--num-epoch must be >= 1"):
        _parse(tmp_path, tiny_model_dir, "--num-epoch", "0")


def test_max_prompt_len_drops_and_counts_before_epochs_are_counted(tmp_path, tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    rows = [{"prompt": "1+1?" if i % 3 else "a much longer question " * 6, "label": "2"} for i in range(12)]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    limit = len(tok.encode("1+1?", add_special_tokens=False)) + 2
    src = RolloutDataSourceWithBuffer(_args(path, rollout_max_prompt_len=limit), tokenizer=tok)
    assert len(src) == 8 and src.num_dropped == 4  # rows 0, 3, 6, 9 are too long
    assert all(g[0].prompt == "1+1?" for g in src.get_samples(8))

    args = parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(path),
            "--input-key",
            "prompt",
            "--rollout-batch-size",
            "4",
            "--num-epoch",
            "3",
            "--rollout-max-prompt-len",
            str(limit),
            "--rm-type",
            "math",
            "--rollout-max-response-len",
            "8",
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    assert _counted(args).num_rollout == 6  # 3 epochs x 8 kept prompts // 4


# ---------------------------------------------------------------- pass@k


def _brute_pass_at_k(correct: list[bool], k: int) -> float:
    """Fraction of all k-subsets of the samples that hold a correct one (the definition)."""
    subsets = list(itertools.combinations(range(len(correct)), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,c", [(8, 0), (8, 1), (8, 3), (8, 8), (5, 2), (1, 1)])
def test_pass_at_k_matches_enumeration(n, c):
    correct = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(correct, k), abs=1e-12)


def test_eval_metrics_report_pass_at_k_per_prompt():
    rewards = [1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0]  # prompt 0: 1 of 4, prompt 1: 0 of 4, prompt 2: 2 of 4
    samples = [Sample(group_index=i // 4, index=i, response_length=3) for i in range(12)]
    m = eval_metrics(make_args(), {"arith": {"rewards": rewards, "samples": samples}})
    groups = [[bool(r) for r in rewards[i : i + 4]] for i in (0, 4, 8)]
    for k in (1, 2, 4):
        assert m[f"eval/arith/pass@{k}"] == pytest.approx(sum(_brute_pass_at_k(g, k) for g in groups) / 3)
    assert "eval/arith/pass@8" not in m and m["eval/arith"] == pytest.approx(3 / 12)


# ---------------------------------------------------------------- slime's import path and contract


def test_slimes_data_source_path_is_the_default_and_the_contract(tmp_path):
    import slime.rollout.data_source as slime_path
    from slime.data import data_source
    from slime.utils.misc import load_function

    args = _args(_prompts(tmp_path))
    assert args.data_source_path == "slime.rollout.data_source.RolloutDataSourceWithBuffer"
    assert load_function(args.data_source_path) is data_source.RolloutDataSourceWithBuffer
    assert slime_path.DataSource is data_source.DataSource
    assert issubclass(slime_path.RolloutDataSourceWithBuffer, slime_path.DataSource)

    class Incomplete(slime_path.DataSource):  # a custom source must implement the whole contract
        def get_samples(self, num_samples):
            return []

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()
    read_only = slime_path.RolloutDataSource(args)
    with pytest.raises(SlimeError, match="read-only data source"):
        read_only.add_samples(read_only.get_samples(1))
