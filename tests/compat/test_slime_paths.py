"""Module paths slime users' hooks import exist here with slime's behaviour.

Every name is imported by its slime path and checked against a reference computed here: expected
values written from slime's rules, a plain re-derivation (the loss mask from rendering prefixes of
the conversation), or a run of the same case through another route.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from dataclasses import fields
from types import SimpleNamespace

import pytest

from slime.utils.processing_utils import load_processor, load_tokenizer
from slime.utils.types import Sample
from tests.helpers import make_args as full_args
from tests.helpers import stub_generate_state

HERE = "tests.compat.test_slime_paths."


def test_processing_utils_on_a_text_only_model(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    assert tok.decode(tok.encode("12+3=15", add_special_tokens=False)) == "12+3=15"
    assert load_processor(str(tiny_model_dir)) is None  # text-only: no processor, as slime returns


# ============================================================== 1. slime.utils.types.Sample

# slime's Sample, field by field, in slime's order, with slime's defaults
SLIME_SAMPLE_DEFAULTS = [
    ("group_index", None),
    ("index", None),
    ("rollout_id", None),
    ("prompt", ""),
    ("tokens", []),
    ("multimodal_inputs", None),
    ("multimodal_train_inputs", None),
    ("multimodal_train_input_id", None),
    ("apply_chat_template_kwargs", {}),
    ("response", ""),
    ("response_length", 0),
    ("label", None),
    ("reward", None),
    ("loss_mask", None),
    ("weight_versions", []),
    ("rollout_log_probs", None),
    ("rollout_top_p_token_ids", None),
    ("rollout_top_p_token_offsets", None),
    ("rollout_routed_experts", None),
    ("remove_sample", False),
    ("teacher_log_probs", None),
    ("status", "pending"),
    ("metadata", {}),
    ("generate_function_path", None),
    ("custom_rm_path", None),
    ("train_metadata", None),
    ("session_id", None),
    ("non_generation_time", 0.0),
    ("spec_info", None),
    ("prefix_cache_info", None),
]


def _b64(values):
    import numpy as np

    return base64.b64encode(np.asarray(values, dtype=np.int32).tobytes()).decode("ascii")


def test_sample_fields_and_defaults_are_slimes():
    from slime.utils.types import Sample

    assert [f.name for f in fields(Sample)] == [name for name, _ in SLIME_SAMPLE_DEFAULTS]
    s = Sample()
    for name, default in SLIME_SAMPLE_DEFAULTS:
        value = getattr(s, name)
        if name == "status":
            assert value is Sample.Status.PENDING
        elif name == "spec_info":
            assert value == Sample.SpecInfo() and value.spec_accept_rate == 0.0 and value.spec_accept_length == 0.0
        elif name == "prefix_cache_info":
            assert value == Sample.PrefixCacheInfo() and value.prefix_cache_hit_rate == 0.0
        else:
            assert value == default, name
    assert Sample().tokens is not Sample().tokens  # mutable defaults are per sample
    assert [st.value for st in Sample.Status] == ["pending", "completed", "truncated", "aborted", "failed"]


def test_sample_append_response_tokens_model_then_tool_turns():
    from slime.utils.types import Sample

    s = Sample(prompt="p", tokens=[7, 8])
    meta = {"finish_reason": {"type": "length"}, "weight_version": "4", "cached_tokens": 1, "prompt_tokens": 2}
    s.append_response_tokens(None, tokens=[1, 2], log_probs=[-0.5, -0.25], meta_info=meta, text="ab")
    s.append_response_tokens(tokens=[3], trainable=False, text="<tool>")  # no meta: status stays
    s.append_response_tokens(
        None,
        tokens=[4],
        log_probs=[-1.0],
        meta_info={"finish_reason": {"type": "stop"}, "cached_tokens": 3, "prompt_tokens": 5},
    )
    assert s.tokens == [7, 8, 1, 2, 3, 4] and s.response == "ab<tool>" and s.response_length == 4
    assert s.loss_mask == [1, 1, 0, 1] and s.rollout_log_probs == [-0.5, -0.25, 0.0, -1.0]
    assert s.status is Sample.Status.COMPLETED and s.weight_versions == ["4"]
    assert (s.prefix_cache_info.cached_tokens, s.prefix_cache_info.total_prompt_tokens) == (4, 7)
    assert s.prefix_cache_info.prefix_cache_hit_rate == pytest.approx(4 / 7)
    assert s.effective_response_length == 3 and s.prompt_length == 2
    s.append_response_tokens(None, tokens=[5], log_probs=[-0.1], meta_info={"finish_reason": {"type": "abort"}})
    assert s.status is Sample.Status.ABORTED
    # update_terminal_info=False: tokens appended, status and counters untouched
    s.append_response_tokens(
        None,
        tokens=[6],
        log_probs=[-0.1],
        meta_info={"finish_reason": {"type": "stop"}, "weight_version": "9"},
        update_terminal_info=False,
    )
    assert s.status is Sample.Status.ABORTED and s.weight_versions == ["4"]
    assert Sample(response_length=3).effective_response_length == 3  # no mask: the whole response


def test_sample_append_response_tokens_rejects_misaligned_input():
    from slime.utils.types import Sample

    with pytest.raises(ValueError, match="require rollout log probabilities"):
        Sample().append_response_tokens(tokens=[1])
    with pytest.raises(ValueError, match="should not pass"):
        Sample().append_response_tokens(tokens=[1], log_probs=[0.0], trainable=False)
    with pytest.raises(ValueError, match="length"):
        Sample().append_response_tokens(tokens=[1, 2], log_probs=[0.0])
    old = Sample(tokens=[1, 2], response_length=1)  # a response without log-probs: cannot add model tokens
    with pytest.raises(ValueError, match="no existing rollout_log_probs"):
        old.append_response_tokens(tokens=[3], log_probs=[-1.0])
    tool = Sample(tokens=[1, 2], response_length=1)  # but tool tokens: earlier log-probs become 0.0
    tool.append_response_tokens(tokens=[3], trainable=False)
    assert tool.rollout_log_probs == [0.0, 0.0] and tool.loss_mask == [1, 0]


def test_sample_top_p_replay_and_routed_experts():
    import torch

    from slime.utils.types import Sample

    s = Sample(tokens=[9, 9])
    # response token 0 kept ids {5, 6}, token 1 kept {7}
    s.append_response_tokens(
        None,
        tokens=[1, 2],
        log_probs=[0.0, 0.0],
        meta_info={"top_p_token_ids": _b64([5, 6, 7]), "top_p_token_offsets": [0, 2, 3]},
    )
    s.append_response_tokens(tokens=[3], trainable=False)  # a tool token: an empty span
    s.append_response_tokens(
        None,
        tokens=[4],
        log_probs=[0.0],
        meta_info={"top_p_kept_token_ids": [8, 9], "top_p_kept_token_offsets": [0, 2]},
    )
    ids, offsets = s.rollout_top_p_token_ids.tolist(), s.rollout_top_p_token_offsets.tolist()
    spans = [ids[offsets[i] : offsets[i + 1]] for i in range(s.response_length)]
    assert spans == [[5, 6], [7], [], [8, 9]]
    with pytest.raises(ValueError, match="offsets"):
        Sample().append_response_tokens(
            None, tokens=[1], log_probs=[0.0], meta_info={"top_p_token_ids": [1], "top_p_token_offsets": [0, 1, 1]}
        )

    args = SimpleNamespace(num_layers=2, moe_router_topk=1)
    r = Sample(tokens=[1, 2])  # experts for each token's input position: len(tokens) - 1 rows
    r.append_response_tokens(args, tokens=[3], log_probs=[0.0], meta_info={"routed_experts": _b64([10, 11, 20, 21])})
    assert r.rollout_routed_experts.tolist() == [[[10], [11]], [[20], [21]]]
    r.append_response_tokens(
        args, tokens=[4], log_probs=[0.0], meta_info={"routed_experts": [30, 31], "routed_experts_start_len": 2}
    )
    assert r.rollout_routed_experts.shape == torch.Size([3, 2, 1])
    assert r.rollout_routed_experts[2].flatten().tolist() == [30, 31]
    with pytest.raises(ValueError, match="element count"):
        Sample(tokens=[1, 2]).append_response_tokens(
            args, tokens=[3], log_probs=[0.0], meta_info={"routed_experts": [1, 2, 3]}
        )


def test_sample_spec_info_counts_only_with_speculative_decoding():
    from slime.utils.types import Sample

    meta = {
        "finish_reason": {"type": "stop"},
        "spec_accept_token_num": 6,
        "spec_draft_token_num": 8,
        "spec_verify_ct": 2,
        "completion_tokens": 5,
    }
    s = Sample()
    s.append_response_tokens(
        SimpleNamespace(sglang_speculative_algorithm="EAGLE"), tokens=[1], log_probs=[0.0], meta_info=meta
    )
    assert s.spec_info.spec_accept_rate == 6 / 8 and s.spec_info.spec_accept_length == 5 / 2
    plain = Sample()
    plain.append_response_tokens(SimpleNamespace(), tokens=[1], log_probs=[0.0], meta_info=meta)
    assert plain.spec_info == Sample.SpecInfo()


def test_sample_dict_round_trip_and_old_saved_state():
    from slime.utils.types import Sample

    s = Sample(
        group_index=1,
        index=3,
        rollout_id=7,
        prompt=[{"role": "user", "content": "hi"}],
        tokens=[1, 2, 3],
        response="x",
        response_length=1,
        label="5",
        reward={"score": 1.0},
        loss_mask=[1],
        rollout_log_probs=[-0.5],
        teacher_log_probs=[-0.4],
        status=Sample.Status.TRUNCATED,
        metadata={"k": 1},
        custom_rm_path="a.b",
        generate_function_path="c.d",
        session_id="s",
        weight_versions=["2"],
        remove_sample=True,
        non_generation_time=1.5,
        spec_info=Sample.SpecInfo(1, 2, 3, 4),
        prefix_cache_info=Sample.PrefixCacheInfo(5, 6),
    )
    d = json.loads(json.dumps(s.to_dict()))  # what the Data Buffer writes and reads back
    assert d["status"] == "truncated" and d["spec_info"]["spec_verify_ct"] == 3
    assert d["prefix_cache_info"] == {"cached_tokens": 5, "total_prompt_tokens": 6}
    assert Sample.from_dict(d) == s
    # state saved before the new fields existed (this project's earlier Sample.to_dict)
    old = {
        "group_index": 0,
        "index": 1,
        "prompt": "p",
        "tokens": [4, 5],
        "response": "r",
        "response_length": 1,
        "label": "1",
        "reward": 1.0,
        "loss_mask": [1],
        "rollout_log_probs": [-0.1],
        "status": "aborted",
        "metadata": {},
        "train_metadata": None,
        "session_id": None,
        "weight_versions": ["0"],
        "remove_sample": False,
    }
    loaded = Sample.from_dict(old)
    assert loaded.status is Sample.Status.ABORTED and loaded.tokens == [4, 5] and loaded.rollout_id is None
    assert loaded.spec_info == Sample.SpecInfo() and loaded.apply_chat_template_kwargs == {}
    # a key that is not a field becomes an attribute (slime's rule), and survives the next round trip
    extra = Sample.from_dict({**old, "legacy_note": "kept"})
    assert extra.legacy_note == "kept" and Sample.from_dict(extra.to_dict()).legacy_note == "kept"
    # tensors are written as lists
    import torch

    t = Sample(rollout_routed_experts=torch.tensor([[[1]]], dtype=torch.int32))
    assert json.loads(json.dumps(t.to_dict()))["rollout_routed_experts"] == [[[1]]]


def test_sample_reward_value_and_other_types():
    from slime.utils.types import MultimodalTypes, ParamInfo, RolloutBatch, Sample  # noqa: F401

    assert Sample(reward=2).get_reward_value(SimpleNamespace(reward_key=None)) == 2
    assert Sample(reward={"acc": 1, "score": -1}).get_reward_value(SimpleNamespace(reward_key="acc")) == 1
    assert MultimodalTypes.get("image").placeholder == "<image>" and MultimodalTypes.get("text") is None
    assert [m.name for m in MultimodalTypes.all()] == ["image", "video", "audio"]


# ============================================================== 2. slime.utils.mask_utils

NL = "{{ '\\n' }}"  # a newline the whitespace control of `{%-` cannot strip
# A template that gives a lone non-system message a default system prompt (as Qwen2.5's does)
QWEN_LIKE = (
    "{%- if messages[0]['role'] != 'system' -%}<|system|>You are a helpful assistant.<|end|>"
    + NL
    + "{%- endif -%}{%- for m in messages -%}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>"
    + NL
    + "{%- endfor -%}{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
# One that puts consecutive tool answers into one user turn (as Qwen3's does)
QWEN3_LIKE = (
    "{%- for m in messages -%}{%- if m['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}<|user|>{%- endif -%}"
    "<tool_response>{{ m['content'] }}</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}<|end|>" + NL + "{%- endif -%}"
    "{%- else -%}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>" + NL + "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
# Qwen3.5's markers, with the assistant's thought opened by the template
QWEN35_LIKE = (
    "{%- for m in messages -%}<|im_start|>{{ m['role'] }}"
    + NL
    + "{%- if m['role'] == 'assistant' -%}<think>"
    + NL
    + "{%- endif -%}{{ m['content'] }}<|im_end|>"
    + NL
    + "{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant"
    + NL
    + "{%- endif -%}"
)

CHAT = [
    {"role": "system", "content": "Add the numbers."},
    {"role": "user", "content": "12+30"},
    {"role": "assistant", "content": "The answer is 42"},
    {"role": "user", "content": "and 5+5?"},
    {"role": "assistant", "content": "10", "step_loss_mask": 0},
    {"role": "user", "content": "thanks"},
    {"role": "assistant", "content": "You are welcome."},
]
NO_SYSTEM = CHAT[1:]
TOOLS = [
    {"role": "user", "content": "what is 2+2"},
    {"role": "assistant", "content": "call calc"},
    {"role": "tool", "content": "4"},
    {"role": "tool", "content": "ok"},
    {"role": "assistant", "content": "The answer is 4"},
]


def _tokenizer(template=None, specials=()):
    from slime.data.tiny_model import build_tokenizer

    tok = build_tokenizer()
    if template:
        tok.chat_template = template
    if specials:
        tok.add_special_tokens({"additional_special_tokens": list(specials)})
    return tok


def _prefix_reference(tok, messages, header_tail=""):
    """Tokens of the whole rendered conversation, and a mask that is 1 from the end of the
    generation prompt before each trained assistant message (plus `header_tail`, text the template
    opens the message with) to the end of that message's rendering."""

    def enc(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    full = enc(tok.apply_chat_template(messages, tokenize=False))
    mask = [0] * len(full)
    for k, m in enumerate(messages):
        if m["role"] != "assistant" or m.get("step_loss_mask", 1) != 1:
            continue
        start = enc(tok.apply_chat_template(messages[:k], tokenize=False, add_generation_prompt=True) + header_tail)
        end = enc(tok.apply_chat_template(messages[: k + 1], tokenize=False))
        assert full[: len(start)] == start and full[: len(end)] == end  # the reference itself is sound
        mask[len(start) : len(end)] = [1] * (len(end) - len(start))
    return full, mask


@pytest.mark.parametrize(
    "template,kind,messages,system_len",
    [
        (None, "qwen", CHAT, 0),
        (None, "qwen", NO_SYSTEM, 0),
        (None, "qwen3", CHAT, 0),
        (QWEN_LIKE, "qwen", CHAT, None),
        (QWEN_LIKE, "qwen", NO_SYSTEM, None),  # qwen3 assumes no default system prompt
        (QWEN3_LIKE, "qwen3", TOOLS, 0),
        (QWEN3_LIKE, "qwen3", CHAT, 0),
    ],
)
def test_loss_mask_is_one_exactly_on_assistant_tokens(template, kind, messages, system_len):
    from slime.utils.mask_utils import MultiTurnLossMaskGenerator

    tok = _tokenizer(template)
    gen = MultiTurnLossMaskGenerator(tok, tokenizer_type=kind)
    if system_len is None:  # the default system prompt's tokens, measured independently
        system_len = len(
            tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=True, return_dict=False)
        ) - len(tok("<|user|>x<|end|>\n")["input_ids"])
        assert system_len > 0
    assert gen.system_message_length == system_len and gen.gen_token_length == 1  # `<|assistant|>`
    ids, mask = gen.get_loss_mask(messages)
    assert (ids, mask) == _prefix_reference(tok, messages)
    trained = [
        m["content"] + "<|end|>\n" * (template is not None) + "<|end|>" * (template is None)
        for m in messages
        if m["role"] == "assistant" and m.get("step_loss_mask", 1) == 1
    ]
    assert gen.get_text_from_loss_mask(ids, mask) == trained
    assert gen.get_response_lengths([mask]) == [len(mask) - mask.index(1)]


def test_loss_mask_qwen3_5_from_character_offsets():
    from slime.utils.mask_utils import MultiTurnLossMaskGenerator

    tok = _tokenizer(QWEN35_LIKE, specials=("<|im_start|>", "<|im_end|>", "<think>"))
    gen = MultiTurnLossMaskGenerator(tok, tokenizer_type="qwen3_5")
    ids, mask = gen.get_loss_mask(NO_SYSTEM)
    assert (ids, mask) == _prefix_reference(tok, NO_SYSTEM, header_tail="<think>\n")
    assert gen.get_text_from_loss_mask(ids, mask) == ["The answer is 42<|im_end|>\n", "You are welcome.<|im_end|>\n"]


def test_loss_mask_distill_qwen_and_its_detection():
    from slime.utils.mask_utils import MultiTurnLossMaskGenerator

    tok = _tokenizer()
    conv = [{"role": "user", "content": "12+30"}, {"role": "assistant", "content": "The answer is 42"}]
    prompt = tok("<|user|>12+30<|end|><|assistant|>", add_special_tokens=False)["input_ids"]
    answer = tok("The answer is 42", add_special_tokens=False)["input_ids"]
    expected = (prompt + answer, [0] * len(prompt) + [1] * len(answer))
    assert MultiTurnLossMaskGenerator(tok, "distill_qwen").get_loss_mask(conv) == expected
    off = [conv[0], {**conv[1], "step_loss_mask": 0}]
    assert MultiTurnLossMaskGenerator(tok, "distill_qwen").get_loss_mask(off) == (expected[0], [0] * len(expected[0]))
    tok.add_tokens(["<｜Assistant｜>"])  # DeepSeek-R1 distills: "qwen" means distill_qwen
    assert MultiTurnLossMaskGenerator(tok, "qwen").get_loss_mask(conv) == expected


def test_loss_mask_helpers():
    from slime.utils.mask_utils import MultiTurnLossMaskGenerator, get_response_lengths

    assert get_response_lengths([[0, 0, 1, 0, 1], [0, 0], [1, 1], []]) == [3, 0, 2, 0]
    assert MultiTurnLossMaskGenerator.find_all_sublist_indices([1, 2, 1, 2, 1], [1, 2, 1]) == [0, 2]
    tok = _tokenizer()
    gen = MultiTurnLossMaskGenerator(tok)
    ids, mask = gen.get_loss_mask(NO_SYSTEM[:2])
    mm = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "12+30"}]}, NO_SYSTEM[1]]
    padded = [0, 0, 0] + ids  # the processor's ids: three more (image) tokens in the prompt
    assert gen.get_loss_mask_with_multimodal_alignment(mm, padded) == (padded, [0, 0, 0] + mask)
    with pytest.raises(ValueError, match="Unsupported tokenizer type"):
        MultiTurnLossMaskGenerator(tok, "llama").get_loss_mask(NO_SYSTEM)


# ============================================================== 3. slime.utils.misc / async_utils


def test_singleton_meta():
    from slime.utils.misc import SingletonMeta

    built = []

    class Registry(metaclass=SingletonMeta):
        def __init__(self, name):
            built.append(name)
            self.name = name

    class Other(metaclass=SingletonMeta):
        pass

    threads = [threading.Thread(target=Registry, args=(f"t{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1 and Registry("ignored") is Registry("also ignored") and Other() is not Registry("x")
    first = Registry("y")
    Registry.clear_instances()
    again = Registry("fresh")
    assert again is not first and again.name == "fresh" and Registry("z") is again


def test_async_loop_thread():
    from slime.utils.async_utils import AsyncLoopThread, get_async_loop, run

    async def where(x):
        await asyncio.sleep(0)
        return x * 2, threading.current_thread() is threading.main_thread()

    shared = get_async_loop()
    assert get_async_loop() is shared and isinstance(shared, AsyncLoopThread)
    assert shared.run(where(2)) == (4, False) and run(where(3)) == (6, False)  # on the background thread
    own = AsyncLoopThread()
    assert own.loop is not shared.loop and own.run(where(5)) == (10, False)

    async def nested():
        return run(where(1))  # blocking on the loop it runs on would hang: refused

    with pytest.raises(RuntimeError, match="inside its own loop"):
        run(nested())


# ============================================================== 4. slime.rollout.rm_hub


def test_math_dapo_compute_score():
    from slime.rollout.rm_hub import compute_score_dapo
    from slime.rollout.rm_hub.math_dapo_utils import compute_score

    assert compute_score_dapo is compute_score
    assert compute_score("so...\nAnswer: 42", "42") == {"score": 1.0, "acc": True, "pred": "42"}
    assert compute_score("Answer: 41", "42") == {"score": -1.0, "acc": False, "pred": "41"}
    assert compute_score("the answer is \\boxed{42}", "42") == {"score": -1.0, "acc": False, "pred": "[INVALID]"}
    assert compute_score("Answer: $1,000$ dollars", "1000.0") == {"score": 1.0, "acc": True, "pred": "1000"}
    assert compute_score("Answer: 42\n" + "x" * 300, "42")["pred"] == "[INVALID]"  # only the last 300 characters
    # strict boxed: the last \boxed{} in the final 100 characters, compared verbatim
    assert compute_score("so \\boxed{42}", "42", strict_box_verify=True) == {"score": 1.0, "acc": True, "pred": "42"}
    assert compute_score("Answer: 42", "42", strict_box_verify=True) == {"score": -1.0, "acc": False, "pred": None}
    assert compute_score("\\boxed{42}", 42, strict_box_verify=True)["acc"] is False  # not the string "42"
    far = "\\boxed{7}" + "y" * 150
    assert compute_score(far, "7", strict_box_verify=True)["pred"] is None
    assert compute_score(far, "7", strict_box_verify=True, pause_tokens_index=[0, 0, 0, 100]) == {
        "score": 1.0,
        "acc": True,
        "pred": "7",
    }  # read from the last pause token - 100


def test_math_dapo_utils_helpers():
    from slime.rollout.rm_hub import math_dapo_utils as m

    assert m.last_boxed_only_string("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\boxed{\\frac{1}{2}}"
    assert m.last_boxed_only_string("\\boxed{open") is None and m.last_boxed_only_string("\\fbox{2}") is None
    assert m.remove_boxed("\\boxed{x+1}") == "x+1"
    with pytest.raises(AssertionError):
        m.remove_boxed("\\fbox{1}")
    assert m.normalize_final_answer("x = \\text{5 } cm") == "5"
    assert m.normalize_final_answer("\\frac12") == "\\frac{1}{2}" and m.normalize_final_answer("1,234") == "1234"
    assert m.is_correct_minerva("Answer: 12", "\\boxed{12}", gt_need_extract=True) == (True, "12")
    assert m.verify("Answer: 3", "3") == (True, "3")
    assert m.verify("\\boxed{3}", "3", strict_box_verify=True) == (True, "3")
    assert m.is_correct_strict_box("\\boxed{3}", "4") == (-1, "3")
    assert "dollars" in m.REMOVED_EXPRESSIONS and ("mbox", "text") in m.SUBSTITUTIONS
    with pytest.raises(TimeoutError), m.timeout(seconds=1):
        time.sleep(3)


def test_rm_hub_scorers_by_slime_names():
    from slime.rollout.rm_hub import (
        extract_boxed_answer,
        f1_score,
        get_deepscaler_rule_based_reward,
        grade_answer_verl,
    )
    from slime.rollout.rm_hub.math_utils import extract_answer, grade_answer_mathd, grade_answer_sympy

    assert get_deepscaler_rule_based_reward("<think>\\boxed{1}</think> so \\boxed{2}", "2") == 1
    assert get_deepscaler_rule_based_reward("<think>\\boxed{2}</think> none", "2") == 0
    assert get_deepscaler_rule_based_reward("\\boxed{2}", "2") == 0  # no </think> nor ###Response
    assert get_deepscaler_rule_based_reward("###Response \\boxed{\\frac{1}{2}}", "\\boxed{0.5}") == 1
    assert grade_answer_verl("so \\boxed{\\dfrac{1}{2}}", "0.5") is True
    assert grade_answer_verl("\\boxed{2/4}", "\\frac{1}{2}") is False  # unreduced fractions differ
    assert grade_answer_verl("\\boxed{3}", "") is False and grade_answer_verl("3", "3") is False
    assert grade_answer_mathd("\\frac{1}{2}", "1/2") and grade_answer_sympy("x+1", "1+x")
    # slime's extract_boxed_answer is strict: only `\boxed{...}`
    assert extract_boxed_answer("a \\boxed{3} b") == "3" == extract_answer("\\boxed{3}")
    assert extract_boxed_answer("\\boxed 5") is None and extract_boxed_answer("\\fbox{3}") is None
    assert extract_boxed_answer("no box") is None
    f1, precision, recall = f1_score("Paris France", "Paris")
    assert (precision, recall) == (0.5, 1.0) and f1 == pytest.approx(2 / 3)
    assert f1_score(None, "x") == (0, 0, 0) and f1_score("yes", "no") == (0, 0, 0)


def _per_sample_rm(args, sample):
    return 7.0


def test_rm_type_random_and_per_sample_custom_rm():
    from slime.rollout.rm_hub import async_rm, validate_rm_type
    from slime.utils.types import Sample

    args = full_args(rm_type="random")
    assert validate_rm_type("random") == "random"

    async def many():
        return await asyncio.gather(*(async_rm(args, Sample(response="r", label="1")) for _ in range(200)))

    assert set(asyncio.run(many())) == {0, 1}  # both appear (the chance they do not is 2**-199)
    own = Sample(response="r", label="1", custom_rm_path=HERE + "_per_sample_rm")
    assert asyncio.run(async_rm(full_args(rm_type="math"), own)) == 7.0  # before --rm-type


# ============================================================== 5. slime.rollout.filter_hub


def test_dynamic_filter_types():
    from slime.rollout.filter_hub.base_types import (
        DynamicFilterOutput,
        MetricGatherer,
        call_dynamic_filter,
        should_drop_dynamic_filter_output,
    )

    assert DynamicFilterOutput(keep=False) == DynamicFilterOutput(False, None, False)
    assert call_dynamic_filter(None, "args", []) == DynamicFilterOutput(keep=True)
    assert call_dynamic_filter(lambda a, s: False, "args", []) == DynamicFilterOutput(keep=False)
    kept = DynamicFilterOutput(keep=True, reason="r")
    assert call_dynamic_filter(lambda a, s: kept, "args", []) is kept
    fallback = DynamicFilterOutput(keep=False, keep_when_insufficient=True)
    for out, remaining, target, drop in [
        (kept, 1, 4, False),
        (DynamicFilterOutput(keep=False), 1, 4, True),
        (fallback, 5, 4, True),
        (fallback, 4, 4, False),
        (fallback, 3, 4, False),
    ]:
        assert should_drop_dynamic_filter_output(out, remaining_batch_size=remaining, target_data_size=target) is drop
    g = MetricGatherer()
    for reason in ["zero_std_1.0", None, "zero_std_1.0", "x"]:
        g.on_dynamic_filter_drop(reason)
    assert g.collect() == {"rollout/dynamic_filter/drop_zero_std_1.0": 2, "rollout/dynamic_filter/drop_x": 1}


def test_reward_nonzero_std_with_fallback():
    from slime.rollout.filter_hub.dynamic_sampling_filters import check_reward_nonzero_std_with_fallback
    from slime.utils.types import Sample

    args = SimpleNamespace(reward_key=None)
    flat = check_reward_nonzero_std_with_fallback(args, [Sample(reward=1.0), Sample(reward=1.0)])
    assert (flat.keep, flat.reason, flat.keep_when_insufficient) == (False, "zero_std_1.0", True)
    mixed = check_reward_nonzero_std_with_fallback(args, [Sample(reward=0.0), Sample(reward=1.0)])
    assert mixed.keep is True and mixed.reason is None


def make_args(**kw):
    return full_args(**{"rm_type": "math", "rollout_batch_size": 2, "n_samples_per_prompt": 2, **kw})


@pytest.fixture
def state(monkeypatch):
    """A GenerateState without tokenizer or engine (hooks stand in for the engine)."""
    from slime.rollout import sglang_rollout

    yield lambda args: stub_generate_state(monkeypatch, args)
    sglang_rollout.GenerateState.reset()


async def _gen(args, sample, sampling_params, evaluation=False):
    sample.response, sample.response_length = f"r{sample.index}", 1
    sample.tokens, sample.loss_mask, sample.rollout_log_probs = list(sample.tokens) + [1], [1], [0.0]
    sample.metadata["evaluation"] = evaluation
    sample.status = Sample.Status.COMPLETED
    return sample


async def _gen_own(args, sample, sampling_params):
    await _gen(args, sample, sampling_params)
    sample.response = "own"
    return sample


async def _gen_two(args, sample, sampling_params):
    first = await _gen(args, sample, sampling_params)
    second = Sample(
        index=sample.index,
        prompt=sample.prompt,
        tokens=[9, 2],
        response="second",
        response_length=1,
        loss_mask=[1],
        status=Sample.Status.COMPLETED,
        reward=0.5,
    )
    return [first, second]


async def _rm_by_index(args, sample):
    return args.test_rewards[sample.index]  # on args: the hook may be loaded as another module object


async def _batch_rm(args, samples):
    if isinstance(samples, Sample):
        return float(len(samples.response))
    return [10.0 + i for i in range(len(samples))]


def _group(n=2, gi=0):
    return [Sample(group_index=gi, index=gi * n + j, prompt="p", tokens=[9], metadata={}) for j in range(n)]


class _Source:
    def __init__(self, n=2):
        self.n, self.next, self.returned = n, 0, []

    def get_samples(self, k):
        out = [_group(self.n, self.next + i) for i in range(k)]
        self.next += k
        return out

    def add_samples(self, groups):
        self.returned += groups


@pytest.mark.parametrize(
    "filter_name,over_sampling,kept_from,drops,fetched",
    [
        # no fallback: every flat group is dropped and replaced until two mixed ones come
        ("check_reward_nonzero_std", 4, {4, 5, 6, 7}, {"zero_std_1.0": 4}, 8),
        # fallback, over-sampling 4 for 2: flat groups are dropped while 2 others could still fill the
        # batch, then kept; no second round is fetched
        ("check_reward_nonzero_std_with_fallback", 4, {0, 1, 2, 3}, {"zero_std_1.0": 2}, 4),
        # fallback without over-sampling: nothing to spare, every group is kept
        ("check_reward_nonzero_std_with_fallback", 2, {0, 1}, {}, 2),
    ],
)
def test_rollout_honours_keep_when_insufficient(state, filter_name, over_sampling, kept_from, drops, fetched):
    from slime.rollout import sglang_rollout

    args = make_args(
        custom_generate_function_path=HERE + "_gen",
        custom_rm_path=HERE + "_rm_by_index",
        dynamic_sampling_filter_path="slime.rollout.filter_hub.dynamic_sampling_filters." + filter_name,
        over_sampling_batch_size=over_sampling,
    )
    args.test_rewards = [1.0] * 8 + [0.0, 1.0] * 4  # groups 0-3 flat, groups 4-7 mixed
    state(args)
    source = _Source()
    out = asyncio.run(sglang_rollout.generate_rollout_async(args, 0, source))
    kept = [g[0].group_index for g in out.samples]  # groups finishing together are examined in any order
    assert len(kept) == 2 and set(kept) <= kept_from and source.next == fetched
    assert {
        k.removeprefix("rollout/dynamic_filter/drop_"): v
        for k, v in out.metrics.items()
        if k.startswith("rollout/dynamic_filter/drop_")
    } == drops


# ============================================================== 6. slime.rollout.base_types


def test_call_rollout_fn():
    from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput, call_rollout_fn

    seen = []

    def fn(args, rollout_id, data_source, evaluation=False):
        seen.append((args, rollout_id, data_source, evaluation))
        return {"set": {"rewards": [1.0]}} if evaluation else [["g"]]

    assert call_rollout_fn(fn, "a", 3, "ds", evaluation=False) == RolloutFnTrainOutput(samples=[["g"]])
    assert call_rollout_fn(fn, "a", 3, "ds", evaluation=True) == RolloutFnEvalOutput(data={"set": {"rewards": [1.0]}})
    assert seen == [("a", 3, "ds", False), ("a", 3, "ds", True)]
    wrapped = RolloutFnTrainOutput(samples=[], metrics={"m": 1.0})
    assert call_rollout_fn(lambda evaluation: wrapped, evaluation=False) is wrapped


# ============================================================== 7. slime.rollout.sglang_rollout


def test_generate_and_rm_per_sample(state):
    from slime.rollout.sglang_rollout import generate_and_rm

    args = make_args(custom_generate_function_path=HERE + "_gen", custom_rm_path=HERE + "_batch_rm")
    state(args)
    params = {"max_new_tokens": 4}
    s = asyncio.run(generate_and_rm(args, _group(1)[0], params, evaluation=True))
    assert s.response == "r0" and s.metadata["evaluation"] is True and s.reward == 2.0  # len("r0")
    own = _group(1)[0]
    own.generate_function_path = HERE + "_gen_own"  # the sample's own function wins
    assert asyncio.run(generate_and_rm(args, own, params)).response == "own"
    done = Sample(status=Sample.Status.COMPLETED, response="x", reward=3.0)
    assert asyncio.run(generate_and_rm(args, done, params)) is done and done.reward == 3.0
    # several samples from one call: one batched reward call for those without a reward
    args2 = make_args(custom_generate_function_path=HERE + "_gen_two", custom_rm_path=HERE + "_batch_rm")
    state(args2)
    out = asyncio.run(generate_and_rm(args2, _group(1)[0], params))
    assert [x.response for x in out] == ["r0", "second"] and [x.reward for x in out] == [10.0, 0.5]
    # --group-rm: the caller scores the group
    args3 = make_args(custom_generate_function_path=HERE + "_gen", custom_rm_path=HERE + "_batch_rm", group_rm=True)
    state(args3)
    assert asyncio.run(generate_and_rm(args3, _group(1)[0], params)).reward is None


async def _gen_until_abort(args, sample, sampling_params):
    from slime.rollout.sglang_rollout import GenerateState

    while not GenerateState(args).aborted:
        await asyncio.sleep(0.01)
    sample.response, sample.response_length, sample.status = "part", 1, Sample.Status.ABORTED
    sample.tokens, sample.loss_mask = list(sample.tokens) + [3], [1]
    return sample


@pytest.mark.parametrize("partial", [True, False])
def test_submit_generate_tasks_then_abort(state, monkeypatch, partial):
    from slime.rollout import sglang_rollout

    async def no_engines(args):
        return None

    monkeypatch.setattr(sglang_rollout, "abort_engines", no_engines)
    args = make_args(
        custom_generate_function_path=HERE + "_gen_until_abort",
        custom_rm_path=HERE + "_batch_rm",
        partial_rollout=partial,
    )
    st = state(args)

    async def main():
        st.submit_generate_tasks([_group(2, 0), _group(2, 1)])
        assert st.remaining_batch_size == 2 and len(st.pendings) == 2
        await asyncio.sleep(0.05)
        return await sglang_rollout.abort(args, 5)

    collected = asyncio.run(main())
    assert st.aborted and not st.pendings
    if partial:
        assert sorted(s.index for g in collected for s in g) == [0, 1, 2, 3]
        assert all(s.metadata["start_rollout_id"] == 5 and s.reward is None for g in collected for s in g)
    else:
        assert collected == []
    st.reset()  # slime's per-rollout reset on the instance
    assert (st.aborted, st.remaining_batch_size, st.pendings) == (False, 0, set())
    assert sglang_rollout.GenerateState._instance is st  # the singleton is kept
    sglang_rollout.GenerateState.reset()  # on the class: forgotten
    assert sglang_rollout.GenerateState._instance is None


def test_eval_rollout_and_get_model_url(state):
    from slime.rollout.base_types import RolloutFnEvalOutput
    from slime.rollout.sglang_rollout import eval_rollout, get_model_url

    args = make_args(
        custom_generate_function_path=HERE + "_gen",
        custom_rm_path=HERE + "_dict_rm",
        n_samples_per_eval_prompt=2,
        eval_reward_key="acc",
    )  # eval reads it, not --reward-key
    st = state(args)
    st.eval_datasets = {"set": [Sample(prompt="p", tokens=[9], label="1"), Sample(prompt="q", tokens=[9], label="2")]}
    output, aborted = asyncio.run(eval_rollout(args, 0))
    assert isinstance(output, RolloutFnEvalOutput) and aborted == []
    res = output.data["set"]
    assert [s.index for s in res["samples"]] == [0, 1, 2, 3] and res["rewards"] == [0.0, 1.0, 0.0, 1.0]
    assert res["truncated"] == [False] * 4

    args.sglang_router_ip, args.sglang_router_port = "127.0.0.1", 3000
    assert get_model_url(args, "ref") == "http://127.0.0.1:3000/generate"
    args.sglang_model_routers = {"ref": ("10.0.0.2", 4000)}
    assert get_model_url(args, "ref", "/health") == "http://10.0.0.2:4000/health"
    assert get_model_url(args, "actor") == "http://127.0.0.1:3000/generate"


async def _dict_rm(args, sample):
    return {"score": -1.0, "acc": float(sample.index % 2)}


# ============================================================== 8. slime.utils.http_utils


def test_http_post_and_get_with_slimes_positional_arguments():
    from aiohttp import web

    from slime.utils.http_utils import close_sessions, get, post

    async def echo(request):
        body = await request.json() if request.method == "POST" else None
        return web.json_response({"body": body, "key": request.headers.get("X-Key")})

    async def main():
        app = web.Application()
        app.router.add_route("*", "/echo", echo)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/echo"
        try:
            return (
                await post(url, {"a": 1}, 3, {"X-Key": "k"}),  # slime's order: url, payload, max_retries, headers
                await post(url, {"a": 2}, max_retries=2, headers={"X-Key": "kw"}, retry_interval=0.1),
                await post(url),
                await get(url),
            )
        finally:
            await close_sessions()
            await runner.cleanup()

    positional, keywords, empty, got = asyncio.run(main())
    assert positional == {"body": {"a": 1}, "key": "k"} and keywords == {"body": {"a": 2}, "key": "kw"}
    assert empty == {"body": {}, "key": None} and got == {"body": None, "key": None}


def test_sample_hooks_module_applies_hooks_in_order_keeping_the_shape():
    """slime.rollout.sample_hooks: hooks in order, only the keywords they take, None keeps the sample,
    a Sample replaces it, nested lists keep their shape, a bad return raises (slime's contract)."""
    from slime.rollout import sample_hooks

    args = full_args(
        "--rollout-sample-hook-path", HERE + "_hook_tag", "--rollout-sample-hook-path", HERE + "_hook_replace_odd"
    )
    sample_hooks.set_current_rollout_id(7)
    groups = [[Sample(index=0), Sample(index=1)], [Sample(index=2)]]
    out = asyncio.run(sample_hooks.apply_rollout_sample_hooks(args, groups, evaluation=True))
    assert [[s.index for s in g] for g in out] == [[0, 101], [2]]
    assert [s.metadata["tag"] for g in out for s in g] == [(7, True), (7, True), (7, True)]
    with pytest.raises(TypeError, match="returned int"):
        asyncio.run(
            sample_hooks.apply_rollout_sample_hooks(
                full_args("--rollout-sample-hook-path", HERE + "_hook_bad"), Sample(index=0)
            )
        )
    sample_hooks.set_current_rollout_id(None)


def _hook_tag(args, sample, *, rollout_id=None, evaluation=False):
    sample.metadata["tag"] = (rollout_id, evaluation)


async def _hook_replace_odd(args, sample):  # takes no keywords: none are passed
    if sample.index % 2:
        return Sample(index=sample.index + 100, metadata=dict(sample.metadata))
    return None


def _hook_bad(args, sample):
    return 3
