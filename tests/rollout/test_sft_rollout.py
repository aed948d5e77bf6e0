import json
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from slime.data.arithmetic import write_arithmetic_dataset
from slime.data.data_source import RolloutDataSource
from slime.data.tiny_model import build_tiny_model
from slime.errors import SlimeError
from slime.rollout.sft_rollout import generate_rollout, tokenize_messages
from slime.utils.types import Sample
from tests.helpers import make_args


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.getbasetemp() / "tiny-qwen2"  # shared with the other data tests
    if not (d / "config.json").exists():
        build_tiny_model(d, arch="qwen2")
    return d


@pytest.fixture(scope="module")
def tok(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dir))


CONVERSATION = [
    {"role": "system", "content": "Add."},
    {"role": "user", "content": "1+2="},
    {"role": "assistant", "content": "\\boxed{3}"},
    {"role": "user", "content": "and 20+2?"},
    {"role": "tool", "content": "calc: 22"},
    {"role": "assistant", "content": "The answer is \\boxed{22}"},
]


def _hand_made(tok):
    """Tokens and mask built piece by piece, by hand, from what the template is known to emit."""
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    prompt = "<|system|>Add.<|end|><|user|>1+2=<|end|><|assistant|>"
    pieces = [
        ("\\boxed{3}<|end|>", 1),
        ("<|user|>and 20+2?<|end|>", 0),
        ("<|tool|>calc: 22<|end|>", 0),
        ("<|assistant|>", 0),
        ("The answer is \\boxed{22}<|end|>", 1),
    ]
    tokens, mask = enc(prompt), []
    for text, m in pieces:
        ids = enc(text)
        tokens += ids
        mask += [m] * len(ids)
    return tokens, mask, len(enc(prompt))


def test_tokenize_messages_multi_turn_matches_hand_made_mask(tok):
    tokens, mask, response_length = tokenize_messages(tok, CONVERSATION)
    want_tokens, want_mask, prompt_len = _hand_made(tok)
    assert tokens == want_tokens
    assert tokens == tok.encode(tok.apply_chat_template(CONVERSATION, tokenize=False), add_special_tokens=False)
    assert response_length == len(tokens) - prompt_len == len(mask)
    assert mask == want_mask
    # spot checks: the markers are 0, every <|end|> closing an assistant turn is 1
    resp = tokens[-response_length:]
    end_id, asst_id = tok.convert_tokens_to_ids("<|end|>"), tok.convert_tokens_to_ids("<|assistant|>")
    assert [m for t, m in zip(resp, mask, strict=True) if t == asst_id] == [0]
    assert [m for t, m in zip(resp, mask, strict=True) if t == end_id] == [1, 0, 0, 1]
    assert (
        tok.decode([t for t, m in zip(resp, mask, strict=True) if m])
        == "\\boxed{3}<|end|>The answer is \\boxed{22}<|end|>"
    )


def test_tokenize_messages_single_turn(tok):
    msgs = [{"role": "user", "content": "57+8="}, {"role": "assistant", "content": "\\boxed{65}"}]
    tokens, mask, n = tokenize_messages(tok, msgs)
    assert tok.decode(tokens[:-n]) == "<|user|>57+8=<|end|><|assistant|>"
    assert tok.decode(tokens[-n:]) == "\\boxed{65}<|end|>"
    assert mask == [1] * n
    with pytest.raises(SlimeError, match="no assistant message"):
        tokenize_messages(tok, msgs[:1])


def test_tokenize_messages_text_template_offsets_fallback(tok, monkeypatch):
    # A plain-text template: the generation prompt ends in a space that BPE merges with the
    # answer's first word ("Ġanswer" is one token), so tokenizing the prompt alone does not give
    # a prefix of the whole; character offsets decide instead.
    import slime.rollout.sft_rollout as sft

    used = []
    real = sft._mask_from_offsets
    monkeypatch.setattr(sft, "_mask_from_offsets", lambda *a: used.append(1) or real(*a))
    template = (
        "{%- for m in messages -%}{{ m['role'] + ': ' + m['content'] + '\\n' }}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ 'assistant: ' }}{%- endif -%}"
    )
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "answer 5"},
        {"role": "user", "content": "ok"},
        {"role": "assistant", "content": "answer 6"},
    ]
    tokens, mask, n = tokenize_messages(tok, msgs, chat_template_kwargs={"chat_template": template})
    assert used
    text = "user: hi\nassistant: answer 5\nuser: ok\nassistant: answer 6\n"
    assert tokens == tok.encode(text, add_special_tokens=False)
    resp = tokens[-n:]
    assert tok.decode(resp) == " answer 5\nuser: ok\nassistant: answer 6\n"
    trained = "".join(tok.decode([t]) for t, m in zip(resp, mask, strict=True) if m)
    assert trained == " answer 5\n answer 6\n"  # the straddling " answer" tokens are trained on


def test_generate_rollout_on_arithmetic_sft(tmp_path, tiny_dir):
    paths = write_arithmetic_dataset(tmp_path, num_train=10, num_eval=5)
    args = make_args(
        prompt_data=str(paths["sft"]),
        input_key="messages",
        rollout_seed=1,
        hf_checkpoint=str(tiny_dir),
        rollout_batch_size=4,
    )
    ds = RolloutDataSource(args)
    groups = generate_rollout(args, 0, ds)
    assert len(groups) == 4 and all(len(g) == 1 for g in groups)
    first_row = json.loads(paths["sft"].read_text().splitlines()[0])
    s = groups[0][0]
    assert s.prompt == first_row["messages"]
    assert s.status == Sample.Status.COMPLETED and s.reward == 0.0
    assert len(s.loss_mask) == s.response_length and all(m == 1 for m in s.loss_mask)
    assert s.response == first_row["messages"][1]["content"] + "<|end|>"
    # "<|user|>A+B=<|end|><|assistant|>": 3 special tokens + one token per character
    assert s.prompt_length == 3 + len(s.prompt[0]["content"])
    assert [g[0].group_index for g in generate_rollout(args, 1, ds)] == [4, 5, 6, 7]

    with pytest.raises(SlimeError, match="no evaluation mode"):
        generate_rollout(args, 0, ds, evaluation=True)


def test_generate_rollout_rejects_string_prompts(tmp_path, tiny_dir):
    paths = write_arithmetic_dataset(tmp_path, num_train=4, num_eval=2)
    args = make_args(
        prompt_data=str(paths["train"]),
        input_key="prompt",
        label_key="label",
        hf_checkpoint=str(tiny_dir),
        rollout_batch_size=2,
    )
    with pytest.raises(SlimeError, match="list of chat"):
        generate_rollout(args, 0, RolloutDataSource(args))
